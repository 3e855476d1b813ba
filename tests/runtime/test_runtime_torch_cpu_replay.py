"""The C++ torch kernel end to end on CPU-only CI: a test build of ext/torch against the fake driver.

Builds leapp_warp_torch.cpp (+ ext/core) with LEAPP_TORCH_TEST_CPU_AS_CUDA,
points LEAPP_WARP_PT2_CUSTOM_OP_LIBRARY at it and runs mock_torch_cases.py in
a subprocess whose libcuda.so.1 is tests/runtime/mock_cuda. The build is the session's
(conftest.py's ``fake_cuda``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from runtime_helpers import mock_driver_env

HERE = Path(__file__).resolve().parent


def test_cpp_torch_kernel_against_the_fake_driver(fake_cuda):
    """The session's CPU-as-CUDA build (conftest.py's ``fake_cuda``, shared with the AOTInductor tests)."""
    test_library, mock = fake_cuda
    env = mock_driver_env(mock, LEAPP_WARP_PT2_CUSTOM_OP_LIBRARY=test_library)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", str(HERE / "mock_torch_cases.py")],
        cwd=HERE, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    sanitized = "libasan" in os.environ.get("LD_PRELOAD", "")  # one case cannot occur under ASan (it says why)
    assert " passed" in proc.stdout and (sanitized or "skipped" not in proc.stdout.splitlines()[-1]), proc.stdout[-2000:]
    assert os.path.exists(test_library)
