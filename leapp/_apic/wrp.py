"""leapp/_apic/wrp.py: a reader for Warp 1.19 API-capture files (``.wrp``, format version 18).

The ``.wrp`` written by ``wp.capture_save`` is the single record of what a Warp
segment did: memory regions, the ordered operation stream (kernel launches with
byte-exact argument blobs and relocation tables, memsets, copies, ...) and
module/kernel metadata. It is read with ``struct`` alone, so parsing needs
neither warp.so nor a GPU. The exporter uses the whole ``WrpFile``; the
recorder uses ``read_ops``, its short view of the same parse.

NOTE: the layouts below mirror ``warp/native/apic_types.h`` and the writer
``wp_apic_state_save`` in ``warp/native/apic.cpp`` of warp-lang 1.19. Every record
is range-checked before use; a malformed file raises ``WrpError`` naming the
section and the record, never an ``IndexError`` or ``struct.error``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from leapp.errors import ExportError

__all__ = [
    "FORMAT_VERSION",
    "SUPPORTED_WARP_SERIES",
    "DEVICE_CUDA",
    "DEVICE_CPU",
    "OP_NAMES",
    "RELOC_DATA_PTR",
    "RELOC_HANDLE",
    "RELOC_NULL",
    "WrpError",
    "WrpModule",
    "WrpKernel",
    "WrpRegion",
    "WrpReloc",
    "WrpParam",
    "WrpLaunch",
    "WrpMemcpy",
    "WrpMemset",
    "WrpMemtile",
    "WrpAlloc",
    "WrpMemcpyH2D",
    "WrpOtherOp",
    "WrpFile",
    "parse_wrp",
    "check_producer_version",
    "OP_KINDS",
    "OpSummary",
    "read_ops",
]

FORMAT_VERSION = 18  # APIC_FORMAT_VERSION of warp-lang 1.19 (and its minimum supported version)
SUPPORTED_WARP_SERIES = "1.19"  # leapp reads exactly what warp-lang 1.19.x writes
MAGIC = b"WRP1"

DEVICE_CUDA = 0  # APICDeviceType
DEVICE_CPU = 1

SECTION_METADATA = 0x01  # APICSectionType
SECTION_MEMORY = 0x02
SECTION_OPERATIONS = 0x03
_SECTION_NAMES = {SECTION_METADATA: "metadata", SECTION_MEMORY: "memory", SECTION_OPERATIONS: "operations"}

RELOC_DATA_PTR = 1  # APICRelocKind
RELOC_HANDLE = 2
RELOC_NULL = 3
_RELOC_NAMES = {RELOC_DATA_PTR: "DATA_PTR", RELOC_HANDLE: "HANDLE", RELOC_NULL: "NULL"}

# APICOpType -> a name users recognise (the Warp call that records it).
OP_NAMES = {
    1: "KERNEL_LAUNCH (wp.launch)",
    2: "MEMCPY_H2D (host-to-device copy)",
    3: "MEMCPY_D2H (device-to-host copy)",
    4: "MEMCPY_D2D (wp.copy)",
    5: "MEMSET (array.zero_ / byte fill)",
    6: "ALLOC (allocation inside the capture)",
    7: "IF (wp.capture_if)",
    8: "WHILE (wp.capture_while)",
    9: "SCAN (wp.utils.array_scan)",
    10: "MEMTILE (array.fill_)",
    11: "SEGMENTED_SORT (wp.utils.segmented_sort_pairs)",
    12: "RADIX_SORT (wp.utils.radix_sort_pairs)",
    13: "RUNLENGTH_ENCODE (wp.utils.runlength_encode)",
    14: "BSR_FROM_TRIPLETS (warp.sparse.bsr_set_from_triplets)",
    15: "BSR_TRANSPOSE (warp.sparse.bsr_transpose)",
    16: "REDUCTION (wp.utils.array_sum / array_inner)",
    17: "BVH_REFIT (wp.Bvh.refit)",
    18: "BVH_REBUILD (wp.Bvh.rebuild)",
    19: "HASH_GRID_UPDATE (wp.HashGrid.build)",
}
OP_KERNEL_LAUNCH, OP_MEMCPY_H2D, OP_MEMCPY_D2D, OP_MEMSET, OP_ALLOC, OP_MEMTILE = 1, 2, 4, 5, 6, 10
OP_SCAN, OP_REDUCTION = 9, 16

# APICOpType -> the short name a recorded segment lists in ``captured_ops`` (leapp/_contract/records.py).
OP_KINDS = {
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
# Undecoded ops that write a region -> byte offset of the int32 destination region id in their record.
_OTHER_DST_OFFSET = {OP_SCAN: 8, OP_REDUCTION: 16}

# Packed little-endian layouts (apic_types.h, #pragma pack(1)); sizes are checked below.
_FILE_HEADER = struct.Struct("<4sIIIQB3xI32x")  # APICFileHeader, 64 bytes
_SECTION_ENTRY = struct.Struct("<IIQQQ")  # APICSectionEntry, 32 bytes
_OP_HEADER = struct.Struct("<II")  # APICOpHeader, 8 bytes
_LAUNCH = struct.Struct("<II4IiQQiiiiBB2xHHHHII")  # APICLaunchRecord, 80 bytes
_PARAM = struct.Struct("<HHIII")  # APICLaunchParamRecord, 16 bytes
_RELOC = struct.Struct("<IiQB7x")  # APICLaunchPtrLocation, 24 bytes
_MEMCPY_H2D = struct.Struct("<IIiIQQ")  # APICMemcpyH2DRecord, 32 bytes + data
_MEMCPY_D2D = struct.Struct("<IIiiQQQ")  # APICMemcpyD2DRecord, 40 bytes
_MEMSET = struct.Struct("<IIiiQQ")  # APICMemsetRecord, 32 bytes
_MEMTILE = struct.Struct("<IIiIQQ")  # APICMemtileRecord, 32 bytes + pattern
_ALLOC = struct.Struct("<IIiIQ")  # APICAllocRecord, 24 bytes
_REGION = struct.Struct("<IIQB7x")  # APICMemoryRegionRecord, 24 bytes + data
_MESH = struct.Struct("<iiBBHIIIQ")  # APICMeshRecord, 32 bytes
_PTR_LOCATION = struct.Struct("<IQQQ")  # APICMemoryPtrLocation as written field by field, 28 bytes
_RECIPE_SIZE = 16  # APICCudaCompileRecipe

for _s, _n in ((_FILE_HEADER, 64), (_SECTION_ENTRY, 32), (_LAUNCH, 80), (_PARAM, 16), (_RELOC, 24),
               (_MEMCPY_H2D, 32), (_MEMCPY_D2D, 40), (_MEMSET, 32), (_MEMTILE, 32), (_ALLOC, 24),
               (_REGION, 24), (_MESH, 32), (_PTR_LOCATION, 28)):
    assert _s.size == _n, (_s.format, _s.size, _n)


class WrpError(ExportError):
    """A ``.wrp`` file is malformed, truncated or from an unsupported Warp release."""


# --------------------------------------------------------------------------- records


@dataclass(frozen=True)
class WrpModule:
    """A module the capture launched kernels from (CUDA saves carry binary metadata)."""

    module_hash: str  # full hex hash of the loaded variant
    name: str
    binary_filename: str
    target_arch: int  # SM version the saved binary targets, 0 on CPU
    binary_digest: str
    source_filename: str
    source_digest: str
    binary_kind: int  # APICCudaBinaryKind
    fallback_reason: int
    compile_recipe: bytes  # raw APICCudaCompileRecipe (16 bytes)


@dataclass(frozen=True)
class WrpKernel:
    """One captured kernel: its key, its module variant and exact entry symbols."""

    key: str
    module_hash: str
    forward_name: str  # e.g. "add_7bfd6746_cpu_forward" (CPU) or "..._cuda_kernel_forward"
    backward_name: str
    forward_smem_bytes: int
    backward_smem_bytes: int
    block_dim: int  # block_dim of the captured variant (the module hash depends on it)


@dataclass(frozen=True)
class WrpRegion:
    """A memory region: a base allocation that ops address as (region id, byte offset)."""

    id: int
    size: int
    element_size: int
    snapshot: bytes | None  # content when the graph was saved; None for transient regions

    @property
    def transient(self) -> bool:
        """Saved size-only: allocated inside the capture, content regenerated by its ops."""
        return self.snapshot is None


@dataclass(frozen=True)
class WrpReloc:
    """An 8-byte slot of a parameter blob patched at replay time."""

    offset: int  # byte offset inside the parameter's value blob
    kind: int  # RELOC_DATA_PTR, RELOC_HANDLE or RELOC_NULL
    region_id: int  # DATA_PTR only (-1 otherwise)
    region_offset: int  # DATA_PTR: byte offset in the region; HANDLE: captured handle id

    @property
    def kind_name(self) -> str:
        return _RELOC_NAMES[self.kind]


@dataclass(frozen=True)
class WrpParam:
    """One kernel argument: its exact bytes as the live launch passed them."""

    index: int  # 1-based kernelParams index (0 is launch_bounds_t)
    value: bytes
    align: int
    relocs: tuple[WrpReloc, ...]


@dataclass(frozen=True)
class WrpLaunch:
    """APIC_OP_KERNEL_LAUNCH. CPU captures record max_blocks/block_dim/grid_stride/smem as 0."""

    index: int  # position in the operation stream
    kernel_key: str
    module_hash: str
    shape: tuple[int, ...]  # launch_bounds_t<ndim>::shape
    ndim: int  # kernel dimensionality N of launch_bounds_t<N>
    size: int  # launch_bounds_t::size (includes folded extra dims)
    dim: int  # total threads
    max_blocks: int
    block_dim: int
    smem_bytes: int
    grid_stride: int
    is_forward: bool
    cluster_dim: int
    params: tuple[WrpParam, ...]
    adj_params: tuple[WrpParam, ...]

    op_name = "launch"
    op_type = OP_KERNEL_LAUNCH

    @property
    def coord_mult(self) -> int:
        """Threads sharing one coordinate tuple, as Warp's replay derives it."""
        prod = 1
        for extent in self.shape:
            prod *= extent
        return self.size // prod if prod > 0 and self.size > prod else 1


@dataclass(frozen=True)
class WrpMemcpy:
    """APIC_OP_MEMCPY_D2D (``wp.copy`` between contiguous arrays)."""

    index: int
    dst_region: int
    dst_offset: int
    src_region: int
    src_offset: int
    size: int
    op_name = "copy"
    op_type = OP_MEMCPY_D2D


@dataclass(frozen=True)
class WrpMemset:
    """APIC_OP_MEMSET: bytes [offset, offset + size) set to the low byte of value."""

    index: int
    region: int
    offset: int
    size: int
    value: int
    op_name = "memset"
    op_type = OP_MEMSET


@dataclass(frozen=True)
class WrpMemtile:
    """APIC_OP_MEMTILE: ``count`` copies of ``pattern`` written from ``offset`` (``fill_``)."""

    index: int
    region: int
    offset: int
    count: int
    pattern: bytes
    op_name = "memtile"
    op_type = OP_MEMTILE


@dataclass(frozen=True)
class WrpAlloc:
    """APIC_OP_ALLOC: a region allocated inside the capture."""

    index: int
    region: int
    size: int
    op_name = "alloc"
    op_type = OP_ALLOC


@dataclass(frozen=True)
class WrpMemcpyH2D:
    """APIC_OP_MEMCPY_H2D: inline host bytes copied into a region."""

    index: int
    dst_region: int
    dst_offset: int
    data: bytes
    op_name = "MEMCPY_H2D (host-to-device copy)"
    op_type = OP_MEMCPY_H2D


@dataclass(frozen=True)
class WrpOtherOp:
    """An op leapp recognises by type but does not decode (sorts, scans, IF/WHILE, ...)."""

    index: int
    op_type: int
    raw: bytes

    @property
    def op_name(self) -> str:
        return OP_NAMES[self.op_type]


WrpOp = WrpLaunch | WrpMemcpy | WrpMemset | WrpMemtile | WrpAlloc | WrpMemcpyH2D | WrpOtherOp


@dataclass
class WrpFile:
    """A parsed ``.wrp``: what one captured Warp segment did, in order."""

    version: int
    producer: str  # Warp version that wrote the file, e.g. "1.19.0"
    device_type: int  # DEVICE_CUDA or DEVICE_CPU
    target_arch: int  # CUDA SM of the capture, 0 on CPU
    modules: dict[str, WrpModule] = field(default_factory=dict)  # by module hash
    kernels: list[WrpKernel] = field(default_factory=list)
    bindings: dict[str, int] = field(default_factory=dict)  # name -> region id (capture_save inputs/outputs)
    mesh_count: int = 0
    handle_locations: list[tuple[int, int, int, int]] = field(default_factory=list)  # region, offset, stride, count
    regions: dict[int, WrpRegion] = field(default_factory=dict)
    ops: list[WrpOp] = field(default_factory=list)

    @property
    def device(self) -> str:
        return "cpu" if self.device_type == DEVICE_CPU else "cuda"

    def kernel(self, module_hash: str, key: str) -> WrpKernel:
        """The kernel metadata record of a launch (every launch has one in a valid file)."""
        for k in self.kernels:
            if k.module_hash == module_hash and k.key == key:
                return k
        raise WrpError(f"invalid .wrp: no kernel record for kernel '{key}' of module {module_hash[:7]}")


# --------------------------------------------------------------------------- reading


class _Reader:
    """Bounds-checked cursor over one section; errors name the section and the record."""

    def __init__(self, data: bytes, section: str):
        self.data = data
        self.pos = 0
        self.section = section

    def remaining(self) -> int:
        return len(self.data) - self.pos

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or n > self.remaining():
            raise WrpError(
                f"invalid .wrp {self.section} section: truncated {what} "
                f"(needs {n} bytes at offset {self.pos}, {self.remaining()} left)"
            )
        chunk = self.data[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def unpack(self, layout: struct.Struct, what: str) -> tuple:
        return layout.unpack(self.take(layout.size, what))

    def u32(self, what: str) -> int:
        return struct.unpack("<I", self.take(4, what))[0]

    def string(self, what: str) -> str:
        n = self.u32(what + " length")
        raw = self.take(n, what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise WrpError(f"invalid .wrp {self.section} section: {what} is not UTF-8") from e


def check_producer_version(producer: str) -> None:
    """Reject captures written by a Warp release other than 1.19.x."""
    parts = producer.split(".")
    if len(parts) < 2 or ".".join(parts[:2]) != SUPPORTED_WARP_SERIES:
        raise WrpError(
            f"unsupported .wrp producer: written by Warp {producer!r}, "
            f"but leapp supports exactly warp-lang {SUPPORTED_WARP_SERIES}.x "
            f"(APIC format version {FORMAT_VERSION}); re-capture with warp-lang {SUPPORTED_WARP_SERIES}"
        )


def parse_wrp(data: bytes) -> WrpFile:
    """Parse and validate the bytes of a ``.wrp`` file.

    Raises:
        WrpError: the file is truncated or malformed (the message names the
            section and the record), or it was written by a Warp release other
            than 1.19.x.
    """
    data = bytes(data)
    if len(data) < _FILE_HEADER.size:
        raise WrpError(f"invalid .wrp: {len(data)} bytes is shorter than the {_FILE_HEADER.size}-byte header")
    magic, version, _flags, num_sections, table_offset, device_type, target_arch = _FILE_HEADER.unpack_from(data)
    if magic != MAGIC:
        raise WrpError(f"invalid .wrp: bad magic {magic!r} (expected {MAGIC!r}); not a Warp API-capture file")
    if version != FORMAT_VERSION:
        raise WrpError(
            f"unsupported .wrp format version {version}: leapp reads APIC format version {FORMAT_VERSION} "
            f"(warp-lang {SUPPORTED_WARP_SERIES}.x)"
        )
    if device_type not in (DEVICE_CUDA, DEVICE_CPU):
        raise WrpError(f"invalid .wrp header: unknown device type {device_type}")
    if (device_type == DEVICE_CPU) != (target_arch == 0):
        raise WrpError(f"invalid .wrp header: device type {device_type} with target arch {target_arch}")

    sections = _read_section_table(data, num_sections, table_offset)
    wrp = _parse_metadata(sections[SECTION_METADATA], device_type, target_arch)
    wrp.version = version
    wrp.regions = _parse_memory(sections[SECTION_MEMORY])
    wrp.ops = _parse_operations(sections[SECTION_OPERATIONS])
    _check_references(wrp)
    return wrp


def _read_section_table(data: bytes, num_sections: int, table_offset: int) -> dict[int, bytes]:
    if num_sections > 64:
        raise WrpError(f"invalid .wrp section table: {num_sections} sections")
    end = table_offset + num_sections * _SECTION_ENTRY.size
    if table_offset < _FILE_HEADER.size or end > len(data):
        raise WrpError(
            f"invalid .wrp section table: {num_sections} entries at offset {table_offset} "
            f"do not fit in {len(data)} bytes"
        )
    sections: dict[int, bytes] = {}
    for i in range(num_sections):
        stype, _sflags, offset, size, uncompressed = _SECTION_ENTRY.unpack_from(data, table_offset + i * 32)
        name = _SECTION_NAMES.get(stype)
        if name is None:
            raise WrpError(f"invalid .wrp section table: entry {i} has unknown section type {stype:#x}")
        if stype in sections:
            raise WrpError(f"invalid .wrp section table: duplicate {name} section (entry {i})")
        if uncompressed != size:
            raise WrpError(f"invalid .wrp {name} section: compressed sections are not supported")
        if offset > len(data) or size > len(data) - offset:
            raise WrpError(
                f"invalid .wrp {name} section: range [{offset}, {offset}+{size}) is outside the "
                f"{len(data)}-byte file (truncated?)"
            )
        sections[stype] = data[offset : offset + size]
    for stype, name in _SECTION_NAMES.items():
        if stype not in sections:
            raise WrpError(f"invalid .wrp: missing {name} section")
    return sections


def _parse_metadata(data: bytes, device_type: int, header_arch: int) -> WrpFile:
    r = _Reader(data, "metadata")
    version = r.u32("format version")
    if version != FORMAT_VERSION:
        raise WrpError(f"invalid .wrp metadata section: format version {version} (expected {FORMAT_VERSION})")
    producer = r.string("producer version")
    check_producer_version(producer)
    target_arch = r.u32("target arch")
    if target_arch != header_arch:
        raise WrpError(
            f"invalid .wrp metadata section: target arch {target_arch} differs from the header's {header_arch}"
        )
    counts = [r.u32(what) for what in ("module count", "kernel count", "binding count", "mesh count",
                                        "pointer-location count")]
    num_modules, num_kernels, num_bindings, num_meshes, num_locations = counts
    wrp = WrpFile(version=version, producer=producer, device_type=device_type, target_arch=target_arch)

    for i in range(num_modules):
        what = f"module record {i}"
        mod = WrpModule(
            module_hash=r.string(what + " hash"),
            name=r.string(what + " name"),
            binary_filename=r.string(what + " binary filename"),
            target_arch=r.u32(what + " arch"),
            binary_digest=r.string(what + " binary digest"),
            source_filename=r.string(what + " source filename"),
            source_digest=r.string(what + " source digest"),
            binary_kind=r.take(1, what + " binary kind")[0],
            fallback_reason=r.take(1, what + " fallback reason")[0],
            compile_recipe=r.take(_RECIPE_SIZE, what + " compile recipe"),
        )
        if mod.module_hash in wrp.modules:
            raise WrpError(f"invalid .wrp metadata section: duplicate module hash in module record {i}")
        wrp.modules[mod.module_hash] = mod

    for i in range(num_kernels):
        what = f"kernel record {i}"
        key, module_hash = r.string(what + " key"), r.string(what + " module hash")
        fwd, bwd = r.string(what + " forward name"), r.string(what + " backward name")
        fwd_smem, bwd_smem, block_dim = (r.u32(what + " " + f) for f in ("forward smem", "backward smem", "block_dim"))
        wrp.kernels.append(WrpKernel(key, module_hash, fwd, bwd, fwd_smem, bwd_smem, block_dim))

    for i in range(num_bindings):
        name = r.string(f"binding record {i} name")
        wrp.bindings[name] = r.u32(f"binding record {i} region id")

    for i in range(num_meshes):
        r.unpack(_MESH, f"mesh record {i}")
    wrp.mesh_count = num_meshes

    for i in range(num_locations):
        wrp.handle_locations.append(r.unpack(_PTR_LOCATION, f"pointer-location record {i}"))

    if r.remaining():
        raise WrpError(f"invalid .wrp metadata section: {r.remaining()} trailing bytes after the last record")
    return wrp


def _parse_memory(data: bytes) -> dict[int, WrpRegion]:
    r = _Reader(data, "memory")
    count = r.u32("region count")
    regions: dict[int, WrpRegion] = {}
    for i in range(count):
        region_id, element_size, size, has_data = r.unpack(_REGION, f"region record {i}")
        if has_data > 1:
            raise WrpError(f"invalid .wrp memory section: region {region_id} has initial-data flag {has_data}")
        if region_id in regions:
            raise WrpError(f"invalid .wrp memory section: duplicate region id {region_id} (record {i})")
        snapshot = r.take(size, f"initial data of region {region_id}") if has_data else None
        regions[region_id] = WrpRegion(region_id, size, element_size, snapshot)
    if r.remaining():
        raise WrpError(f"invalid .wrp memory section: {r.remaining()} trailing bytes after the last region")
    return regions


def _parse_operations(data: bytes) -> list:
    r = _Reader(data, "operations")
    count = r.u32("operation count")
    ops = []
    for i in range(count):
        if r.remaining() < _OP_HEADER.size:
            raise WrpError(f"invalid .wrp operations section: truncated header of operation {i}")
        op_type, total = _OP_HEADER.unpack_from(r.data, r.pos)
        if total < _OP_HEADER.size or total > r.remaining():
            raise WrpError(
                f"invalid .wrp operations section: operation {i} (type {op_type}) declares {total} bytes, "
                f"{r.remaining()} left (truncated?)"
            )
        record = r.take(total, f"operation {i}")
        ops.append(_parse_op(i, op_type, record))
    if r.remaining():
        raise WrpError(f"invalid .wrp operations section: {r.remaining()} trailing bytes after operation {count - 1}")
    return ops


def _fixed(record: bytes, layout: struct.Struct, i: int, name: str) -> tuple:
    if len(record) < layout.size:
        raise WrpError(f"invalid .wrp operations section: {name} record of operation {i} is truncated "
                       f"({len(record)} of {layout.size} bytes)")
    return layout.unpack_from(record)


def _parse_op(i: int, op_type: int, record: bytes):
    if op_type == OP_KERNEL_LAUNCH:
        return _parse_launch(i, record)
    if op_type == OP_MEMCPY_D2D:
        _, _, dst, src, dst_off, src_off, size = _fixed(record, _MEMCPY_D2D, i, "memcpy")
        return WrpMemcpy(i, dst, dst_off, src, src_off, size)
    if op_type == OP_MEMSET:
        _, _, region, value, offset, size = _fixed(record, _MEMSET, i, "memset")
        return WrpMemset(i, region, offset, size, value)
    if op_type == OP_MEMTILE:
        _, _, region, srcsize, offset, count = _fixed(record, _MEMTILE, i, "memtile")
        if srcsize == 0 or _MEMTILE.size + srcsize > len(record):
            raise WrpError(f"invalid .wrp operations section: memtile pattern of operation {i} "
                           f"({srcsize} bytes) overflows its record")
        return WrpMemtile(i, region, offset, count, record[_MEMTILE.size : _MEMTILE.size + srcsize])
    if op_type == OP_ALLOC:
        _, _, region, _, size = _fixed(record, _ALLOC, i, "alloc")
        return WrpAlloc(i, region, size)
    if op_type == OP_MEMCPY_H2D:
        _, _, dst, _, dst_off, size = _fixed(record, _MEMCPY_H2D, i, "memcpy H2D")
        if size > len(record) - _MEMCPY_H2D.size:
            raise WrpError(f"invalid .wrp operations section: H2D data of operation {i} overflows its record")
        return WrpMemcpyH2D(i, dst, dst_off, record[_MEMCPY_H2D.size : _MEMCPY_H2D.size + size])
    if op_type in OP_NAMES:
        return WrpOtherOp(i, op_type, record)
    raise WrpError(f"invalid .wrp operations section: unknown op type {op_type} at operation {i}")


def _parse_launch(i: int, record: bytes) -> WrpLaunch:
    (_, _, s0, s1, s2, s3, ndim, size, dim, max_blocks, block_dim, smem, grid_stride, is_forward, cluster_dim,
     key_len, hash_len, num_params, _pad2, num_relocs, value_size) = _fixed(record, _LAUNCH, i, "kernel launch")
    where = f"kernel launch (operation {i})"
    if not 1 <= ndim <= 4:
        raise WrpError(f"invalid .wrp {where}: kernel dimensionality {ndim} is outside 1..4")
    r = _Reader(record, "operations")
    r.pos = _LAUNCH.size
    key = r.take(key_len, f"kernel key of {where}").decode("utf-8", "replace")
    module_hash = r.take(hash_len, f"module hash of {where}").decode("utf-8", "replace")
    where = f"kernel launch '{key}' (operation {i})"
    n_adj = 0 if is_forward else num_params
    bindings = [r.unpack(_PARAM, f"parameter record {j} of {where}") for j in range(num_params + n_adj)]
    relocs = [r.unpack(_RELOC, f"relocation {j} of {where}") for j in range(num_relocs)]
    values = r.take(value_size, f"argument values of {where}")
    if r.remaining():
        raise WrpError(f"invalid .wrp {where}: {r.remaining()} trailing bytes in the record")

    params = []
    cursor = 0
    for j, (index, n_relocs, v_off, v_size, v_align) in enumerate(bindings):
        expected = j + 1
        if index != expected:
            raise WrpError(f"invalid .wrp {where}: parameter record {j} has index {index} (expected {expected})")
        if v_off > value_size or v_size > value_size - v_off:
            raise WrpError(f"invalid .wrp {where}: value of parameter {index} [{v_off}, +{v_size}) "
                           f"is outside the {value_size}-byte value section")
        if v_align not in (0, 1, 2, 4, 8, 16):
            raise WrpError(f"invalid .wrp {where}: parameter {index} has alignment {v_align}")
        if cursor + n_relocs > num_relocs:
            raise WrpError(f"invalid .wrp {where}: parameter {index} claims relocations beyond the table")
        rel = []
        for k, (off, region_id, region_offset, kind) in enumerate(relocs[cursor : cursor + n_relocs]):
            if kind not in _RELOC_NAMES:
                raise WrpError(f"invalid .wrp {where}: relocation {k} of parameter {index} has unknown kind {kind}")
            if off + 8 > v_size:
                raise WrpError(f"invalid .wrp {where}: relocation {k} of parameter {index} at byte {off} "
                               f"is outside the {v_size}-byte value")
            rel.append(WrpReloc(off, kind, region_id, region_offset))
        cursor += n_relocs
        params.append(WrpParam(index, values[v_off : v_off + v_size], v_align or 8, tuple(rel)))
    if cursor != num_relocs:
        raise WrpError(f"invalid .wrp {where}: {num_relocs} relocations but parameters claim {cursor}")

    return WrpLaunch(
        index=i, kernel_key=key, module_hash=module_hash, shape=(s0, s1, s2, s3)[:ndim], ndim=ndim, size=size,
        dim=dim, max_blocks=max_blocks, block_dim=block_dim, smem_bytes=smem, grid_stride=grid_stride,
        is_forward=bool(is_forward), cluster_dim=cluster_dim, params=tuple(params[:num_params]),
        adj_params=tuple(params[num_params:]),
    )


def _check_references(wrp: WrpFile) -> None:
    """Every region an op names exists and every byte range it touches lies inside it."""

    def check(region_id: int, offset: int, nbytes: int, what: str) -> None:
        region = wrp.regions.get(region_id)
        if region is None:
            raise WrpError(f"invalid .wrp: {what} refers to region {region_id}, absent from the memory section")
        if offset > region.size or nbytes > region.size - offset:
            raise WrpError(f"invalid .wrp: {what} touches bytes [{offset}, {offset}+{nbytes}) "
                           f"of the {region.size}-byte region {region_id}")

    for name, region_id in wrp.bindings.items():
        if region_id not in wrp.regions:
            raise WrpError(f"invalid .wrp: binding '{name}' refers to missing region {region_id}")
    for op in wrp.ops:
        if isinstance(op, WrpLaunch):
            wrp.kernel(op.module_hash, op.kernel_key)
            for p in op.params + op.adj_params:
                for k, rel in enumerate(p.relocs):
                    if rel.kind == RELOC_DATA_PTR:
                        what = f"relocation {k} of parameter {p.index} of launch '{op.kernel_key}' (operation {op.index})"
                        check(rel.region_id, rel.region_offset, 0, what)
        elif isinstance(op, WrpMemcpy):
            check(op.dst_region, op.dst_offset, op.size, f"copy destination (operation {op.index})")
            check(op.src_region, op.src_offset, op.size, f"copy source (operation {op.index})")
        elif isinstance(op, WrpMemset):
            check(op.region, op.offset, op.size, f"memset (operation {op.index})")
        elif isinstance(op, WrpMemtile):
            check(op.region, op.offset, op.count * len(op.pattern), f"memtile (operation {op.index})")
        elif isinstance(op, WrpMemcpyH2D):
            check(op.dst_region, op.dst_offset, len(op.data), f"H2D copy (operation {op.index})")


# --------------------------------------------------------------------------- the recorder's view


@dataclass(frozen=True)
class OpSummary:
    """What the recorder needs of one op: its short kind, the launched kernel and the region it writes."""

    kind: str  # OP_KINDS value, e.g. "launch", "copy", "memset"
    kernel_key: str | None  # launches only
    dst_region: int | None  # region written by copies, fills, scans and reductions; None for launches


def read_ops(data: bytes) -> list[OpSummary]:
    """Top-level operations of a ``.wrp`` in stream order (IF/WHILE bodies are not expanded).

    Raises:
        WrpError: as ``parse_wrp``.
    """
    return [OpSummary(OP_KINDS[op.op_type], getattr(op, "kernel_key", None), _written_region(op))
            for op in parse_wrp(data).ops]


def _written_region(op) -> int | None:
    if isinstance(op, (WrpMemcpy, WrpMemcpyH2D)):
        return op.dst_region
    if isinstance(op, (WrpMemset, WrpMemtile)):
        return op.region
    offset = _OTHER_DST_OFFSET.get(op.op_type)
    if offset is None or offset + 4 > len(op.raw):
        return None
    return struct.unpack_from("<i", op.raw, offset)[0]
