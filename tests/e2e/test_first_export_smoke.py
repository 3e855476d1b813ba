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
    proc = subprocess.run([sys.executable, str(SCRIPT), "--runs", "1", "--n", "64", "--modes", "cold,warm,warm-revalidate",
                           "--json", str(out)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "LEAPP_CUDA_ARCHS": "90"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "| cold |" in proc.stdout and "| warm |" in proc.stdout, proc.stdout
    results = json.loads(out.read_text())["results"]
    (cold,), (warm,), (revalidate,) = results["cold"], results["warm"], results["warm-revalidate"]
    assert (cold["compiled"], cold["from_cache"]) == (2, 0)  # PTX sm_75 + cubin sm_90
    assert (warm["compiled"], warm["from_cache"]) == (0, 2) and (revalidate["compiled"], revalidate["from_cache"]) == (0, 2)
    assert warm["nvrtc_s"] == 0 and cold["nvrtc_s"] > 0
    validated = json.loads(out.read_text())["device"].startswith("cuda")  # without a GPU compile() cannot validate
    assert (cold["validation_cached"], warm["validation_cached"], revalidate["validation_cached"]) == (
        (0, 1, 0) if validated else (0, 0, 0))
