"""Host allocations per step of leapp-run on an export: what a real-time loop must drive to zero (issue 34).

A tiny malloc/calloc/realloc counter (C, compiled here with the system's cc) is preloaded into
leapp-run, which opens the export and runs the step ``--time A`` and then ``--time B`` more times in
two processes; the difference divided by ``B - A`` is the allocations of one step after warm-up
(leapp's pipeline, ONNX Runtime's Run and leapp-run's own timing, which keeps one number per node
per step). Default export: examples/cpu_policy.py's (three ONNX nodes on the CPU EP), made here.

    python3 benchmarks/step_allocations.py [--export DIR] [--steps 100,1100]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
COUNTER = r"""
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
extern void* __libc_malloc(size_t);
extern void* __libc_calloc(size_t, size_t);
extern void* __libc_realloc(void*, size_t);
static atomic_long count;
void* malloc(size_t n) { atomic_fetch_add(&count, 1); return __libc_malloc(n); }
void* calloc(size_t a, size_t b) { atomic_fetch_add(&count, 1); return __libc_calloc(a, b); }
void* realloc(void* p, size_t n) { atomic_fetch_add(&count, 1); return __libc_realloc(p, n); }
__attribute__((destructor)) static void report(void) { fprintf(stderr, "LEAPP_ALLOCATIONS %ld\n", (long)count); }
"""


def _counter(folder: Path) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        sys.exit("step_allocations: needs a C compiler (cc) for the allocation counter")
    (folder / "count.c").write_text(COUNTER)
    subprocess.run([cc, "-O2", "-shared", "-fPIC", str(folder / "count.c"), "-o", str(folder / "count.so")], check=True)
    return folder / "count.so"


def _allocations(leapp_run: Path, counter: Path, export: Path, inputs: Path, out: Path, steps: int) -> int:
    r = subprocess.run([str(leapp_run), str(export), "--in", str(inputs), "--out", str(out), "--time", str(steps)],
                       env={"LD_PRELOAD": str(counter), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"step_allocations: leapp-run failed: {r.stderr[-2000:]}")
    return int(next(line.split()[1] for line in r.stderr.splitlines() if line.startswith("LEAPP_ALLOCATIONS")))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--export", help="an export folder (default: examples/cpu_policy.py's, made here)")
    parser.add_argument("--steps", default="100,1100", help="A,B: the two --time counts compared")
    args = parser.parse_args(argv)
    a, b = (int(v) for v in args.steps.split(","))
    leapp_run = Path(sys.executable).with_name("leapp-run")
    if not leapp_run.is_file():
        sys.exit("step_allocations: leapp-run was not built (docs/deploy.md)")
    import leapp

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        export = Path(args.export) if args.export else None
        if export is None:
            subprocess.run([sys.executable, str(ROOT / "examples" / "cpu_policy.py"), "--out", str(tmp)], check=True,
                           capture_output=True)
            export = tmp / "go2_cpu"
        pipeline = leapp.load(export)
        (tmp / "in").mkdir()
        rng = np.random.default_rng(0)
        for name, spec in pipeline.inputs.items():
            rng.standard_normal(spec.shape).astype(str(spec.dtype).removeprefix("torch.")).tofile(tmp / "in" / f"{name}.bin")
        counter = _counter(tmp)
        counts = [_allocations(leapp_run, counter, export, tmp / "in", tmp / f"out{n}", n) for n in (a, b)]
    per_step = (counts[1] - counts[0]) / (b - a)
    print(f"| export | nodes | --time {a} | --time {b} | allocations per step |")
    print("|---|---|---|---|---|")
    print(f"| {export.name} | {len(pipeline.nodes)} | {counts[0]} | {counts[1]} | {per_step:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
