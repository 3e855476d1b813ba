"""benchmarks/dynamic_batch.py keeps working: its table on any machine, a tiny timed run on a GPU."""

from __future__ import annotations

import subprocess
import sys

import pytest
from bench_scripts import BENCHMARKS, benchmark_module

SCRIPT = BENCHMARKS / "dynamic_batch.py"

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _module():
    return benchmark_module("dynamic_batch")


def test_table_gives_both_clocks_and_the_paired_ratio():
    side = {"median_us": 10.0, "p90_us": 12.0, "spread_us": [9.5, 10.5],
            "wall_median_us": 20.0, "wall_p90_us": 25.0, "wall_spread_us": [19.0, 21.0]}
    row = {"n": 7, "path": "pt2", "fixed": side, "dynamic": {**side, "median_us": 11.0},
           "ratio_events": 1.1, "ratio_events_spread": [1.05, 1.2], "ratio_host": 1.0, "ratio_host_spread": [0.9, 1.1]}
    text = _module().table([row])
    assert "| 7 | pt2 (events) | 10.0 / 12.0 (9.5-10.5) | 11.0 / 12.0 (9.5-10.5) | 1.100 (1.050-1.200) |" in text, text
    assert "| 7 | pt2 (host) | 20.0 / 25.0 (19.0-21.0) | 20.0 / 25.0 (19.0-21.0) | 1.000 (0.900-1.100) |" in text, text


@pytest.mark.cuda
def test_quick_gpu_run():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device for torch")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--sizes", "1,64", "--calls", "20", "--repeats", "2"],
                          capture_output=True, text=True, timeout=600, cwd=str(SCRIPT.parent))
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "| 1 | native (host) |" in proc.stdout and "worst median ratio" in proc.stdout, proc.stdout
