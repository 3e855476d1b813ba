"""The entry points through which leapp's C++ Pipeline owns its step captures' segment scratch.

Each op library links its own copy of leapp's runtime; Pipeline::open looks up that copy's adopt and release
functions by name (ext/pipeline/src/pipeline.cpp, adopt_captures) and falls back to CUDA user objects, which
make the driver allocate at every graph launch, when a name is missing (docs/deploy.md, "Allocations in a
step"). The GPU test (tests/e2e/test_cpp_runner_gpu.py) counts the allocations; these check, on any machine,
that the names the pipeline asks for are the ones the libraries export, and that the calls are safe for any id.
The adoption itself is tested against the fake driver (mock_driver_cases.py).
"""

from __future__ import annotations

import ctypes
import sys

import pytest

from leapp.runtime.libraries import LIBRARY_NAMES, native_dir

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the op libraries are Linux .so files")

ENTRY_POINTS = {
    "onnx": ("LeappAdoptCapture", "LeappReleaseCapture"),
    "pt2": ("leapp_warp_torch_adopt_capture", "leapp_warp_torch_release_capture"),
}


def _library(backend: str):
    path = native_dir() / LIBRARY_NAMES[backend]
    if not path.is_file():
        pytest.skip(f"{path.name} was not built")
    if backend == "pt2":
        import torch  # noqa: F401  (the library links libtorch, which torch's import loads)
    return path, ctypes.CDLL(str(path))


@pytest.mark.parametrize("backend", sorted(ENTRY_POINTS))
def test_each_op_library_exports_what_the_pipeline_looks_up(backend):
    path, lib = _library(backend)
    pipeline = native_dir() / "libleapp_pipeline.so"
    if not pipeline.is_file():
        pytest.skip("libleapp_pipeline.so was not built (ONNX Runtime's headers were missing)")
    text = pipeline.read_bytes()
    for name in ENTRY_POINTS[backend]:
        assert name.encode() + b"\0" in text, f"libleapp_pipeline.so does not look up {name}"
        fn = getattr(lib, name)  # AttributeError: path does not export it
        fn.argtypes, fn.restype = [ctypes.c_ulonglong], None
    adopt, release = (getattr(lib, name) for name in ENTRY_POINTS[backend])
    adopt(2**63 + 5)
    release(2**63 + 5)
    release(2**63 + 5)  # twice, and an id never adopted: nothing happens
    release(7)
