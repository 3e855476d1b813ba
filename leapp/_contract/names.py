"""leapp/_contract/names.py: the rule for node and session names, which become file and folder names.

A session exports into ``<save_path>/<session>/`` and a node into
``<session folder>/<node>.onnx`` (``.pt2``, ``.pt``), so a name must be one
plain path component on every file system an export is copied to: 1 to
``MAX_NAME_LENGTH`` ASCII letters, digits, ``_``, ``.`` and ``-``, not
starting with ``.`` (hidden files, ``..``) or ``-`` (read as an option by
command-line tools). No name is reserved: every artifact ends with its
backend's suffix, so no node name can produce ``pipeline.yaml`` or another
node's file.

The rule is checked where a name is declared (``leapp.node``, ``leapp.trace``,
``leapp.start``) and again by the exporter before it writes, for records built
without the recorder.
"""

from __future__ import annotations

import re

__all__ = ["MAX_NAME_LENGTH", "NAME_RULE", "identifier", "name_problem", "shown"]

MAX_NAME_LENGTH = 64
NAME_RULE = (
    f"1-{MAX_NAME_LENGTH} characters of ASCII letters, digits, '_', '.' and '-', not starting with '.' or '-'"
)
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")
_ALLOWED = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")


def name_problem(name: object) -> str | None:
    """What makes ``name`` unusable as a node or session name (None when it follows the rule)."""
    if not isinstance(name, str):
        return f"a name must be a str, not {type(name).__name__}"
    if len(name) <= MAX_NAME_LENGTH and _NAME.fullmatch(name):
        return None
    if not name:
        return "the name is empty"
    if len(name) > MAX_NAME_LENGTH:
        return f"the name has {len(name)} characters (at most {MAX_NAME_LENGTH})"
    bad = sorted({c for c in name if c not in _ALLOWED})
    if bad:
        return "the name contains " + ", ".join(repr(c) for c in bad)
    return f"the name starts with {name[0]!r}"


def shown(name: object) -> str:
    """``repr`` of a name for an error message, cut after ``MAX_NAME_LENGTH`` characters."""
    if isinstance(name, str) and len(name) > MAX_NAME_LENGTH:
        return repr(name[:MAX_NAME_LENGTH]) + "..."
    return repr(name)


def identifier(name: str) -> str:
    """``name`` as part of a Python identifier (an FX GraphModule's class name): other characters become ``_``."""
    return "".join(c if c.isalnum() else "_" for c in name)
