"""leapp/bundle/reader.py: parse and fully check a segment bundle (docs/bundle-format.md sections 1 and 2).

NOTE: bundles arrive from files users hand us, so every offset, size and
hash is checked before use, in the order the spec lists; any failure is a
BundleError that names the check and the field (never an IndexError,
KeyError, UnicodeDecodeError or json error).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from leapp.bundle.format import (
    ALIGNMENT,
    BLOB_ENTRY,
    BLOB_ENTRY_SIZE,
    HASH_SIZE,
    HEADER,
    HEADER_SIZE,
    MAGIC,
    MAX_BLOBS,
    MAX_BUFFER_BYTES,
    MAX_MANIFEST_SIZE,
    MIN_FILE_SIZE,
    OLDEST_READABLE_VERSION,
    READER_VERSION,
    BundleError,
)
from leapp.bundle.manifest import validate_manifest
from leapp.bundle.strict_json import decode_strict_json

__all__ = ["Bundle", "read_bundle", "decode_manifest"]


@dataclass(frozen=True)
class Bundle:
    """A bundle that passed every check of the spec.

    Attributes:
        manifest: the decoded manifest (section 2).
        blobs: blob i's bytes, in table order.
        digest: hex sha256 of the file (its trailing hash); the runtimes' cache key.
        format_version: the header's format_version.
        min_reader_version: the header's min_reader_version (2 when a binary is compressed).
        decoded: blob index -> decoded bytes of each compressed binary (section 1.1); ``binary`` reads it.
    """

    manifest: dict
    blobs: list[bytes]
    digest: str
    format_version: int
    min_reader_version: int = 1
    decoded: dict[int, bytes] = field(default_factory=dict, repr=False, compare=False)

    @property
    def segment(self) -> str:
        return self.manifest["segment"]

    @property
    def source(self) -> str:
        return self.manifest["source"]

    @property
    def producer(self) -> dict[str, str]:
        return self.manifest["producer"]

    @property
    def modules(self) -> list[dict]:
        return self.manifest["modules"]

    @property
    def kernels(self) -> list[dict]:
        return self.manifest["kernels"]

    @property
    def buffers(self) -> list[dict]:
        return self.manifest["buffers"]

    @property
    def ops(self) -> list[dict]:
        return self.manifest["ops"]

    @property
    def inputs(self) -> list[dict]:
        """signature.inputs: name, buffer, dtype, shape (+ warp_dtype, logical_shape) per input tensor."""
        return self.manifest["signature"]["inputs"]

    @property
    def outputs(self) -> list[dict]:
        """signature.outputs, same fields as ``inputs``."""
        return self.manifest["signature"]["outputs"]

    def binary(self, module: int, index: int) -> bytes:
        """``modules[module].binaries[index]`` as a loader hands it to the driver: its blob, decoded when the
        manifest gives it an ``encoding`` (the reader decoded and checked it)."""
        spec = self.modules[module]["binaries"][index]
        return self.decoded[spec["blob"]] if "encoding" in spec else self.blobs[spec["blob"]]

    def binary_size(self, module: int, index: int) -> int:
        """The binary's decoded size (its blob's length when it is not compressed)."""
        spec = self.modules[module]["binaries"][index]
        return spec["decoded_bytes"] if "encoding" in spec else len(self.blobs[spec["blob"]])

    def blob(self, index: int) -> bytes:
        """The bytes of blob ``index``; IndexError names the blob count when out of range."""
        if not 0 <= index < len(self.blobs):
            raise IndexError(f"bundle {self.segment}: blob {index} out of range ({len(self.blobs)} blobs)")
        return self.blobs[index]


Bundle.__module__ = "leapp.bundle"


def decode_manifest(raw: bytes | memoryview) -> Any:
    """Strict UTF-8 JSON decoding (leapp.bundle.strict_json): no BOM, NaN/Infinity, duplicate key or lone
    surrogate; depth <= 512, at most 2^20 values; errors are BundleErrors."""
    return decode_strict_json(raw, "bundle manifest", refuse_nul=True)


def _as_bytes(data: Any) -> bytes:
    if isinstance(data, bytes):
        return data
    try:
        view = memoryview(data)
    except TypeError as e:
        raise TypeError(f"read_bundle: expected bytes or a buffer, got {type(data).__name__}") from e
    if not view.contiguous:
        raise TypeError("read_bundle: the buffer is not contiguous")
    return view.tobytes()


def read_bundle(data: bytes | bytearray | memoryview) -> Bundle:
    """Checks everything of sections 1 and 2, in the spec's order, and returns the Bundle.

    Raises:
        BundleError: the first check that fails, naming the field, expected and found values.
        TypeError: ``data`` is not a bytes-like object.
    """
    buf = _as_bytes(data)
    n = len(buf)
    if n < MIN_FILE_SIZE:
        raise BundleError(
            f"bundle: truncated: {n} bytes, a bundle has at least {MIN_FILE_SIZE} "
            f"({HEADER_SIZE}-byte header + {HASH_SIZE}-byte sha256)"
        )
    (magic, format_version, min_reader, file_size, table_offset, blob_count, flags,
     manifest_offset, manifest_size, reserved) = HEADER.unpack_from(buf, 0)
    if magic != MAGIC:
        raise BundleError(f"bundle: bad magic {magic!r}, expected {MAGIC!r}: not a leapp segment bundle")
    _check_versions(format_version, min_reader)
    if file_size != n:
        raise BundleError(f"bundle: header file_size {file_size} differs from the data length {n} (truncated or padded)")
    body_end = n - HASH_SIZE
    stored = buf[body_end:]
    computed = hashlib.sha256(memoryview(buf)[:body_end]).digest()
    if stored != computed:
        raise BundleError(f"bundle: whole-file sha256 mismatch: stored {stored.hex()}, computed {computed.hex()}")

    if table_offset != HEADER_SIZE:
        raise BundleError(f"bundle header: blob_table_offset must be {HEADER_SIZE}, got {table_offset}")
    if blob_count > MAX_BLOBS:
        raise BundleError(f"bundle header: blob_count {blob_count} exceeds {MAX_BLOBS}")
    if flags != 0:
        raise BundleError(f"bundle header: flags must be 0 (reserved), got {flags:#x}")
    if reserved != 0:
        raise BundleError(f"bundle header: reserved must be 0, got {reserved:#x}")
    table_end = table_offset + BLOB_ENTRY_SIZE * blob_count
    if table_end > body_end:
        raise BundleError(
            f"bundle header: blob table [{table_offset}, {table_end}) of {blob_count} entries "
            f"runs past the data end {body_end} (file_size - 32)"
        )
    if manifest_offset % ALIGNMENT:
        raise BundleError(f"bundle header: manifest_offset {manifest_offset} is not {ALIGNMENT}-aligned")
    if manifest_offset < table_end:
        raise BundleError(f"bundle header: manifest_offset {manifest_offset} overlaps the blob table ending at {table_end}")
    if not 0 < manifest_size <= MAX_MANIFEST_SIZE:
        raise BundleError(f"bundle header: manifest_size {manifest_size} is not in [1, {MAX_MANIFEST_SIZE}]")
    manifest_end = manifest_offset + manifest_size
    if manifest_end > body_end:
        raise BundleError(
            f"bundle header: manifest [{manifest_offset}, {manifest_end}) runs past the data end {body_end} "
            "(file_size - 32)"
        )

    entries = [BLOB_ENTRY.unpack_from(buf, table_offset + i * BLOB_ENTRY_SIZE) for i in range(blob_count)]
    _check_blob_ranges(entries, manifest_end, body_end)
    blobs = []
    for i, (offset, length, digest) in enumerate(entries):
        blob = buf[offset:offset + length]
        actual = hashlib.sha256(blob).digest()
        if actual != digest:
            raise BundleError(f"bundle: blob {i} sha256 mismatch: stored {digest.hex()}, computed {actual.hex()}")
        blobs.append(blob)

    manifest = decode_manifest(memoryview(buf)[manifest_offset:manifest_end])
    decoded = validate_manifest(manifest, [len(b) for b in blobs], blobs, min_reader_version=min_reader)
    return Bundle(manifest=manifest, blobs=blobs, digest=stored.hex(), format_version=format_version,
                  min_reader_version=min_reader, decoded=decoded)


def _check_versions(format_version: int, min_reader: int) -> None:
    supported = f"this leapp reads {OLDEST_READABLE_VERSION}..{READER_VERSION}"
    if format_version < OLDEST_READABLE_VERSION:
        raise BundleError(f"unsupported bundle format version {format_version} ({supported})")
    if not 1 <= min_reader <= format_version:
        raise BundleError(
            f"bundle header: min_reader_version {min_reader} is not in [1, format_version {format_version}]"
        )
    if min_reader > READER_VERSION:
        needs = "" if min_reader == format_version else f", which needs a reader of version {min_reader} or later"
        raise BundleError(f"unsupported bundle format version {format_version}{needs} ({supported})")


def _check_blob_ranges(entries: list[tuple[int, int, bytes]], manifest_end: int, body_end: int) -> None:
    for i, (offset, length, _) in enumerate(entries):
        if offset % ALIGNMENT:
            raise BundleError(f"bundle: blob {i} offset {offset} is not {ALIGNMENT}-aligned")
        if length > MAX_BUFFER_BYTES:
            raise BundleError(f"bundle: blob {i} length {length} exceeds {MAX_BUFFER_BYTES} (2^40)")
        if offset < manifest_end:
            raise BundleError(f"bundle: blob {i} offset {offset} lies before the manifest end {manifest_end}")
        if offset + length > body_end:
            raise BundleError(
                f"bundle: blob {i} [{offset}, {offset + length}) runs past the data end {body_end} (file_size - 32)"
            )
    spans = sorted((offset, offset + length, i) for i, (offset, length, _) in enumerate(entries) if length)
    for (start_a, end_a, a), (start_b, end_b, b) in zip(spans, spans[1:]):
        if start_b < end_a:
            first, second = sorted(((a, start_a, end_a), (b, start_b, end_b)))
            raise BundleError(
                f"bundle: blob {second[0]} [{second[1]}, {second[2]}) overlaps blob {first[0]} [{first[1]}, {first[2]})"
            )
