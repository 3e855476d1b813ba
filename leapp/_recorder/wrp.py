"""leapp/_recorder/wrp.py: a small, bounds-checked reader of Warp's ``.wrp`` files.

The recorder only needs the operation list (to name a segment's ops and find
the regions that copies and fills write) and the memory-region table. Layouts
mirror ``warp/native/apic_types.h`` of Warp 1.19 (APIC_FORMAT_VERSION 18);
every offset is checked against the buffer before it is read.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

__all__ = ["WrpOp", "WrpRegion", "WrpFormatError", "read_ops", "read_regions", "OP_NAMES"]

MAGIC = b"WRP1"
_HEADER = struct.Struct("<4sIIIQ")  # magic, version, flags, num_sections, section_table_offset (APICFileHeader, 64 bytes)
_HEADER_SIZE = 64
_SECTION = struct.Struct("<IIQQQ")  # APICSectionEntry, 32 bytes
_OP_HEADER = struct.Struct("<II")  # APICOpHeader: op_type, total_size
_LAUNCH_FIXED = 80  # sizeof(APICLaunchRecord)
_LAUNCH_LENS = struct.Struct("<HH")  # kernel_key_len, module_hash_len at offset 64
_REGION = struct.Struct("<IIQB7x")  # APICMemoryRegionRecord, 24 bytes

SECTION_MEMORY = 0x02
SECTION_OPERATIONS = 0x03

OP_NAMES = {
    1: "launch",
    2: "memcpy_h2d",
    3: "memcpy_d2h",
    4: "copy",
    5: "memset",
    6: "alloc",
    7: "if",
    8: "while",
    9: "scan",
    10: "fill",
    11: "segmented_sort",
    12: "radix_sort",
    13: "runlength_encode",
    14: "bsr_from_triplets",
    15: "bsr_transpose",
    16: "reduction",
    17: "bvh_refit",
    18: "bvh_rebuild",
    19: "hash_grid_update",
}
# op type -> byte offset of the int32 destination region id in its record
_DST_REGION_OFFSET = {2: 8, 4: 8, 5: 8, 9: 8, 10: 8, 16: 16}


class WrpFormatError(ValueError):
    """The bytes are not a .wrp file this reader understands."""


@dataclass(frozen=True)
class WrpOp:
    kind: str  # OP_NAMES value, e.g. "launch", "copy", "memset"
    kernel_key: str | None  # launches only
    dst_region: int | None  # region written by copies, fills and reductions; None for launches


@dataclass(frozen=True)
class WrpRegion:
    region_id: int
    element_size: int
    size: int
    has_initial_data: bool


def _sections(data: bytes) -> dict[int, tuple[int, int]]:
    if len(data) < _HEADER_SIZE:
        raise WrpFormatError(f"truncated .wrp header ({len(data)} bytes)")
    magic, _version, _flags, count, table = _HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        raise WrpFormatError(f"bad .wrp magic {magic!r}")
    if table > len(data) or count > (len(data) - table) // _SECTION.size:
        raise WrpFormatError("section table outside the file")
    out = {}
    for i in range(count):
        kind, _f, offset, size, _usize = _SECTION.unpack_from(data, table + i * _SECTION.size)
        if offset > len(data) or size > len(data) - offset:
            raise WrpFormatError(f"section {kind} outside the file")
        out[kind] = (offset, size)
    return out


def read_ops(data: bytes) -> list[WrpOp]:
    """Top-level operations in stream order (bodies of if/while are not expanded)."""
    offset, size = _sections(data).get(SECTION_OPERATIONS, (0, 0))
    if size < 4:
        return []
    (count,) = struct.unpack_from("<I", data, offset)
    pos, end = offset + 4, offset + size
    ops = []
    for i in range(count):
        if end - pos < _OP_HEADER.size:
            raise WrpFormatError(f"truncated operation {i}")
        op_type, total = _OP_HEADER.unpack_from(data, pos)
        if total < _OP_HEADER.size or total > end - pos:
            raise WrpFormatError(f"operation {i} has bad size {total}")
        key = dst = None
        if op_type == 1:
            if total < _LAUNCH_FIXED:
                raise WrpFormatError(f"truncated launch record {i}")
            key_len, _hash_len = _LAUNCH_LENS.unpack_from(data, pos + 64)
            if _LAUNCH_FIXED + key_len > total:
                raise WrpFormatError(f"launch record {i}: kernel key outside the record")
            key = data[pos + _LAUNCH_FIXED : pos + _LAUNCH_FIXED + key_len].decode("utf-8", "replace")
        elif op_type in _DST_REGION_OFFSET and _DST_REGION_OFFSET[op_type] + 4 <= total:
            (dst,) = struct.unpack_from("<i", data, pos + _DST_REGION_OFFSET[op_type])
        ops.append(WrpOp(OP_NAMES.get(op_type, f"op{op_type}"), key, dst))
        pos += total
    return ops


def read_regions(data: bytes) -> list[WrpRegion]:
    offset, size = _sections(data).get(SECTION_MEMORY, (0, 0))
    if size < 4:
        return []
    (count,) = struct.unpack_from("<I", data, offset)
    pos, end = offset + 4, offset + size
    regions = []
    for i in range(count):
        if end - pos < _REGION.size:
            raise WrpFormatError(f"truncated memory region {i}")
        rid, elem, nbytes, has_data = _REGION.unpack_from(data, pos)
        pos += _REGION.size
        if has_data:
            if nbytes > end - pos:
                raise WrpFormatError(f"memory region {rid}: data outside the section")
            pos += nbytes
        regions.append(WrpRegion(rid, elem, nbytes, bool(has_data)))
    return regions
