"""examples/cpp (the C++ controller loop) builds with find_package(leapp) and its outputs equal leapp.load's.

The program is configured and built as its README says (CMake, ``leapp --cmake-dir``), then runs 50 steps
on the export of examples/cpu_policy.py (the robot step in torch, three ONNX nodes, recorded on the CPU) and
dumps the last step's inputs and outputs; leapp.load on those inputs must give the same bytes.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import leapp

ROOT = Path(__file__).resolve().parents[2]
LEAPP_RUN = Path(sys.executable).with_name("leapp-run")
pytestmark = pytest.mark.skipif(not LEAPP_RUN.is_file(), reason="the C++ pipeline library was not built (ONNX Runtime's "
                                "headers are missing: bash scripts/fetch-ort-headers.sh, then pip install -e . again)")


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> Path:
    """examples/cpu_policy.py's export, made as its README says."""
    save = tmp_path_factory.mktemp("controller")
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "cpu_policy.py"), "--out", str(save)],
                       capture_output=True, text=True, timeout=600, cwd=str(ROOT))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return save / "go2_cpu"


def test_controller_example_builds_runs_and_equals_leapp_load(export, tmp_path, cmake_build_with_leapp):
    build = cmake_build_with_leapp(ROOT / "examples" / "cpp", tmp_path / "build")
    dump = tmp_path / "dump"
    dump.mkdir()
    r = subprocess.run([str(build / "controller"), str(export), "--steps", "50", "--dump", str(dump)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "50 steps on cpu; per step (us, after step 0): median" in r.stdout, r.stdout
    for node in ("obs", "policy", "action"):
        assert f"node   {node:<12} ort-cpu" in r.stdout, r.stdout
    pipeline = leapp.load(export)
    inputs = {name: torch.frombuffer(bytearray((dump / f"{name}.in.bin").read_bytes()), dtype=spec.dtype).reshape(spec.shape)
              for name, spec in pipeline.inputs.items()}
    assert inputs["joints"].abs().max() > 0.5  # the loop really filled the sensors
    for name, value in pipeline(**inputs).items():
        assert (dump / f"{name}.out.bin").read_bytes() == value.contiguous().numpy().tobytes(), name

    r = subprocess.run([str(build / "controller"), str(tmp_path / "nowhere")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "controller: no pipeline.yaml in" in r.stderr, r.stderr
