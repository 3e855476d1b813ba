"""The replay engine against a fake CUDA driver, so CPU-only CI exercises run_segment end to end.

Builds tests/runtime/mock_cuda/mock_libcuda.c into a private libcuda.so.1 and
runs mock_driver_cases.py in a subprocess whose loader finds it first (the
driver is dlopen'ed once per process, so it cannot be swapped in this one).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from runtime_helpers import mock_driver_env

HERE = Path(__file__).resolve().parent


def run_cases(mock_driver_dir, cases: str):
    env = mock_driver_env(mock_driver_dir)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", str(HERE / cases)],
        cwd=HERE, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout.splitlines()[-1], proc.stdout[-2000:]


def test_replay_against_the_fake_driver(mock_driver_dir):
    run_cases(mock_driver_dir, "mock_driver_cases.py")


def test_threads_and_resources_against_the_fake_driver(mock_driver_dir):
    """Same-stream threads (every output byte checked), thread exits, the bundle table, release_segments."""
    run_cases(mock_driver_dir, "mock_concurrency_cases.py")
