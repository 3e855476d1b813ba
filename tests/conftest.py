"""Shared pytest setup: the `cuda` marker skips with a reason when no GPU is usable; the binary cache is the
session's own folder (never the user's ~/.cache/leapp), shared by the subprocesses tests start."""

from __future__ import annotations

import functools
import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def _session_binary_cache(tmp_path_factory):
    """$LEAPP_CACHE_DIR -> a folder of this session: exports start cold, and no test reads the user's cache."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LEAPP_CACHE_DIR", str(tmp_path_factory.mktemp("leapp-cache")))
        mp.delenv("LEAPP_NO_CACHE", raising=False)
        yield os.environ["LEAPP_CACHE_DIR"]


@functools.lru_cache(maxsize=1)
def cuda_usable() -> bool:
    """True when leapp's own driver loader finds a driver and at least one device."""
    try:
        from leapp import _native
    except ImportError:
        return False
    return bool(_native.driver_status()["available"])


def pytest_collection_modifyitems(config, items):
    if cuda_usable():
        return
    skip = pytest.mark.skip(reason="no CUDA driver/device")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


try:  # hypothesis: 2-core CI machines make per-example deadlines flaky; keep example counts explicit per test.
    from hypothesis import settings

    settings.register_profile("leapp", deadline=None, print_blob=True)
    settings.load_profile("leapp")
except ImportError:  # pragma: no cover - hypothesis is a test extra
    pass
