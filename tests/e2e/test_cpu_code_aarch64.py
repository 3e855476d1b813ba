"""An x86_64 export's aarch64 CPU code runs, through leapp's runtime, and computes what the x86_64 code and
Warp compute (issue 36: "aarch64 as well when a cross toolchain is available").

The export carries an aarch64 object when ``aarch64-linux-gnu-g++`` is on PATH (docs/export-cpu.md). Here
leapp's runtime core (ext/core, no CUDA, ONNX Runtime or torch) and a small driver program
(cpu_code_harness/run_segment.cpp) are built twice, natively and with the cross compiler; the aarch64 build
runs under qemu's user-mode emulator with Debian's aarch64 C library (``/usr/aarch64-linux-gnu``), so the
segment's aarch64 code goes through the same memfd load, entry and layout checks as on an ARM board.
Needs an x86_64 machine with ``g++-aarch64-linux-gnu`` and ``qemu-user`` (Debian packages); skipped
elsewhere, with that reason.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cpu_observation import BATCH, bundle_of, observe, quats, rewritten, trace, warp_cpu

ROOT = Path(__file__).resolve().parents[2]
SYSROOT = Path("/usr/aarch64-linux-gnu")
CROSS = shutil.which("aarch64-linux-gnu-g++")
QEMU = shutil.which("qemu-aarch64") or shutil.which("qemu-aarch64-static")

pytestmark = [
    warp_cpu,
    pytest.mark.skipif(platform.machine() != "x86_64" or CROSS is None or QEMU is None or not SYSROOT.is_dir(),
                       reason="needs an x86_64 machine with the aarch64 cross compiler (aarch64-linux-gnu-g++, "
                              "its C library in /usr/aarch64-linux-gnu) and qemu-aarch64 (Debian's "
                              "g++-aarch64-linux-gnu and qemu-user)"),
]


@pytest.fixture(scope="module")
def runners(tmp_path_factory) -> dict[str, list[str]]:
    """run_segment built for this machine and for aarch64 (in parallel), as argv prefixes."""
    folder = tmp_path_factory.mktemp("run_segment")
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


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> bytes:
    """The CPU-traced observation segment (two kernels, a copy, a memset), exported with both machines' code."""
    _, folder = trace(tmp_path_factory.mktemp("aarch64"), "onnx", validate=False)
    data = bundle_of(folder)
    from leapp.bundle import read_bundle

    assert [c["machine"] for c in read_bundle(data).manifest["cpu_code"]] == ["x86_64", "aarch64"]
    return data


def _run(runner: list[str], data: bytes, quat: torch.Tensor, folder: Path) -> subprocess.CompletedProcess:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "segment.lbundle").write_bytes(data)
    quat.numpy().tofile(folder / "quat.bin")
    return subprocess.run([*runner, str(folder / "segment.lbundle"), str(folder), str(folder / "quat.bin")],
                          capture_output=True, text=True, timeout=300)


def _outputs(folder: Path, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The segment's outputs in signature order: the zeroed norm, then gravity."""
    norm = np.fromfile(folder / "output_0.bin", dtype=np.float32)
    grav = np.fromfile(folder / "output_1.bin", dtype=np.float32).reshape(n, 3)
    return torch.from_numpy(norm), torch.from_numpy(grav)


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**31 - 1))
def test_the_aarch64_code_computes_what_x86_64_and_warp_compute(runners, bundle, tmp_path_factory, seed):
    """Bit for bit against the x86_64 code (the objects are built with -ffp-contract=off: no fused multiply-add
    on either machine), and equal to Warp's own CPU run of the node (eager)."""
    quat = quats(BATCH, seed)
    folder = tmp_path_factory.mktemp("run")
    results = {}
    for machine, runner in runners.items():
        r = _run(runner, bundle, quat, folder / machine)
        assert r.returncode == 0 and "from its CPU code" in r.stdout, f"{machine}: {r.stdout}{r.stderr}"
        results[machine] = _outputs(folder / machine, BATCH)
    for x86, arm in zip(results["x86_64"], results["aarch64"]):
        assert torch.equal(x86, arm), (x86 - arm).abs().max()
    norm, grav = results["aarch64"]
    torch.testing.assert_close(torch.cat([grav, norm[:, None]], dim=1) * 0.5, observe(quat), rtol=1e-6, atol=1e-6)


def test_on_aarch64_an_entry_the_code_does_not_define_is_refused(runners, bundle, tmp_path):
    """The runtime's check that each entry is defined by the segment's own object (not resolved from the C
    library, as ``system`` would be) holds on aarch64 too."""
    data = rewritten(bundle, lambda m, b: m["kernels"][0].update(cpu_entry="system"))
    r = _run(runners["aarch64"], data, quats(BATCH, 0), tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "kernels[0] CPU entry 'system': not defined by the CPU code" in r.stderr, r.stderr


def test_a_bundle_without_aarch64_code_is_refused_there_by_name(runners, bundle, tmp_path):
    """A bundle whose CPU code is for x86_64 only: on aarch64 the refusal names the segment, this machine and
    the machines it has code for, and nothing runs."""
    def x86_only(manifest, blobs):
        manifest["cpu_code"] = [c for c in manifest["cpu_code"] if c["machine"] == "x86_64"]

    r = _run(runners["aarch64"], rewritten(bundle, x86_only), quats(BATCH, 0), tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "aarch64" in r.stderr and "x86_64" in r.stderr and "obs/warp_segment_0" in r.stderr, r.stderr
    assert not (tmp_path / "output_0.bin").exists()
    assert os.path.getsize(tmp_path / "segment.lbundle") > 0
