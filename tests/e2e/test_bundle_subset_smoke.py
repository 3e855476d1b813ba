"""benchmarks/bundle_subset.py keeps working: MuJoCo Warp's kinematics exported whole and as its launched kernels."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bundle_subset.py"

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def test_the_subset_bundle_carries_the_launched_kernels_only(tmp_path):
    pytest.importorskip("mujoco_warp", reason="mujoco-warp 4.0.0 is not installed (bash scripts/install-realworld.sh)")
    out = tmp_path / "subset.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--runs", "1", "--json", str(out)], capture_output=True,
                          text=True, timeout=900, env={**os.environ, "LEAPP_CUDA_ARCHS": "90"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "| whole |" in proc.stdout and "| subset |" in proc.stdout, proc.stdout
    results = json.loads(out.read_text())["results"]
    (whole,), (subset,) = results["whole"], results["subset"]
    assert whole["launched_kernels"] == subset["launched_kernels"] > 1 and whole["modules"] == subset["modules"]
    assert subset["ptx_entries"] == subset["launched_kernels"] < whole["ptx_entries"]
    assert subset["ptx_bytes"] < whole["ptx_bytes"] and subset["bundle_bytes"] < whole["bundle_bytes"]
    assert subset["cubins"] == whole["cubins"] == [90]
