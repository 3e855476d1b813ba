"""Compressed binaries (docs/bundle-format.md 1.1, format version 2): writer -> both readers, hostile LZ4 blocks,
and version-1 files.

The LZ4 block rules are applied by two implementations: ``leapp.bundle.lz4_block`` (Python: a walk over the
sequences, then the ``lz4`` package's decoder) and ``ext/core/src/lz4_block.cpp`` (the runtime's own decoder,
``leapp._native.lz4_block_decode``). Every case here is given to both: they accept the same blocks with the same
bytes and reject the same blocks, and the native decoder never crashes.

``fixtures/example_v1.lwb`` was written by leapp's version-1 writer (commit 9490c22, before format version 2):
``example_bundle(cubins={90: b"\\x7fELF" + bytes(60) + b"not a real cubin" * 8})``.
"""

from __future__ import annotations

import copy
import random
from pathlib import Path

import lz4.block
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from leapp.bundle import BundleError, read_bundle, write_bundle
from leapp.bundle import lz4_block
from leapp.bundle.describe import describe_bundle
from leapp.bundle.testing import example_manifest_and_blobs, reseal_blob, write_unchecked

native = pytest.importorskip("leapp._native", reason="leapp._native is not built")

V1_FIXTURE = Path(__file__).parent / "fixtures" / "example_v1.lwb"
V1_DIGEST = "8e5a3c4a2261f61dd02ac8c6f3e655a90d12bbf8a09f4a7e6c870da929e145e3"


def py_decode(block: bytes, size: int) -> bytes | str:
    try:
        return lz4_block.decode_block(block, size)
    except lz4_block.BlockError as e:
        return f"rejected: {e}"


def cpp_decode(block: bytes, size: int) -> bytes | str:
    try:
        return native.lz4_block_decode(block, size)
    except ValueError as e:
        assert str(e).startswith("LZ4 block: "), e
        return f"rejected: {str(e).removeprefix('LZ4 block: ')}"


def assert_decoders_agree(block: bytes, size: int) -> bytes | str:
    py, cpp = py_decode(block, size), cpp_decode(block, size)
    assert type(py) is type(cpp), f"python: {py!r:.200}\nc++:    {cpp!r:.200}"
    assert py == cpp  # the same bytes, or the same rule named at the same byte
    return py


def compress(data: bytes) -> bytes:
    return lz4_block.encode_block(data)


# --- the decoders on their own ----------------------------------------------------------------------------

payloads = st.one_of(
    st.binary(max_size=3000),  # mostly incompressible
    st.lists(st.sampled_from([b"\0", b"ab", b"warp", b"\xff" * 7, bytes(range(40))]), max_size=400).map(b"".join),
    st.builds(lambda n, b: bytes([b]) * n, st.integers(0, 70_000), st.integers(0, 255)),  # long matches
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(payloads, st.sampled_from(["hc", "default", "fast"]))
def test_blocks_of_the_lz4_compressor_decode_identically(data, mode):
    block = compress(data) if mode == "hc" else lz4.block.compress(
        data, store_size=False, **({"mode": "fast", "acceleration": 8} if mode == "fast" else {}))
    assert assert_decoders_agree(block, len(data)) == data


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(payloads, st.data())
def test_hostile_blocks_are_rejected_alike_never_a_crash(data, draw):
    block = bytearray(compress(data))
    size = len(data)
    for _ in range(draw.draw(st.integers(1, 4))):
        how = draw.draw(st.sampled_from(["flip", "truncate", "extend", "size", "random"]))
        if how == "flip" and block:
            block[draw.draw(st.integers(0, len(block) - 1))] = draw.draw(st.integers(0, 255))
        elif how == "truncate":
            del block[draw.draw(st.integers(0, len(block))):]
        elif how == "extend":
            block += draw.draw(st.binary(min_size=1, max_size=20))
        elif how == "size":
            size = max(0, size + draw.draw(st.integers(-300, 300)))
        else:
            block = bytearray(draw.draw(st.binary(max_size=60)))
            size = draw.draw(st.integers(0, 20_000))
    assert_decoders_agree(bytes(block), size)


def test_random_mutations_of_real_blocks_agree():
    """A fixed-seed sweep with more cases than hypothesis runs (every byte of small blocks flipped)."""
    rng = random.Random(13)
    samples = [b"", b"a", bytes(15), bytes(16), b"ab" * 30, bytes(range(256)) * 3, b"warp kernel " * 50]
    for data in samples:
        block = compress(data)
        for at in range(len(block)):
            for value in (0, 1, 0x0F, 0x10, 0xF0, 0xFF, rng.randrange(256)):
                mutated = bytearray(block)
                mutated[at] = value
                assert_decoders_agree(bytes(mutated), len(data))
        for cut in range(len(block)):
            assert_decoders_agree(block[:cut], len(data))


# (block, declared size, the rule both decoders name)
HOSTILE = [
    (b"", 0, "no sequence token at byte 0"),
    (b"\x00\x00", 0, "a match starts at output byte 0, within the last 12 bytes"),
    (b"\x01", 0, "the last sequence's token 0x01 has a match length"),
    (b"\x10a", 2, "decodes to 1 bytes, the manifest declares 2"),
    (b"\x20a", 2, "2 literal bytes at byte 1 run past the end of the block"),
    (b"\x30abc", 2, "3 literal bytes at output byte 0 exceed the declared size 2"),
    (b"\xf0", 20, "the literal length's extension bytes run past the end of the block"),
    (b"\xf0\xff\xff", 600, "extension bytes run past the end"),
    (b"\x10a\x00\x00" + b"\x50abcde", 30, "match offset 0 at byte 2 is not in [1, 1]"),
    (b"\x10a\x02\x00" + b"\x50abcde", 30, "match offset 2 at byte 2 is not in [1, 1]"),
    (b"\x1fa\x01\x00", 40, "only 2 bytes follow the literals ending at byte 2"),
    (b"\x1fa\x01\x00\xff\xff\xff\xff\xff\xff", 2000, "the match length's extension bytes run past the end"),
    (b"\x1fa\x01\x00\x10" + b"\x50abcde", 40, "a match of 35 bytes at output byte 1 ends within the last 5 bytes"),
    (b"\x10a", 10**9, "declares 1000000000 decoded bytes, more than 255 x its 2 bytes"),
    (b"\x10a\x01\x00" + b"\x50abcde", 2**40, "more than 255 x its"),
]


@pytest.mark.parametrize(("block", "size", "rule"), HOSTILE, ids=[h[2][:40] for h in HOSTILE])
def test_hostile_block_names_the_rule(block, size, rule):
    verdict = assert_decoders_agree(block, size)
    assert isinstance(verdict, str) and rule in verdict, verdict


def test_a_valid_overlapping_match_decodes():
    # 1 literal, a 20-byte match at offset 1 (run of 'a'), then 5 final literals
    block = b"\x1f" + b"a" + b"\x01\x00" + b"\x01" + b"\x50bcdef"
    assert assert_decoders_agree(block, 26) == b"a" * 21 + b"bcdef"


# --- bundles: writer -> both readers ---------------------------------------------------------------------------

def bundle_with_cubins(cubins: dict[int, bytes], compress_them: bool = True) -> bytes:
    manifest, blobs = example_manifest_and_blobs(cubins=cubins)
    return write_bundle(manifest, blobs, compress=compress_them)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from([75, 80, 86, 90, 100, 110, 120]), payloads, max_size=4))
def test_round_trip_through_both_readers(cubins):
    data = bundle_with_cubins(cubins)
    py, cpp = read_bundle(data), native.Bundle(data)
    assert py.digest == cpp.digest
    binaries = py.modules[0]["binaries"]
    originals = [example_manifest_and_blobs()[1][0]] + [cubins[a] for a in sorted(cubins)]
    for i, (spec, original) in enumerate(zip(binaries, originals, strict=True)):
        assert py.binary(0, i) == cpp.binary_image(0, i) == original
        assert py.binary_size(0, i) == len(original)
        stored = py.blobs[spec["blob"]]
        if "encoding" in spec:  # compressed only where that is smaller
            assert spec["encoding"] == "lz4-block" and spec["decoded_bytes"] == len(original)
            assert len(stored) < len(original)
        else:
            assert stored == original and len(compress(original)) >= len(original)
    encoded = any("encoding" in b for b in binaries)
    assert (py.format_version, py.min_reader_version) == (2, 2 if encoded else 1)
    # the constant and the launch parameters are never compressed
    assert py.blobs[1] == example_manifest_and_blobs()[1][1] and py.blobs[2] == example_manifest_and_blobs()[1][2]
    assert write_bundle(py.manifest, py.blobs) == data  # a read bundle writes back to the same bytes


def test_example_ptx_is_compressed_and_inspect_shows_both_sizes():
    data = bundle_with_cubins({90: b"\x7fELF" + bytes(3000)})
    bundle = read_bundle(data)
    assert [b.get("encoding") for b in bundle.modules[0]["binaries"]] == ["lz4-block", "lz4-block"]
    text = "\n".join(describe_bundle(bundle, len(data)))
    assert "(format v2, readers v2+," in text
    assert "cubin sm_90 (" in text and " lz4-block of 2.9 KiB)" in text
    assert "binaries: " in text and " stored, " in text and " decoded (" in text
    assert write_bundle(*example_manifest_and_blobs()) != data and read_bundle(write_bundle(
        *example_manifest_and_blobs())).min_reader_version == 1  # without compress: a version-1 reader reads it


def _compressed_example():
    manifest, blobs = example_manifest_and_blobs(cubins={90: b"\x7fELF" + bytes(3000)})
    return write_bundle(manifest, blobs, compress=True)


def both_verdicts(data: bytes) -> tuple[str | None, str | None]:
    try:
        read_bundle(data)
        py = None
    except BundleError as e:
        py = str(e)
    try:
        native.Bundle(data)
        cpp = None
    except ValueError as e:
        cpp = str(e)
    assert (py is None) == (cpp is None), f"python: {py!r}\nc++:    {cpp!r}"
    return py, cpp


def test_a_hostile_compressed_blob_is_refused_naming_bundle_and_blob():
    data = bytearray(_compressed_example())
    bundle = read_bundle(bytes(data))
    spec = bundle.modules[0]["binaries"][1]
    blob = spec["blob"]
    from leapp.bundle.format import BLOB_ENTRY, HEADER_SIZE

    offset, length, _ = BLOB_ENTRY.unpack_from(data, HEADER_SIZE + blob * 48)
    data[offset + length - 1] ^= 0x5A  # the last literal byte: still a block, the wrong bytes
    assert all(v is None for v in both_verdicts(reseal_blob(data, blob)))  # hashes resealed: contents not checked
    literals = data[offset] >> 4
    assert literals < 15
    data[offset + 1 + literals:offset + 3 + literals] = b"\0\0"  # the first match's offset: 0
    py, cpp = both_verdicts(reseal_blob(data, blob))
    where = f"modules[0].binaries[1].blob {blob} ({length} bytes, decoded_bytes 3004): LZ4 block: match offset 0 at byte"
    assert py.startswith(f"bundle manifest: {where}"), py
    assert cpp.startswith(f"leapp bundle 'example/warp_segment_0': {where}"), cpp


@pytest.mark.parametrize("case", ["size+1", "size-1", "huge", "negative", "string", "missing", "no-encoding",
                                  "unknown-encoding", "min-reader-1", "ptx-without-nul"])
def test_manifest_rules_of_compressed_binaries_agree(case):
    manifest, blobs = example_manifest_and_blobs(cubins={90: b"\x7fELF" + bytes(3000)})
    data = write_bundle(manifest, blobs, compress=True)
    bundle = read_bundle(data)
    manifest, blobs = copy.deepcopy(bundle.manifest), list(bundle.blobs)
    cubin = manifest["modules"][0]["binaries"][1]
    min_reader = None
    if case == "size+1":
        cubin["decoded_bytes"] += 1
    elif case == "size-1":
        cubin["decoded_bytes"] -= 1
    elif case == "huge":
        cubin["decoded_bytes"] = 2**41
    elif case == "negative":
        cubin["decoded_bytes"] = -1
    elif case == "string":
        cubin["decoded_bytes"] = "3064"
    elif case == "missing":
        del cubin["decoded_bytes"]
    elif case == "no-encoding":
        del cubin["encoding"]
    elif case == "unknown-encoding":
        cubin["encoding"] = "zlib"
    elif case == "min-reader-1":
        min_reader = 1
    elif case == "ptx-without-nul":
        ptx = manifest["modules"][0]["binaries"][0]
        text = example_manifest_and_blobs()[1][0][:-1]
        blobs[ptx["blob"]] = compress(text)
        ptx["decoded_bytes"] = len(text)
    py, cpp = both_verdicts(write_unchecked(manifest, blobs, min_reader_version=min_reader))
    assert py is not None and cpp is not None
    expected = {"size+1": "LZ4 block: decodes to", "size-1": "LZ4 block: ", "huge": "decoded_bytes",
                "negative": "decoded_bytes", "string": "decoded_bytes", "missing": "decoded_bytes",
                "no-encoding": "decoded_bytes is given without an encoding", "unknown-encoding": "encoding",
                "min-reader-1": "min_reader_version is 1", "ptx-without-nul": "NUL"}[case]
    assert expected in py and expected in cpp, (py, cpp)


# --- version 1 ---------------------------------------------------------------------------------------------------

def test_a_version_1_bundle_still_loads_in_both_readers():
    data = V1_FIXTURE.read_bytes()
    py, cpp = read_bundle(data), native.Bundle(data)
    assert (py.format_version, py.min_reader_version) == (1, 1)
    assert py.digest == cpp.digest == V1_DIGEST
    assert [b.get("encoding") for b in py.modules[0]["binaries"]] == [None, None]
    for i in range(2):
        assert py.binary(0, i) == cpp.binary_image(0, i) == py.blobs[py.modules[0]["binaries"][i]["blob"]]
    assert cpp.binary_choice(0, 9, 0, 13000, "")["candidates"][0]["kind"] == "cubin"
    # the same content written today: format version 2, still readable by version-1 readers unless compressed
    rewritten = read_bundle(write_bundle(py.manifest, py.blobs))
    assert (rewritten.format_version, rewritten.min_reader_version) == (2, 1)
    assert read_bundle(write_bundle(py.manifest, py.blobs, compress=True)).min_reader_version == 2
