"""Fixtures shared by the runtime tests that replay Warp segments (through the fake driver or on a GPU)."""

from __future__ import annotations

from pathlib import Path

import pytest
from runtime_helpers import build_mock_driver, build_torch_test_library


@pytest.fixture(scope="session")
def fake_cuda(tmp_path_factory) -> tuple[Path, Path]:
    """(the CPU-as-CUDA build of libleapp_warp_torch.so, the folder of the fake libcuda.so.1).

    Built once per session (about 30-50 s on 2 cores): test_aoti.py and test_cpp_pipeline_aoti.py share it.
    """
    pytest.importorskip("torch", reason="the torch op library is built against torch")
    folder = tmp_path_factory.mktemp("fake_cuda")
    library = folder / "libleapp_warp_torch_test.so"
    try:
        proc = build_torch_test_library(library)
    except LookupError as e:
        pytest.skip(str(e))
    assert proc.returncode == 0, proc.stderr[-4000:]
    mock = build_mock_driver(folder)
    if mock is None:
        pytest.skip("no C compiler to build the fake libcuda.so.1")
    return library, mock


@pytest.fixture(scope="session")
def mock_driver_dir(tmp_path_factory) -> Path:
    """The folder of the fake libcuda.so.1 (tests/runtime/mock_cuda), built once per session."""
    out = build_mock_driver(tmp_path_factory.mktemp("mock_cuda"))
    if out is None:
        pytest.skip("no C compiler to build the fake libcuda.so.1")
    return out


@pytest.fixture(scope="module")
def dev():
    """torch's current CUDA device (the GPU tests skip without one)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    return torch.device("cuda", torch.cuda.current_device())
