"""leapp/_export/segment_bundle.py: one captured Warp segment -> one segment bundle.

The ``.wrp`` of a segment says what ran (launches with exact argument bytes and
relocations, copies, memsets); the recorder says which memory regions are the
segment's inputs, outputs, constants and scratch. This module maps regions to
bundle buffers, launches to ``launch`` ops with CUDA grids and packed
parameters, compiles the kernels each module variant launches with Warp's
NVRTC and writes the bundle of docs/bundle-format.md.

NOTE: a CPU capture records CPU launch facts (block_dim 1, no grid). The CUDA
replay uses the block_dim of the variant we compile (the module hash depends
on it): the captured one when it is > 1, else 256 (Warp's CUDA default), and
the grid follows docs/warp-internals.md ("Launch grids") for that block_dim.
NOTE: output init "zero" is inferred from the region's snapshot, which
``capture_save`` takes before the captured work runs (CPU captures never run
during capture; the recorder saves before ``capture_launch``), except for
outputs the recorder marks ``undefined_before`` (init "none").
"""

from __future__ import annotations

import importlib.metadata
import math
import os
import struct
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from leapp import _warp_private as wpp
from leapp._export import cpu_code, cuda_code
from leapp._export.source_paths import recorded_source
from leapp._export.warp_abi import WarpABI, abi_for_version
from leapp._apic.wrp import (
    RELOC_DATA_PTR,
    RELOC_HANDLE,
    WrpAlloc,
    WrpFile,
    WrpLaunch,
    WrpMemcpy,
    WrpMemset,
    WrpMemtile,
    parse_wrp,
)
from leapp.bundle.format import COPY_ONLY_NOTE, ptx_isa_of
from leapp.bundle.manifest import grid_for  # the grid Warp launches (one rule for writer and readers)
from leapp.errors import ExportError

__all__ = ["build_segment_bundle", "build_bundle_from_wrp", "torch_dtype_name", "DEFAULT_CUDA_BLOCK_DIM"]

DEFAULT_CUDA_BLOCK_DIM = 256  # Warp's CUDA default (_resolve_launch_block_dim)
_SIGNED_OF_UNSIGNED = {"uint16": "int16", "uint32": "int32", "uint64": "int64"}


def torch_dtype_name(dtype) -> str:
    """Bundle dtype name of a torch dtype ("float32"); Warp's unsigned ints travel as signed ones."""
    name = str(dtype).removeprefix("torch.")
    return _SIGNED_OF_UNSIGNED.get(name, name)


def build_segment_bundle(segment, *, cuda_block_dim: int | None = None, archs: tuple[int, ...] | None = None) -> bytes:
    """The bundle bytes of a recorded segment (``leapp._contract.records.SegmentRecord``).

    Args:
        segment: the recorder's SegmentRecord (its ``.wrp`` bytes, kernels and region roles).
        cuda_block_dim: CUDA block size for kernels captured on CPU with block_dim 1 (default 256).
        archs: cubin targets (default: sm_75/80/86/90/100/110/120 or $LEAPP_CUDA_ARCHS).

    Raises:
        ExportError: naming the segment and its source line, for anything that
            cannot be replayed (an unsupported Warp op, a mesh/volume handle, a
            multi-byte fill, a region without a role, a malformed .wrp, ...).
    """
    where = _where(segment.id, segment.source)
    try:
        wrp = parse_wrp(segment.wrp)
    except ExportError as e:
        raise ExportError(f"{where}: {e}") from e
    return build_bundle_from_wrp(
        wrp, segment_id=segment.id, source=segment.source, kernels=segment.kernels, inputs=segment.inputs,
        outputs=segment.outputs, constants=segment.constants, scratch=segment.scratch,
        cuda_block_dim=cuda_block_dim, archs=archs,
    )


def build_bundle_from_wrp(
    wrp: WrpFile,
    *,
    segment_id: str,
    source: str,
    kernels: Sequence,
    inputs: Sequence,
    outputs: Sequence,
    constants: Mapping[int, bytes] | None = None,
    scratch: Mapping[int, int] | None = None,
    cuda_block_dim: int | None = None,
    archs: tuple[int, ...] | None = None,
) -> bytes:
    """The bundle bytes of a parsed capture plus its region roles.

    Args:
        wrp: the parsed ``.wrp`` of the segment.
        segment_id, source: written to the manifest and to every error message.
        kernels: the live kernels the segment launched (``KernelRef``s or ``wp.Kernel``s).
        inputs, outputs: ``SegmentIO``s (``spec``: TensorSpec, ``region_id``, ``nbytes``), in signature order.
        constants: region id -> bytes of untraced arrays the segment reads.
        scratch: region id -> bytes of regions allocated inside the segment.
        cuda_block_dim, archs: see ``build_segment_bundle``.
    """
    from leapp.bundle import BundleError, write_bundle

    builder = make_builder(wrp, segment_id=segment_id, source=source, kernels=kernels, inputs=inputs,
                           outputs=outputs, constants=constants, scratch=scratch, cuda_block_dim=cuda_block_dim,
                           archs=archs)
    manifest = builder.manifest()
    try:
        return write_bundle(manifest, builder.blobs, compress=compress_binaries())
    except BundleError as e:
        raise ExportError(f"{builder.where}: the bundle breaks the format: {e}") from e


COMPRESSION_ENV = "LEAPP_BUNDLE_COMPRESSION"  # "lz4" (default) or "none" (a bundle version-1 readers read)


def compress_binaries() -> bool:
    """Whether exported bundles store their binaries LZ4-compressed ($LEAPP_BUNDLE_COMPRESSION, default lz4)."""
    value = os.environ.get(COMPRESSION_ENV, "").strip().lower()
    if value in ("", "lz4"):
        return True
    if value == "none":
        return False
    raise ExportError(f"{COMPRESSION_ENV}={value!r}: expected 'lz4' (the default: compressed binaries, bundle "
                      "readers of version 2) or 'none' (raw binaries, readable by leapp's version-1 readers too)")


def make_builder(wrp: WrpFile, *, segment_id: str, source: str, kernels: Sequence, inputs: Sequence,
                 outputs: Sequence, constants: Mapping[int, bytes] | None = None,
                 scratch: Mapping[int, int] | None = None, cuda_block_dim: int | None = None,
                 archs: tuple[int, ...] | None = None) -> "_Builder":
    """A builder holding the manifest (``manifest()``, ``launch_facts``) and ``blobs`` of one capture."""
    builder = _Builder(wrp, segment_id, source, kernels, constants or {}, scratch or {}, cuda_block_dim, archs)
    builder.add_signature(inputs, outputs)
    builder.add_ops()
    builder.add_cpu_code()
    return builder


def segment_builder(segment, *, cuda_block_dim: int | None = None, archs: tuple[int, ...] | None = None) -> "_Builder":
    """``make_builder`` for a recorded SegmentRecord (its .wrp parsed here)."""
    where = _where(segment.id, segment.source)
    try:
        wrp = parse_wrp(segment.wrp)
    except ExportError as e:
        raise ExportError(f"{where}: {e}") from e
    return make_builder(wrp, segment_id=segment.id, source=segment.source, kernels=segment.kernels,
                        inputs=segment.inputs, outputs=segment.outputs, constants=segment.constants,
                        scratch=segment.scratch, cuda_block_dim=cuda_block_dim, archs=archs)


def _where(segment_id: str, source: str) -> str:
    return f"segment {segment_id}" + (f" ({source})" if source else "")


def _leapp_version() -> str:
    try:
        return importlib.metadata.version("leapp")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - source checkout without install
        return "0+unknown"


@dataclass
class _Kernel:
    module: int  # index into modules
    compiled: cuda_code.CompiledModule
    kernel: object  # live wp.Kernel
    block_dim: int


@dataclass
class _Builder:
    """Accumulates buffers, blobs, modules, kernels and ops of one bundle."""

    wrp: WrpFile
    segment_id: str
    source: str
    kernel_refs: Sequence
    constants: Mapping[int, bytes]
    scratch: Mapping[int, int]
    cuda_block_dim: int | None
    archs: tuple[int, ...] | None
    blobs: list[bytes] = field(default_factory=list)
    buffers: list[dict] = field(default_factory=list)
    region_buffer: dict[int, int] = field(default_factory=dict)  # region id -> buffer the ops address
    modules: list[dict] = field(default_factory=list)
    module_index: dict[str, int] = field(default_factory=dict)
    kernels: list[dict] = field(default_factory=list)
    kernel_index: dict[tuple[int, str], int] = field(default_factory=dict)
    prelude: list[dict] = field(default_factory=list)  # copies of constant content into outputs
    ops: list[dict] = field(default_factory=list)
    signature: dict = field(default_factory=dict)
    compiled: list[cuda_code.CompiledModule] = field(default_factory=list)
    # per launch op (by identity of its dict): what the dynamic-batch rules need (size, grid kind, kernel, site)
    launch_facts: dict[int, dict] = field(default_factory=dict)
    live_kernels: dict[int, object] = field(default_factory=dict)  # manifest kernel index -> live wp.Kernel
    cpu_code: list[dict] = field(default_factory=list)  # the manifest's "cpu_code" entries
    cpu_code_note: str = ""  # producer.cpu_code: the machines, or why there is none ("" when not wanted)
    # (id(module), CUDA block_dim) -> the kernels the segment launches from that variant: what its binaries hold
    launched: dict[tuple[int, int], list] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.where = _where(self.segment_id, self.source)
        self.abi: WarpABI = abi_for_version(self.wrp.producer)
        wpp.require_supported_warp()
        self.live = [getattr(ref, "kernel", ref) for ref in self.kernel_refs]
        self.allocated: set[int] = set()  # regions of ALLOC ops
        self.op_written: set[int] = set()  # regions that copies and fills write

    def fail(self, message: str) -> ExportError:
        return ExportError(f"{self.where}: {message}")

    # ------------------------------------------------------------------ buffers

    def add_blob(self, data: bytes) -> int:
        self.blobs.append(bytes(data))
        return len(self.blobs) - 1

    def add_buffer(self, nbytes: int, role: str, init, io: int | None = None) -> int:
        buffer = {"id": len(self.buffers), "bytes": nbytes, "role": role, "init": init}
        if io is not None:
            buffer["io"] = io
        self.buffers.append(buffer)
        return buffer["id"]

    def region(self, region_id: int, what: str):
        region = self.wrp.regions.get(region_id)
        if region is None:
            raise self.fail(f"{what} names region {region_id}, which the capture does not contain")
        return region

    def add_signature(self, inputs: Sequence, outputs: Sequence) -> None:
        """Input/output buffers, in signature order, and the manifest's signature."""
        sig_in, sig_out = [], []
        input_of: dict[int, int] = {}
        for j, io in enumerate(inputs):
            region = self.region(io.region_id, f"input '{io.spec.name}'")
            if io.region_id in input_of:
                raise self.fail(f"inputs '{inputs[input_of[io.region_id]].spec.name}' and '{io.spec.name}' "
                                f"are the same region {io.region_id}")
            input_of[io.region_id] = j
            b = self.add_buffer(region.size, "input", "none", io=j)
            self.region_buffer[io.region_id] = b
            sig_in.append(self.signature_entry(io, region.size, b, "input"))
        seen_out: set[int] = set()
        for k, io in enumerate(outputs):
            region = self.region(io.region_id, f"output '{io.spec.name}'")
            if io.region_id in seen_out:
                raise self.fail(f"two outputs name the same region {io.region_id} ('{io.spec.name}')")
            seen_out.add(io.region_id)
            if io.region_id in input_of:
                init = {"input": input_of[io.region_id]}
            elif io.region_id in self.constants:
                init = "none"  # filled by a copy from a constant buffer before the first op
            elif getattr(io, "undefined_before", False):
                init = "none"  # torch.empty-like: its snapshot bytes are whatever memory held, not a value
            elif region.snapshot is not None and not any(region.snapshot):
                init = "zero"
            else:
                init = "none"
            b = self.add_buffer(region.size, "output", init, io=k)
            if io.region_id in self.constants:
                src = self.add_constant(io.region_id)
                self.prelude.append({"op": "copy", "dst": b, "dst_offset": 0, "src": src, "src_offset": 0,
                                     "bytes": region.size})
            self.region_buffer[io.region_id] = b
            sig_out.append(self.signature_entry(io, region.size, b, "output"))
        self.signature = {"inputs": sig_in, "outputs": sig_out}

    def signature_entry(self, io, region_bytes: int, buffer: int, side: str) -> dict:
        spec = io.spec
        dtype = torch_dtype_name(spec.dtype)
        from leapp.bundle.format import DTYPE_ITEMSIZE

        if dtype not in DTYPE_ITEMSIZE:
            raise self.fail(f"{side} '{spec.name}' has dtype {dtype}, which a bundle cannot carry "
                            f"(supported: {', '.join(DTYPE_ITEMSIZE)})")
        nbytes = math.prod(spec.shape) * DTYPE_ITEMSIZE[dtype]
        if nbytes != region_bytes or io.nbytes != region_bytes:
            raise self.fail(f"{side} '{spec.name}' is {dtype} {list(spec.shape)} = {nbytes} bytes (nbytes "
                            f"{io.nbytes}), but its region {io.region_id} has {region_bytes} bytes")
        entry = {"name": spec.name, "buffer": buffer, "dtype": dtype, "shape": [int(d) for d in spec.shape]}
        if spec.warp_dtype is not None:
            entry["warp_dtype"] = str(spec.warp_dtype)
        if spec.logical_shape is not None:
            entry["logical_shape"] = [int(d) for d in spec.logical_shape]
        return entry

    def add_constant(self, region_id: int) -> int:
        region = self.region(region_id, "a constant")
        data = bytes(self.constants[region_id])
        if len(data) != region.size:
            raise self.fail(f"constant of region {region_id} has {len(data)} bytes, the region has {region.size}")
        return self.add_buffer(region.size, "constant", {"blob": self.add_blob(data)})

    def buffer_for(self, region_id: int, what: str) -> int:
        """The buffer ops address for a region; constants and scratch get theirs on first use."""
        if region_id in self.region_buffer:
            return self.region_buffer[region_id]
        region = self.region(region_id, what)
        if region_id in self.constants and (region_id in self.op_written or region_id in self.scratch):
            # a copy/fill or a kernel writes it: replay on a scratch copy seeded every call, the constant stays
            # read-only (memory a segment writes in part, whose other bytes keep their trace values)
            src = self.add_constant(region_id)
            b = self.add_buffer(region.size, "scratch", "none")
            self.prelude.append({"op": "copy", "dst": b, "dst_offset": 0, "src": src, "src_offset": 0,
                                 "bytes": region.size})
        elif region_id in self.constants:
            b = self.add_constant(region_id)
        elif region_id in self.scratch or region.transient or region_id in self.allocated:
            nbytes = max(region.size, int(self.scratch.get(region_id, 0)))
            b = self.add_buffer(nbytes, "scratch", "none")
        else:
            raise self.fail(f"{what} uses region {region_id} ({region.size} bytes), which is neither an input, an "
                            "output, a constant nor scratch of the segment (the recorder did not classify it)")
        self.region_buffer[region_id] = b
        return b

    def writable(self, region_id: int, what: str) -> int:
        b = self.buffer_for(region_id, what)
        if self.buffers[b]["role"] in ("input", "constant"):
            raise self.fail(f"{what} writes region {region_id}, a segment {self.buffers[b]['role']} "
                            "that is not an output (the recorder must list written regions as outputs)")
        return b

    # ------------------------------------------------------------------ ops

    def add_ops(self) -> None:
        self.allocated = {op.region for op in self.wrp.ops if isinstance(op, WrpAlloc)}
        self.op_written = {op.region for op in self.wrp.ops if isinstance(op, (WrpMemset, WrpMemtile))}
        self.op_written |= {op.dst_region for op in self.wrp.ops if isinstance(op, WrpMemcpy)}
        self.launched = self.launched_kernels()
        for op in self.wrp.ops:
            what = f"{op.op_name} (operation {op.index})"
            if isinstance(op, WrpLaunch):
                self.add_launch(op)
            elif isinstance(op, WrpMemcpy):
                if op.size:
                    dst = self.writable(op.dst_region, what)
                    src = self.buffer_for(op.src_region, what)
                    self.ops.append({"op": "copy", "dst": dst, "dst_offset": op.dst_offset, "src": src,
                                     "src_offset": op.src_offset, "bytes": op.size})
            elif isinstance(op, WrpMemset):
                if op.size:
                    self.ops.append({"op": "memset", "buffer": self.writable(op.region, what), "offset": op.offset,
                                     "bytes": op.size, "value": op.value & 0xFF})
            elif isinstance(op, WrpMemtile):
                self.add_memtile(op, what)
            elif isinstance(op, WrpAlloc):
                pass  # the region becomes scratch when an op uses it
            else:
                raise self.fail(f"Warp operation {op.op_name} (operation {op.index}) is not exportable: "
                                "leapp replays kernel launches, wp.copy, zero_ and byte fills only")

    def add_memtile(self, op: WrpMemtile, what: str) -> None:
        if op.count == 0:
            return
        if len(set(op.pattern)) != 1:
            raise self.fail(f"{what}: fill_ with the {len(op.pattern)}-byte value 0x{op.pattern.hex()} is not "
                            "exportable; only fills whose bytes are all equal (zero_, fill_(0), ...) are")
        self.ops.append({"op": "memset", "buffer": self.writable(op.region, what), "offset": op.offset,
                         "bytes": op.count * len(op.pattern), "value": op.pattern[0]})

    def live_kernel(self, op: WrpLaunch):
        """The live kernel a launch record names (by key, disambiguated by the captured variant)."""
        record = self.wrp.kernel(op.module_hash, op.kernel_key)
        named = [k for k in self.live if k.key == op.kernel_key]
        direct = {id(k): k for k in named if not getattr(k, "is_generic", False)}
        # a generic kernel stands for the overloads it resolved to (when no overload is given directly)
        candidates = direct or {id(c): c for k in named for c in k.overloads.values()}
        if len(candidates) > 1:  # same key in several modules: keep the captured module variant
            candidates = {i: k for i, k in candidates.items() if wpp.hashed_variant_hash(k, record.block_dim)
                          == op.module_hash} or candidates
        if len(candidates) > 1 and not direct:  # overloads of a generic parent: the one APIC recorded
            mangled = record.forward_name.removesuffix("_cpu_forward").removesuffix("_cuda_kernel_forward")
            candidates = {i: k for i, k in candidates.items() if wpp.hashed_variant_name(k, record.block_dim)
                          == mangled} or candidates
        if len(candidates) > 1:
            raise self.fail(f"launch of kernel '{op.kernel_key}' (operation {op.index}) matches {len(candidates)} "
                            "overloads of one module; APIC records them under one name, so the segment cannot "
                            "be exported: give each overload its own kernel")
        if not candidates:
            raise self.fail(f"launch of kernel '{op.kernel_key}' (operation {op.index}) matches none of the "
                            f"segment's kernels ({sorted({k.key for k in self.live})})")
        (kernel,) = candidates.values()
        captured = wpp.hashed_variant_hash(kernel, record.block_dim)
        if captured is not None and captured != op.module_hash:
            raise self.fail(f"module '{kernel.module.name}' of kernel '{kernel.key}' changed since the capture "
                            f"(hash {captured[:7]}, captured {op.module_hash[:7]})")
        return kernel, record

    def launched_kernels(self) -> dict[tuple[int, int], list]:
        """(id(module), CUDA block_dim) -> the kernels of that module variant the capture launches (non-empty
        forward launches), in launch order: each variant is compiled once, for all of them. A launch whose
        kernel cannot be resolved is left to ``add_launch``, which reports it in the order of the ops."""
        launched: dict[tuple[int, int], list] = {}
        for op in self.wrp.ops:
            if not isinstance(op, WrpLaunch) or not op.is_forward or op.size == 0:
                continue
            try:
                kernel, record = self.live_kernel(op)
            except ExportError:
                continue
            kernels = launched.setdefault((id(kernel.module), self.cuda_block_dim_for(record, op)), [])
            if kernel not in kernels:
                kernels.append(kernel)
        return launched

    def cuda_block_dim_for(self, record, op: WrpLaunch) -> int:
        if self.wrp.device == "cuda":
            return op.block_dim if op.block_dim > 0 else record.block_dim
        if record.block_dim > 1:
            return record.block_dim  # CPU blocks (enable_cpu_blocks): keep the tile block size
        return self.cuda_block_dim or DEFAULT_CUDA_BLOCK_DIM

    def add_launch(self, op: WrpLaunch) -> None:
        what = f"launch of kernel '{op.kernel_key}' (operation {op.index})"
        if not op.is_forward:
            raise self.fail(f"{what} is a backward (adjoint) launch; only forward kernels are exportable")
        kernel, record = self.live_kernel(op)
        block_dim = self.cuda_block_dim_for(record, op)
        if op.size == 0:
            return  # Warp skips empty launches: nothing of it is replayed or compiled
        compiled = cuda_code.compile_module(kernel, block_dim, self.archs,
                                            kernels=self.launched[(id(kernel.module), block_dim)])
        if self.wrp.device == "cpu" and record.block_dim <= 1 and wpp.uses_tiles(kernel):
            raise self.fail(f"{what}: kernel '{kernel.key}' uses tiles and was captured on CPU with block_dim=1, "
                            "so its CUDA block size is unknown; capture it on a CUDA device, or launch it with "
                            "block_dim and wp.config.enable_cpu_blocks=True")
        if self.wrp.device == "cuda" and compiled.module_hash != op.module_hash:
            raise self.fail(f"{what}: recompiling module '{kernel.module.name}' at block_dim {block_dim} gives "
                            f"hash {compiled.module_hash[:7]}, the capture ran {op.module_hash[:7]} "
                            "(module or wp.config changed since the capture)")
        k = self.kernel_entry(compiled, kernel, block_dim)
        params, relocs = self.pack_params(op, kernel, what)
        grid_stride = bool(op.grid_stride) if self.wrp.device == "cuda" else bool(kernel.grid_stride)
        grid = grid_for(op.size, block_dim, grid_stride, op.max_blocks if self.wrp.device == "cuda" else 0)
        launch = {
            "op": "launch", "kernel": k, "grid": list(grid), "block": [block_dim, 1, 1],
            "smem": self.kernels[k]["smem_bytes"], "params": params, "relocs": relocs,
        }
        self.ops.append(launch)
        launches_before = sum(1 for o in self.wrp.ops[:op.index] if isinstance(o, WrpLaunch))
        self.launch_facts[id(launch)] = {
            "size": op.size, "grid_stride": grid_stride, "max_blocks": op.max_blocks if self.wrp.device == "cuda" else 0,
            "kernel": kernel, "ndim": len(op.shape), "ordinal": launches_before,
        }

    def kernel_entry(self, compiled: cuda_code.CompiledModule, kernel, block_dim: int) -> int:
        m = self.module_index.get(compiled.name)
        if m is None:
            m = len(self.modules)
            binaries = []
            for kind, arch, data in compiled.binaries():
                binaries.append({"kind": kind, "arch": arch, "blob": self.add_blob(data)})
                isa = ptx_isa_of(data) if kind == "ptx" else ""
                if isa:  # recorded so readers and leapp inspect see which drivers can JIT it
                    binaries[-1]["ptx_isa"] = isa
            self.modules.append({"name": compiled.name, "binaries": binaries})
            self.module_index[compiled.name] = m
            self.compiled.append(compiled)
        entry = compiled.entry(kernel)
        k = self.kernel_index.get((m, entry))
        if k is None:
            k = len(self.kernels)
            self.kernels.append({"module": m, "entry": entry, "key": kernel.key, "block_dim": block_dim,
                                 "smem_bytes": compiled.entry_smem(kernel)})
            self.kernel_index[(m, entry)] = k
            self.live_kernels[k] = kernel
        return k

    def add_cpu_code(self) -> None:
        """Native CPU code of the launched kernels when wanted ($LEAPP_CPU_CODE; docs/export-cpu.md): one
        ``cpu_code`` entry per machine and each kernel's ``cpu_entry``; else ``cpu_code_note`` says why not."""
        if not cpu_code.cpu_code_wanted(self.wrp.device):
            return
        launched = [(self.kernels[k]["entry"], kernel) for k, kernel in self.live_kernels.items()]
        if not launched:  # copies and memsets only: memmove and memset run them on every machine
            self.cpu_code_note = COPY_ONLY_NOTE
            return
        try:
            codes, why = cpu_code.build_cpu_code(launched, self.where)
        except ExportError as e:
            if cpu_code.cpu_code_setting() == "always":  # asked for explicitly: a failure is the export's
                raise
            # by default (a CPU capture) the export stays what it was before CPU code: CUDA code, and the reason
            warnings.warn(f"leapp: {e}; the segment is exported without CPU code (LEAPP_CPU_CODE=1 makes this an "
                          "error; docs/export-cpu.md)", RuntimeWarning, stacklevel=2)
            codes, why = [], str(e).removeprefix(f"{self.where}: ").splitlines()[0]
        if not codes:
            self.cpu_code_note = f"none: {why}"
            return
        for code in codes:
            self.cpu_code.append({"machine": code.machine, "blob": self.add_blob(code.image)})
        for k, kernel in enumerate(self.kernels):
            kernel["cpu_entry"] = codes[0].entries[kernel["entry"]]
        self.cpu_code_note = ", ".join(code.machine for code in codes)

    def pack_params(self, op: WrpLaunch, kernel, what: str) -> tuple[dict, list[dict]]:
        """kernelParams bytes: launch bounds, then each argument blob at its alignment; relocations to buffers."""
        args = wpp.kernel_args(kernel)
        if len(op.params) != len(args):
            raise self.fail(f"{what} recorded {len(op.params)} arguments, kernel '{kernel.key}' takes {len(args)}")
        values = [self.abi.launch_bounds(op.shape, op.size, op.coord_mult)]
        for p, arg in zip(op.params, args):
            expected = wpp.expected_arg_size(arg.type)
            if expected is not None and expected != len(p.value):
                raise self.fail(f"{what}: argument '{arg.label}' was recorded as {len(p.value)} bytes, "
                                f"the {self.abi.name} ABI passes {expected}")
            if not p.value:
                raise self.fail(f"{what}: argument '{arg.label}' has an empty value")
            values.append(p.value)
        blob, offsets = bytearray(), []
        aligns = [8] + [p.align for p in op.params]
        for value, align in zip(values, aligns):
            blob.extend(b"\0" * (-len(blob) % max(align, 1)))
            offsets.append(len(blob))
            blob.extend(value)
        relocs = []
        for p, arg in zip(op.params, args):
            base = offsets[p.index]
            for rel in p.relocs:
                # the captured pointer is process-local: never ship it, the runtime patches the slot
                struct.pack_into("<Q", blob, base + rel.offset, 0)
                if rel.kind == RELOC_HANDLE:
                    raise self.fail(f"{what}: argument '{arg.label}' holds a wp.Mesh/wp.Volume/wp.Bvh handle; "
                                    "meshes/volumes are not exportable")
                if rel.kind == RELOC_DATA_PTR:
                    b = self.buffer_for(rel.region_id, f"argument '{arg.label}' of the {what}")
                    relocs.append({"param": p.index, "offset": rel.offset, "buffer": b,
                                   "buffer_offset": rel.region_offset})
        params = {"blob": self.add_blob(bytes(blob)), "offsets": offsets, "sizes": [len(v) for v in values]}
        return params, relocs

    # ------------------------------------------------------------------ manifest

    def manifest(self) -> dict:
        producer = {
            "leapp": _leapp_version(),
            "warp": self.wrp.producer,
            "param_abi": self.abi.name,
            "cuda_toolkit": cuda_code.toolkit_version(),
        }
        if self.compiled:
            producer["ptx_isa"] = self.compiled[0].ptx_isa
            if self.compiled[0].ptx_toolkit not in ("", producer["cuda_toolkit"]):
                producer["ptx_toolkit"] = self.compiled[0].ptx_toolkit  # an older NVRTC wrote the PTX
            if self.compiled[0].ptx_isa_check:
                producer["ptx_isa_check"] = self.compiled[0].ptx_isa_check
        if self.cpu_code_note:
            producer["cpu_code"] = self.cpu_code_note
        extra = {"cpu_code": self.cpu_code} if self.cpu_code else {}
        return {
            "format": "leapp.warp.bundle",
            "segment": self.segment_id,
            "source": recorded_source(self.source),
            "producer": producer,
            "modules": self.modules,
            "kernels": self.kernels,
            "buffers": self.buffers,
            "ops": self.prelude + self.ops,
            "signature": self.signature,
            **extra,
        }
