"""ruff's rules (pyproject.toml [tool.ruff]) hold for the whole tree; the test extra installs the pinned ruff."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(importlib.util.find_spec("ruff") is None,
                                reason="ruff is not installed (pip install -e '.[test]' installs it)")


def _ruff(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", *args], cwd=ROOT, input=stdin,
                          capture_output=True, text=True, timeout=300)


def test_ruff_check_passes():
    result = _ruff(".")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(("filename", "banned"), [
    ("leapp/_export/example.py", True),
    ("leapp/_recorder/example.py", True),
    ("leapp/_warp_private.py", False),
])
def test_warp_private_api_is_banned_outside_the_adapter(filename, banned):
    result = _ruff("--stdin-filename", filename, "-", stdin="import warp._src.context as ctx\n\nprint(ctx)\n")
    assert (result.returncode != 0 and "TID251" in result.stdout) == banned, result.stdout + result.stderr
