"""Importing a script of benchmarks/ as a module (their smoke tests call its table functions directly)."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def benchmark_module(name: str):
    """``benchmarks/<name>.py`` imported (its sibling modules, e.g. ``replay``, importable while it loads)."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCHMARKS))
