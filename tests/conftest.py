"""Shared pytest setup: the `cuda` marker skips with a reason when no GPU is usable; the binary cache is the
session's own folder (never the user's ~/.cache/leapp), shared by the subprocesses tests start."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="session", autouse=True)
def _session_binary_cache(tmp_path_factory):
    """$LEAPP_CACHE_DIR -> a folder of this session: exports start cold, and no test reads the user's cache."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LEAPP_CACHE_DIR", str(tmp_path_factory.mktemp("leapp-cache")))
        mp.delenv("LEAPP_NO_CACHE", raising=False)
        yield os.environ["LEAPP_CACHE_DIR"]


@pytest.fixture
def cmake_build_with_leapp():
    """``build(src, build_dir)``: configures and builds a CMake project that does ``find_package(leapp)``
    (leapp_DIR from ``leapp --cmake-dir``), failing with CMake's output; skips without cmake."""
    cmake = shutil.which("cmake")
    if cmake is None:
        pytest.skip("no cmake on PATH (leapp's C++ package is used through CMake)")
    leapp = Path(sys.executable).with_name("leapp")
    cmake_dir = subprocess.run([str(leapp), "--cmake-dir"], capture_output=True, text=True, check=True).stdout.strip()
    assert (Path(cmake_dir) / "leappConfig.cmake").is_file(), cmake_dir

    def build(src: Path, build_dir: Path) -> Path:
        for step in ([cmake, "-S", str(src), "-B", str(build_dir), f"-Dleapp_DIR={cmake_dir}", "-DCMAKE_BUILD_TYPE=Release"],
                     [cmake, "--build", str(build_dir), "-j", "2"]):
            r = subprocess.run(step, capture_output=True, text=True, timeout=300)
            assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        return build_dir

    return build


@functools.lru_cache(maxsize=1)
def cuda_usable() -> bool:
    """True when leapp's own driver loader finds a driver and at least one device."""
    try:
        from leapp import _native
    except ImportError:
        return False
    return bool(_native.driver_status()["available"])


def pytest_xdist_auto_num_workers(config):
    """Workers for ``-n auto`` (README's test command): one per CPU, at most 4, where no GPU is usable; none (one
    process) where one is, since the ``cuda`` tests time host waits and share the device. Most of the suite's time
    is subprocesses and compilers, so two workers on CI's 2 cores keep both busy.
    ``PYTEST_XDIST_AUTO_NUM_WORKERS`` still decides when set."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # pytest-xdist's own hook reads it
    if cuda_usable():
        return 0
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return min(cpus, 4) if cpus > 1 else 0


def pytest_collection_modifyitems(config, items):
    """Without a usable GPU, ``cuda`` tests skip, except those also marked ``cpu_fallback``: they pick their
    device themselves and run on the CPU there (Warp segments from their CPU code, docs/export-cpu.md)."""
    if cuda_usable():
        return
    skip = pytest.mark.skip(reason="no CUDA driver/device")
    for item in items:
        if "cuda" in item.keywords and "cpu_fallback" not in item.keywords:
            item.add_marker(skip)


try:  # hypothesis: 2-core CI machines make per-example deadlines flaky; keep example counts explicit per test.
    from hypothesis import settings

    settings.register_profile("leapp", deadline=None, print_blob=True)
    settings.load_profile("leapp")
except ImportError:  # pragma: no cover - hypothesis is a test extra
    pass
