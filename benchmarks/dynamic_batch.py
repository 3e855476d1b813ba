"""Per-call latency of a dynamic-batch export against a fixed-batch export of the same node (target: within 10%).

The node is the go2 observation step (three Warp kernels, a scratch array, a constant). It is traced twice,
once with ``dynamic_batch=(1, 4096)`` and once fixed at N, and both are exported to PT2. Measured per call,
after a warm-up, each call synchronised (a control loop's latency), with a host clock:

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
import time
from pathlib import Path

import torch
import warp as wp

import leapp
from leapp import annotate

REST = [0.1, 0.8, -1.5] * 4


@wp.kernel
def gravity(q: wp.array(dtype=wp.quat), g: wp.vec3, out: wp.array(dtype=wp.vec3)):
    i = wp.tid()
    out[i] = wp.quat_rotate_inv(q[i], g)


@wp.kernel
def offsets(pos: wp.array2d(dtype=float), rest: wp.array(dtype=float), out: wp.array2d(dtype=float)):
    i, j = wp.tid()
    out[i, j] = pos[i, j] - rest[j]


@wp.kernel
def scale(src: wp.array2d(dtype=float), factor: float, out: wp.array2d(dtype=float)):
    i, j = wp.tid()
    out[i, j] = src[i, j] * factor


def make_node(device: str, dynamic):
    rest = wp.array(REST, dtype=float, device=device)

    @leapp.node("obs", export_with="pt2", dynamic_batch=dynamic)
    def obs(quat, joints):
        n = quat.shape[0]
        grav = torch.empty(n, 3, device=quat.device)
        joint_obs = torch.empty(n, 12, device=quat.device)
        with annotate.warp_op():
            tmp = wp.empty((n, 12), dtype=float, device=device)
            wp.launch(gravity, dim=n, inputs=[wp.from_torch(quat, dtype=wp.quat), wp.vec3(0.0, 0.0, -1.0)],
                      outputs=[wp.from_torch(grav, dtype=wp.vec3)], device=device)
            wp.launch(offsets, dim=(n, 12), inputs=[wp.from_torch(joints), rest], outputs=[tmp], device=device)
            wp.launch(scale, dim=(n, 12), inputs=[tmp, 0.5], outputs=[wp.from_torch(joint_obs)], device=device)
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


def per_call_us(fn, calls: int, sync) -> float:
    for _ in range(20):
        fn()
    sync()
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def measure(folder: Path, n: int, device: str, calls: int) -> dict[str, float]:
    from leapp import _native

    pipeline = leapp.load(str(folder))
    quat, joints = state(n, device)
    sync = torch.cuda.synchronize
    out = {"pt2": per_call_us(lambda: pipeline.run_node("obs", quat=quat, joints=joints), calls, sync)}
    program = torch.export.load(str(folder / "obs.pt2"))
    data = next(v for k, v in program.state_dict.items() if k.endswith("_bundle")).numpy().tobytes()
    bundle = _native.Bundle(data)
    grav = torch.empty(n, 3, device=device)
    joint_obs = torch.empty(n, 12, device=device)
    stream = torch.cuda.current_stream().cuda_stream
    ins, outs = [quat, joints], [grav, joint_obs]
    ptrs_in, ptrs_out = [t.data_ptr() for t in ins], [t.data_ptr() for t in outs]
    nb_in, nb_out = [t.numel() * 4 for t in ins], [t.numel() * 4 for t in outs]
    out["native"] = per_call_us(lambda: _native.run_segment(bundle, ptrs_in, ptrs_out, stream, 0, input_nbytes=nb_in,
                                                            output_nbytes=nb_out), calls, sync)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,1024,4096")
    parser.add_argument("--calls", type=int, default=2000)
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
        print("| N | path | fixed (µs) | dynamic (µs) | dynamic / fixed |")
        print("|---|---|---|---|---|")
        worst = 0.0
        for n in sizes:
            fixed = measure(export(folder, f"fixed{n}", n, device, None), n, device, args.calls)
            dyn = measure(dynamic, n, device, args.calls)
            for path in fixed:
                ratio = dyn[path] / fixed[path]
                worst = max(worst, ratio)
                print(f"| {n} | {path} | {fixed[path]:.1f} | {dyn[path]:.1f} | {ratio:.3f} |")
        print(f"\nworst ratio {worst:.3f} (target <= 1.10)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
