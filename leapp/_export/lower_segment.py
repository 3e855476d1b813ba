"""A recorded Warp segment written as standard ops (issue 48, docs/lowering.md), or why it cannot be.

The capture says everything a launch passed: each array argument's region,
byte offset, shape and strides, each scalar's bytes, the launch dimensions.
Each region becomes a flat tensor of 32-bit lanes (an input's tensor, a
constant's captured bytes, or zeros); each launch is lowered from its kernel's
own SSA (``leapp.lowering.frontend``) against those bindings, and copies and
memsets become slices. ``LoweredCall`` runs the result with torch ops, which
torch.export records as ATen ops and torch.onnx writes as standard ONNX.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import torch

from leapp import _warp_private
from leapp._apic.wrp import (
    RELOC_DATA_PTR,
    WrpAlloc,
    WrpLaunch,
    WrpMemcpy,
    WrpMemset,
    WrpMemtile,
    parse_wrp,
)
from leapp._contract.records import SegmentRecord
from leapp.errors import ExportError
from leapp.lowering import torch_backend
from leapp.lowering.frontend import ArrayBinding, LaunchBinding, lower_launch
from leapp.lowering.ir import KINDS, Affine, Graph, Region, Value, resolve, scalar_of

__all__ = ["LoweredCall", "LoweredSegment", "SegmentRefused", "lower_segment"]

_SCALAR_OF_DTYPE = {torch.float32: "float32", torch.int32: "int32"}


class SegmentRefused(ExportError):
    """The segment cannot be lowered; ``reasons`` name each construct (kernel, file:line)."""

    def __init__(self, where: str, reasons: list[str]):
        self.reasons = reasons
        super().__init__(f"{where} cannot be lowered to standard ops: " + "; ".join(reasons))


@dataclass
class LoweredSegment:
    """A segment's IR, and which region each of its outputs is."""

    id: str
    kernels: list[str]
    graph: Graph
    outputs: list[tuple[int, tuple[int, ...], torch.dtype]] = field(default_factory=list)

    @property
    def constant_regions(self) -> list[int]:
        return [r.id for r in self.graph.regions.values() if r.source == "constant"]

    def pick_indices(self) -> list[tuple]:
        """The index tuples of the graph's non-consecutive picks (each becomes one index tensor)."""
        found = []
        for op in self.graph.ops:
            indices = dict(op.attrs).get("indices") if op.primitive == "Pick" else None
            if indices and list(indices) != list(range(indices[0], indices[0] + len(indices))) \
                    and indices not in found:
                found.append(indices)
        return found

    def constant_values(self) -> dict[tuple, list[str]]:
        """(primitive, kind, value) -> the ``Const`` and ``Table`` ops of that value, for every constant that
        does not follow the batch."""
        found: dict[tuple, list[str]] = {}
        for op in self.graph.ops:
            attrs = dict(op.attrs)
            if op.primitive == "Const" and not any(isinstance(v, Affine) for v in attrs["value"]):
                found.setdefault(("Const", attrs["of"], attrs["value"]), []).append(op.output.name)
            elif op.primitive == "Table":
                found.setdefault(("Table", attrs["of"], attrs["rows"]), []).append(op.output.name)
        return found


class LoweredCall:
    """The torch function of a lowered segment: ``(*inputs, *regions, *values, *picks) -> outputs``: the
    segment's inputs, its constant regions (``constant_regions`` order, flat lanes), its constant values (one
    tensor per key of ``constant_values()``) and its picks' index tensors (``pick_indices()`` order), which the
    module holds as buffers."""

    def __init__(self, lowered: LoweredSegment, n_inputs: int, batch_input: int | None = None):
        self.lowered = lowered
        self.n_inputs = n_inputs
        self.batch_input = batch_input  # dynamic batch: the input whose dim 0 is the batch
        self.values = list(lowered.constant_values().values())
        self.picks = lowered.pick_indices()
        self.__name__ = f"lowered_{lowered.id.replace('/', '_')}"

    def __call__(self, *args):
        n_regions = len(self.lowered.constant_regions)
        inputs, consts = args[:self.n_inputs], args[self.n_inputs:self.n_inputs + n_regions]
        start = self.n_inputs + n_regions
        preset = {name: tensor for names, tensor in zip(self.values, args[start:start + len(self.values)])
                  for name in names}
        picks = dict(zip(self.picks, args[start + len(self.values):]))
        constants = dict(zip(self.lowered.constant_regions, consts))
        batch = None if self.batch_input is None else inputs[self.batch_input].shape[0]
        regions = torch_backend.run_graph(self.lowered.graph, list(inputs), constants, batch, preset, picks)
        out = [regions[rid].reshape(resolve(shape, batch)) for rid, shape, _ in self.lowered.outputs]
        return tuple(t if t.dtype == dtype else t.to(dtype) for t, (_, _, dtype) in zip(out, self.lowered.outputs))


# leapp's own strided-copy kernel (leapp/_recorder/strided_copy.py) moves raw 32-bit lanes as uint32: those
# arrays take their region's lane type, since the kernel only loads and stores them.
_LANE_COPY_PREFIX = "leapp_strided_copy"


def _array_kind(type_name: str, lane_copy: bool) -> tuple[int, str] | None:
    if not type_name.startswith("array") or "d[" not in type_name:
        return None
    ndim, kind = type_name[5:].split("d[", 1)
    kind = kind[:-1]
    if kind == "uint32" and lane_copy:
        return int(ndim), "lane"
    if kind not in KINDS or scalar_of(kind) == "bool":
        return None
    return int(ndim), kind


class _Builder:
    def __init__(self, seg: SegmentRecord):
        self.seg = seg
        self.wrp = parse_wrp(seg.wrp)
        self.graph = Graph(seg.id)
        self.known: dict[str, torch.Tensor] = {}
        self.reasons: list[str] = []
        self.inputs = {io.region_id: j for j, io in enumerate(seg.inputs)}
        self.io_spec = {io.region_id: io.spec for io in list(seg.inputs) + list(seg.outputs)}

    def region(self, rid: int, scalar: str, where: str) -> None:
        """Declares region ``rid`` as lanes of ``scalar`` (first use) or checks that it is."""
        if rid in self.graph.regions:
            if self.graph.regions[rid].scalar != scalar:
                raise ExportError(f"{where}: region {rid} is read both as {self.graph.regions[rid].scalar} and "
                                  f"as {scalar} (a reinterpretation of its bytes)")
            return
        wrp_region = self.wrp.regions.get(rid)
        if wrp_region is None:
            raise ExportError(f"{where}: region {rid} is not in the capture")
        if wrp_region.size % 4:
            raise ExportError(f"{where}: region {rid} has {wrp_region.size} bytes, not whole 32-bit lanes")
        lanes = wrp_region.size // 4
        spec = self.io_spec.get(rid)
        if spec is not None and _SCALAR_OF_DTYPE.get(spec.dtype) != scalar:
            raise ExportError(f"{where}: '{spec.name}' is {spec.dtype} but the kernel reads it as {scalar}")
        if rid in self.inputs:
            region = Region(rid, scalar, lanes, "input", index=self.inputs[rid])
        elif rid in self.seg.constants:
            region = Region(rid, scalar, lanes, "constant", data=bytes(self.seg.constants[rid]))
        elif spec is not None or rid in self.seg.scratch or wrp_region.transient:
            region = Region(rid, scalar, lanes, "zeros")
        else:
            raise ExportError(f"{where}: region {rid} is memory the segment neither receives nor owns")
        self.graph.regions[rid] = region
        first = Value(f"region{rid}_0", "region")
        self.graph.current[rid] = first
        if region.source == "constant":
            self.known[first.name] = torch_backend.constant_tensor(region)

    def binding(self, launch: WrpLaunch, kernel, where: str) -> LaunchBinding:
        if launch.coord_mult != 1:
            raise ExportError(f"{where}: a launch whose threads share coordinates (folded dimensions)")
        dims = tuple(int(d) for d in launch.shape[:launch.ndim])
        arrays: dict[str, ArrayBinding] = {}
        scalars: dict[str, tuple] = {}
        shape_at, strides_at = _warp_private.array_t_offsets()
        for j, arg in enumerate(_warp_private.kernel_args(kernel)):
            name = _warp_private.kernel_arg_type_name(arg.type)
            param = launch.params[j]
            array = _array_kind(name, launch.kernel_key.startswith(_LANE_COPY_PREFIX))
            if array is not None:
                ndim, kind = array
                ptr = [r for r in param.relocs if r.kind == RELOC_DATA_PTR and r.offset == 0]
                shape = struct.unpack_from(f"<{ndim}i", param.value, shape_at)
                strides = struct.unpack_from(f"<{ndim}i", param.value, strides_at)
                if not ptr:  # a null array (wp.empty(0) and the like): reads give zeros, stores are dropped
                    arrays[arg.label] = ArrayBinding(-1, "float32" if kind == "lane" else kind, 0, tuple(shape),
                                                     tuple(0 for _ in strides))
                    continue
                offset = ptr[0].region_offset
                if offset % 4 or any(s % 4 for s in strides):
                    raise ExportError(f"{where}: array `{arg.label}` is not aligned to 32-bit lanes")
                if kind == "lane":
                    kind = self.lane_scalar(ptr[0].region_id)
                self.region(ptr[0].region_id, scalar_of(kind), where)
                arrays[arg.label] = ArrayBinding(ptr[0].region_id, kind, offset // 4, tuple(shape),
                                                 tuple(s // 4 for s in strides))
            elif name in KINDS:
                scalar, width = KINDS[name]
                fmt = {"float32": "f", "int32": "i", "bool": "?"}[scalar]
                scalars[arg.label] = struct.unpack_from(f"<{width}{fmt}", param.value, 0)
        return LaunchBinding(dims, arrays, scalars)

    def lane_scalar(self, rid: int) -> str:
        """The lane type of a region a raw copy touches: as declared, else its tensor's, else float32."""
        if rid in self.graph.regions:
            return self.graph.regions[rid].scalar
        spec = self.io_spec.get(rid)
        return _SCALAR_OF_DTYPE.get(spec.dtype, "float32") if spec is not None else "float32"

    def lanes(self, rid: int, offset: int, size: int, where: str) -> tuple[int, int]:
        if offset % 4 or size % 4:
            raise ExportError(f"{where}: bytes [{offset}, {offset + size}) are not whole 32-bit lanes")
        if rid not in self.graph.regions:
            spec = self.io_spec.get(rid)
            scalar = _SCALAR_OF_DTYPE.get(spec.dtype) if spec is not None else "float32"
            if scalar is None:
                raise ExportError(f"{where}: '{spec.name}' is {spec.dtype}, not 32-bit lanes")
            self.region(rid, scalar, where)
        return offset // 4, size // 4

    def memory_op(self, op, where: str) -> None:
        g = self.graph
        if isinstance(op, WrpAlloc):
            return
        if isinstance(op, WrpMemcpy):
            so, count = self.lanes(op.src_region, op.src_offset, op.size, where)
            do, _ = self.lanes(op.dst_region, op.dst_offset, op.size, where)
            src, dst = g.current[op.src_region], g.current[op.dst_region]
            if g.regions[op.src_region].scalar != g.regions[op.dst_region].scalar:
                raise ExportError(f"{where}: a copy between lanes of different types")
            g.current[op.dst_region] = g.emit("Copy", (dst, src), "region", dst_offset=do, src_offset=so,
                                              count=count)
            return
        if isinstance(op, WrpMemset):
            offset, count = self.lanes(op.region, op.offset, op.size, where)
            pattern = bytes([op.value & 0xFF]) * 4
        elif isinstance(op, WrpMemtile):
            if len(op.pattern) % 4:
                raise ExportError(f"{where}: a fill pattern of {len(op.pattern)} bytes (not whole 32-bit lanes)")
            offset, count = self.lanes(op.region, op.offset, op.count * len(op.pattern), where)
            pattern = bytes(op.pattern)
        else:
            raise ExportError(f"{where}: a {op.op_name} operation")
        scalar = g.regions[op.region].scalar
        lanes = struct.unpack(f"<{len(pattern) // 4}{'f' if scalar == 'float32' else 'i'}", pattern)
        g.current[op.region] = g.emit("Fill", (g.current[op.region],), "region", offset=offset, count=count,
                                      pattern=tuple(lanes))


def lower_segment(seg: SegmentRecord, fold: bool = True) -> LoweredSegment:
    """The IR of ``seg``: every launch, copy and memset, in the captured order (``fold``: per-thread values
    known at lowering time become tables; False for the captures of a dynamic-batch node).

    Raises:
        SegmentRefused: naming each kernel or operation that does not lower, with its file:line.
    """
    where = f"segment '{seg.id}' ({seg.source})"
    b = _Builder(seg)
    kernels = {k.key: k.kernel for k in seg.kernels}
    ssa_cache: dict[str, dict] = {}
    launches = 0
    for op in b.wrp.ops:
        if not isinstance(op, WrpLaunch):
            try:
                b.memory_op(op, f"{op.op_name} operation {op.index}")
            except ExportError as e:
                b.reasons.append(str(e))
            continue
        site = seg.call_sites[launches] if launches < len(seg.call_sites) else seg.source
        launches += 1
        here = f"kernel `{op.kernel_key}` at {site}"
        try:
            kernel = kernels.get(op.kernel_key)
            if kernel is None:
                raise ExportError(f"{here}: not among the segment's recorded kernels")
            binding = b.binding(op, kernel, here)
            if op.kernel_key not in ssa_cache:
                ssa_cache[op.kernel_key] = _warp_private.kernel_ssa(kernel)
            refusals = lower_launch(b.graph, ssa_cache[op.kernel_key], binding, b.known, fold)
            if refusals:
                raise ExportError(f"{here}: " + "; ".join(refusals))
        except ExportError as e:
            b.reasons.append(str(e))
    lowered = LoweredSegment(seg.id, [k.key for k in seg.kernels], b.graph)
    for io in seg.outputs:
        if io.region_id not in b.graph.regions:
            scalar = _SCALAR_OF_DTYPE.get(io.spec.dtype)
            if scalar is None:
                b.reasons.append(f"output '{io.spec.name}' is {io.spec.dtype}, which no launch writes")
                continue
            b.region(io.region_id, scalar, f"output '{io.spec.name}'")
        lowered.outputs.append((io.region_id, tuple(io.spec.shape), io.spec.dtype))
    if b.reasons:
        raise SegmentRefused(where, list(dict.fromkeys(b.reasons)))
    b.graph.prune()  # simplify() once the graph is final: lower_for_export / lower_dynamic_segment
    return lowered
