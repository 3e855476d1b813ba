"""benchmarks/replay.py keeps working: its CPU dry run, its reporting, and (GPU) a tiny timed run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "replay.py"
sys.path.insert(0, str(SCRIPT.parent))

import replay_report  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _warp_builds_cpu_kernels() -> bool:
    import warp

    return (Path(warp.__file__).parent / "bin" / "warp-clang.so").is_file()


def run_benchmark(tmp_path: Path, *args: str, env: dict | None = None) -> tuple[str, dict]:
    out_json = tmp_path / "results.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args, "--json", str(out_json), "--out", str(tmp_path / "exports")],
        capture_output=True, text=True, timeout=600, cwd=str(ROOT), env={**os.environ, **(env or {})},
    )
    assert proc.returncode == 0, f"replay.py exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout, json.loads(out_json.read_text())


@pytest.mark.skipif(not _warp_builds_cpu_kernels(),
                    reason="this Warp has no warp-clang.so: no CPU kernels for the dry run")
def test_dry_run_exports_and_opens_the_artifacts(tmp_path):
    stdout, results = run_benchmark(tmp_path, "--dry-run", "--sizes", "1,300", env={"LEAPP_CUDA_ARCHS": "90"})
    assert results["mode"] == "dry-run" and list(results["sizes"]) == ["1", "300"]
    for n, entry in results["sizes"].items():
        folder = Path(entry["folder"])
        assert sorted(p.name for p in folder.iterdir()) == ["pipeline.json", "pipeline.yaml", "seg_onnx.onnx", "seg_pt2.pt2"], n
        assert entry["export_s"] > 0
        assert entry["dry_run_checked"] == [
            "eager", "floor", "pt2 (loaded)", "native (buffers built)", "onnx-cpu-ep (session created)"
        ]
        assert f"| {n} | (dry run: eager, floor" in stdout
    cold = results["cold_start"]
    assert cold["load_ms"] > 0 and cold["first_call_ms"] is None
    assert [t["measured"] for t in results["targets"]] == [None] * 5
    assert "| PT2 call ≤ 1.2× floor at N=262144 | not measured | - |" in stdout


def _method(median: float) -> dict:
    allocations = {"leapp_native_per_call": 0.0, "torch_allocator_requests_per_call": 2.0,
                   "torch_cudamalloc_total": 0, "free_device_bytes_delta": 0}
    return {"calls": 1000, "median_us": median, "p90_us": median * 1.5, "wall_median_us": median + 1,
            "allocations": allocations}


def test_targets_and_table_from_measurements():
    results = {
        "mode": "full",
        "environment": {"gpu": "NVIDIA H200"},
        "sizes": {
            "1": {"export_s": 3.0, "max_abs_error_pt2": 0.0,
                  "methods": {"eager": _method(40.0), "pt2": _method(25.0), "pt2-cuda-graphs": _method(10.0),
                              "floor": _method(8.0)}},
            "262144": {"export_s": 0.5, "max_abs_error_pt2": 0.0,
                       "methods": {"pt2": _method(33.0), "floor": _method(30.0)}},
        },
        "cold_start": {"runs": 5, "load_ms": 900.0, "load_again_ms": 9.0, "first_call_ms": 61.0,
                       "load_plus_first_call_ms": 961.0, "warp_imported": False},
    }
    rows = replay_report.targets(results)
    assert [(r["measured"] and round(r["measured"], 3), r["met"]) for r in rows] == [
        (1.1, True), (0.625, False), (None, None), (0.25, True), (61.0, False)]
    results["targets"] = rows
    table = replay_report.markdown(results)
    assert "| 1 | pt2 | 25.0 | 37.5 | 26.0 | 3.12 | 2.00 | 0.00 | 0 |" in table
    assert "| PT2 call ≤ 0.5× eager at N=1 | 0.62× | NO |" in table
    assert "first call 61.0 ms, load + first call 961.0 ms; Warp imported in that process: no" in table


def test_percentile():
    values = list(range(1, 101))
    assert replay_report.percentile(values, 0.5) in (50, 51) and replay_report.percentile(values, 0.9) == 90
    assert replay_report.percentile([7.0], 0.9) == 7.0


@pytest.mark.cuda
def test_quick_gpu_run(tmp_path):
    import torch

    major, minor = torch.cuda.get_device_capability(0)
    stdout, results = run_benchmark(tmp_path, "--quick", "--sizes", "1", "--calls", "50", "--warmup", "5",
                                    env={"LEAPP_CUDA_ARCHS": f"{major}{minor}"})
    methods = results["sizes"]["1"]["methods"]
    assert list(methods) == ["eager", "eager-launches", "pt2", "pt2-module", "pt2-pipeline", "pt2-op",
                             "pt2-cuda-graphs", "pt2-graph", "native", "onnx-cpu-ep", "floor"]
    assert all(m["calls"] == 50 and 0 < m["median_us"] <= m["p90_us"] for m in methods.values()), methods
    assert results["sizes"]["1"]["max_abs_error_pt2"] <= 1e-6
    assert results["cold_start"]["first_call_ms"] > 0
    assert "| 1 | pt2 |" in stdout
