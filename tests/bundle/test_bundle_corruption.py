"""Every corrupt, truncated or rule-breaking bundle is rejected with a BundleError that names the check."""

from __future__ import annotations

import copy
import re

import pytest

from leapp.bundle import BundleError, parse_signature, read_bundle, signature_json, validate_manifest, write_bundle
from leapp.bundle.format import BLOB_ENTRY, BLOB_ENTRY_SIZE, HEADER, HEADER_SIZE
from leapp.bundle.testing import (
    LONE_SURROGATE_CASES,
    example_bundle,
    example_manifest_and_blobs,
    reseal,
    reseal_blob,
    set_header_field,
    write_unchecked,
)
from leapp.bundle.writer import encode_manifest

EXAMPLE = example_bundle()
MANIFEST, BLOBS = example_manifest_and_blobs()


def header(data: bytes) -> dict:
    names = ("magic", "format_version", "min_reader_version", "file_size", "blob_table_offset", "blob_count",
             "flags", "manifest_offset", "manifest_size", "reserved")
    return dict(zip(names, HEADER.unpack_from(data, 0)))


def blob_entry(data: bytes, index: int) -> tuple[int, int, bytes]:
    return BLOB_ENTRY.unpack_from(data, HEADER_SIZE + index * BLOB_ENTRY_SIZE)


def with_blob_entry(data: bytes, index: int, offset: int, length: int | None = None) -> bytes:
    out = bytearray(data)
    _, old_length, digest = blob_entry(data, index)
    BLOB_ENTRY.pack_into(out, HEADER_SIZE + index * BLOB_ENTRY_SIZE, offset, old_length if length is None else length,
                         digest)
    return reseal(out)


def rejected(data: bytes) -> str:
    with pytest.raises(BundleError) as info:
        read_bundle(data)
    return str(info.value)


# --- section 1: file structure ----------------------------------------------------------------------------


def test_every_truncation_is_rejected():
    for length in range(len(EXAMPLE)):
        rejected(EXAMPLE[:length])


def test_every_truncation_with_a_consistent_header_is_rejected():
    """Truncated, then file_size and the hash fixed up: the range and blob checks must catch it."""
    for length in range(96, len(EXAMPLE)):
        message = rejected(set_header_field(EXAMPLE[:length], file_size=length))
        assert "sha256" in message or "runs past" in message or "before the manifest end" in message, message


def test_exact_texts_file_level():
    assert rejected(EXAMPLE[:95]) == "bundle: truncated: 95 bytes, a bundle has at least 96 (64-byte header + 32-byte sha256)"
    assert rejected(b"PK\x03\x04" + EXAMPLE[4:]) == (
        "bundle: bad magic b'PK\\x03\\x04PWB\\x00', expected b'LEAPPWB\\x00': not a leapp segment bundle"
    )
    assert rejected(EXAMPLE + b"\0") == (
        f"bundle: header file_size {len(EXAMPLE)} differs from the data length {len(EXAMPLE) + 1} (truncated or padded)"
    )
    corrupt = bytearray(EXAMPLE)
    corrupt[300] ^= 0xFF
    assert re.fullmatch(r"bundle: whole-file sha256 mismatch: stored [0-9a-f]{64}, computed [0-9a-f]{64}",
                        rejected(bytes(corrupt)))


def test_version_range_is_named():
    assert rejected(set_header_field(EXAMPLE, format_version=4, min_reader_version=4)) == (
        "unsupported bundle format version 4 (this leapp reads 1..2)"
    )
    assert rejected(set_header_field(EXAMPLE, format_version=4, min_reader_version=3)) == (
        "unsupported bundle format version 4, which needs a reader of version 3 or later (this leapp reads 1..2)"
    )
    assert rejected(set_header_field(EXAMPLE, format_version=0, min_reader_version=0)) == (
        "unsupported bundle format version 0 (this leapp reads 1..2)"
    )
    assert rejected(set_header_field(EXAMPLE, min_reader_version=0)) == (
        "bundle header: min_reader_version 0 is not in [1, format_version 2]"
    )
    assert rejected(set_header_field(EXAMPLE, min_reader_version=3)) == (
        "bundle header: min_reader_version 3 is not in [1, format_version 2]"
    )
    assert rejected(set_header_field(EXAMPLE, format_version=1, min_reader_version=2)) == (
        "bundle header: min_reader_version 2 is not in [1, format_version 1]"
    )


def test_newer_format_readable_by_old_readers_is_read():
    bundle = read_bundle(set_header_field(EXAMPLE, format_version=3, min_reader_version=2))
    assert (bundle.format_version, bundle.min_reader_version) == (3, 2)
    assert read_bundle(set_header_field(EXAMPLE, format_version=1, min_reader_version=1)).format_version == 1


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"blob_table_offset": 72}, "bundle header: blob_table_offset must be 64, got 72"),
        ({"blob_count": 65537}, "bundle header: blob_count 65537 exceeds 65536"),
        ({"flags": 1}, "bundle header: flags must be 0 (reserved), got 0x1"),
        ({"reserved": 2**63}, "bundle header: reserved must be 0, got 0x8000000000000000"),
        ({"blob_count": 60}, "bundle header: blob table [64, 2944) of 60 entries runs past the data end {end} (file_size - 32)"),
        ({"manifest_offset": 212}, "bundle header: manifest_offset 212 is not 8-aligned"),
        ({"manifest_offset": 200}, "bundle header: manifest_offset 200 overlaps the blob table ending at 208"),
        ({"manifest_size": 0}, "bundle header: manifest_size 0 is not in [1, 67108864]"),
        ({"manifest_size": 2**26 + 1}, "bundle header: manifest_size 67108865 is not in [1, 67108864]"),
        ({"manifest_offset": 2**64 - 8}, "bundle header: manifest [18446744073709551608, {huge}) runs past the data end {end} (file_size - 32)"),
    ],
)
def test_header_fields(fields, message):
    end = len(EXAMPLE) - 32
    huge = 2**64 - 8 + header(EXAMPLE)["manifest_size"]
    assert rejected(set_header_field(EXAMPLE, **fields)) == message.format(end=end, huge=huge)


def test_blob_ranges():
    offset0, length0, _ = blob_entry(EXAMPLE, 0)
    offset1, length1, _ = blob_entry(EXAMPLE, 1)
    end = len(EXAMPLE) - 32
    assert rejected(with_blob_entry(EXAMPLE, 1, offset1 + 4)) == f"bundle: blob 1 offset {offset1 + 4} is not 8-aligned"
    manifest_end = header(EXAMPLE)["manifest_offset"] + header(EXAMPLE)["manifest_size"]
    assert rejected(with_blob_entry(EXAMPLE, 0, 8 * (manifest_end // 8) - 8)) == (
        f"bundle: blob 0 offset {8 * (manifest_end // 8) - 8} lies before the manifest end {manifest_end}"
    )
    assert rejected(with_blob_entry(EXAMPLE, 1, offset1, end - offset1 + 1)) == (
        f"bundle: blob 1 [{offset1}, {end + 1}) runs past the data end {end} (file_size - 32)"
    )
    assert rejected(with_blob_entry(EXAMPLE, 1, 2**64 - 8, 16)) == (
        f"bundle: blob 1 [{2**64 - 8}, {2**64 + 8}) runs past the data end {end} (file_size - 32)"
    )
    # blob 1 placed inside blob 0
    assert rejected(with_blob_entry(EXAMPLE, 1, offset0 + 8)) == (
        f"bundle: blob 1 [{offset0 + 8}, {offset0 + 8 + length1}) overlaps blob 0 [{offset0}, {offset0 + length0})"
    )
    # a zero-length blob overlaps nothing: it fails on its (now wrong) hash instead
    assert "blob 1 sha256 mismatch" in rejected(with_blob_entry(EXAMPLE, 1, offset0 + 8, 0))
    # a declared length beyond the size cap is named as such, before its range
    assert rejected(with_blob_entry(EXAMPLE, 1, offset1, 2**62)) == (
        "bundle: blob 1 length 4611686018427387904 exceeds 1099511627776 (2^40)"
    )


def test_blob_hash_and_content():
    offset, _, _ = blob_entry(EXAMPLE, 2)
    corrupt = bytearray(EXAMPLE)
    corrupt[offset] ^= 1
    assert re.fullmatch(r"bundle: blob 2 sha256 mismatch: stored [0-9a-f]{64}, computed [0-9a-f]{64}",
                        rejected(reseal(corrupt)))
    offset, length, _ = blob_entry(EXAMPLE, 0)
    corrupt = bytearray(EXAMPLE)
    corrupt[offset + length - 1] = ord("\n")  # the PTX's terminating NUL
    assert rejected(reseal_blob(corrupt, 0)) == (
        "bundle manifest: modules[0].binaries[0]: PTX blob 0 does not end with a NUL byte"
    )


# --- the manifest as JSON -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"\xef\xbb\xbf{}", "bundle manifest: not valid JSON: Unexpected UTF-8 BOM (decode using utf-8-sig) at line 1 column 1"),
        (b'{"a": "\xff"}', "bundle manifest: not valid UTF-8 at byte 7: invalid start byte"),
        (b'{"a": NaN}', "bundle manifest: NaN is not valid JSON (RFC 8259)"),
        (b'{"a": -Infinity}', "bundle manifest: -Infinity is not valid JSON (RFC 8259)"),
        (b'{"a": 1, "a": 2}', 'bundle manifest: duplicate key "a" in one JSON object'),
        (b'{"a": ', "bundle manifest: not valid JSON: Expecting value at line 1 column 7"),
        (b"[" * 100_000 + b"]" * 100_000, "bundle manifest: not readable JSON: nested deeper than 512 levels"),
        (b'{"a":' + b"[" * 512 + b"]" * 512 + b"}", "bundle manifest: not readable JSON: nested deeper than 512 levels"),
        (b"[]", "bundle manifest: the manifest must be an object, got array []"),
        (b"{}", "bundle manifest: format is missing"),
    ],
)
def test_manifest_json(raw, message):
    assert rejected(write_unchecked(raw, BLOBS)) == message


def test_nesting_of_512_levels_is_fine():
    manifest = copy.deepcopy(MANIFEST)
    deep: list = []
    for _ in range(510):
        deep = [deep]
    manifest["future"] = deep  # top-level object 1, "future" 2..512
    read_bundle(write_bundle(manifest, BLOBS))
    manifest["future"] = [deep]
    with pytest.raises(BundleError, match="nested deeper than 512 levels"):
        write_bundle(manifest, BLOBS)


LONE = "the escape {} is a lone UTF-16 surrogate (not a character; a pair is \\ud800-\\udbff then \\udc00-\\udfff)"


@pytest.mark.parametrize(("old", "new", "escape", "where"), list(LONE_SURROGATE_CASES.values()),
                         ids=list(LONE_SURROGATE_CASES))
def test_lone_surrogate_escapes_are_refused(old, new, escape, where):
    raw = encode_manifest(MANIFEST)
    assert old in raw
    assert rejected(write_unchecked(raw.replace(old, new, 1), BLOBS)) == (
        f"bundle manifest: {where}: {LONE.format(escape)}"
    )


def test_surrogate_pairs_are_characters():
    raw = encode_manifest(MANIFEST).replace(b'"segment":"example/warp_segment_0"', b'"segment":"obs\\ud83d\\ude00"')
    assert read_bundle(write_unchecked(raw, BLOBS)).segment == "obs\U0001f600"


def test_huge_integer_literal():
    assert rejected(write_unchecked(b'{"a": ' + b"9" * 5000 + b"}", BLOBS)).startswith("bundle manifest: not readable JSON: ")


# --- section 2: the manifest rules, one at a time -------------------------------------------------------


def _set(path: str, value):
    def mutate(m):
        *parents, last = path.split(".")
        for key in parents:
            m = m[int(key)] if key.isdigit() else m[key]
        if value is _DELETE:
            del m[int(last) if last.isdigit() else last]
        else:
            m[int(last) if last.isdigit() else last] = value

    return mutate


_DELETE = object()

RULES = [
    # (mutation, exact message after "bundle manifest: ")
    (_set("format", "leapp.warp.bundle2"), 'format must be "leapp.warp.bundle", got \'leapp.warp.bundle2\' (str)'),
    (_set("segment", _DELETE), "segment is missing"),
    (_set("source", 3), "source must be a string, got 3 (int)"),
    (_set("producer.warp", 1.19), "producer.warp must be a string, got 1.19 (float)"),
    (_set("modules", {}), "modules must be an array, got object {}"),
    (_set("modules.0.name", _DELETE), "modules[0].name is missing"),
    (_set("modules.0.binaries", []), "modules[0].binaries is empty: a module has at least one binary"),
    (_set("modules.0.binaries.0.kind", "sass"), "modules[0].binaries[0].kind must be \"ptx\" or \"cubin\", got 'sass' (str)"),
    (_set("modules.0.binaries.0.arch", 9), "modules[0].binaries[0].arch 9 is not in [10, 9223372036854775807]"),
    (_set("modules.0.binaries.0.arch", 75.0), "modules[0].binaries[0].arch must be an integer, got 75.0 (float)"),
    (_set("modules.0.binaries.0.blob", 3), "modules[0].binaries[0].blob 3 is out of range: the bundle has 3 blobs"),
    (_set("modules.0.binaries.0.blob", 1), "modules[0].binaries[0]: PTX blob 1 does not end with a NUL byte"),
    (_set("kernels.0.module", 1), "kernels[0].module 1 is out of range: modules has 1 entry"),
    (_set("kernels.0.entry", ""), "kernels[0].entry must not be empty"),
    (_set("kernels.0.key", None), "kernels[0].key must be a string, got null"),
    (_set("kernels.0.block_dim", 0), "kernels[0].block_dim 0 is not in [1, 1024]"),
    (_set("kernels.0.block_dim", True), "kernels[0].block_dim must be an integer, got true"),
    (_set("kernels.0.smem_bytes", -1), "kernels[0].smem_bytes -1 is not in [0, 4294967295]"),
    (_set("buffers.2.id", 3), "buffers[2].id must be 2 (its position), got 3"),
    (_set("buffers.2.bytes", 0), "buffers[2].bytes 0 is not in [1, 1099511627776]"),
    (_set("buffers.2.bytes", 2**40 + 1), "buffers[2].bytes 1099511627777 is not in [1, 1099511627776]"),
    (_set("buffers.2.bytes", 2**62), "buffers[2].bytes 4611686018427387904 is not in [1, 1099511627776]"),
    (_set("buffers.2.bytes", 2**63), "buffers[2].bytes 9223372036854775808 is not in [1, 1099511627776]"),
    (_set("buffers.2.bytes", 10**4000), "buffers[2].bytes <4001-digit integer> is not in [1, 1099511627776]"),
    (_set("buffers.2.bytes", 2**40), "buffers hold 1099511627792 bytes of scratch and constant memory, more than 1099511627776 (2^40)"),
    (_set("buffers.2.role", "temp"), "buffers[2].role must be one of input, output, scratch, constant, got 'temp' (str)"),
    (_set("buffers.0.io", _DELETE), "buffers[0].io is missing"),
    (_set("buffers.1.io", 1), "buffers[1].io 1 is out of range: signature.outputs has 1 entry"),
    (_set("buffers.2.init", "random"), 'buffers[2].init must be "none", "zero", {"blob": n} or {"input": j}, got \'random\' (str)'),
    (_set("buffers.2.init", {"blob": 1, "input": 0}), 'buffers[2].init must be "none", "zero", {"blob": n} or {"input": j}, got object {\'blob\': 1, \'input\': 0}'),
    (_set("buffers.0.init", "zero"), "buffers[0].init of an input buffer must be \"none\", got 'zero' (str)"),
    (_set("buffers.2.init", {"blob": 1}), 'buffers[2].init of a scratch buffer must be "none" or "zero", got object {\'blob\': 1}'),
    (_set("buffers.3.init", "zero"), "buffers[3].init of a constant buffer must be {\"blob\": ...}, got 'zero' (str)"),
    (_set("buffers.3.init", {"blob": 2}), "buffers[3].init.blob 2 has 192 bytes, the buffer has 16"),
    (_set("buffers.1.init", {"input": 1}), "buffers[1].init.input 1 is out of range: signature.inputs has 1 entry"),
    (_set("signature.inputs.0.name", _DELETE), "signature.inputs[0].name is missing"),
    (_set("signature.inputs.0.buffer", 2), "signature.inputs[0].buffer 2 has role scratch, expected input"),
    (_set("signature.outputs.0.dtype", "uint16"), "signature.outputs[0].dtype must be one of float32, float16, bfloat16, float64, int8, int16, int32, int64, uint8, bool, got 'uint16' (str)"),
    (_set("signature.outputs.0.shape", [2, 3]), "signature.outputs[0] is float32 [2, 3] = 24 bytes, but buffers[1].bytes = 16"),
    (_set("signature.outputs.0.shape", [2, -2]), "signature.outputs[0].shape[1] -2 is not in [0, 9223372036854775807]"),
    (_set("signature.outputs.0.logical_shape", "4"), "signature.outputs[0].logical_shape must be an array, got '4' (str)"),
    (_set("ops.0.op", "fill"), "ops[0].op must be one of launch, memset, copy, got 'fill' (str)"),
    (_set("ops.0.buffer", 0), "ops[0].buffer 0 is an input buffer, which the ops never write"),
    (_set("ops.0.buffer", 3), "ops[0].buffer 3 is a constant buffer, which the ops never write"),
    (_set("ops.0.bytes", 0), "ops[0].bytes 0 is not in [1, 1099511627776]"),
    (_set("ops.0.bytes", 2**62), "ops[0].bytes 4611686018427387904 is not in [1, 1099511627776]"),
    (_set("ops.2.bytes", 2**40 + 1), "ops[2].bytes 1099511627777 is not in [1, 1099511627776]"),
    (_set("ops.0.offset", 1), "ops[0].offset 1 + bytes 16 exceeds buffers[2].bytes = 16"),
    (_set("ops.0.value", 256), "ops[0].value 256 is not in [0, 255]"),
    (_set("ops.1.kernel", 1), "ops[1].kernel 1 is out of range: kernels has 1 entry"),
    (_set("ops.1.grid", [1, 1]), "ops[1].grid must have 3 entries, got 2"),
    (_set("ops.1.grid", [2**32, 1, 1]), "ops[1].grid[0] 4294967296 is not in [1, 4294967295]"),
    (_set("ops.1.block", [256, 4, 2]), "ops[1].block [256, 4, 2] has 2048 threads, more than 1024"),
    (_set("ops.1.block", [128, 1, 1]), "ops[1].block[0] 128 differs from kernels[0].block_dim 256"),
    (_set("ops.1.smem", _DELETE), "ops[1].smem is missing"),
    (_set("ops.1.params.blob", 7), "ops[1].params.blob 7 is out of range: the bundle has 3 blobs"),
    (_set("ops.1.params.offsets", [0, 24, 80]), "ops[1].params has 3 offsets but 4 sizes"),
    (_set("ops.1.params.sizes", [24, 56, 56, 57]), "ops[1].params.offsets[3] 136 + sizes[3] 57 exceeds the length of blob 2 (192 bytes)"),
    (_set("ops.1.params.sizes", [24, 0, 56, 56]), "ops[1].params.sizes[1] 0 is not in [1, 9223372036854775807]"),
    (_set("ops.1.relocs", None), "ops[1].relocs must be an array, got null"),
    (_set("ops.1.relocs.0.param", 4), "ops[1].relocs[0].param 4 is out of range: ops[1].params.sizes has 4 entries"),
    (_set("ops.1.relocs.0.offset", 52), "ops[1].relocs[0].offset 52 + 8 exceeds params.sizes[1] = 56"),
    (_set("ops.1.relocs.0.buffer", 4), "ops[1].relocs[0].buffer 4 is out of range: buffers has 4 entries"),
    (_set("ops.1.relocs.0.buffer_offset", 17), "ops[1].relocs[0].buffer_offset 17 exceeds buffers[0].bytes = 16"),
    (_set("ops.2.dst", 0), "ops[2].dst 0 is an input buffer, which the ops never write"),
    (_set("ops.2.src_offset", 4), "ops[2].src_offset 4 + bytes 16 exceeds buffers[2].bytes = 16"),
]


def _rule_id(rule):
    return rule[1].split(" ")[0]


@pytest.mark.parametrize(("mutate", "message"), RULES, ids=[_rule_id(r) for r in RULES])
def test_manifest_rule(mutate, message):
    manifest = copy.deepcopy(MANIFEST)
    mutate(manifest)
    with pytest.raises(BundleError) as from_writer:
        write_bundle(manifest, BLOBS)
    assert str(from_writer.value) == f"bundle manifest: {message}"
    assert rejected(write_unchecked(manifest, BLOBS)) == f"bundle manifest: {message}"


def test_block_of_exactly_1024_threads_is_fine():
    manifest = copy.deepcopy(MANIFEST)
    manifest["kernels"][0]["block_dim"] = 256
    manifest["ops"][1]["block"] = [256, 4, 1]
    read_bundle(write_bundle(manifest, BLOBS))


def test_output_initialized_from_input():
    manifest = copy.deepcopy(MANIFEST)
    manifest["buffers"][1]["init"] = {"input": 0}
    assert read_bundle(write_bundle(manifest, BLOBS)).manifest["buffers"][1]["init"] == {"input": 0}
    manifest["buffers"][0]["bytes"] = 32
    manifest["signature"]["inputs"][0]["shape"] = [8]
    manifest["ops"][1]["relocs"] = []
    with pytest.raises(BundleError, match=re.escape("buffers[1].init.input 0 has 32 bytes (buffers[0]), the buffer has 16")):
        write_bundle(manifest, BLOBS)


def test_overlapping_self_copy():
    manifest = copy.deepcopy(MANIFEST)
    manifest["ops"][2].update(dst=2, dst_offset=4, src=2, src_offset=0, bytes=8)
    with pytest.raises(BundleError) as info:
        write_bundle(manifest, BLOBS)
    assert str(info.value) == "bundle manifest: ops[2] copies buffers[2] [0, 8) onto the overlapping [4, 12)"
    manifest["ops"][2].update(dst_offset=8)
    read_bundle(write_bundle(manifest, BLOBS))


def test_duplicate_binary_and_names():
    manifest = copy.deepcopy(MANIFEST)
    manifest["modules"][0]["binaries"].append({"kind": "ptx", "arch": 75, "blob": 0})
    with pytest.raises(BundleError, match=re.escape("modules[0].binaries[1] is a second ptx for arch 75 (first: binaries[0])")):
        write_bundle(manifest, BLOBS)
    manifest = copy.deepcopy(MANIFEST)
    manifest["buffers"].append({"id": 4, "bytes": 16, "role": "input", "io": 1, "init": "none"})
    manifest["signature"]["inputs"].append(dict(manifest["signature"]["inputs"][0], buffer=4))
    with pytest.raises(BundleError, match=re.escape('signature.inputs[1].name "x" is already used by signature.inputs[0]')):
        write_bundle(manifest, BLOBS)


def test_signature_must_point_back():
    manifest = copy.deepcopy(MANIFEST)
    manifest["buffers"].append({"id": 4, "bytes": 16, "role": "input", "io": 0, "init": "none"})
    with pytest.raises(BundleError) as info:
        write_bundle(manifest, BLOBS)
    assert str(info.value) == "bundle manifest: buffers[4].io 0 points to signature.inputs[0], whose buffer is 0"
    manifest["buffers"][4]["io"] = 1
    with pytest.raises(BundleError) as info:
        write_bundle(manifest, BLOBS)
    assert str(info.value) == "bundle manifest: buffers[4].io 1 is out of range: signature.inputs has 1 entry"
    manifest = copy.deepcopy(MANIFEST)
    manifest["buffers"][0]["io"] = 1
    manifest["signature"]["inputs"].append(dict(manifest["signature"]["inputs"][0], name="x2"))
    with pytest.raises(BundleError) as info:
        write_bundle(manifest, BLOBS)
    assert str(info.value) == "bundle manifest: signature.inputs[0].buffer 0 has io 1, expected 0"


# --- writer-only failures and the signature string ------------------------------------------------------


def test_writer_rejects_what_json_cannot_hold():
    manifest = copy.deepcopy(MANIFEST)
    manifest["producer"]["when"] = object()
    with pytest.raises(BundleError, match="bundle manifest: cannot be written as JSON: Object of type object"):
        write_bundle(manifest, BLOBS)
    manifest = copy.deepcopy(MANIFEST)
    manifest["ops"][0]["value"] = float("nan")
    with pytest.raises(BundleError, match="cannot be written as JSON: Out of range float values"):
        write_bundle(manifest, BLOBS)
    with pytest.raises(BundleError, match="bundle: blobs must be bytes-like objects"):
        write_bundle(MANIFEST, [*BLOBS, 5])
    with pytest.raises(BundleError, match="bundle: 65537 blobs, at most 65536 are allowed"):
        write_bundle(MANIFEST, [b""] * 65537)


def test_validate_manifest_without_blob_bytes():
    validate_manifest(MANIFEST, [len(b) for b in BLOBS])
    with pytest.raises(BundleError, match=r"modules\[0\]\.binaries\[0\]: PTX blob 0 is empty"):
        validate_manifest(MANIFEST, [0, 16, 192])


def test_read_bundle_type_error():
    with pytest.raises(TypeError, match="read_bundle: expected bytes or a buffer, got str"):
        read_bundle("LEAPPWB")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "signature: not valid JSON"),
        ("[]", "signature: must be a JSON object, got list"),
        ('{"digest": "ABC"}', "signature: digest must be 64 lowercase hex digits (a sha256), got 'ABC'"),
        ('{"digest": "' + "0" * 64 + '", "segment": 1}', "signature: segment must be a string, got 1"),
        ('{"digest": "' + "0" * 64 + '", "segment": "s", "inputs": {}}', "signature: inputs must be an array, got dict"),
        ('{"digest": "' + "0" * 64 + '", "segment": "s", "inputs": [], "outputs": [{"name": "y", "dtype": "f32", "shape": [1]}]}',
         "signature: outputs[0].dtype must be one of"),
        ('{"digest": "' + "0" * 64 + '", "segment": "s", "inputs": [], "outputs": [{"name": "y", "dtype": "bool", "shape": [true]}]}',
         "signature: outputs[0].shape must be an array of non-negative integers, got [True]"),
        ('{"digest": "' + "0" * 64 + '", "segment": "\\ud800", "inputs": [], "outputs": []}',
         "signature: segment: the escape \\ud800 is a lone UTF-16 surrogate"),
        ('{"digest": "' + "0" * 64 + '", "segment": "s", "inputs": [], "outputs": [{"name": "\\udc00", "dtype": "bool", "shape": []}]}',
         "signature: outputs[0].name: the escape \\udc00 is a lone UTF-16 surrogate"),
        ('{"digest": "' + "0" * 64 + '", "segment": "\ud800", "inputs": [], "outputs": []}',
         "signature: not Unicode text: character 91 is a lone surrogate"),
        ('{"digest": "' + "0" * 64 + '", "segment": "s", "segment": "t", "inputs": [], "outputs": []}',
         'signature: duplicate key "segment" in one JSON object'),
        ('{"digest": "' + "0" * 64 + '", "segment": "s", "inputs": [], "outputs": [], "x": NaN}',
         "signature: NaN is not valid JSON (RFC 8259)"),
    ],
)
def test_parse_signature_rejects(text, message):
    with pytest.raises(BundleError) as info:
        parse_signature(text)
    assert str(info.value).startswith(message)


def test_signature_json_of_a_manifest_needs_a_digest():
    with pytest.raises(BundleError, match="signature: a digest is required with a manifest"):
        signature_json(MANIFEST)
    bundle = read_bundle(EXAMPLE)
    assert signature_json(MANIFEST, bundle.digest) == signature_json(bundle)
