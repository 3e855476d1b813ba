"""GPU: a GPU without a matching cubin runs the PTX fallback, and the PTX an older NVRTC wrote loads on a driver
older than Warp's NVRTC (issue 17).

The export keeps only the sm_75 cubin (LEAPP_CUDA_ARCHS=75), so an H200 (9.0), like any GPU other than a 7.x,
must JIT the PTX. With $LEAPP_PTX_NVRTC naming an older NVRTC (or "auto" finding NVIDIA's pip wheel), that PTX
has an ISA the driver reads: compile(validate=True) replays it, and leapp.load's result equals eager on new
inputs, through the PT2 op and the ONNX op. Without it (Warp's ISA 9.4 on a driver older than CUDA 13.4), the
load fails with the error naming the GPU, the driver, the ISAs and the fix.

    LEAPP_PTX_NVRTC=auto python -m pytest -q tests/export/test_ptx_compat_gpu.py
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

import leapp
from leapp import _native
from leapp._export import ptx_compat, ptx_isa
from leapp.errors import ExportError

sys.path.insert(0, str(Path(__file__).resolve().parent))
import size_pipeline

pytestmark = [pytest.mark.cuda, pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")]

DEVICE = "cuda:0"
NODES = ("seg_pt2", "seg_onnx")


def _machine() -> tuple[tuple[int, int], int]:
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    cc = torch.cuda.get_device_capability(0)
    if cc[0] == 7:
        pytest.skip("a 7.x GPU would load the sm_75 cubin, not the PTX")
    return cc, int(_native.driver_status()["version"])


def _bundles(folder: Path) -> list[bytes]:
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(folder / "seg_onnx.onnx"))
    return [raw for raw in (numpy_helper.to_array(t).tobytes() for t in model.graph.initializer)
            if raw.startswith(b"LEAPPWB\0")]


def test_ptx_fallback_of_an_older_nvrtc_runs_and_equals_eager(monkeypatch, tmp_path):
    cc, driver = _machine()
    value = os.environ.get(ptx_compat.NVRTC_ENV) or "auto"
    monkeypatch.setenv(ptx_compat.NVRTC_ENV, value)
    try:
        compat = ptx_compat.compat_nvrtc()
    except ExportError as e:
        pytest.skip(f"{ptx_compat.NVRTC_ENV}={value}: {e}")
    assert compat is not None
    monkeypatch.setenv("LEAPP_CUDA_ARCHS", "75")
    folder = size_pipeline.export(tmp_path, 4096, device=DEVICE, validate=True, names=NODES)  # validate replays it
    (data,) = _bundles(folder)
    choice = _native.Bundle(data).binary_choice(0, *cc, driver)
    chosen = choice["candidates"][choice["chosen"]]
    assert (chosen["kind"], chosen["expected"]) == ("ptx", True), choice["summary"]
    assert _native.ptx_isa_min_driver(*map(int, chosen["ptx_isa"].split("."))) <= driver
    pipe = leapp.load(str(folder))
    for seed in range(3):
        x = torch.randn(4096, generator=torch.Generator().manual_seed(seed)).to(DEVICE)
        expected = size_pipeline.eager(x)
        for name in NODES:
            (out,) = pipe.run_node(name, x=x).values()
            # without onnxruntime-gpu the ONNX node runs on the CPU EP: host tensors out (docs/runtime.md), its
            # segment still replayed on the GPU from the PTX
            torch.testing.assert_close(out.to(DEVICE), expected[name], rtol=1e-6, atol=1e-6)


def test_warps_own_ptx_on_an_older_driver_is_refused_by_name(monkeypatch, tmp_path):
    cc, driver = _machine()
    if driver >= 13040:
        pytest.skip(f"the CUDA {driver // 1000}.{driver % 1000 // 10} driver reads Warp 1.19's PTX ISA 9.4")
    monkeypatch.setenv(ptx_compat.NVRTC_ENV, "off")
    monkeypatch.setenv(ptx_isa.ISA_ENV, "keep")  # the NVRTC's own .version (a default export declares 8.0)
    monkeypatch.setenv("LEAPP_CUDA_ARCHS", "75")
    folder = size_pipeline.export(tmp_path, 256, device=DEVICE, validate=False, names=("seg_pt2",))
    pipe = leapp.load(str(folder))
    with pytest.raises(RuntimeError) as info:
        pipe.run_node("seg_pt2", x=torch.randn(256, device=DEVICE))
    text = str(info.value)
    name = torch.cuda.get_device_name(0)
    for part in (name, f"compute capability {cc[0]}.{cc[1]}", "PTX ISA 9.4", "CUDA_ERROR_UNSUPPORTED_PTX_VERSION (222)",
                 "it reads PTX up to ISA 9.", "Update the driver to CUDA 13.4 or later", "leapp[ptx-compat]"):
        assert part in text, (part, text)


def test_the_declared_ptx_runs_on_this_driver_and_equals_eager(monkeypatch, tmp_path):
    """The same export with the PTX declared ISA 8.0 (the default): this driver JIT-compiles it, checking every
    feature against 8.0, and the result equals eager."""
    cc, driver = _machine()
    monkeypatch.setenv(ptx_compat.NVRTC_ENV, "off")
    monkeypatch.delenv(ptx_isa.ISA_ENV, raising=False)
    monkeypatch.setenv("LEAPP_CUDA_ARCHS", "75")
    folder = size_pipeline.export(tmp_path, 256, device=DEVICE, validate=False, names=("seg_pt2",))
    pipe = leapp.load(str(folder))
    x = torch.randn(256, device=DEVICE)
    (out,) = pipe.run_node("seg_pt2", x=x).values()
    torch.testing.assert_close(out, size_pipeline.eager(x)["seg_pt2"], rtol=0, atol=0)
