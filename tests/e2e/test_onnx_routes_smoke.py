"""benchmarks/onnx_routes.py keeps working: its CPU dry run, its table, and (GPU) a tiny timed run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "onnx_routes.py"

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _warp_builds_cpu_kernels() -> bool:
    import warp

    return (Path(warp.__file__).parent / "bin" / "warp-clang.so").is_file()


def run_routes(tmp_path: Path, *args: str, env: dict | None = None) -> tuple[str, dict]:
    out_json = tmp_path / "results.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args, "--json", str(out_json), "--out", str(tmp_path / "exports")],
        capture_output=True, text=True, timeout=600, cwd=str(ROOT), env={**os.environ, **(env or {})},
    )
    assert proc.returncode == 0, (f"onnx_routes.py exited {proc.returncode}\n{proc.stdout[-3000:]}\n"
                                  f"{proc.stderr[-4000:]}")
    return proc.stdout, json.loads(out_json.read_text())


@pytest.mark.skipif(not _warp_builds_cpu_kernels(),
                    reason="this Warp has no warp-clang.so: no CPU kernels for the dry run")
def test_dry_run_exports_and_opens_both_nodes(tmp_path):
    pytest.importorskip("onnxscript", reason="onnxscript is not installed (torch.onnx.export(dynamo=True) needs it)")
    stdout, results = run_routes(tmp_path, "--dry-run", "--sizes", "300", env={"LEAPP_CUDA_ARCHS": "90"})
    assert results["mode"] == "dry-run" and list(results["sizes"]) == ["300"]
    assert "CPUExecutionProvider" in results["environment"]["providers_available"]
    assert "providers available:" in stdout
    checked = results["sizes"]["300"]["dry_run_checked"]
    assert checked == ["seg_onnx opened (cpu-ep: node on cpu)", "seg_pt2 opened"]
    assert "| 300 | (dry run: seg_onnx opened" in stdout


def _route(median: float) -> dict:
    return {"calls": 1000, "median_us": median, "p90_us": median * 1.25, "wall_median_us": median + 2,
            "allocations": {}}


def test_table_from_measurements():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import onnx_routes
    finally:
        sys.path.remove(str(SCRIPT.parent))
    results = {
        "mode": "full", "environment": {"onnxruntime": "1.30.0"}, "total_s": 41.0,
        "sizes": {"1024": {
            "export_s": 6.0, "onnx_stream_mode": "torch-stream", "onnx_stream_reason": "CUDA EP on torch's stream 0x0",
            "onnx_session_providers": ["CUDAExecutionProvider", "CPUExecutionProvider"],
            "max_abs_error": {"onnx-cuda-ep": 0.0, "pt2": 0.0, "pt2-cuda-graphs": 2e-7},
            "routes": {"onnx-cuda-ep": _route(30.0), "onnx-cpu-ep": _route(52.0), "pt2": _route(25.0),
                       "pt2-cuda-graphs": _route(11.0), "floor": _route(10.0), "onnx-cuda-ep-handoff": _route(36.0)},
        }},
    }
    text = onnx_routes.table(results)
    assert "| 1024 | onnx-cuda-ep | 30.0 | 37.5 | 32.0 | 3.00 | 0 |" in text
    assert "| 1024 | onnx-cpu-ep | 52.0 | 65.0 | 54.0 | 5.20 | - |" in text  # replay.py's method: not checked here
    assert "| 1024 | onnx-cuda-ep-handoff | 36.0 | 45.0 | 38.0 | 3.60 | 0 |" in text  # the same call's check
    assert "| 1024 | pt2-cuda-graphs | 11.0 | 13.8 | 13.0 | 1.10 | 2e-07 |" in text
    assert "leapp.load's ONNX node: torch-stream (CUDA EP on torch's stream 0x0)" in text
    assert "total 41.0 s (exports 6.0 s)" in text


@pytest.mark.cuda
def test_quick_gpu_run(tmp_path):
    import onnxruntime as ort
    import torch

    major, minor = torch.cuda.get_device_capability(0)
    stdout, results = run_routes(tmp_path, "--quick", "--sizes", "1024", "--calls", "50", "--warmup", "5",
                                 env={"LEAPP_CUDA_ARCHS": f"{major}{minor}"})
    entry = results["sizes"]["1024"]
    names = list(entry["routes"])
    if "CUDAExecutionProvider" in ort.get_available_providers():
        assert entry["onnx_stream_mode"] == "torch-stream", entry["onnx_stream_reason"]
        assert names == ["onnx-cuda-ep", "onnx-cpu-ep", "pt2", "pt2-cuda-graphs", "floor", "onnx-cuda-ep-bare",
                         "onnx-cuda-ep-bare-user-stream", "onnx-cuda-ep-handoff"]
    else:
        assert names == ["onnx-leapp.load (cpu-ep)", "onnx-cpu-ep", "pt2", "pt2-cuda-graphs", "floor"]
    assert all(m["calls"] == 50 and 0 < m["median_us"] <= m["p90_us"] for m in entry["routes"].values())
    assert all(error <= 1e-6 for error in entry["max_abs_error"].values()), entry["max_abs_error"]
    assert "| 1024 | floor |" in stdout and "providers available:" in stdout
