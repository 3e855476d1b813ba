"""A Warp segment's CPU code (docs/export-cpu.md) against eager Warp on the CPU, per call.

For each N the script traces one node on the CPU (projected gravity scaled: one launch, N quaternions in,
N vec3 out), exports it as PT2 (validate=False) and measures, after a warm-up, the median and p90 of:

  eager-launch   wp.launch of the kernel on prebuilt Warp arrays (Warp's own CPU launch)
  eager-node     the node's Python function: wp.from_torch, torch.empty, wp.launch
  native         leapp._native.run_segment_cpu on prebuilt tensors (the runtime without torch's dispatcher)
  leapp.load     the whole user call: leapp.load(folder)(quat=...) (input checks, the PT2 program, the op)

The machine's other work shows in p90; a row's numbers are host-clock microseconds.

    python3 benchmarks/cpu_segment.py [--sizes 1,64,4096] [--calls 2000]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import warp as wp

import leapp
from leapp import annotate


@wp.kernel
def gravity_scaled(q: wp.array(dtype=wp.quat), g: wp.vec3, s: float, out: wp.array(dtype=wp.vec3)):
    i = wp.tid()
    out[i] = wp.quat_rotate_inv(q[i], g) * s


def observe(quat: torch.Tensor) -> torch.Tensor:
    grav = torch.empty(quat.shape[0], 3)
    with annotate.warp_op():
        wp.launch(gravity_scaled, dim=quat.shape[0], device="cpu",
                  inputs=[wp.from_torch(quat, dtype=wp.quat), wp.vec3(0.0, 0.0, -1.0), 2.0],
                  outputs=[wp.from_torch(grav, dtype=wp.vec3)])
    return grav


def _time(fn, calls: int) -> tuple[float, float]:
    for _ in range(min(100, calls)):
        fn()
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e6)
    samples.sort()
    return statistics.median(samples), samples[int(0.9 * (len(samples) - 1))]


def run(sizes: list[int], calls: int) -> list[tuple]:
    from leapp import _native
    from leapp.runtime.binary_choice import bundles_in_artifact

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            quat = torch.nn.functional.normalize(torch.randn(n, 4), dim=1)
            node = leapp.node("obs", export_with="pt2")(observe)
            with leapp.trace(f"cpu_segment_{n}", save_path=tmp) as session:
                for _ in range(3):
                    node(quat)
            session.compile(validate=False)
            folder = Path(tmp) / f"cpu_segment_{n}"
            pipeline = leapp.load(folder)
            entry = pipeline.nodes["obs"]
            (data,) = bundles_in_artifact(entry.backend, entry.artifact, entry.runner)
            bundle = _native.Bundle(data)
            out = torch.empty(n, 3)
            q_wp, out_wp = wp.from_torch(quat, dtype=wp.quat), wp.from_torch(out, dtype=wp.vec3)
            g = wp.vec3(0.0, 0.0, -1.0)
            want = observe(quat)
            _native.run_segment_cpu(bundle, [quat.data_ptr()], [out.data_ptr()], [quat.numel() * 4], [out.numel() * 4])
            err = float((out - want).abs().max())
            methods = {
                "eager-launch": lambda: wp.launch(gravity_scaled, dim=n, inputs=[q_wp, g, 2.0], outputs=[out_wp],
                                                  device="cpu"),
                "eager-node": lambda: observe(quat),
                "native": lambda: _native.run_segment_cpu(bundle, [quat.data_ptr()], [out.data_ptr()],
                                                          [quat.numel() * 4], [out.numel() * 4]),
                "leapp.load": lambda: pipeline(quat=quat),
            }
            for name, fn in methods.items():
                median, p90 = _time(fn, calls)
                rows.append((n, name, median, p90, err))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,64,4096")
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args(argv)
    wp.config.quiet = True
    wp.init()
    rows = run([int(v) for v in args.sizes.split(",")], args.calls)
    print(f"cpu_segment: python {platform.python_version()}, torch {torch.__version__}, warp {wp.__version__}, "
          f"{platform.machine()}, {platform.processor() or 'cpu'}; host clock, {args.calls} calls per row")
    print("| N | method | median µs | p90 µs | max abs error native vs eager |")
    print("|---:|---|---:|---:|---:|")
    for n, name, median, p90, err in rows:
        print(f"| {n} | {name} | {median:.1f} | {p90:.1f} | {err:.1e} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
