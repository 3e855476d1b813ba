"""The C++ bundle reader (leapp._native.Bundle): accepts what leapp.bundle writes, rejects corruption clearly.

Complements tests/bundle/test_bundle_cross_reader.py (agreement on crafted
cases) with the C++ side's own guarantees: every rejection is a ValueError
whose text starts with "leapp bundle" and names the field; thousands of random
corruptions never crash the process; field values the runtime uses are exact.
"""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from leapp import _native
from leapp.bundle import BundleError, read_bundle, signature_json, write_bundle
from leapp.bundle.format import BLOB_ENTRY, BLOB_ENTRY_SIZE, HEADER_SIZE
from leapp.bundle.writer import encode_manifest
from leapp.bundle.testing import (
    LONE_SURROGATE_CASES,
    example_bundle,
    example_manifest_and_blobs,
    reseal,
    reseal_blob,
    set_header_field,
    write_unchecked,
)

SEG = "example/warp_segment_0"
EXAMPLE = example_bundle()
MANIFEST, BLOBS = example_manifest_and_blobs()


def cpp_error(data: bytes) -> str | None:
    """None when the C++ reader accepts ``data``, else its ValueError text (any other exception fails the test)."""
    try:
        _native.Bundle(bytes(data))
    except ValueError as e:
        text = str(e)
        assert text.startswith("leapp bundle"), text
        return text
    return None


def python_accepts(data: bytes) -> bool:
    try:
        read_bundle(data)
    except BundleError:
        return False
    return True


# --- accepting -------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 4, 1000])
@pytest.mark.parametrize("cubins", [None, {90: b"\x7fELF fake sm_90", 86: b"fake sm_86"}])
def test_reads_what_the_python_writer_writes(n, cubins):
    data = example_bundle(n, cubins=cubins)
    ref = read_bundle(data)
    b = _native.Bundle(data)
    assert b.digest == ref.digest
    assert b.segment == ref.segment == SEG
    assert b.source == ref.source
    assert b.size == len(data)
    assert b.producer == ref.producer
    assert json.loads(b.manifest_json) == ref.manifest
    assert b.blob_count == len(ref.blobs)
    for i, blob in enumerate(ref.blobs):
        assert b.blob(i) == blob
    for mine, theirs in ((b.inputs, ref.inputs), (b.outputs, ref.outputs)):
        assert [(t["name"], t["dtype"], list(t["shape"]), t["buffer"]) for t in mine] == [
            (t["name"], t["dtype"], t["shape"], t["buffer"]) for t in theirs
        ]
        assert [t["nbytes"] for t in mine] == [4 * n] * len(theirs)
    assert "example/warp_segment_0" in repr(b)


def test_same_bytes_give_one_shared_bundle_digest():
    a, b = _native.Bundle(EXAMPLE), _native.Bundle(bytes(EXAMPLE))
    assert a.digest == b.digest
    with pytest.raises(IndexError):
        a.blob(99)


# --- exact messages ------------------------------------------------------------------------------------


def _set(manifest: dict, path: tuple, value) -> dict:
    out = copy.deepcopy(manifest)
    parent = out
    for key in path[:-1]:
        parent = parent[key]
    if value is _DELETE:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return out


_DELETE = object()

FIELD_CASES = [
    (("ops", 1, "relocs", 0, "buffer"), 9, f"leapp bundle '{SEG}': ops[1].relocs[0].buffer 9 out of range (4 buffers)"),
    (("ops", 1, "relocs", 0, "offset"), 52, "ops[1].relocs[0].offset 52 + 8 exceeds parameter 1 of 56 bytes"),
    (("ops", 1, "relocs", 0, "param"), 4, "ops[1].relocs[0].param 4 out of range (4 parameters)"),
    (("ops", 1, "params", "sizes", 3), 57, "ops[1].params.offsets[3] range [136, 136 + 57) exceeds params blob 2"),
    (("ops", 1, "block"), [128, 1, 1], "ops[1].block[0] 128 differs from kernels[0].block_dim 256"),
    (("ops", 1, "block"), [256, 8, 1], "ops[1].block has 2048 threads (at most 1024)"),
    (("ops", 1, "grid"), [1, 1], "ops[1].grid must have 3 entries, got 2"),
    (("ops", 1, "grid", 0), 2**32, "ops[1].grid[0] 4294967296 out of range [1, 4294967295]"),
    (("ops", 0, "buffer"), 0, "ops[0].buffer 0 is an input buffer, which the ops must not write"),
    (("ops", 2, "dst"), 3, "ops[2].dst 3 is an constant buffer, which the ops must not write"),
    (("ops", 0, "value"), 256, "ops[0].value 256 out of range [0, 255]"),
    (("ops", 0, "bytes"), 0, "ops[0].bytes 0 out of range [1, 1099511627776]"),
    (("ops", 0, "bytes"), 2**62, "ops[0].bytes 4611686018427387904 out of range [1, 1099511627776]"),
    (("ops", 2, "bytes"), 2**40 + 1, "ops[2].bytes 1099511627777 out of range [1, 1099511627776]"),
    (("buffers", 2, "bytes"), 2**62, f"leapp bundle '{SEG}': buffers[2].bytes 4611686018427387904 out of range [1, 1099511627776]"),
    (("buffers", 2, "bytes"), 2**40, "buffers hold 1099511627792 bytes of scratch and constant memory, more than 1099511627776 (2^40)"),
    (("ops", 0, "op"), "fill", 'ops[0].op "fill" is not launch, memset or copy'),
    (("kernels", 0, "block_dim"), 2000, "kernels[0].block_dim 2000 out of range [1, 1024]"),
    (("kernels", 0, "block_dim"), 256.0, "kernels[0].block_dim must be an integer, got number"),
    (("kernels", 0, "entry"), "", "kernels[0].entry is empty"),
    (("kernels", 0, "module"), 1, "kernels[0].module 1 out of range (1 modules)"),
    (("modules", 0, "binaries"), [], "modules[0].binaries is empty"),
    (("modules", 0, "binaries", 0, "kind"), "sass", 'modules[0].binaries[0].kind "sass" is not "ptx" or "cubin"'),
    (("modules", 0, "binaries", 0, "arch"), 9, "modules[0].binaries[0].arch 9 out of range"),
    (("modules", 0, "binaries", 0, "blob"), 1, "modules[0].binaries[0].blob 1 is PTX but not NUL-terminated"),
    (("buffers", 2, "id"), 5, "buffers[2].id 5 is not its index 2"),
    (("buffers", 2, "init"), {"blob": 1}, "buffers[2].init is not allowed: a scratch buffer's init must be"),
    (("buffers", 3, "init"), "zero", "buffers[3].init is not allowed: a constant buffer needs init"),
    (("buffers", 1, "init"), {"input": 1}, "buffers[1].init.input 1 out of range (1 inputs)"),
    (("buffers", 0, "role"), "weights", 'buffers[0].role "weights" is not input, output, scratch or constant'),
    (("buffers", 0, "bytes"), 20, "signature.inputs[0].shape holds 16 bytes of float32, buffer 0 20"),
    (("signature", "inputs", 0, "dtype"), "complex64", 'signature.inputs[0].dtype "complex64" is not one of'),
    (("signature", "outputs", 0, "buffer"), 0, "signature.outputs[0].buffer 0 is not the output buffer with io 0"),
    (("signature",), _DELETE, f"leapp bundle '{SEG}': signature is missing"),
    (("format",), "leapp.other", 'leapp bundle: manifest format "leapp.other" is not "leapp.warp.bundle"'),
    (("producer", "warp"), 119, "producer.warp must be a string, got integer"),
]


@pytest.mark.parametrize(("path", "value", "message"), FIELD_CASES, ids=[".".join(map(str, c[0])) for c in FIELD_CASES])
def test_field_errors_name_the_field(path, value, message):
    data = write_unchecked(_set(MANIFEST, path, value), BLOBS)
    error = cpp_error(data)
    assert error is not None and message in error, error
    assert not python_accepts(data)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: d[:50], "leapp bundle: 50 bytes is too short for a bundle (at least 96"),
        (lambda d: b"LEAPPWX\0" + d[8:], "bad magic"),
        (lambda d: set_header_field(d, format_version=4, min_reader_version=3),
         "unsupported bundle format version 4, which needs a reader of version 3 or later (this leapp reads 1..2)"),
        (lambda d: set_header_field(d, format_version=0, min_reader_version=0),
         "unsupported bundle format version 0 (this leapp reads 1..2)"),
        (lambda d: d + b"\0" * 8, "does not match the buffer length"),
        (lambda d: d[:-1] + bytes([d[-1] ^ 1]), "whole-file sha256 mismatch"),
        (lambda d: set_header_field(d, flags=1), "flags 1 must be 0"),
        (lambda d: set_header_field(d, blob_count=70000), "blob_count 70000 exceeds 65536"),
        (lambda d: set_header_field(d, manifest_offset=2**64 - 8), "extends past the end of the data"),
        (lambda d: set_header_field(d, manifest_offset=68), "manifest_offset 68 is not 8-aligned"),
    ],
    ids=["short", "magic", "min-reader", "version-0", "file-size", "hash", "flags", "blob-count", "manifest-range",
         "manifest-align"],
)
def test_structure_errors(make, message):
    error = cpp_error(make(EXAMPLE))
    assert error is not None and message in error, error


def test_blob_hash_and_ptx_content_errors():
    manifest_end = 64 + 48 * len(BLOBS)
    offset = EXAMPLE.index(b".version 7.5")
    assert offset > manifest_end
    broken = bytearray(EXAMPLE)
    broken[offset] ^= 0x20
    assert "blob 0 sha256 mismatch" in cpp_error(reseal(broken))
    assert cpp_error(reseal_blob(broken, 0)) is None  # a different but well-formed PTX text is accepted


LONE = "is a lone UTF-16 surrogate (not a character; a pair is \\ud800-\\udbff then \\udc00-\\udfff)"


@pytest.mark.parametrize(("old", "new", "escape", "where"), list(LONE_SURROGATE_CASES.values()),
                         ids=list(LONE_SURROGATE_CASES))
def test_lone_surrogate_escapes_name_the_field(old, new, escape, where):
    raw = encode_manifest(MANIFEST)
    assert old in raw
    raw = raw.replace(old, new, 1)
    error = cpp_error(write_unchecked(raw, BLOBS))
    position = raw.index(escape.encode())
    assert error == f"leapp bundle: manifest: invalid JSON: \\u escape {escape} {LONE} at byte {position} in {where}"
    assert not python_accepts(write_unchecked(raw, BLOBS))


def test_a_surrogate_pair_is_one_character():
    raw = encode_manifest(MANIFEST).replace(b'"segment":"example/warp_segment_0"', b'"segment":"obs\\ud83d\\ude00"')
    assert _native.Bundle(write_unchecked(raw, BLOBS)).segment == "obs\U0001f600"


def test_odd_segment_names_keep_messages_whole():
    """A control character in a name is shown escaped, a long name cut: the message reaches Python whole."""
    manifest = _set(MANIFEST, ("segment",), "a\x01b\nc")
    manifest = _set(manifest, ("ops", 0, "value"), 256)
    assert cpp_error(write_unchecked(manifest, BLOBS)) == (
        "leapp bundle 'a\\u0001b\\u000ac': ops[0].value 256 out of range [0, 255]"
    )
    long_name = "\u00e9" * 100  # 200 bytes: cut at a character boundary
    error = cpp_error(write_unchecked(_set(manifest, ("segment",), long_name), BLOBS))
    assert error == "leapp bundle '" + "\u00e9" * 60 + "...': ops[0].value 256 out of range [0, 255]"


@pytest.mark.parametrize("path", [("segment",), ("producer", "a\x00b"), ("kernels", 0, "entry"), ("source",)],
                         ids=["segment", "producer-key", "entry", "source"])
def test_a_nul_in_any_manifest_string_is_refused_by_both_readers(path):
    """A name is cut at a NUL by every C API it reaches (dlsym would look up "X" for "X\\0evil"): refused at read."""
    manifest = _set(MANIFEST, path, "v") if path[0] == "producer" else _set(MANIFEST, path, "X\x00evil")
    data = write_unchecked(manifest, BLOBS)
    assert "NUL character" in cpp_error(data)
    assert not python_accepts(data)


def test_json_errors_name_the_path():
    raw = encode_manifest(MANIFEST).replace(b'"value":0', b'"value":0,"value":1', 1)
    error = cpp_error(write_unchecked(raw, BLOBS))
    second = raw.index(b'"value":1')
    assert error == f'leapp bundle: manifest: invalid JSON: duplicate key "value" at byte {second} in ops[0]'
    raw = encode_manifest(MANIFEST).replace(b'"shape":[4]', b'"shape":[4,NaN]', 1)
    assert cpp_error(write_unchecked(raw, BLOBS)).endswith(
        f"unexpected character 'N' at byte {raw.index(b'NaN')} in signature.inputs[0].shape[1]"
    )


def test_declared_blob_length_is_capped():
    data = bytearray(EXAMPLE)
    entry = HEADER_SIZE + BLOB_ENTRY_SIZE  # blob 1
    offset, _, digest = BLOB_ENTRY.unpack_from(EXAMPLE, entry)
    BLOB_ENTRY.pack_into(data, entry, offset, 2**62, digest)
    assert cpp_error(reseal(data)) == "leapp bundle: blob 1 length 4611686018427387904 exceeds 1099511627776 (2^40)"


def test_signature_strings_follow_the_manifest_json_rules():
    b = _native.Bundle(EXAMPLE)
    sig = signature_json(read_bundle(EXAMPLE))
    with pytest.raises(ValueError, match=r"leapp signature: invalid JSON: \\u escape \\ud800 is a lone UTF-16 "
                                         r"surrogate .* in segment$"):
        b.check_signature(sig.replace('"segment":"example/warp_segment_0"', '"segment":"\\ud800"'))
    with pytest.raises(ValueError, match=r'leapp signature: invalid JSON: duplicate key "segment" at byte \d+$'):
        b.check_signature(sig[:-1] + ',"segment":"x"}')
    with pytest.raises(ValueError, match=r"leapp signature: invalid JSON: nesting deeper than 512 levels"):
        b.check_signature(sig[:-1] + ',"x":' + "[" * 512 + "]" * 512 + "}")


# --- random corruption: thousands of cases, never a crash ---------------------------------------------------


@settings(max_examples=1500, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, len(EXAMPLE) - 1), st.integers(1, 255)), min_size=1, max_size=4,
                unique_by=lambda flip: flip[0]))
def test_byte_flips_without_resealing_are_rejected(flips):
    data = bytearray(EXAMPLE)
    for position, mask in flips:
        data[position] ^= mask
    assert cpp_error(bytes(data)) is not None
    assert not python_accepts(bytes(data))


@settings(max_examples=1500, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, len(EXAMPLE) - 33), st.integers(1, 255)), min_size=1, max_size=3),
       st.booleans())
def test_resealed_byte_flips_agree_with_python(flips, reseal_blobs):
    data = bytearray(EXAMPLE)
    for position, mask in flips:
        data[position] ^= mask
    data = reseal(data)
    if reseal_blobs:  # reach the manifest and blob-content rules too
        for index in range(len(BLOBS)):
            try:
                data = reseal_blob(data, index)
            except Exception:  # noqa: BLE001 - a corrupt table entry the helper cannot follow
                break
    assert (cpp_error(data) is None) == python_accepts(data)


def test_truncation_at_every_length():
    for length in range(len(EXAMPLE)):
        assert cpp_error(EXAMPLE[:length]) is not None, length
        if length >= 96:  # with a consistent file_size and hash, the range checks must catch it
            fixed = set_header_field(EXAMPLE[:length], file_size=length)
            error = cpp_error(fixed)
            assert error is not None, length
            assert not python_accepts(fixed)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.sampled_from([0, 1, 2, 3, 4, 8, 16, 24, 56, 255, 256])
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=6),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=5,
)


def _paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, prefix + (key,))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _paths(item, prefix + (i,))


PATHS = [p for p in _paths(MANIFEST) if p]


@settings(max_examples=2000, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(PATHS), st.one_of(st.just(_DELETE), JSON_VALUES), st.booleans())
def test_manifest_field_mutations_agree_with_python(path, value, add_unknown_key):
    if value is _DELETE and isinstance(path[-1], int):
        value = None
    manifest = _set(MANIFEST, path, value)
    if add_unknown_key:
        manifest["zz_unknown"] = {"ignored": [1, 2.5, "x"]}
    data = write_unchecked(manifest, BLOBS)
    error = cpp_error(data)
    assert (error is None) == python_accepts(data), error
    if error is not None:
        assert error.startswith(f"leapp bundle '{SEG}': ") or error.startswith("leapp bundle: manifest"), error


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 64), st.sampled_from([1, 32, 128, 256, 1024]))
def test_valid_variants_are_accepted(n, block_dim):
    data = example_bundle(n, block_dim=block_dim)
    assert cpp_error(data) is None


# --- binary choice (docs/bundle-format.md section 3) ------------------------------------------------------------


def _bundle_with_binaries(pairs):
    manifest, blobs = example_manifest_and_blobs()
    binaries = []
    for kind, arch in pairs:
        binaries.append({"kind": kind, "arch": arch, "blob": len(blobs)})
        blobs.append(b"ptx\0" if kind == "ptx" else b"cubin")
    manifest["modules"][0]["binaries"] = binaries
    return _native.Bundle(write_bundle(manifest, blobs))


@pytest.mark.parametrize(
    ("cc", "expected"),
    [
        ((9, 0), [("cubin", 90), ("ptx", 86), ("ptx", 75)]),
        ((8, 9), [("cubin", 89), ("cubin", 86), ("cubin", 80), ("ptx", 86), ("ptx", 75)]),
        ((8, 7), [("cubin", 86), ("cubin", 80), ("ptx", 86), ("ptx", 75)]),
        ((12, 0), [("ptx", 86), ("ptx", 75)]),
        ((7, 0), []),
    ],
)
def test_binary_candidates(cc, expected):
    b = _bundle_with_binaries([("ptx", 75), ("cubin", 80), ("cubin", 86), ("cubin", 89), ("cubin", 90), ("ptx", 86),
                               ("cubin", 100)])
    assert b.binary_candidates(0, *cc) == expected


# --- signatures ----------------------------------------------------------------------------------------------


def test_signature_checks():
    b = _native.Bundle(EXAMPLE)
    sig = json.loads(signature_json(read_bundle(EXAMPLE)))
    b.check_signature(json.dumps(sig))

    other = dict(sig, digest="0" * 64)
    with pytest.raises(ValueError, match="belong to different segments"):
        b.check_signature(json.dumps(other))
    wrong_shape = copy.deepcopy(sig)
    wrong_shape["outputs"][0]["shape"] = [5]
    with pytest.raises(ValueError, match=r"signature outputs\[0\] 'y' differs from the bundle's 'y'"):
        b.check_signature(json.dumps(wrong_shape))
    with pytest.raises(ValueError, match="leapp signature: digest must be 64 lowercase hex digits"):
        b.check_signature(json.dumps(dict(sig, digest="ABC")))
    with pytest.raises(ValueError, match="leapp signature: invalid JSON"):
        b.check_signature("{")
    dup = copy.deepcopy(sig)
    dup["outputs"].append(dup["outputs"][0])
    with pytest.raises(ValueError, match=r"outputs\[1\].name \"y\" is used twice"):
        b.check_signature(json.dumps(dup))


@pytest.mark.parametrize(("literal", "refused"), [
    (b"1e999", True), (b"-1.5E+400", True), (b"0.00001e320", True), (b"0.00001e310", False), (b"1e-999", False), (b"-0.0e-400", False),
    (b"1.7976931348623157e308", False), (b"1000" + b"0" * 400 + b".0", True), (b"0." + b"0" * 400 + b"1", False),
])
def test_numbers_beyond_the_double_range_are_refused_by_both_readers(literal, refused):
    """Python's json gives inf for 1e999 and C++'s from_chars left 0.0: neither may pass for a number."""
    manifest = encode_manifest(MANIFEST)
    raw = manifest[:-1] + b',"future":' + literal + b"}"
    data = write_unchecked(raw, BLOBS)
    error = cpp_error(data)
    assert python_accepts(data) is not refused
    if refused:
        assert error is not None and f"number {literal[:40].decode()} is out of range (not a finite double)" in error
        with pytest.raises(BundleError, match="is out of range"):
            read_bundle(data)
    else:
        assert error is None, error


def _shared_block_bundle(modules: int, second_size_delta: int = 0) -> bytes:
    """``modules`` modules whose PTX binaries all name one LZ4 block (the last one declaring a size off by
    ``second_size_delta``)."""
    from leapp.bundle.lz4_block import ENCODING, encode_block

    manifest = copy.deepcopy(MANIFEST)
    ptx = BLOBS[0]
    blobs = [encode_block(ptx), *BLOBS[1:]]
    binary = {"kind": "ptx", "arch": 75, "blob": 0, "encoding": ENCODING, "decoded_bytes": len(ptx)}
    manifest["modules"] = [{"name": f"m{k}", "binaries": [dict(binary)]} for k in range(modules)]
    manifest["modules"][-1]["binaries"][0]["decoded_bytes"] += second_size_delta
    return write_unchecked(manifest, blobs)


def test_a_block_that_many_binaries_name_is_accepted_or_refused_alike():
    """Both readers decode a shared block once; a binary declaring another size for it is refused with one
    text by both (the C++ reader decodes again only to say why)."""
    assert cpp_error(_shared_block_bundle(64)) is None and python_accepts(_shared_block_bundle(64))
    bad = _shared_block_bundle(64, second_size_delta=8)
    with pytest.raises(BundleError) as python:
        read_bundle(bad)
    error = cpp_error(bad)
    assert error is not None and "modules[63].binaries[0].blob 0" in str(python.value)
    assert "modules[63].binaries[0].blob" in error and "decoded_bytes" in error, error
