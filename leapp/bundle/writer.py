"""leapp/bundle/writer.py: serialize a manifest and its blobs into a segment bundle (docs/bundle-format.md).

NOTE: the manifest is written as compact JSON with sorted keys, so the same
manifest and blobs always give the same bytes, hence the same digest (the
runtimes' module cache key).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

from leapp.bundle.format import (
    ALIGNMENT,
    BLOB_ENTRY,
    BLOB_ENTRY_SIZE,
    FORMAT_VERSION,
    HASH_SIZE,
    HEADER,
    HEADER_SIZE,
    MAGIC,
    MAX_BLOBS,
    MAX_MANIFEST_SIZE,
    MIN_READER_VERSION,
    BundleError,
    align_up,
    min_reader_version_of,
)
from leapp.bundle.lz4_block import ENCODING, encode_block
from leapp.bundle.manifest import validate_manifest
from leapp.bundle.reader import decode_manifest

__all__ = ["write_bundle", "encode_manifest", "pack", "compress_binaries"]


def encode_manifest(manifest: dict) -> bytes:
    """The manifest as the writer stores it: compact UTF-8 JSON, sorted keys, no NaN/Infinity."""
    try:
        text = json.dumps(manifest, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        return text.encode("utf-8")
    except (TypeError, ValueError, RecursionError) as e:  # UnicodeEncodeError (lone surrogates) is a ValueError
        raise BundleError(f"bundle manifest: cannot be written as JSON: {e}") from e


def write_bundle(manifest: dict, blobs: Sequence[bytes | bytearray | memoryview], *, compress: bool = False) -> bytes:
    """The bundle bytes for ``manifest`` and ``blobs`` (blob i is what the manifest's ``"blob": i`` means).

    The manifest is checked with the reader's rules first (on its JSON form,
    so tuples count as arrays), and a BundleError names the first field that
    breaks one; whatever this returns, ``read_bundle`` accepts. With
    ``compress``, binaries are stored LZ4-compressed where that makes them
    smaller (``compress_binaries``). The header's min_reader_version is 2 when
    a binary is compressed, else 1 (version-1 readers still read the file).
    """
    try:
        blob_bytes = [memoryview(b).tobytes() for b in blobs]  # memoryview: bytes(5) would be 5 zeros
    except TypeError as e:
        raise BundleError(f"bundle: blobs must be bytes-like objects: {e}") from e
    if compress:
        manifest, blob_bytes = compress_binaries(manifest, blob_bytes)
    if len(blob_bytes) > MAX_BLOBS:
        raise BundleError(f"bundle: {len(blob_bytes)} blobs, at most {MAX_BLOBS} are allowed")
    raw = encode_manifest(manifest)
    if len(raw) > MAX_MANIFEST_SIZE:
        raise BundleError(f"bundle manifest: {len(raw)} bytes of JSON, at most {MAX_MANIFEST_SIZE} are allowed")
    decoded = decode_manifest(raw)
    min_reader = min_reader_version_of(decoded)
    validate_manifest(decoded, [len(b) for b in blob_bytes], blob_bytes, min_reader_version=min_reader)
    return pack(raw, blob_bytes, min_reader_version=min_reader)


def compress_binaries(manifest: dict, blobs: Sequence[bytes]) -> tuple[dict, list[bytes]]:
    """A copy of ``manifest`` and ``blobs`` in which each binary's blob is one LZ4 block (section 1.1) when
    that is smaller; its binary entries then carry ``"encoding": "lz4-block"`` and ``"decoded_bytes"``. The
    shared objects of ``cpu_code`` are binaries here too (section 2, "CPU code").

    A blob is compressed only when binaries alone refer to it, all without an encoding (an operation's
    parameters or a constant stay raw: the runtime reads them in place). Incompressible blobs stay raw.
    """
    import copy

    out = copy.deepcopy(manifest)
    blobs = list(blobs)
    binary_refs: dict[int, list[dict]] = {}
    for binary in _binary_entries(out):
        if type(binary.get("blob")) is int and 0 <= binary["blob"] < len(blobs):
            binary_refs.setdefault(binary["blob"], []).append(binary)
    other_refs = _blob_refs_outside_binaries(out)
    for blob, refs in binary_refs.items():
        if blob in other_refs or any("encoding" in r or "decoded_bytes" in r for r in refs):
            continue
        data = blobs[blob]
        block = encode_block(data)
        if len(block) >= len(data):
            continue
        blobs[blob] = block
        for r in refs:
            r["encoding"] = ENCODING
            r["decoded_bytes"] = len(data)
    return out, blobs


def _binary_entries(manifest: dict) -> list[dict]:
    """Every entry that names a binary's blob: modules[m].binaries[b] and cpu_code[c]."""
    entries = []
    for module in manifest.get("modules", ()) if isinstance(manifest, dict) else ():
        entries += [b for b in module.get("binaries", ()) if isinstance(b, dict)] if isinstance(module, dict) else []
    codes = manifest.get("cpu_code") if isinstance(manifest, dict) else None
    entries += [c for c in codes if isinstance(c, dict)] if isinstance(codes, list) else []
    return entries


def _blob_refs_outside_binaries(manifest: dict) -> set[int]:
    """Blob indices that constants' init or launches' params name."""
    refs: set[int] = set()
    for buffer in manifest.get("buffers", ()) if isinstance(manifest, dict) else ():
        init = buffer.get("init") if isinstance(buffer, dict) else None
        if isinstance(init, dict) and type(init.get("blob")) is int:
            refs.add(init["blob"])
    for op in manifest.get("ops", ()) if isinstance(manifest, dict) else ():
        params = op.get("params") if isinstance(op, dict) else None
        if isinstance(params, dict) and type(params.get("blob")) is int:
            refs.add(params["blob"])
    return refs


def pack(raw_manifest: bytes, blobs: Sequence[bytes], *, min_reader_version: int = MIN_READER_VERSION) -> bytes:
    """Lays out header, blob table, manifest bytes and blobs, then seals the file; checks nothing.

    ``write_bundle`` is the public entry; ``leapp.bundle.testing`` uses this to build invalid files.
    """
    raw = bytes(raw_manifest)
    manifest_offset = HEADER_SIZE + BLOB_ENTRY_SIZE * len(blobs)  # a multiple of 8
    cursor = align_up(manifest_offset + len(raw), ALIGNMENT)
    table = bytearray()
    placed: list[tuple[int, bytes]] = []
    for blob in blobs:
        table += BLOB_ENTRY.pack(cursor, len(blob), hashlib.sha256(blob).digest())
        placed.append((cursor, blob))
        cursor = align_up(cursor + len(blob), ALIGNMENT)
    body_end = max([manifest_offset + len(raw)] + [offset + len(blob) for offset, blob in placed])
    file_size = body_end + HASH_SIZE

    out = bytearray(file_size)  # zero-filled: padding bytes are 0
    out[0:HEADER_SIZE] = HEADER.pack(
        MAGIC, FORMAT_VERSION, min_reader_version, file_size, HEADER_SIZE, len(blobs), 0,
        manifest_offset, len(raw), 0,
    )
    out[HEADER_SIZE:manifest_offset] = table
    out[manifest_offset:manifest_offset + len(raw)] = raw
    for offset, blob in placed:
        out[offset:offset + len(blob)] = blob
    out[body_end:] = hashlib.sha256(memoryview(out)[:body_end]).digest()
    return bytes(out)
