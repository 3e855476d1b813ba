"""Seeded mutations of bundle files and of their JSON (manifest, signature string), for the readers' fuzz test.

Byte flips alone rarely get past the hashes and the JSON syntax, so most
mutations edit the manifest text in ways a parser must survive (tokens,
escapes, numbers at the documented bounds, duplicated members, cut or spliced
spans) and the file is rebuilt around it with ``write_unchecked``, so every
case reaches the JSON parser and the field rules. A few flip bytes of the
finished file and reseal it, to reach the structure checks too. Everything is
drawn from one ``random.Random``, so a case is reproduced from its seed alone.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence

from leapp.bundle.testing import reseal, reseal_blob, write_unchecked

INTERESTING_INTS = [
    0, 1, 2, 3, 4, 7, 8, 16, 24, 56, 255, 256, 1023, 1024, 1025, 2**31 - 1, 2**32 - 1, 2**32, 2**40 - 1, 2**40,
    2**40 + 1, 2**53 + 1, 2**62, 2**63 - 1, 2**63, 2**64, 10**30,
]
INTERESTING_NUMBERS = [str(i).encode() for i in INTERESTING_INTS] + [
    b"-1", b"-0", b"0.0", b"1.5", b"1e3", b"1E400", b"-9223372036854775809", b"9" * 5000, b"NaN", b"true", b"null",
    b'"1"', b"[]", b"{}",
]
INTERESTING_STRINGS = [
    b"", b"ptx", b"cubin", b"input", b"output", b"scratch", b"constant", b"none", b"zero", b"launch", b"memset",
    b"copy", b"float32", b"bool", b"int64", b"leapp.warp.bundle", b"\\ud800", b"\\udc00", b"\\ud83d\\ude00",
    b"\\u0000", b"a\\\\", b"\\\"", b"\xc3\xa9", b"\xf0\x9f\x98\x80", b"x" * 300,
]
TOKENS = [
    b'"', b"\\", b"\\u", b"\\ud800", b"\\udbff\\u0041", b"\\udc00", b"\\ud83d\\ude00", b"\\u0000", b"{", b"}", b"[",
    b"]", b",", b":", b"null", b"true", b"-0", b"1e400", b"NaN", b"Infinity", b"9" * 25, b'"a":1,', b"[" * 600,
    b"\xc0\xaf", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xff", b"\x00", b"\x1f", b" ", b"\n", b"\xef\xbb\xbf",
]
# In the compact JSON the writer emits: a number or string *value* follows ':', '[' or ',' (a key is followed by ':').
_NUMBER = re.compile(rb"(?<=[:\[,])-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
_STRING = re.compile(rb'(?<=[:\[,])"(?:[^"\\]|\\.)*"(?!:)')
_SCALAR = rb'(?:-?\d+|"(?:[^"\\]|\\.)*"|\[[^\[\]]*\]|true|false|null)'
_MEMBER = re.compile(rb'"(?:[^"\\]|\\.)*":' + _SCALAR)
_VALUE = re.compile(rb'(?<=:)' + _SCALAR)


def _span(rng: random.Random, text: bytes, most: int = 16) -> tuple[int, int]:
    start = rng.randrange(len(text) + 1)
    return start, min(len(text), start + rng.randint(1, most))


def _pick(rng: random.Random, pattern: re.Pattern, text: bytes) -> re.Match | None:
    matches = list(pattern.finditer(text))
    return rng.choice(matches) if matches else None


def flip_byte(rng, text):
    if not text:
        return text
    i = rng.randrange(len(text))
    return text[:i] + bytes([text[i] ^ rng.randint(1, 255)]) + text[i + 1:]


def delete_span(rng, text):
    start, end = _span(rng, text)
    return text[:start] + text[end:]


def copy_span(rng, text):
    start, end = _span(rng, text, 64)
    at = rng.randrange(len(text) + 1)
    return text[:at] + text[start:end] + text[at:]


def insert_token(rng, text):
    at = rng.randrange(len(text) + 1)
    return text[:at] + rng.choice(TOKENS) + text[at:]


def replace_number(rng, text):
    m = _pick(rng, _NUMBER, text)
    if m is None:
        return insert_token(rng, text)
    return text[:m.start()] + rng.choice(INTERESTING_NUMBERS) + text[m.end():]


def replace_string(rng, text):
    m = _pick(rng, _STRING, text)
    if m is None:
        return insert_token(rng, text)
    return text[:m.start()] + b'"' + rng.choice(INTERESTING_STRINGS) + b'"' + text[m.end():]


def duplicate_member(rng, text):
    """Repeats a ``"key":value`` member in its object (a duplicate key), or drops it (a missing field)."""
    m = _pick(rng, _MEMBER, text)
    if m is None:
        return delete_span(rng, text)
    if rng.random() < 0.5:
        return text[:m.end()] + b"," + m.group() + text[m.end():]
    if text[m.end():m.end() + 1] == b",":
        return text[:m.start()] + text[m.end() + 1:]
    start = m.start() - (1 if text[m.start() - 1:m.start()] == b"," else 0)
    return text[:start] + text[m.end():]


def swap_value(rng, text):
    """One member's value replaced by another's (an index where a size belongs, a string for a number...)."""
    values = list(_VALUE.finditer(text))
    if len(values) < 2:
        return insert_token(rng, text)
    a, b = rng.sample(values, 2)
    return text[:a.start()] + b.group() + text[a.end():]


def truncate(rng, text):
    return text[:rng.randrange(len(text) + 1)]


# Weighted toward edits that keep the JSON well-formed, so most cases reach the field rules.
TEXT_MUTATIONS: Sequence[Callable[[random.Random, bytes], bytes]] = (
    flip_byte, delete_span, copy_span, insert_token, truncate,
    *[replace_number] * 4, *[replace_string] * 3, *[duplicate_member] * 2, *[swap_value] * 2,
)


def mutate_text(rng: random.Random, text: bytes) -> bytes:
    """1 to 3 stacked mutations of a JSON text."""
    for _ in range(rng.choice((1, 1, 1, 2, 2, 3))):
        text = rng.choice(TEXT_MUTATIONS)(rng, text)
    return text


def mutate_bundle(rng: random.Random, manifest: bytes, blobs: Sequence[bytes], min_reader_version: int = 1) -> bytes:
    """A file from a mutated ``manifest`` text (well-formed around it), or, one time in eight,
    the valid file with a few bytes flipped and the hashes resealed. ``min_reader_version``: the header's
    (what the unmutated manifest needs: 2 for compressed binaries or dynamic-batch rules)."""
    if rng.random() < 0.875:
        return write_unchecked(mutate_text(rng, manifest), blobs, min_reader_version)
    data = bytearray(write_unchecked(manifest, blobs, min_reader_version))
    for _ in range(rng.randint(1, 3)):
        data[rng.randrange(len(data) - 32)] ^= rng.randint(1, 255)
    data = reseal(data)
    if rng.random() < 0.5:
        for index in range(len(blobs)):
            try:
                data = reseal_blob(data, index)
            except Exception:  # noqa: BLE001 - a corrupt table entry the helper cannot follow
                break
    return data
