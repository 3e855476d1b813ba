"""An x86_64 export's aarch64 CPU code runs, through leapp's runtime, and computes what the x86_64 code and
Warp compute (issue 36: "aarch64 as well when a cross toolchain is available").

The export carries an aarch64 object when ``aarch64-linux-gnu-g++`` is on PATH (docs/export-cpu.md);
tests/aarch64_emulation.py builds leapp's runtime core for both machines and runs the aarch64 build under
qemu, so the segment's aarch64 code goes through the same memfd load, entry and layout checks as on an ARM
board. Skipped, with that reason, without the cross compiler and qemu.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from aarch64_emulation import build_runners, needs_emulation, outputs, run_on_both, run_segment
from cpu_observation import BATCH, bundle_of, observe, quats, rewritten, trace, warp_cpu
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from leapp.bundle import read_bundle

pytestmark = [warp_cpu, needs_emulation]


@pytest.fixture(scope="module")
def runners(tmp_path_factory) -> dict[str, list[str]]:
    return build_runners(tmp_path_factory.mktemp("run_segment"))


@pytest.fixture(scope="module")
def bundle(tmp_path_factory) -> bytes:
    """The CPU-traced observation segment (two kernels, a copy, a memset), exported with both machines' code."""
    _, folder = trace(tmp_path_factory.mktemp("aarch64"), "onnx", validate=False)
    data = bundle_of(folder)
    assert [c["machine"] for c in read_bundle(data).manifest["cpu_code"]] == ["x86_64", "aarch64"]
    return data


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**31 - 1))
def test_the_aarch64_code_computes_what_x86_64_and_warp_compute(runners, bundle, tmp_path_factory, seed):
    """Bit for bit against the x86_64 code (the objects are built with -ffp-contract=off: no fused multiply-add
    on either machine), and equal to Warp's own CPU run of the node (eager)."""
    quat = quats(BATCH, seed)
    signature = read_bundle(bundle).manifest["signature"]
    results = run_on_both(runners, bundle, [quat.numpy()], tmp_path_factory.mktemp("run"), signature)
    for x86, arm in zip(results["x86_64"], results["aarch64"]):
        assert np.array_equal(x86, arm), np.abs(x86 - arm).max()
    norm, grav = (torch.from_numpy(v) for v in results["aarch64"])  # signature order: the zeroed norm first
    torch.testing.assert_close(torch.cat([grav, norm[:, None]], dim=1) * 0.5, observe(quat), rtol=1e-6, atol=1e-6)


def test_on_aarch64_an_entry_the_code_does_not_define_is_refused(runners, bundle, tmp_path):
    """The runtime's check that each entry is defined by the segment's own object (not resolved from the C
    library, as ``system`` would be) holds on aarch64 too."""
    data = rewritten(bundle, lambda m, b: m["kernels"][0].update(cpu_entry="system"))
    r = run_segment(runners["aarch64"], data, [quats(BATCH, 0).numpy()], tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "kernels[0] CPU entry 'system': not defined by the CPU code" in r.stderr, r.stderr


def test_a_bundle_without_aarch64_code_is_refused_there_by_name(runners, bundle, tmp_path):
    """A bundle whose CPU code is for x86_64 only: on aarch64 the refusal names the segment, this machine and
    the machines it has code for, and nothing runs."""
    def x86_only(manifest, blobs):
        manifest["cpu_code"] = [c for c in manifest["cpu_code"] if c["machine"] == "x86_64"]

    r = run_segment(runners["aarch64"], rewritten(bundle, x86_only), [quats(BATCH, 0).numpy()], tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "aarch64" in r.stderr and "x86_64" in r.stderr and "obs/warp_segment_0" in r.stderr, r.stderr
    assert not (tmp_path / "output_0.bin").exists()
    with pytest.raises(FileNotFoundError):
        outputs(tmp_path, read_bundle(bundle).manifest["signature"])
