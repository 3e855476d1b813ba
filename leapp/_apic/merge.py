"""leapp/_apic/merge.py: rewrite a ``.wrp`` so that each piece of memory is one region.

APIC keys a region by the Python object that carries the memory, not by the
memory: ``wp.array(ptr=base.ptr + offset, ...)`` (a column view of a group
buffer, a quaternion view into a transform array) becomes a region of its
own, apart from its base and from other views of the same allocation. A
replay gives every region its own buffer, so a write through one view is not
seen through another, and a view into a traced tensor is not fed from it.

``merge_regions`` folds such regions into one: every reference to a folded
region (kernel-argument relocations, copies, fills, pointer locations)
becomes a reference to its target at ``offset + delta``; the target takes the
size and initial bytes of the whole piece of memory; bindings of folded
regions are dropped. Warp's own loader and leapp's exporter then both see one
buffer per allocation. The result is parsed again before it is returned.

NOTE: the record layouts are those ``leapp/_apic/wrp.py`` reads (warp-lang
1.19, APIC format 18). Operations whose region fields leapp does not decode
(scans, reductions, sorts, conditionals) cannot be rewritten: a capture that
holds one and needs a merge is refused.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping

from . import wrp as w

__all__ = ["merge_regions"]

_I32 = struct.Struct("<i")
_U64 = struct.Struct("<Q")
# op type -> ((region field offset, byte-offset field offset), ...) inside its record (apic_types.h)
_REGION_FIELDS = {
    w.OP_MEMCPY_D2D: ((8, 16), (12, 24)),
    w.OP_MEMSET: ((8, 16),),
    w.OP_MEMTILE: ((8, 16),),
    w.OP_MEMCPY_H2D: ((8, 16),),
}


def merge_regions(data: bytes, merges: Mapping[int, tuple[int, int]], sizes: Mapping[int, int],
                  snapshots: Mapping[int, bytes | None]) -> bytes:
    """A copy of the ``.wrp`` ``data`` with regions folded into others.

    Args:
        merges: folded region id -> (target region id, byte offset of the folded region inside the target); a
            region mapped to itself stays, and every reference to it moves by the offset (its memory starts
            before the first byte the capture saw of it).
        sizes: target region id -> its size in bytes after the merge (at least its old size).
        snapshots: target region id -> its initial bytes (``sizes`` long), or None to save it size-only.

    Raises:
        WrpError: the file is malformed, a merge names a missing or transient region, or the capture holds an
            operation whose region fields cannot be rewritten.
    """
    parsed = w.parse_wrp(data)
    _check_plan(parsed, merges, sizes, snapshots)
    _, version, flags, _, table_offset, device_type, target_arch = w._FILE_HEADER.unpack_from(data)
    sections = w._read_section_table(data, 3, table_offset)
    metadata = _rewrite_metadata(sections[w.SECTION_METADATA], merges)
    memory = _rewrite_memory(parsed, merges, sizes, snapshots)
    operations = _rewrite_operations(sections[w.SECTION_OPERATIONS], parsed, merges)
    body = [(w.SECTION_METADATA, metadata), (w.SECTION_MEMORY, memory), (w.SECTION_OPERATIONS, operations)]
    table_offset = w._FILE_HEADER.size
    offset = table_offset + len(body) * w._SECTION_ENTRY.size
    table = bytearray()
    for stype, section in body:
        table += w._SECTION_ENTRY.pack(stype, 0, offset, len(section), len(section))
        offset += len(section)
    out = (w._FILE_HEADER.pack(w.MAGIC, version, flags, len(body), table_offset, device_type, target_arch)
           + bytes(table) + b"".join(section for _, section in body))
    w.parse_wrp(out)  # every rewritten reference still lies inside its region
    return out


def _check_plan(parsed: w.WrpFile, merges, sizes, snapshots) -> None:
    for region_id, (target, delta) in merges.items():
        for rid, what in ((region_id, "folded"), (target, "target")):
            if rid not in parsed.regions:
                raise w.WrpError(f"cannot merge regions: {what} region {rid} is not in the capture")
        if target != region_id and merges.get(target, (target,))[0] != target:
            raise w.WrpError(f"cannot merge region {region_id} into {target}: the target is folded itself")
        if delta < 0 or delta > sizes.get(target, parsed.regions[target].size):
            raise w.WrpError(f"cannot merge region {region_id} into {target} at offset {delta}")
    allocated = {op.region for op in parsed.ops if isinstance(op, w.WrpAlloc)}
    for rid in set(merges) | {t for t, _ in merges.values()}:
        if rid in allocated or parsed.regions[rid].transient:
            raise w.WrpError(f"cannot merge region {rid}: it is allocated inside the capture")
    for target, size in sizes.items():
        if size < parsed.regions[target].size:
            raise w.WrpError(f"cannot shrink region {target} from {parsed.regions[target].size} to {size} bytes")
        snapshot = snapshots.get(target)
        if snapshot is not None and len(snapshot) != size:
            raise w.WrpError(f"initial bytes of region {target}: {len(snapshot)}, its size is {size}")
    if merges:
        other = [op for op in parsed.ops if isinstance(op, w.WrpOtherOp)]
        if other:
            raise w.WrpError(f"cannot merge regions of a capture holding {other[0].op_name} (operation "
                             f"{other[0].index}): leapp does not rewrite its region fields")


def _moved(merges, region_id: int, offset: int) -> tuple[int, int]:
    target = merges.get(region_id)
    return (region_id, offset) if target is None else (target[0], offset + target[1])


def _rewrite_metadata(data: bytes, merges) -> bytes:
    r = w._Reader(data, "metadata")
    r.u32("format version")
    r.string("producer version")
    r.u32("target arch")
    counts_at = r.pos
    num_modules, num_kernels, num_bindings, num_meshes, num_locations = (r.u32("count") for _ in range(5))
    for i in range(num_modules):
        for _ in range(3):
            r.string(f"module record {i}")
        r.u32("arch")
        for _ in range(3):
            r.string(f"module record {i}")
        r.take(2 + w._RECIPE_SIZE, f"module record {i}")
    for i in range(num_kernels):
        for _ in range(4):
            r.string(f"kernel record {i}")
        r.take(12, f"kernel record {i}")
    head = data[:r.pos]
    bindings = []
    for i in range(num_bindings):
        name = r.string(f"binding record {i} name")
        region = r.u32(f"binding record {i} region id")
        if merges.get(region, (region,))[0] == region:
            bindings.append((name, region))
    meshes = r.take(num_meshes * w._MESH.size, "mesh records")
    locations = []
    for i in range(num_locations):
        region, offset, stride, count = r.unpack(w._PTR_LOCATION, f"pointer-location record {i}")
        region, offset = _moved(merges, region, offset)
        locations.append(w._PTR_LOCATION.pack(region, offset, stride, count))
    out = bytearray(head)
    struct.pack_into("<I", out, counts_at + 8, len(bindings))
    for name, region in bindings:
        raw = name.encode("utf-8")
        out += struct.pack("<I", len(raw)) + raw + struct.pack("<I", region)
    return bytes(out) + meshes + b"".join(locations)


def _rewrite_memory(parsed: w.WrpFile, merges, sizes, snapshots) -> bytes:
    folded = {rid for rid, (target, _) in merges.items() if target != rid}
    out = bytearray(struct.pack("<I", len(parsed.regions) - len(folded)))
    for region in parsed.regions.values():
        if region.id in folded:
            continue
        size, snapshot = region.size, region.snapshot
        if region.id in sizes:
            size, snapshot = sizes[region.id], snapshots.get(region.id)
        out += w._REGION.pack(region.id, region.element_size, size, 0 if snapshot is None else 1)
        if snapshot is not None:
            out += snapshot
    return bytes(out)


def _rewrite_operations(data: bytes, parsed: w.WrpFile, merges) -> bytes:
    out = bytearray(data)
    pos = 4
    for op in parsed.ops:
        op_type, total = w._OP_HEADER.unpack_from(out, pos)
        if isinstance(op, w.WrpLaunch):
            _rewrite_launch(out, pos, merges)
        for region_at, offset_at in _REGION_FIELDS.get(op_type, ()):
            region = _I32.unpack_from(out, pos + region_at)[0]
            offset = _U64.unpack_from(out, pos + offset_at)[0]
            region, offset = _moved(merges, region, offset)
            _I32.pack_into(out, pos + region_at, region)
            _U64.pack_into(out, pos + offset_at, offset)
        pos += total
    return bytes(out)


def _rewrite_launch(out: bytearray, pos: int, merges) -> None:
    fields = w._LAUNCH.unpack_from(out, pos)
    is_forward, key_len, hash_len, num_params, num_relocs = fields[13], fields[15], fields[16], fields[17], fields[19]
    n_params = num_params * (1 if is_forward else 2)
    at = pos + w._LAUNCH.size + key_len + hash_len + n_params * w._PARAM.size
    for k in range(num_relocs):
        slot = at + k * w._RELOC.size
        _, region, region_offset, kind = w._RELOC.unpack_from(out, slot)
        if kind == w.RELOC_DATA_PTR:
            region, region_offset = _moved(merges, region, region_offset)
            _I32.pack_into(out, slot + 4, region)
            _U64.pack_into(out, slot + 8, region_offset)
