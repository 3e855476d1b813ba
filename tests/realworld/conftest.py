"""Real simulator packages (Isaac Lab 3.0's Warp-first MDP terms, MuJoCo Warp) traced by leapp on the CPU.

Every test here is marked ``realworld`` and skips with a reason when its package is absent;
``bash scripts/install-realworld.sh`` installs them. The recorder's replay helpers (``tests/recorder``)
check what leapp recorded.
"""

from __future__ import annotations

import sys
from pathlib import Path

_RECORDER_TESTS = str(Path(__file__).resolve().parents[1] / "recorder")
if _RECORDER_TESTS not in sys.path:  # recorder_helpers / warp_replay, as tests/recorder imports them
    sys.path.insert(0, _RECORDER_TESTS)



def pytest_collection_modifyitems(config, items):
    """The CPU tests need Warp's CPU compiler (warp-clang), which some GPU images leave out; a module that
    traces on a GPU when there is one says so with ``TRACE_DEVICE``."""
    import pytest
    import warp as wp

    wp.init()
    if wp.is_cpu_available():
        return
    skip = pytest.mark.skip(reason="Warp has no CPU compiler here (warp-clang is not installed)")
    for item in items:
        traces_on_cpu = getattr(item.module, "TRACE_DEVICE", "cpu") == "cpu"
        if item.fspath.dirpath().basename == "realworld" and "cuda" not in item.keywords and traces_on_cpu:
            item.add_marker(skip)
