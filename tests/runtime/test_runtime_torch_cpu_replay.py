"""The C++ torch kernel end to end on CPU-only CI: a test build of ext/torch against the fake driver.

Builds leapp_warp_torch.cpp (+ ext/core) with LEAPP_TORCH_TEST_CPU_AS_CUDA,
points LEAPP_WARP_PT2_CUSTOM_OP_LIBRARY at it and runs mock_torch_cases.py in
a subprocess whose libcuda.so.1 is tests/runtime/mock_cuda. About 15 s of compiling.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from runtime_helpers import build_mock_driver, build_torch_test_library, mock_driver_env

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def test_library(tmp_path_factory) -> Path:
    pytest.importorskip("torch")
    out = tmp_path_factory.mktemp("torch_test_lib") / "libleapp_warp_torch_test.so"
    try:
        proc = build_torch_test_library(out)
    except LookupError as e:
        pytest.skip(str(e))
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


def test_cpp_torch_kernel_against_the_fake_driver(test_library, tmp_path):
    mock = build_mock_driver(tmp_path)
    if mock is None:
        pytest.skip("no C compiler to build the fake libcuda.so.1")
    env = mock_driver_env(mock, LEAPP_WARP_PT2_CUSTOM_OP_LIBRARY=test_library)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", str(HERE / "mock_torch_cases.py")],
        cwd=HERE, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    sanitized = "libasan" in os.environ.get("LD_PRELOAD", "")  # one case cannot occur under ASan (it says why)
    assert " passed" in proc.stdout and (sanitized or "skipped" not in proc.stdout.splitlines()[-1]), proc.stdout[-2000:]
    assert os.path.exists(test_library)
