"""leapp/_recorder/source.py: the user's ``file:line`` for error messages and records.

NOTE: frames inside torch, warp, leapp itself and the standard library's
context-manager helpers are skipped, so the location is the line the user
wrote (``with annotate.warp_op():``, ``wp.launch(...)``, ``torch.cat(...)``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys

import torch
import warp

_LEAPP_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SKIPPED_DIRS = tuple(
    os.path.dirname(os.path.abspath(m.__file__)) + os.sep for m in (torch, warp)
) + (_LEAPP_DIR + os.sep,)
_SKIPPED_FILES = {os.path.abspath(contextlib.__file__), os.path.abspath(functools.__file__)}


def _is_internal(filename: str) -> bool:
    path = os.path.abspath(filename)
    return path.startswith(_SKIPPED_DIRS) or path in _SKIPPED_FILES


def user_location(skip: int = 1) -> str:
    """``path:line`` of the innermost frame that is user code (``<unknown>`` if none)."""
    frame = sys._getframe(skip)
    while frame is not None:
        if not _is_internal(frame.f_code.co_filename):
            return f"{frame.f_code.co_filename}:{frame.f_lineno}"
        frame = frame.f_back
    return "<unknown>"


_WARP_DIR = os.path.dirname(os.path.abspath(warp.__file__)) + os.sep


def traceback_location(tb) -> str:
    """``path:line`` of the innermost user frame of a traceback (``<unknown>`` if none)."""
    found = "<unknown>"
    while tb is not None:
        if not _is_internal(tb.tb_frame.f_code.co_filename):
            found = f"{tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}"
        tb = tb.tb_next
    return found


def raised_in_warp(tb) -> bool:
    """Whether the innermost frame of a traceback is Warp's own code."""
    last = None
    while tb is not None:
        last, tb = tb, tb.tb_next
    return last is not None and os.path.abspath(last.tb_frame.f_code.co_filename).startswith(_WARP_DIR)


def frame_location(filename: str, lineno: int) -> str:
    return f"{filename}:{lineno}"
