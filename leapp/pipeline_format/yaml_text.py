"""leapp/pipeline_format/yaml_text.py: the one text of ``pipeline.yaml`` for a description.

leapp writes ``pipeline.yaml`` for people and ``pipeline.json`` (its twin) for the
C++ runner, which has no YAML parser. So that every reader acts on one document,
``pipeline.yaml`` is the *canonical rendering* of the description: a text that
depends on the values only, defined by the small rules below, and written the same
way by this module and by the C++ reader (``ext/pipeline/src/yaml_text.cpp``).
A reader holding the twin renders it and compares bytes with ``pipeline.yaml``
(``compare``); a reader of YAML (PyYAML with leapp's strict loader) reads the text
back to the same values (a property test checks both directions).

Rules (block style, two spaces per level, ``\\n`` line ends, a final newline):

- a mapping is one ``key: value`` line per member, in order; a list is one ``- item``
  line per item; a mapping or list inside a list item starts on the item's line;
- an empty mapping is ``{}``, an empty list ``[]``, a non-empty list of numbers,
  booleans and nulls is one flow line ``[1, 2.5, null]``;
- a string or key matching ``[A-Za-z_][A-Za-z0-9_./-]*`` that YAML would not read as
  a boolean or null is written plain; any other is double-quoted, with ``\\"``, ``\\\\``
  and ``\\uXXXX`` for control characters, DEL, C1 controls, U+2028/U+2029 (YAML 1.1 line
  breaks), U+FEFF, U+FFFE and U+FFFF;
- integers in decimal; floats as Python's ``repr`` with ``.0`` put before an exponent
  that has no fraction (``1.0e+20``: YAML 1.1 needs the dot); ``true``, ``false``, ``null``.
"""

from __future__ import annotations

import math
import re
from typing import Any

__all__ = ["yaml_text", "yaml_lines", "first_difference", "shown"]

_PLAIN = re.compile(r"[A-Za-z_][A-Za-z0-9_./-]*")
_WORDS = frozenset({"yes", "no", "true", "false", "on", "off", "null"})  # YAML 1.1 booleans and null
_ESCAPED = frozenset([*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029, 0xFEFF, 0xFFFE, 0xFFFF])


def _string(text: str) -> str:
    if _PLAIN.fullmatch(text) and text.lower() not in _WORDS:
        return text
    out = ['"']
    for c in text:
        code = ord(c)
        if c in '"\\':
            out.append("\\" + c)
        elif code in _ESCAPED or 0xD800 <= code < 0xE000:
            out.append(f"\\u{code:04X}")
        else:
            out.append(c)
    out.append('"')
    return "".join(out)


def _float(x: float) -> str:
    if not math.isfinite(x):
        raise ValueError(f"{x!r} is not a finite number")
    text = repr(x)
    mantissa, e, exponent = text.partition("e")
    if e and "." not in mantissa:
        return f"{mantissa}.0e{exponent}"
    return text


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _float(value)
    if isinstance(value, str):
        return _string(value)
    raise TypeError(f"{type(value).__name__} is not a JSON value")


def _inline(value: Any) -> str | None:
    """The value's one-line form, or None when it takes a block."""
    if isinstance(value, dict):
        return "{}" if not value else None
    if isinstance(value, list):
        if not value:
            return "[]"
        if all(v is None or isinstance(v, (bool, int, float)) for v in value):
            return "[" + ", ".join(_scalar(v) for v in value) + "]"
        return None
    return _scalar(value)


def _block(value: Any, indent: int, path: str, out: list) -> None:
    """Appends (line, path) for a non-inline mapping or list at ``indent``."""
    pad = " " * indent
    if isinstance(value, dict):
        for key, item in value.items():
            at = f"{path}.{key}" if path else key
            head = f"{pad}{_string(key)}:"
            one = _inline(item)
            if one is not None:
                out.append((f"{head} {one}", at))
            else:
                out.append((head, at))
                _block(item, indent + 2, at, out)
        return
    for i, item in enumerate(value):
        at = f"{path}[{i}]"
        one = _inline(item)
        if one is not None:
            out.append((f"{pad}- {one}", at))
            continue
        start = len(out)
        _block(item, indent + 2, at, out)
        line, first = out[start]
        out[start] = (f"{pad}- {line[indent + 2:]}", first)


def yaml_lines(description: dict) -> list[tuple[str, str]]:
    """The lines of ``yaml_text(description)`` without their newlines, each with the field path it starts
    (``nodes[0].name``), then ``("", "")`` for the empty rest after the final newline."""
    if not isinstance(description, dict):
        raise TypeError("a description is a mapping")
    out: list[tuple[str, str]] = []
    if description:
        _block(description, 0, "", out)
    else:
        out.append(("{}", ""))
    out.append(("", ""))
    return out


def yaml_text(description: dict) -> str:
    """The canonical ``pipeline.yaml`` text of ``description`` (module docstring)."""
    return "\n".join(line for line, _ in yaml_lines(description))


def first_difference(description: dict, text: bytes) -> tuple[int, str, str] | None:
    """None when ``text`` is ``yaml_text(description)``; else (1-based line, the expected line, its path) at
    the first line that differs (a missing line counts as differing; past the description's last line the
    expected line and the path are empty)."""
    lines = yaml_lines(description)
    found = text.split(b"\n")
    for i, (line, path) in enumerate(lines):
        if i >= len(found) or found[i] != line.encode("utf-8"):
            return i + 1, line, path
    if len(found) > len(lines):
        return len(lines) + 1, "", ""
    return None


def shown(text: str, limit: int = 120) -> str:
    """``text`` for a message as the C++ reader shows it (``leapp::detail::shown``): control characters and
    DEL as ``\\u00XX``, at most ``limit`` bytes of UTF-8 (cut at a character boundary, then ``...``)."""
    data = text.encode("utf-8", "surrogatepass")
    out = bytearray()
    i = 0
    while i < len(data) and len(out) < limit:
        c = data[i]
        out += f"\\u00{c:02x}".encode() if c < 0x20 or c == 0x7F else bytes([c])
        i += 1
    if i == len(data):
        return out.decode("utf-8", "surrogatepass")
    while i > 0 and (data[i] & 0xC0) == 0x80:
        i -= 1
        out.pop()
    return out.decode("utf-8", "surrogatepass") + "..."
