"""The PTX fallback written by an older NVRTC (leapp/_export/ptx_compat.py), without a GPU.

Which NVRTC: $LEAPP_PTX_NVRTC (a path, "auto" for NVIDIA's pip wheels, "off"). The compile tests need one
(``pip install 'leapp[ptx-compat]'``) and skip without it; the option and environment checks always run.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import warp as wp

from leapp import _native
from leapp import _warp_private as wpp
from leapp._export import cuda_code, ptx_compat
from leapp.bundle.format import ptx_isa_of
from leapp.errors import ExportError

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ptx_kernels import k_rotate, k_tile_sum

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")


def compat_or_skip() -> ptx_compat.CompatNvrtc:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(ptx_compat.NVRTC_ENV, "auto")
        try:
            return ptx_compat.compat_nvrtc()
        except ExportError as e:
            pytest.skip(f"no older NVRTC installed: {e}")


@pytest.mark.parametrize("value", ["", "off", "OFF", "0", "none", "warp"])
def test_off_means_warps_own_nvrtc(monkeypatch, value):
    monkeypatch.setenv(ptx_compat.NVRTC_ENV, value)
    assert ptx_compat.compat_nvrtc() is None


def test_a_library_that_cannot_load_is_an_error(monkeypatch, tmp_path):
    monkeypatch.setenv(ptx_compat.NVRTC_ENV, str(tmp_path / "libnvrtc.so.12"))
    with pytest.raises(ExportError, match=r"LEAPP_PTX_NVRTC='.*libnvrtc.so.12': cannot load an NVRTC"):
        ptx_compat.compat_nvrtc()


def test_auto_without_wheels_is_an_error(monkeypatch):
    monkeypatch.setenv(ptx_compat.NVRTC_ENV, "auto")
    monkeypatch.setattr(ptx_compat, "_wheel_candidates", lambda: [])
    with pytest.raises(ExportError, match=r"no NVRTC of NVIDIA's pip wheels is installed"):
        ptx_compat.compat_nvrtc()


def test_options_are_the_ones_warp_passes():
    """Every fixed option string leapp passes appears in Warp's own NVRTC call (warp/native/warp.cu)."""
    wp.init()
    source = (wpp.native_include_dir() + "/warp.cu")
    with open(source, encoding="utf-8") as f:
        text = f.read()
    options = {"mode": "release", "optimization_level": None, "fast_math": True, "fuse_fp": True, "lineinfo": True,
               "verify_fp": False}
    for version in ((12, 0), (12, 9), (13, 0)):
        for opt in ptx_compat.nvrtc_options(options, 75, version):
            if opt.startswith(("--gpu-architecture=", "--include-path=", "--define-macro=WP_ENABLE_MATHDX=")):
                continue
            assert f'"{opt}"' in text, (version, opt)
    assert "--Ofast-compile=0" in ptx_compat.nvrtc_options(options, 75, (12, 9))
    assert not any("Ofast" in o for o in ptx_compat.nvrtc_options(options, 75, (12, 8)))  # no such option before 12.9
    debug = ptx_compat.nvrtc_options({"mode": "debug", "fuse_fp": False}, 75, (12, 6))
    assert {"--define-macro=_DEBUG", "--device-debug", "--fmad=false"} <= set(debug)


@pytest.mark.parametrize("kernel", [k_rotate, k_tile_sum], ids=["rotate", "tile"])
def test_compat_ptx_replaces_warps_and_keeps_the_cubins(monkeypatch, kernel):
    compat = compat_or_skip()
    monkeypatch.setenv(ptx_compat.NVRTC_ENV, compat.path)
    monkeypatch.setenv("LEAPP_NO_CACHE", "1")
    ours = cuda_code.compile_module(kernel, 64, (90,))
    monkeypatch.setenv(ptx_compat.NVRTC_ENV, "off")
    warps = cuda_code.compile_module(kernel, 64, (90,))
    assert ours.cubins[90] == warps.cubins[90] and ours.smem_bytes == warps.smem_bytes
    assert ours.ptx_toolkit == compat.version_text and warps.ptx_toolkit == warps.toolkit == "13.4"
    isa = ptx_isa_of(ours.ptx[75])
    assert ours.ptx_isa == isa and isa != warps.ptx_isa
    # a driver of the NVRTC's own CUDA version reads it
    assert _native.ptx_isa_min_driver(*map(int, isa.split("."))) <= compat.version[0] * 1000 + compat.version[1] * 10
    entries = re.compile(rb"\.entry\s+(\w+)")
    assert set(entries.findall(ours.ptx[75])) == set(entries.findall(warps.ptx[75]))
    assert ours.ptx[75].endswith(b"\0") and b".target sm_75" in ours.ptx[75]


def test_bundle_records_isa_and_ptx_toolkit(monkeypatch, tmp_path):
    compat = compat_or_skip()
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import size_pipeline

    from leapp.bundle import read_bundle

    monkeypatch.setenv(ptx_compat.NVRTC_ENV, compat.path)
    monkeypatch.setenv("LEAPP_CUDA_ARCHS", "75")
    folder = size_pipeline.export(tmp_path, 64, names=("seg_onnx",))
    import onnx

    from onnx import numpy_helper

    model = onnx.load(str(folder / "seg_onnx.onnx"))
    (data,) = [raw for raw in (numpy_helper.to_array(t).tobytes() for t in model.graph.initializer)
               if raw.startswith(b"LEAPPWB\0")]
    b = read_bundle(data)
    (ptx,) = [x for x in b.modules[0]["binaries"] if x["kind"] == "ptx"]
    assert b.producer["ptx_toolkit"] == compat.version_text and b.producer["cuda_toolkit"] == "13.4"
    assert ptx["ptx_isa"] == b.producer["ptx_isa"] == ptx_isa_of(b.binary(0, b.modules[0]["binaries"].index(ptx)))
    # an H200 (9.0) has no cubin here: the PTX is chosen, and a CUDA 13.0 driver reads its ISA
    choice = _native.Bundle(data).binary_choice(0, 9, 0, 13000)
    assert choice["candidates"][choice["chosen"]]["kind"] == "ptx", choice["summary"]
