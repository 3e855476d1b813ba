"""The Python reader and the C++ reader (leapp._native.Bundle) accept exactly the same files (docs/bundle-format.md).

Every case is a file; both readers must agree on accept vs reject. Messages may differ.
"""

from __future__ import annotations

import copy
import json
import os

import pytest
from bundle_strategies import json_paths, manifests, mutate_manifest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_bundle_corruption import RULES

from leapp.bundle import BundleError, parse_signature, read_bundle, signature_json, write_bundle
from leapp.bundle.format import MAX_BUFFER_BYTES, MAX_JSON_VALUES, MAX_OWNED_BYTES
from leapp.bundle.writer import encode_manifest
from leapp.bundle.testing import (
    example_bundle,
    example_manifest_and_blobs,
    reseal,
    reseal_blob,
    set_header_field,
    write_unchecked,
)

native = pytest.importorskip("leapp._native", reason="leapp._native is not built")
if not hasattr(native, "Bundle"):
    pytest.skip("leapp._native has no Bundle reader", allow_module_level=True)

EXAMPLE = example_bundle()
MANIFEST, BLOBS = example_manifest_and_blobs()
SCALE = int(os.environ.get("LEAPP_BUNDLE_EXAMPLES_SCALE", "1"))  # e.g. 20 for a long local fuzzing run


def python_verdict(data: bytes) -> str | None:
    try:
        read_bundle(data)
    except BundleError as e:
        return str(e)
    return None


def cpp_verdict(data: bytes) -> str | None:
    try:
        native.Bundle(bytes(data))
    except ValueError as e:
        return str(e)
    return None


def assert_agree(data: bytes) -> None:
    py, cpp = python_verdict(data), cpp_verdict(data)
    assert (py is None) == (cpp is None), f"python: {py!r}\nc++:    {cpp!r}"


@settings(max_examples=60 * SCALE, suppress_health_check=[HealthCheck.too_slow])
@given(manifests())
def test_cpp_reads_what_python_writes(case):
    data = write_bundle(*case)
    bundle = native.Bundle(data)
    assert bundle.digest == read_bundle(data).digest
    assert bundle.blob_count == len(case[1])


@pytest.mark.parametrize(("mutate", "message"), RULES, ids=[r[1].split(" ")[0] for r in RULES])
def test_both_reject_each_manifest_rule(mutate, message):
    manifest = copy.deepcopy(MANIFEST)
    mutate(manifest)
    data = write_unchecked(manifest, BLOBS)
    assert python_verdict(data) is not None
    assert cpp_verdict(data) is not None, f"C++ accepts a manifest Python rejects with: {message}"


@pytest.mark.parametrize(
    "fields",
    [dict(format_version=2, min_reader_version=1), dict(format_version=2, min_reader_version=2),
     dict(format_version=3, min_reader_version=3), dict(format_version=1, min_reader_version=2), dict(min_reader_version=3),
     dict(format_version=0, min_reader_version=0), dict(min_reader_version=0), dict(min_reader_version=2),
     dict(flags=1), dict(reserved=1), dict(blob_table_offset=72), dict(blob_count=65537), dict(manifest_offset=212),
     dict(manifest_size=0), dict(manifest_offset=2**64 - 8)],
    ids=str,
)
def test_header_fields_agree(fields):
    assert_agree(set_header_field(EXAMPLE, **fields))


def test_truncations_agree():
    for length in range(0, len(EXAMPLE), 7):
        assert cpp_verdict(EXAMPLE[:length]) is not None
        if length >= 96:
            assert_agree(set_header_field(EXAMPLE[:length], file_size=length))


@pytest.mark.parametrize(
    "raw",
    [b"\xef\xbb\xbf{}", b'{"a": "\xff"}', b"[]", b"{}", b"[" * 5000 + b"]" * 5000, b"", b" "],
)
def test_json_documents_agree(raw):
    assert_agree(write_unchecked(raw, BLOBS))


@pytest.mark.parametrize(
    "value",
    [b"NaN", b"-Infinity", b'{"a":1,"a":2}', b"9" * 5000, b"[" * 511 + b"]" * 511, b"[" * 512 + b"]" * 512,
     b'"\\ud800"', b'"\\ud83d\\ude00"', b"-0", b"1E2", b"1e400", str(2**64 + 1).encode(), b'"\x01"',
     b'"\xc0\xaf"', b'"\xed\xa0\x80"', b'"\\x"', b'"a\\u0000b"', b'{"":1}', b"1.5", b"true"],
    ids=repr,
)
def test_json_values_in_an_unknown_key_agree(value):
    """A valid manifest plus ``"zz_extra": <value>``: only the JSON rules can reject it."""
    raw = encode_manifest(MANIFEST)
    data = write_unchecked(raw[:-1] + b',"zz_extra":' + value + b"}", BLOBS)
    assert_agree(data)


def test_an_unknown_key_alone_is_accepted_by_both():
    raw = encode_manifest(MANIFEST)
    data = write_unchecked(raw[:-1] + b',"zz_extra":[1,{"b":null}]}', BLOBS)
    assert python_verdict(data) is None and cpp_verdict(data) is None


@pytest.mark.parametrize(
    ("old", "new"),
    [(b'"block_dim":256', b'"block_dim":256.0'), (b'"value":0', b'"value":-0'), (b'"value":0', b'"value":0e0'),
     (b'"smem_bytes":0', b'"smem_bytes":9223372036854775808'), (b'"smem_bytes":0', b'"smem_bytes":-1'),
     (b'"segment":"example/warp_segment_0"', b'"segment":"\\udc00"'), (b'"name":"x"', b'"name":"x\\u0000"'),
     (b'"bytes":16', b'"bytes":16 ')],
    ids=repr,
)
def test_integer_and_string_spellings_agree(old, new):
    raw = encode_manifest(MANIFEST)
    assert old in raw
    assert_agree(write_unchecked(raw.replace(old, new, 1), BLOBS))


@settings(max_examples=200 * SCALE)
@given(st.integers(0, len(EXAMPLE) - 33), st.integers(1, 255))
def test_flipped_and_resealed_bytes_agree(position, mask):
    flipped = bytearray(EXAMPLE)
    flipped[position] ^= mask
    assert_agree(reseal(flipped))
    for index in range(3):
        try:
            resealed = reseal_blob(flipped, index)
        except Exception:  # noqa: BLE001 - the helper cannot follow a corrupt table entry
            continue
        assert_agree(resealed)


@settings(max_examples=200 * SCALE, suppress_health_check=[HealthCheck.too_slow])
@given(manifests(), st.data())
def test_manifest_mutations_agree(case, data):
    manifest, blobs = case
    paths = list(json_paths(manifest))
    path, _ = data.draw(st.sampled_from(paths))
    if not path:
        return
    assert_agree(write_unchecked(mutate_manifest(manifest, path, data), blobs))


# --- the documented bounds: both readers accept up to them and refuse one past (docs/bundle-format.md) ----------


def _with_values(extra: int, raw: bytes) -> bytes:
    """``raw`` (a JSON object) plus ``"zz":[0, ...]`` so that it holds MAX_JSON_VALUES + ``extra`` values."""
    def count(value) -> int:
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
        return 1 + sum(count(child) for child in children)

    zeros = MAX_JSON_VALUES + extra - count(json.loads(raw)) - 1  # - the array itself
    return raw[:-1] + b',"zz":[' + b",".join([b"0"] * zeros) + b"]}"


def test_value_limit_is_one_boundary():
    raw = encode_manifest(MANIFEST)
    at_limit, past = write_unchecked(_with_values(0, raw), BLOBS), write_unchecked(_with_values(1, raw), BLOBS)
    assert python_verdict(at_limit) is None and cpp_verdict(at_limit) is None
    assert python_verdict(past) == "bundle manifest: not readable JSON: more than 1048576 values"
    assert "more than 1048576 values" in cpp_verdict(past)


def test_signature_value_limit_is_the_same_boundary():
    bundle = native.Bundle(EXAMPLE)
    sig = signature_json(read_bundle(EXAMPLE)).encode()
    at_limit, past = _with_values(0, sig).decode(), _with_values(1, sig).decode()
    parse_signature(at_limit)
    bundle.check_signature(at_limit)
    with pytest.raises(BundleError, match="more than 1048576 values"):
        parse_signature(past)
    with pytest.raises(ValueError, match="more than 1048576 values"):
        bundle.check_signature(past)


def _sized(output_elements: int = 4, scratch_bytes: int = 16) -> bytes:
    """The example with output y of ``output_elements`` float32s and a scratch of ``scratch_bytes``."""
    manifest = copy.deepcopy(MANIFEST)
    manifest["signature"]["outputs"][0]["shape"] = [output_elements]
    manifest["buffers"][1]["bytes"] = 4 * output_elements
    manifest["buffers"][2]["bytes"] = scratch_bytes
    return write_unchecked(manifest, BLOBS)


@pytest.mark.parametrize(
    ("data", "accepted"),
    [
        (lambda: _sized(output_elements=MAX_BUFFER_BYTES // 4), True),  # one buffer of exactly 2^40 bytes
        (lambda: _sized(output_elements=MAX_BUFFER_BYTES // 4 + 1), False),
        (lambda: _sized(scratch_bytes=MAX_OWNED_BYTES - 16), True),  # scratch + the 16-byte constant = 2^40
        (lambda: _sized(scratch_bytes=MAX_OWNED_BYTES - 15), False),
    ],
    ids=["buffer-at-cap", "buffer-past-cap", "owned-at-cap", "owned-past-cap"],
)
def test_size_caps_are_one_boundary(data, accepted):
    data = data()
    py, cpp = python_verdict(data), cpp_verdict(data)
    assert (py is None, cpp is None) == (accepted, accepted), f"python: {py!r}\nc++:    {cpp!r}"
