"""GPU: an export made the default way loads the way a Jetson Orin on JetPack 6 loads it, and equals eager.

A JetPack 6 driver (CUDA 12.2 to 12.6) cannot load the CUDA 13 cubins of a default export; it JIT-compiles
the export's sm_75 PTX, whose declared ISA (8.0, leapp._export.ptx_isa) it reads. LEAPP_ASSUME_DRIVER=12.2
makes this machine's loader choose exactly as that driver would (the cubins are never tried) and JIT the PTX
with this machine's driver, which checks every instruction against the declared ISA. The same export with
the NVRTC's own ISA (LEAPP_PTX_ISA=keep: 9.4) loads nothing there, and says why.

    python -m pytest -q tests/export/test_jetpack6_route_gpu.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from leapp._export import ptx_isa

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import size_pipeline  # noqa: E402

pytestmark = [pytest.mark.cuda, pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")]

NODES = ("seg_pt2", "seg_onnx")
LOADER = """
import json, sys
import torch
sys.path.insert(0, {here!r})
import size_pipeline
import leapp
out = {{}}
try:
    pipe = leapp.load({folder!r})
    for seed in range(3):
        x = torch.randn(4096, generator=torch.Generator().manual_seed(seed)).to("cuda:0")
        expected = size_pipeline.eager(x)
        for name in {nodes!r}:
            (y,) = pipe.run_node(name, x=x).values()
            out[name] = max(out.get(name, 0.0), float((y.to("cuda:0") - expected[name]).abs().max()))
except Exception as e:
    out["error"] = f"{{type(e).__name__}}: {{e}}"
print(json.dumps(out))
"""


def _load_as_jetpack6(folder: Path, driver: str) -> dict:
    env = dict(os.environ, LEAPP_ASSUME_DRIVER=driver)
    proc = subprocess.run([sys.executable, "-c", LOADER.format(here=str(HERE), folder=str(folder), nodes=NODES)],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def gpu():
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    from leapp import _native

    status = _native.driver_status()
    if not status["available"] or status["version"] < 12060:
        pytest.skip(f"needs a CUDA driver of 12.6 or later to stand in for JetPack 6's ({status})")


@pytest.mark.parametrize("driver", ["12.2", "12.6"])
def test_default_export_loads_through_the_jetpack6_route_and_equals_eager(gpu, tmp_path, monkeypatch, driver):
    monkeypatch.delenv(ptx_isa.ISA_ENV, raising=False)
    monkeypatch.delenv("LEAPP_CUDA_ARCHS", raising=False)
    monkeypatch.delenv("LEAPP_PTX_NVRTC", raising=False)
    folder = size_pipeline.export(tmp_path, 4096, device="cuda:0", names=NODES)
    result = _load_as_jetpack6(folder, driver)
    assert "error" not in result, result["error"]
    assert result == {name: 0.0 for name in NODES}, result  # 3x, exact in float32


def test_the_nvrtcs_own_isa_loads_nothing_there_and_says_why(gpu, tmp_path, monkeypatch):
    monkeypatch.setenv(ptx_isa.ISA_ENV, "keep")
    monkeypatch.delenv("LEAPP_CUDA_ARCHS", raising=False)
    monkeypatch.delenv("LEAPP_PTX_NVRTC", raising=False)
    folder = size_pipeline.export(tmp_path, 4096, device="cuda:0", names=NODES[:1])
    env = dict(os.environ, LEAPP_ASSUME_DRIVER="12.2")
    code = LOADER.format(here=str(HERE), folder=str(folder), nodes=NODES[:1])
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    error = json.loads(proc.stdout.strip().splitlines()[-1]).get("error", "")
    assert "loading as a CUDA 12.2 driver would (LEAPP_ASSUME_DRIVER)" in error, error
    assert "Its PTX is ISA 9.4, this driver reads PTX up to ISA 8.2." in error, error
