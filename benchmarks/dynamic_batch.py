"""Per-call latency of a dynamic-batch export against a fixed-batch export of the same node (target: within 10%).

The node is the go2 observation step (three Warp kernels, a scratch array, a constant). It is traced twice,
once with ``dynamic_batch=(1, 4096)`` and once fixed at N, and both are exported to PT2. Measured per call,
after a warm-up, each call synchronised (a control loop's latency), with CUDA events and a host clock,
in ``--repeats`` interleaved rounds (timing.measure_interleaved); the ratio is formed per round (paired):

  pt2       leapp.load(...).run_node("obs", ...): input checks, the program, the op, the replay
  native    the bundle alone through leapp._native.run_segment (outputs prebuilt): the runtime's own cost

The dynamic export runs at the same N as the fixed one (its batch is read from the inputs, its rules
applied, its graph cache keyed by batch). ``--dry-run`` exports on the CPU and measures nothing.

    python benchmarks/dynamic_batch.py --sizes 1,1024,4096
    python benchmarks/dynamic_batch.py --dry-run
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import torch
import warp as wp

import leapp
import pipeline_step
import timing
from leapp import annotate

REST = [0.1, 0.8, -1.5] * 4


GO2 = pipeline_step.example()  # examples/go2_pipeline.py: the observation's Warp kernels


def make_node(device: str, dynamic):
    rest = wp.array(REST, dtype=float, device=device)

    @leapp.node("obs", export_with="pt2", dynamic_batch=dynamic)
    def obs(quat, joints):
        n = quat.shape[0]
        grav = torch.empty(n, 3, device=quat.device)
        joint_obs = torch.empty(n, 12, device=quat.device)
        with annotate.warp_op():
            tmp = wp.empty((n, 12), dtype=float, device=device)
            wp.launch(GO2.projected_gravity, dim=n,
                      inputs=[wp.from_torch(quat, dtype=wp.quat), wp.vec3(0.0, 0.0, -1.0)],
                      outputs=[wp.from_torch(grav, dtype=wp.vec3)], device=device)
            wp.launch(GO2.joint_offsets, dim=(n, 12), inputs=[wp.from_torch(joints), rest], outputs=[tmp],
                      device=device)
            wp.launch(GO2.scale, dim=(n, 12), inputs=[tmp, 0.5], outputs=[wp.from_torch(joint_obs)], device=device)
        return torch.cat([grav, joint_obs], dim=-1)

    return obs


def state(n: int, device: str):
    g = torch.Generator().manual_seed(n)
    quat = torch.nn.functional.normalize(torch.randn(n, 4, generator=g), dim=-1)
    return quat.to(device), torch.randn(n, 12, generator=g).to(device)


def export(folder: Path, name: str, n: int, device: str, dynamic) -> Path:
    node = make_node(device, dynamic)
    with leapp.trace(name, save_path=str(folder)) as session:
        for _ in range(2):
            node(*state(n, device))
    session.compile(validate=False)
    return folder / name


def routes(folder: Path, n: int, device: str) -> dict:
    """path -> zero-argument callable running one call at batch n (inputs and the native outputs prebuilt)."""
    from leapp import _native

    pipeline = leapp.load(str(folder))
    quat, joints = state(n, device)
    program = torch.export.load(str(folder / "obs.pt2"))
    data = next(v for k, v in program.state_dict.items() if k.endswith("_bundle")).numpy().tobytes()
    bundle = _native.Bundle(data)
    grav = torch.empty(n, 3, device=device)
    joint_obs = torch.empty(n, 12, device=device)
    stream = torch.cuda.current_stream().cuda_stream
    ins, outs = [quat, joints], [grav, joint_obs]
    ptrs_in, ptrs_out = [t.data_ptr() for t in ins], [t.data_ptr() for t in outs]
    nb_in, nb_out = [t.numel() * 4 for t in ins], [t.numel() * 4 for t in outs]
    return {
        "pt2": lambda: pipeline.run_node("obs", quat=quat, joints=joints),
        # the lambda keeps the tensors alive: the native call holds only their addresses
        "native": lambda keep=(ins, outs): _native.run_segment(bundle, ptrs_in, ptrs_out, stream, 0,
                                                              input_nbytes=nb_in, output_nbytes=nb_out),
    }


def compare(fixed_folder: Path, dynamic_folder: Path, n: int, device: str, calls: int, repeats: int) -> list[dict]:
    """Both exports' routes timed in interleaved rounds (timing.measure_interleaved); one row per path with
    the median of the round medians, p90, spread, and the paired dynamic/fixed ratio per round."""
    fixed, dynamic = routes(fixed_folder, n, device), routes(dynamic_folder, n, device)
    timed = timing.measure_interleaved({**{f"fixed {k}": v for k, v in fixed.items()},
                                        **{f"dynamic {k}": v for k, v in dynamic.items()}}, calls, 20, repeats)
    rows = []
    for path in fixed:
        f, d = timed[f"fixed {path}"], timed[f"dynamic {path}"]
        events = [dr[0] / fr[0] for fr, dr in zip(f["rounds"], d["rounds"])]
        host = [dr[1] / fr[1] for fr, dr in zip(f["rounds"], d["rounds"])]
        rows.append({"n": n, "path": path, "fixed": f, "dynamic": d,
                     "ratio_events": statistics.median(events), "ratio_events_spread": [min(events), max(events)],
                     "ratio_host": statistics.median(host), "ratio_host_spread": [min(host), max(host)]})
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| N | path | fixed µs median / p90 (spread) | dynamic µs median / p90 (spread) | dynamic / fixed "
             "(spread over rounds) |", "|---:|---|---|---|---|"]
    for clock, key in (("events", ""), ("host", "wall_")):
        for r in rows:
            cells = [f"{r[side][key + 'median_us']:.1f} / {r[side][key + 'p90_us']:.1f} "
                     f"({r[side][key + 'spread_us'][0]:.1f}-{r[side][key + 'spread_us'][1]:.1f})"
                     for side in ("fixed", "dynamic")]
            lo, hi = r[f"ratio_{clock}_spread"]
            lines.append(f"| {r['n']} | {r['path']} ({clock}) | {cells[0]} | {cells[1]} | "
                         f"{r[f'ratio_{clock}']:.3f} ({lo:.3f}-{hi:.3f}) |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,1024,4096")
    parser.add_argument("--calls", type=int, default=1000, help="timed calls per route and round")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved rounds (the spread)")
    parser.add_argument("--dry-run", action="store_true", help="export on the CPU only (no GPU needed)")
    args = parser.parse_args(argv)
    wp.init()
    device = "cpu" if args.dry_run else "cuda:0"
    sizes = [int(v) for v in args.sizes.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        dynamic = export(folder, "dyn", sizes[len(sizes) // 2], device, (1, 4096))
        if args.dry_run:
            print(f"exported {dynamic} (dry run: nothing measured)")
            return 0
        rows = []
        for n in sizes:
            rows += compare(export(folder, f"fixed{n}", n, device, None), dynamic, n, device, args.calls, args.repeats)
        print(table(rows))
        worst = max(max(r["ratio_events"], r["ratio_host"]) for r in rows)
        print(f"\nworst median ratio {worst:.3f} (target <= 1.10)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
