"""Running an export's aarch64 CPU code on an x86_64 machine, through leapp's own runtime.

leapp's runtime core (ext/core: no CUDA, ONNX Runtime or torch) and a small driver program
(tests/e2e/cpu_code_harness/run_segment.cpp: one segment bundle, raw input files in, raw output files out)
are built twice, natively and with Debian's aarch64 cross compiler; the aarch64 build runs under qemu's
user-mode emulator with the cross C library (``/usr/aarch64-linux-gnu``). A segment's aarch64 code then goes
through the memfd load, the entry and layout checks and the replay an ARM board would run.
"""

from __future__ import annotations

import platform
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
SYSROOT = Path("/usr/aarch64-linux-gnu")
CROSS = shutil.which("aarch64-linux-gnu-g++")
QEMU = shutil.which("qemu-aarch64") or shutil.which("qemu-aarch64-static")

needs_emulation = pytest.mark.skipif(
    platform.machine() != "x86_64" or CROSS is None or QEMU is None or not SYSROOT.is_dir(),
    reason="needs an x86_64 machine with the aarch64 cross compiler (aarch64-linux-gnu-g++, its C library in "
           "/usr/aarch64-linux-gnu) and qemu-aarch64 (Debian's g++-aarch64-linux-gnu and qemu-user)")


def build_runners(folder: Path) -> dict[str, list[str]]:
    """run_segment built into ``folder`` for this machine and for aarch64 (in parallel): argv prefixes, the
    aarch64 one through qemu."""
    sources = [*sorted(str(p) for p in (ROOT / "ext" / "core" / "src").glob("*.cpp")),
               str(ROOT / "tests" / "e2e" / "cpu_code_harness" / "run_segment.cpp")]
    builds = {machine: subprocess.Popen([compiler, "-std=c++17", "-O1", f"-I{ROOT / 'ext' / 'core' / 'include'}",
                                         *sources, "-ldl", "-o", str(folder / f"run_segment_{machine}")],
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
              for machine, compiler in (("x86_64", shutil.which("g++") or "c++"), ("aarch64", CROSS))}
    for machine, build in builds.items():
        output, _ = build.communicate(timeout=900)
        assert build.returncode == 0, f"building run_segment for {machine} failed:\n{output[-3000:]}"
    return {"x86_64": [str(folder / "run_segment_x86_64")],
            "aarch64": [QEMU, "-L", str(SYSROOT), str(folder / "run_segment_aarch64")]}


def run_segment(runner: list[str], bundle: bytes, inputs: list[np.ndarray], folder: Path) -> subprocess.CompletedProcess:
    """Runs the segment with ``inputs`` (signature order) in ``folder``; its outputs land in
    ``folder/output_<i>.bin`` (``outputs``)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "segment.lbundle").write_bytes(bundle)
    paths = []
    for i, value in enumerate(inputs):
        paths.append(folder / f"input_{i}.bin")
        np.ascontiguousarray(value).tofile(paths[-1])
    return subprocess.run([*runner, str(folder / "segment.lbundle"), str(folder), *map(str, paths)],
                          capture_output=True, text=True, timeout=600)


def outputs(folder: Path, signature: dict) -> list[np.ndarray]:
    """The outputs run_segment wrote into ``folder``, shaped and typed as the bundle's ``signature`` says."""
    return [np.fromfile(folder / f"output_{i}.bin", dtype=t["dtype"]).reshape(t["shape"])
            for i, t in enumerate(signature["outputs"])]


def run_on_both(runners: dict[str, list[str]], bundle: bytes, inputs: list[np.ndarray], folder: Path,
                signature: dict) -> dict[str, list[np.ndarray]]:
    """The segment's outputs on each machine; a failed run fails with its output."""
    results = {}
    for machine, runner in runners.items():
        r = run_segment(runner, bundle, inputs, folder / machine)
        assert r.returncode == 0 and "from its CPU code" in r.stdout, f"{machine}: {r.stdout}{r.stderr}"
        results[machine] = outputs(folder / machine, signature)
    return results
