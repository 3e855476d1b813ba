"""leapp/cli/report.py: what ``leapp inspect`` and ``leapp doctor`` print, and the problems they count.

Every command prints indented lines; a problem is an ``error:`` line and makes the exit status 1.
"""

from __future__ import annotations

from typing import TextIO

__all__ = ["Report"]


class Report:
    """Indented lines on ``out``; counts the problems (``error:`` lines)."""

    def __init__(self, out: TextIO):
        self.out = out
        self.problems = 0
        self.digests: set[str] = set()  # of every bundle read and described

    def line(self, text: str, indent: int = 0) -> None:
        print("  " * indent + text, file=self.out)

    def lines(self, texts: list[str], indent: int = 0) -> None:
        for text in texts:
            self.line(text, indent)

    def problem(self, text: str, indent: int = 0) -> None:
        self.problems += 1
        self.line(f"error: {text}", indent)
