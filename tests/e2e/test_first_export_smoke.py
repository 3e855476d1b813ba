"""benchmarks/first_export.py keeps working: one cold and one warm fresh process on this machine (sm_90 only)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "first_export.py"

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def test_cold_then_warm_reads_every_binary_from_the_cache(tmp_path):
    pytest.importorskip("warp")
    out = tmp_path / "first.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--runs", "1", "--n", "64", "--modes", "cold,warm",
                           "--json", str(out)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "LEAPP_CUDA_ARCHS": "90"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "| cold |" in proc.stdout and "| warm |" in proc.stdout, proc.stdout
    results = json.loads(out.read_text())["results"]
    (cold,), (warm,) = results["cold"], results["warm"]
    assert (cold["compiled"], cold["from_cache"]) == (2, 0)  # PTX sm_75 + cubin sm_90
    assert (warm["compiled"], warm["from_cache"]) == (0, 2)
    assert warm["nvrtc_s"] == 0 and cold["nvrtc_s"] > 0
