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
    DYNAMIC_BATCH_VERSION,
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
)
from leapp.bundle.manifest import validate_manifest
from leapp.bundle.reader import decode_manifest

__all__ = ["write_bundle", "encode_manifest", "pack"]


def encode_manifest(manifest: dict) -> bytes:
    """The manifest as the writer stores it: compact UTF-8 JSON, sorted keys, no NaN/Infinity."""
    try:
        text = json.dumps(manifest, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        return text.encode("utf-8")
    except (TypeError, ValueError, RecursionError) as e:  # UnicodeEncodeError (lone surrogates) is a ValueError
        raise BundleError(f"bundle manifest: cannot be written as JSON: {e}") from e


def write_bundle(manifest: dict, blobs: Sequence[bytes | bytearray | memoryview]) -> bytes:
    """The bundle bytes for ``manifest`` and ``blobs`` (blob i is what the manifest's ``"blob": i`` means).

    The manifest is checked with the reader's rules first (on its JSON form,
    so tuples count as arrays), and a BundleError names the first field that
    breaks one; whatever this returns, ``read_bundle`` accepts.
    """
    try:
        blob_bytes = [memoryview(b).tobytes() for b in blobs]  # memoryview: bytes(5) would be 5 zeros
    except TypeError as e:
        raise BundleError(f"bundle: blobs must be bytes-like objects: {e}") from e
    if len(blob_bytes) > MAX_BLOBS:
        raise BundleError(f"bundle: {len(blob_bytes)} blobs, at most {MAX_BLOBS} are allowed")
    raw = encode_manifest(manifest)
    if len(raw) > MAX_MANIFEST_SIZE:
        raise BundleError(f"bundle manifest: {len(raw)} bytes of JSON, at most {MAX_MANIFEST_SIZE} are allowed")
    decoded = decode_manifest(raw)
    validate_manifest(decoded, [len(b) for b in blob_bytes], blob_bytes)
    # A bundle with dynamic-batch rules needs a reader that applies them (an older one would replay the traced batch).
    versions = (DYNAMIC_BATCH_VERSION, DYNAMIC_BATCH_VERSION) if "batch" in decoded else None
    return pack(raw, blob_bytes, versions=versions)


def pack(raw_manifest: bytes, blobs: Sequence[bytes], *, versions: tuple[int, int] | None = None) -> bytes:
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
    format_version, min_reader = versions or (FORMAT_VERSION, MIN_READER_VERSION)
    out[0:HEADER_SIZE] = HEADER.pack(
        MAGIC, format_version, min_reader, file_size, HEADER_SIZE, len(blobs), 0,
        manifest_offset, len(raw), 0,
    )
    out[HEADER_SIZE:manifest_offset] = table
    out[manifest_offset:manifest_offset + len(raw)] = raw
    for offset, blob in placed:
        out[offset:offset + len(blob)] = blob
    out[body_end:] = hashlib.sha256(memoryview(out)[:body_end]).digest()
    return bytes(out)
