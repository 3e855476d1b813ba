"""leapp/bundle/strict_json.py: the JSON rules of docs/bundle-format.md section 2, for manifests and signatures.

NOTE: Python's ``json`` is lenient where the C++ reader (ext/core/src/json.cpp)
is strict, so the rules are added here: no duplicate key, no NaN/Infinity (nor a literal
beyond the double range, such as ``1e999``),
no lone UTF-16 surrogate escape (``"\\ud800"`` decodes to a str that is not
Unicode text and breaks every later encode), nesting at most
MAX_JSON_DEPTH and at most MAX_JSON_VALUES values. Both readers accept and
refuse the same documents; errors are BundleErrors naming the JSON path.
"""

from __future__ import annotations

import json
import math
import re
from itertools import accumulate
from typing import Any

from leapp.bundle.format import MAX_JSON_DEPTH, MAX_JSON_VALUES, BundleError

__all__ = ["decode_strict_json", "measure_json"]

_SURROGATE = re.compile("[\ud800-\udfff]")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_NUL_ESCAPE = re.compile(r"\\u0000")  # a raw NUL byte is a control character, refused by json itself
_NOT_BRACKETS = bytes(c for c in range(256) if c not in b"[]{}")
_DEPTH_STEP = [0] * 256
_DEPTH_STEP[ord("[")] = _DEPTH_STEP[ord("{")] = 1
_DEPTH_STEP[ord("]")] = _DEPTH_STEP[ord("}")] = -1
_EMPTY_CONTAINER = re.compile(rb"\[[ \t\n\r]*\]|\{[ \t\n\r]*\}")


def decode_strict_json(raw: bytes | bytearray | memoryview | str, what: str, *,
                       error: type[Exception] = BundleError, max_depth: int = MAX_JSON_DEPTH,
                       max_values: int = MAX_JSON_VALUES, refuse_nul: bool = False) -> Any:
    """The decoded document; ``error("<what>: ...")`` for anything the C++ reader refuses too.

    ``raw`` is UTF-8 bytes (a bundle's manifest) or a str (an op's signature string). ``error`` and the
    bounds are the bundle's by default; leapp.pipeline_format reads pipeline.json with its own. ``refuse_nul``:
    no string or key may hold U+0000 (a bundle's manifest and signature, whose names reach C APIs).
    """
    if isinstance(raw, str):
        text = raw
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:  # a str holding a surrogate character itself
            raise error(f"{what}: not Unicode text: character {e.start} is a lone surrogate") from e
    else:
        try:
            text = bytes(raw).decode("utf-8")
        except UnicodeDecodeError as e:
            raise error(f"{what}: not valid UTF-8 at byte {e.start}: {e.reason}") from e

    def reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict:
        obj = dict(pairs)
        if len(obj) != len(pairs):
            seen: set[str] = set()
            for key, _ in pairs:
                if key in seen:
                    raise error(f'{what}: duplicate key "{_shown(key)}" in one JSON object')
                seen.add(key)
        return obj

    def reject_constant(name: str) -> Any:
        raise error(f"{what}: {name} is not valid JSON (RFC 8259)")

    def finite_float(literal: str) -> float:  # 1e999 would be inf: refused, as the C++ reader refuses it
        number = float(literal)
        if math.isinf(number):
            raise error(f"{what}: number {literal[:40]} is out of range (not a finite double)")
        return number

    too_deep = f"{what}: not readable JSON: nested deeper than {max_depth} levels"
    try:
        value = json.loads(text, object_pairs_hook=reject_duplicate_keys, parse_constant=reject_constant,
                           parse_float=finite_float)
    except json.JSONDecodeError as e:
        raise error(f"{what}: not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from e
    except error:
        raise
    except RecursionError as e:
        raise error(too_deep) from e
    except ValueError as e:  # e.g. an integer literal beyond Python's digit limit
        raise error(f"{what}: not readable JSON: {e}") from e
    depth, values = measure_json(text)
    if depth > max_depth:
        raise error(too_deep)
    if values > max_values:
        raise error(f"{what}: not readable JSON: more than {max_values} values")
    nul = refuse_nul and _NUL_ESCAPE.search(text) is not None
    if nul or _SURROGATE_ESCAPE.search(text):  # only then can a decoded string hold a NUL or a surrogate
        _check_strings(value, what, error, nul)
    return value


def measure_json(text: str) -> tuple[int, int]:
    """(nesting depth, value count) of valid JSON text, as ext/core/src/json.cpp counts them.

    Depth: arrays/objects, the outermost being 1 (a scalar document is 0).
    Values: the root and every element of an array or member value of an
    object (keys not counted). Read off the text: in valid JSON, brackets and
    commas outside strings are structure, and a container of k >= 1 elements
    holds k - 1 commas, so values = 1 + commas + non-empty containers. This
    runs at str-method speed, where a walk of the decoded tree costs
    microseconds per container (seconds near the value limit).
    """
    # Outside strings, valid JSON is ASCII without backslashes; inside, dropping the
    # escapes \\ and \" (in that order) leaves every remaining quote a delimiter.
    unescaped = text.replace("\\\\", "").replace('\\"', "")
    bare = "0".join(unescaped.split('"')[::2]).encode("ascii")  # each string is now the scalar 0
    brackets = bare.translate(None, _NOT_BRACKETS)
    depth = max(accumulate(map(_DEPTH_STEP.__getitem__, brackets)), default=0)
    values = 1 + bare.count(b",") + len(brackets) // 2 - len(_EMPTY_CONTAINER.findall(bare))
    return depth, values


def _check_strings(value: Any, what: str, error: type[Exception], refuse_nul: bool) -> None:
    """Every key and string, in document order, without recursion; a path is kept as linked
    (parent, step) pairs and rendered only for a message."""
    stack: list[tuple[Any, Any]] = [(value, None)]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            _check_text(item, what, _render(path), error, refuse_nul)
        elif isinstance(item, dict):
            for key in item:
                _check_text(key, what, f"a key of {_render(path) or 'the top-level object'}", error, refuse_nul)
            stack.extend((child, (path, key)) for key, child in reversed(item.items()))
        elif isinstance(item, list):
            stack.extend((item[i], (path, i)) for i in range(len(item) - 1, -1, -1))


def _check_text(text: str, what: str, where: str, error: type[Exception], refuse_nul: bool) -> None:
    if refuse_nul and "\0" in text:
        raise error(f"{what}: {where or 'the top-level value'}: \\u0000 is a NUL character, which no string here "
                    "may hold (a name ends at it in C)")
    if text.isascii():
        return
    bad = _SURROGATE.search(text)
    if bad is not None:
        escape = f"\\u{ord(bad.group()):04x}"
        raise error(
            f"{what}: {where or 'the top-level value'}: the escape {escape} is a lone UTF-16 surrogate "
            "(not a character; a pair is \\ud800-\\udbff then \\udc00-\\udfff)"
        )


def _render(path: Any) -> str:
    """'ops[3].relocs[0]' from linked (parent, step) pairs; '' for the top level."""
    steps = []
    while path is not None:
        path, step = path
        steps.append(step)
    out = ""
    for step in reversed(steps):
        out += f"[{step}]" if isinstance(step, int) else (f".{_shown(step)}" if out else _shown(step))
    return out


def _shown(text: str, limit: int = 80) -> str:
    """A key for a message: printable (control characters and surrogates escaped), at most ``limit`` characters."""
    out = "".join(c if c.isprintable() else f"\\u{ord(c):04x}" for c in text[:limit])
    return out + ("..." if len(text) > limit else "")
