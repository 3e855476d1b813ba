"""Host cost of a ``leapp::warp_segment`` call in the C++ torch kernel, on the CPU, against the fake driver.

What changes between builds of ext/torch/leapp_warp_torch.cpp is host code (the
signature and bundle caches), so it is measured where the replay itself costs
little: a test build of the kernel (LEAPP_TORCH_TEST_CPU_AS_CUDA, CPU tensors
served as CUDA ones) replaying a one-launch segment through the fake
libcuda.so.1 of tests/runtime/mock_cuda. Cases, per call (median of repeats):

  one-bundle    the same bundle tensor and signature every call (a 1-segment graph)
  three-bundles three segments called in turn (a graph with three segments)
  new-tensor    a fresh bundle tensor each call (the bytes are read and hashed again: a cache miss)
  dynamic-batch a dynamic-batch bundle (batch 1..300) called at batch 37: its rules applied per call

    python benchmarks/op_cache.py                      # the working tree's kernel
    python benchmarks/op_cache.py --baseline main      # and the kernel at git revision `main`, for comparison

Both libraries are built with -O2 into a temporary folder (about 40 s each on 2 cores). Each
round runs every build in a fresh process, builds interleaved, so load from other processes
falls on both alike; the table gives, per case, the median over rounds of each round's median.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNTIME_TESTS = ROOT / "tests" / "runtime"

_CHILD = r"""
import json, statistics, sys, time
import torch
from leapp.runtime import ops
from leapp.bundle import read_bundle, signature_json
from leapp.bundle.testing import dynamic_example_bundle, example_bundle

assert ops.ensure_registered() is True
op = torch.ops.leapp.warp_segment.default
calls, repeats, n = int(sys.argv[1]), int(sys.argv[2]), 16
bundles = [example_bundle(n, segment=f"bench/seg{i}") for i in range(3)]
tensors = [torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in bundles]
sigs = [signature_json(read_bundle(b)) for b in bundles]
x = torch.ones(n)
dyn = dynamic_example_bundle(8, lo=1, hi=300)
dyn_tensor, dyn_sig, x_dyn = torch.frombuffer(bytearray(dyn), dtype=torch.uint8), signature_json(read_bundle(dyn)), torch.ones(37)

def per_call(fn, k):
    for _ in range(min(k, 200)):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        for _ in range(k):
            fn()
        times.append((time.perf_counter_ns() - t0) / k)
    return statistics.median(times)

i = [0]
def three():
    j = i[0] = (i[0] + 1) % 3
    op([x], tensors[j], sigs[j])

def fresh():
    op([x], torch.frombuffer(bytearray(bundles[0]), dtype=torch.uint8), sigs[0])

print(json.dumps({
    "one-bundle": per_call(lambda: op([x], tensors[0], sigs[0]), calls),
    "three-bundles": per_call(three, calls),
    "new-tensor": per_call(fresh, max(calls // 20, 10)),
    "dynamic-batch": per_call(lambda: op([x_dyn], dyn_tensor, dyn_sig), calls),
}))
"""


def build(source: Path, out: Path) -> Path:
    sys.path.insert(0, str(RUNTIME_TESTS))
    from runtime_helpers import build_torch_test_library

    proc = build_torch_test_library(out, source, opt="-O2")
    if proc.returncode != 0:
        raise SystemExit(f"building {source} failed:\n{proc.stderr[-4000:]}")
    return out


def measure(library: Path, mock_dir: Path, calls: int, repeats: int) -> dict:
    sys.path.insert(0, str(RUNTIME_TESTS))
    from runtime_helpers import mock_driver_env

    env = mock_driver_env(mock_dir, LEAPP_WARP_PT2_CUSTOM_OP_LIBRARY=library)
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(calls), str(repeats)], env=env, capture_output=True,
                          text=True, timeout=1200)
    if proc.returncode != 0:
        raise SystemExit(f"the measurement failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", metavar="REV", help="also measure ext/torch/leapp_warp_torch.cpp at this git revision")
    p.add_argument("--calls", type=int, default=20000, help="calls per timed repeat (default 20000)")
    p.add_argument("--repeats", type=int, default=7, help="timed repeats per case and round (default 7)")
    p.add_argument("--rounds", type=int, default=5, help="fresh processes per build, interleaved (default 5)")
    args = p.parse_args(argv)

    sys.path.insert(0, str(RUNTIME_TESTS))
    from runtime_helpers import build_mock_driver

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        mock = build_mock_driver(tmp)
        if mock is None:
            raise SystemExit("no C compiler to build the fake libcuda.so.1")
        builds = {"working tree": ROOT / "ext" / "torch" / "leapp_warp_torch.cpp"}
        if args.baseline:
            text = subprocess.run(["git", "-C", str(ROOT), "show", f"{args.baseline}:ext/torch/leapp_warp_torch.cpp"],
                                  check=True, capture_output=True, text=True).stdout
            (tmp / "baseline.cpp").write_text(text)
            builds[args.baseline] = tmp / "baseline.cpp"
        libraries = {name: build(source, tmp / f"lib{i}.so") for i, (name, source) in enumerate(builds.items())}
        rounds: dict[str, list[dict]] = {name: [] for name in libraries}
        for _ in range(args.rounds):
            for name, library in libraries.items():
                rounds[name].append(measure(library, mock, args.calls, args.repeats))
    results = {name: {case: statistics.median(r[case] for r in runs) for case in runs[0]} for name, runs in rounds.items()}
    cases = list(next(iter(results.values())))
    print("| kernel | " + " | ".join(f"{c} (µs/call)" for c in cases) + " |")
    print("|---|" + "---|" * len(cases))
    for name, r in results.items():
        print(f"| {name} | " + " | ".join(f"{r[c] / 1000:.2f}" for c in cases) + " |")
    print(f"\n{args.calls} calls x {args.repeats} repeats x {args.rounds} rounds (medians), python {sys.version.split()[0]}, "
          f"{os.cpu_count()} CPUs; the fake driver emulates the kernel on the CPU (16 floats).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
