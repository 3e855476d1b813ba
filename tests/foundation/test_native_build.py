"""The foundation: the native module and both op libraries build, load and report the driver."""

from __future__ import annotations

import subprocess
import sys

import pytest

from leapp import _native
from leapp.errors import RuntimeLibraryNotFound
from leapp.runtime import libraries


def test_driver_status_has_every_field():
    s = _native.driver_status()
    assert set(s) == {"available", "error", "version", "assumed_version", "assumed_error", "devices"}
    assert (s["assumed_version"], s["assumed_error"]) == (0, "")  # $LEAPP_ASSUME_DRIVER is unset
    if s["available"]:
        assert s["version"] >= 12000 and s["devices"]
        for dev in s["devices"]:
            major, minor = dev["compute_capability"]
            assert major >= 5 and dev["name"]
    else:
        assert s["error"], "an unavailable driver must say why"
        assert s["devices"] == []


def test_no_driver_message_names_libcuda(monkeypatch):
    s = _native.driver_status()
    if s["available"]:
        pytest.skip("a driver is present on this machine")
    assert "libcuda.so.1" in s["error"] or "cuInit" in s["error"] or "no devices" in s["error"]


def test_native_module_has_no_link_time_cuda_dependency():
    out = subprocess.run(["ldd", _native.__file__], capture_output=True, text=True).stdout
    assert "libcuda" not in out and "libcudart" not in out, out


def test_import_does_not_load_libcuda_eagerly():
    # Importing leapp (and its native module) must not need a driver at all.
    code = "import leapp, leapp._native, sys; print('ok')"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_ort_loads_the_custom_op_library():
    ort = pytest.importorskip("onnxruntime")
    path = libraries.require_library("onnx")
    so = ort.SessionOptions()
    so.register_custom_ops_library(str(path))


def test_torch_loads_the_op_library():
    import torch

    path = libraries.require_library("pt2")
    code = (
        "import torch, sys; torch.ops.load_library(sys.argv[1]); "
        "print(torch.ops.leapp.warp_segment.default._schema)"
    )
    r = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "leapp::warp_segment(Tensor[] inputs, Tensor bundle, str signature) -> Tensor[]" in r.stdout
    assert torch.__version__  # the library was built against this torch


@pytest.mark.parametrize("backend,env", [("pt2", "LEAPP_WARP_PT2_CUSTOM_OP_LIBRARY"),
                                         ("onnx", "LEAPP_WARP_ONNX_CUSTOM_OP_LIBRARY")])
def test_missing_library_message(monkeypatch, tmp_path, backend, env):
    missing = tmp_path / "nope.so"
    monkeypatch.setenv(env, str(missing))
    with pytest.raises(RuntimeLibraryNotFound) as e:
        libraries.require_library(backend)
    assert str(e.value) == (
        f"LEAPP Warp {backend} runtime was not found at {missing}. "
        f"Run leapp-build-warp-runtime or set {env}."
    )


@pytest.mark.cuda
def test_driver_reports_devices_on_gpu_machine():
    s = _native.driver_status()
    assert s["available"] and s["version"] >= 12000
    assert all(d["compute_capability"][0] >= 7 for d in s["devices"])
