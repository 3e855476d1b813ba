"""Host allocations per step of leapp-run on an export, next to ONNX Runtime alone on the same models (issue 34).

A tiny malloc/calloc/realloc counter (C, compiled here with the system's cc) is preloaded into
leapp-run, which opens the export and runs the step ``--time A`` and then ``--time B`` more times in
two processes; the difference divided by ``B - A`` is the allocations of one step after warm-up. The
same count for ``benchmarks/native/ort_alone.cpp`` (ONNX Runtime's C++ API, one session per ONNX node,
each IoBinding bound once, no leapp) is the floor ONNX Runtime's ``Run`` sets: what leapp adds is the
difference. Default export: examples/cpu_policy.py's (three ONNX nodes on the CPU EP), made here.
tests/runtime/test_step_allocations.py asserts that leapp adds none.

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


class Unavailable(RuntimeError):
    """A tool this measurement needs is missing (its message says which)."""


def counter(folder: Path) -> Path:
    """The allocation counter, compiled into ``folder``."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise Unavailable("needs a C compiler (cc) for the allocation counter")
    (folder / "count.c").write_text(COUNTER)
    subprocess.run([cc, "-O2", "-shared", "-fPIC", str(folder / "count.c"), "-o", str(folder / "count.so")], check=True)
    return folder / "count.so"


def ort_alone(folder: Path) -> Path:
    """benchmarks/native/ort_alone.cpp, compiled into ``folder`` against ONNX Runtime's headers (third_party/,
    scripts/fetch-ort-headers.sh) and the onnxruntime wheel's library."""
    import onnxruntime

    cxx = shutil.which("c++") or shutil.which("g++")
    include = ROOT / "third_party" / "onnxruntime" / "include"
    libraries = sorted(Path(onnxruntime.__file__).parent.glob("capi/libonnxruntime.so*"))
    if cxx is None or not (include / "onnxruntime_cxx_api.h").is_file() or not libraries:
        raise Unavailable("needs a C++ compiler, ONNX Runtime's headers in third_party/ (bash "
                          "scripts/fetch-ort-headers.sh) and the onnxruntime wheel's library")
    link = folder / "libonnxruntime.so.1"  # the name the library's SONAME asks for
    link.unlink(missing_ok=True)
    link.symlink_to(libraries[-1])
    subprocess.run([cxx, "-O2", "-std=c++17", f"-I{include}", str(ROOT / "benchmarks" / "native" / "ort_alone.cpp"),
                    "-o", str(folder / "ort_alone"), f"-L{folder}", "-l:libonnxruntime.so.1",
                    f"-Wl,-rpath,{folder}"], check=True, capture_output=True)
    return folder / "ort_alone"


def _count(command: list[str], library: Path) -> int:
    r = subprocess.run(command, env={"LD_PRELOAD": str(library), "PATH": "/usr/bin:/bin"}, capture_output=True,
                       text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{command[0]} failed: {r.stderr[-2000:]}")
    return int(next(line.split()[1] for line in r.stderr.splitlines() if line.startswith("LEAPP_ALLOCATIONS")))


def per_step(command, library: Path, steps: tuple[int, int], repeats: int = 1) -> float:
    """Allocations of one step: ``command(n)`` (argv running n steps) at both counts, the difference per step.

    ONNX Runtime now and then makes a few hundred allocations more in a process (not tied to a step count):
    with ``repeats`` > 1 each count is the least of that many processes, which drops such bursts."""
    a, b = steps
    least = [min(_count(command(n), library) for _ in range(repeats)) for n in (a, b)]
    return (least[1] - least[0]) / (b - a)


def leapp_run_command(export: Path, inputs: Path, out: Path, node: str | None = None):
    """``leapp-run`` running n steps of the pipeline, or of ``node`` alone (``--node``: ``run_node``)."""
    leapp_run = Path(sys.executable).with_name("leapp-run")
    if not leapp_run.is_file():
        raise Unavailable("leapp-run was not built (docs/deploy.md)")
    alone = ["--node", node] if node else []
    return lambda n: [str(leapp_run), str(export), "--in", str(inputs), "--out", str(out), "--time", str(n), *alone]


def ort_alone_command(program: Path, pipeline, node: str | None = None):
    models = [str(n.artifact) for name, n in pipeline.nodes.items() if n.backend == "onnx" and node in (None, name)]
    return lambda n: [str(program), str(n), *models]


def write_inputs(pipeline, folder: Path, node: str | None = None) -> Path:
    """Random inputs of the pipeline, or of ``node`` alone, as leapp-run reads them."""
    folder.mkdir(exist_ok=True)
    rng = np.random.default_rng(0)
    specs = pipeline.inputs.values() if node is None else pipeline.nodes[node].inputs
    for spec in specs:
        rng.standard_normal(spec.shape).astype(str(spec.dtype).removeprefix("torch.")).tofile(folder / f"{spec.name}.bin")
    return folder


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--export", help="an export folder (default: examples/cpu_policy.py's, made here)")
    parser.add_argument("--steps", default="100,1100", help="A,B: the two step counts compared")
    args = parser.parse_args(argv)
    steps = tuple(int(v) for v in args.steps.split(","))
    import leapp

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        export = Path(args.export) if args.export else None
        if export is None:
            subprocess.run([sys.executable, str(ROOT / "examples" / "cpu_policy.py"), "--out", str(tmp)], check=True,
                           capture_output=True)
            export = tmp / "go2_cpu"
        pipeline = leapp.load(export)
        try:
            library = counter(tmp)
            leapp_step = per_step(leapp_run_command(export, write_inputs(pipeline, tmp / "in"), tmp / "out"), library,
                                  steps, repeats=3)
            floor = per_step(ort_alone_command(ort_alone(tmp), pipeline), library, steps, repeats=3)
        except Unavailable as e:
            sys.exit(f"step_allocations: {e}")
    print("| export | nodes | leapp-run, per step | ONNX Runtime alone, per step | leapp adds |")
    print("|---|---|---|---|---|")
    print(f"| {export.name} | {len(pipeline.nodes)} | {leapp_step:.2f} | {floor:.2f} | {leapp_step - floor:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
