"""leapp's native libraries use the process's shared C++ runtime, never a private static copy.

A compiler whose ``-lstdc++`` finds only ``libstdc++.a`` gave each library its own exception
runtime; a ``c10::Error`` caught and rethrown in the torch op library then segfaulted (H200 machine,
ext/core/CMakeLists.txt). ``dlsym`` on a library's handle searches the library before its
dependencies, so a private copy shows up as a ``__cxa_begin_catch`` other than libstdc++.so.6's.
"""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import pytest

from leapp.runtime import libraries

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="libstdc++.so.6 is Linux's C++ runtime")


def _address(lib: ctypes.CDLL, name: str) -> int:
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value


def _native_library(which: str) -> Path:
    if which == "_native":
        from leapp import _native

        return Path(_native.__file__)
    if which in ("pt2", "pipeline_aoti"):
        pytest.importorskip("torch", reason="the torch op library and the AOTInductor plugin need torch loaded first")
    names = {"pipeline": "libleapp_pipeline.so", "pipeline_aoti": "libleapp_pipeline_aoti.so"}
    name = names[which] if which in names else libraries.LIBRARY_NAMES[which]
    path = libraries.native_dir() / name
    if not path.is_file():
        pytest.skip(f"{path.name} was not built in this install")
    return path


@pytest.mark.parametrize("which", ["_native", "pt2", "onnx", "pipeline", "pipeline_aoti"])
def test_native_library_shares_the_process_cpp_runtime(which):
    path = _native_library(which)
    try:
        runtime = ctypes.CDLL("libstdc++.so.6")
    except OSError:
        pytest.skip("this process has no libstdc++.so.6 (another C++ runtime)")
    lib = ctypes.CDLL(str(path))  # loaded already (import leapp / the op registration): the same handle
    assert _address(lib, "__cxa_begin_catch") == _address(runtime, "__cxa_begin_catch"), (
        f"{path.name} carries its own copy of the C++ runtime (libstdc++ linked statically); "
        "rebuild with a compiler that has a shared libstdc++ (see ext/core/CMakeLists.txt)"
    )
