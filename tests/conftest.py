"""Shared pytest setup: the `cuda` marker skips with a reason when no GPU is usable."""

from __future__ import annotations

import functools

import pytest


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
