"""benchmarks/pipeline_step.py keeps working: its table (CPU) and (GPU) a tiny timed run of every route."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from bench_scripts import BENCHMARKS, benchmark_module

SCRIPT = BENCHMARKS / "pipeline_step.py"

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _module():
    return benchmark_module("pipeline_step")


def test_table_names_each_route_against_the_floor():
    route = {"median_us": 40.0, "p90_us": 50.0, "spread_us": [38.0, 44.0], "runs": 3, "wall_median_us": 48.0}
    results = {"environment": {"torch": "x"}, "sizes": {"256": {
        "export_s": 1.0, "nodes": {"obs": "pt2"}, "max_abs_error": {"leapp.load": 0.0},
        "routes": {"leapp.load": route, "floor": {**route, "median_us": 20.0, "wall_median_us": 32.0}}}}}
    text = _module().table(results)
    assert "| 256 | leapp.load | 40.0 | 50.0 | 38.0-44.0 | 2.00 | 48.0 | 1.50 | 0 |" in text, text
    assert "| 256 | floor | 20.0 | 50.0 | 38.0-44.0 | 1.00 | 32.0 | 1.00 | - |" in text, text


@pytest.mark.cuda
def test_quick_gpu_run(tmp_path):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device for torch")
    out_json = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--envs", "64", "--calls", "20", "--warmup", "5",
                           "--repeats", "2", "--nodes", "--json", str(out_json), "--out", str(tmp_path / "exports")],
                          capture_output=True, text=True, timeout=600, cwd=str(SCRIPT.parent))
    assert proc.returncode == 0, proc.stderr[-4000:]
    entry = json.loads(out_json.read_text())["sizes"]["64"]
    nodes = {f"node:{n}{suffix}" for n in ("obs", "policy", "action") for suffix in ("", "-no-node-graph")}
    assert set(entry["routes"]) >= {"eager", "leapp.load", "leapp.load-copies", "leapp.load-node-graphs",
                                    "leapp.load-no-node-graphs", "leapp.load-graphs", *nodes}, entry
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        assert entry["plain_graph"] == "on", entry["plain_graph"]
    else:  # the ONNX node runs on the CPU EP: no whole-step graph, and the reason says so
        assert entry["plain_graph"].startswith("off:") and "CUDA EP" in entry["plain_graph"], entry["plain_graph"]
    for name, error in entry["max_abs_error"].items():
        assert error < 1e-4, (name, error)
    print(proc.stdout)
