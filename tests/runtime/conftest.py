"""Fixtures shared by the runtime tests that replay Warp segments (through the fake driver or on a GPU)."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from runtime_helpers import build_mock_driver, build_torch_test_library


def built_once(tmp_path_factory, name: str, build: Callable[[Path], None]) -> Path:
    """The folder ``name`` that ``build(folder)`` filled, once per test run: pytest-xdist's workers share the
    parent of their base temporary folders, and a file lock lets one of them build while the others wait.
    A build that fails or skips leaves no mark, so the next worker tries again (and fails or skips alike)."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    folder, done = root / name, root / f"{name}.done"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not done.exists():
            folder.mkdir(exist_ok=True)
            build(folder)
            done.touch()
    return folder


def _torch_test_library(folder: Path) -> None:
    try:
        proc = build_torch_test_library(folder / "libleapp_warp_torch_test.so")
    except LookupError as e:
        pytest.skip(str(e))
    assert proc.returncode == 0, proc.stderr[-4000:]


def _mock_driver(folder: Path) -> None:
    if build_mock_driver(folder) is None:
        pytest.skip("no C compiler to build the fake libcuda.so.1")


@pytest.fixture(scope="session")
def fake_cuda(tmp_path_factory) -> tuple[Path, Path]:
    """(the CPU-as-CUDA build of libleapp_warp_torch.so, the folder of the fake libcuda.so.1).

    Built once per test run (about 30-50 s on 2 cores; `built_once`): test_aoti.py, test_cpp_pipeline_aoti.py and
    test_runtime_torch_cpu_replay.py share it.
    """
    pytest.importorskip("torch", reason="the torch op library is built against torch")
    library = built_once(tmp_path_factory, "fake_cuda_torch", _torch_test_library) / "libleapp_warp_torch_test.so"
    return library, built_once(tmp_path_factory, "mock_cuda", _mock_driver)


@pytest.fixture(scope="session")
def mock_driver_dir(tmp_path_factory) -> Path:
    """The folder of the fake libcuda.so.1 (tests/runtime/mock_cuda), built once per test run."""
    return built_once(tmp_path_factory, "mock_cuda", _mock_driver)


@pytest.fixture(scope="module")
def dev():
    """torch's current CUDA device (the GPU tests skip without one)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    return torch.device("cuda", torch.cuda.current_device())
