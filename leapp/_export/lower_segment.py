"""A recorded Warp segment written as standard ONNX ops (issue 48, docs/lowering.md), or why it cannot be.

Each launch of the segment's capture is lowered with ``leapp.lowering.lower_kernel``
and its arrays are bound to the capture's memory regions, so that one kernel's
output feeds the next. The slice's assumptions are checked on the capture first:
a 1-D launch over the batch, contiguous arrays whose whole region is the
launch's length, no region passed twice. Copies and memsets are refused for now.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import onnx
import torch
from onnx import helper, numpy_helper

from leapp import _warp_private
from leapp._apic.wrp import RELOC_DATA_PTR, WrpLaunch, parse_wrp
from leapp._contract.records import SegmentRecord
from leapp.errors import ExportError

__all__ = ["LoweredSegment", "SegmentRefused", "lower_segment"]

_WIDTH = {"float32": 1, "vec3f": 3, "quatf": 4}


class SegmentRefused(ExportError):
    """The segment cannot be lowered; ``reasons`` name each construct (kernel, file:line)."""

    def __init__(self, where: str, reasons: list[str]):
        self.reasons = reasons
        super().__init__(f"{where} cannot be lowered to standard ONNX ops: " + "; ".join(reasons))


@dataclass
class LoweredSegment:
    """The ONNX nodes (and their initializers) that compute a segment from its inputs' value names."""

    id: str
    kernels: list[str]
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    initializers: list[onnx.TensorProto] = field(default_factory=list)


def _kind(arg_type) -> tuple[str, str] | None:
    """('array', kind) or ('scalar', 'float32') for what the slice lowers, else None."""
    name = _warp_private.kernel_arg_type_name(arg_type)
    if name.startswith("array1d[") and name[8:-1] in _WIDTH:
        return "array", name[8:-1]
    if name == "float32":
        return "scalar", name
    return None


def _region_nbytes(spec) -> int:
    count = 1
    for d in spec.shape:
        count *= int(d)
    return count * torch.empty((), dtype=spec.dtype).element_size()


class _Splicer:
    def __init__(self, seg: SegmentRecord, input_names: list[str], batch: int, prefix: str):
        self.seg = seg
        self.batch = batch
        self.prefix = prefix
        self.values: dict[int, str] = {io.region_id: name for io, name in zip(seg.inputs, input_names)}
        self.sized = {io.region_id: io for io in list(seg.inputs) + list(seg.outputs)}
        self.out = LoweredSegment(seg.id, [k.key for k in seg.kernels])
        self.reasons: list[str] = []

    def region_of(self, launch: WrpLaunch, j: int, label: str, kind: str, where: str) -> int:
        param = launch.params[j]
        ptr = [r for r in param.relocs if r.kind == RELOC_DATA_PTR and r.offset == 0]
        if not ptr:
            raise ExportError(f"{where}: array `{label}` has no captured data pointer")
        shape_at, strides_at = _warp_private.array_t_offsets()
        shape = struct.unpack_from("<4i", param.value, shape_at)
        stride = struct.unpack_from("<i", param.value, strides_at)[0]
        width = 4 * _WIDTH[kind]
        region = ptr[0].region_id
        io = self.sized.get(region)
        if ptr[0].region_offset != 0 or shape[0] != launch.dim or stride != width:
            raise ExportError(f"{where}: array `{label}` is a view (offset {ptr[0].region_offset}, length "
                              f"{shape[0]}, stride {stride} bytes), not a whole contiguous array of the launch's "
                              f"{launch.dim} elements")
        if io is None:
            raise ExportError(f"{where}: array `{label}` is memory that is neither an input nor an output of the "
                              "segment (a constant or scratch array)")
        if io.spec.dtype != torch.float32 or _region_nbytes(io.spec) != launch.dim * width:
            raise ExportError(f"{where}: array `{label}` ({kind}[{launch.dim}]) is bound to '{io.spec.name}' "
                              f"{io.spec.dtype}{list(io.spec.shape)}, whose length is not the launch dimension")
        return region

    def launch(self, k: int, launch: WrpLaunch, kernel, site: str) -> None:
        from leapp.lowering import lower_kernel

        where = f"kernel `{launch.kernel_key}` at {site}"
        if launch.ndim != 1 or launch.dim != self.batch:
            raise ExportError(f"{where}: a {launch.ndim}-D launch of {launch.dim} threads is not a 1-D launch over "
                              f"the batch ({self.batch})")
        model = lower_kernel(kernel)
        used = {name for n in model.graph.node for name in n.input}
        read = {name for n in model.graph.node if n.op_type != "Shape" for name in n.input}
        bound: dict[str, str] = {}
        written: dict[str, int] = {}
        regions: dict[int, str] = {}
        for j, arg in enumerate(_warp_private.kernel_args(kernel)):
            kind = _kind(arg.type)
            if kind is None or (kind[0] == "scalar" and arg.label not in used):
                continue
            if kind[0] == "scalar":
                value = struct.unpack_from("<f", launch.params[j].value, 0)[0]
                name = f"{self.prefix}{arg.label}"
                self.out.nodes.append(helper.make_node(
                    "Constant", [], [name], value=numpy_helper.from_array(torch.tensor(value).numpy())))
                bound[arg.label] = name
                continue
            region = self.region_of(launch, j, arg.label, kind[1], where)
            if region in regions:
                raise ExportError(f"{where}: arrays `{regions[region]}` and `{arg.label}` are the same memory")
            regions[region] = arg.label
            written[f"{arg.label}_out"] = region
            if region in self.values and arg.label in used:
                bound[arg.label] = self.values[region]
            elif arg.label in read:
                raise ExportError(f"{where}: reads array `{arg.label}` before anything in the segment defines it")
        for name in used - set(bound) - {i.name for i in model.graph.initializer}:  # Shape of a write-only array
            if name in {i.name for i in model.graph.input}:
                if not self.values:
                    raise ExportError(f"{where}: no array of the batch is defined before it to size its outputs")
                bound[name] = next(iter(self.values.values()))

        def rename(name: str) -> str:
            return bound.get(name) or (f"{self.prefix}{name}" if name else "")

        for init in model.graph.initializer:
            copy = onnx.TensorProto()
            copy.CopyFrom(init)
            copy.name = rename(init.name)
            self.out.initializers.append(copy)
        for node in model.graph.node:
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            copy.input[:] = [rename(i) for i in node.input]
            copy.output[:] = [rename(o) for o in node.output]
            copy.name = f"{self.prefix}{node.name or node.output[0]}"
            self.out.nodes.append(copy)
        for out in model.graph.output:
            self.values[written[out.name]] = rename(out.name)


def lower_segment(seg: SegmentRecord, input_names: list[str], output_names: list[str], batch: int,
                  prefix: str) -> LoweredSegment:
    """ONNX nodes computing ``seg``: they read ``input_names`` (its inputs, in order) and write ``output_names``.

    Raises:
        SegmentRefused: naming each kernel or operation that does not lower, with its file:line.
    """
    where = f"segment '{seg.id}' ({seg.source})"
    splicer = _Splicer(seg, input_names, batch, prefix)
    kernels = {k.key: k.kernel for k in seg.kernels}
    launches = 0
    for op in parse_wrp(seg.wrp).ops:
        if not isinstance(op, WrpLaunch):
            splicer.reasons.append(f"a {op.op_name} operation (only kernel launches lower for now)")
            continue
        site = seg.call_sites[launches] if launches < len(seg.call_sites) else seg.source
        splicer.prefix = f"{prefix}k{launches}_"
        try:
            kernel = kernels.get(op.kernel_key)
            if kernel is None:
                raise ExportError(f"kernel `{op.kernel_key}` at {site}: not among the segment's recorded kernels")
            splicer.launch(launches, op, kernel, site)
        except ExportError as e:
            splicer.reasons.append(str(e))
        launches += 1
    if not splicer.reasons:
        for io, name in zip(seg.outputs, output_names):
            value = splicer.values.get(io.region_id)
            if value is None:
                splicer.reasons.append(f"output '{io.spec.name}' is not written by a lowered launch")
            else:
                splicer.out.nodes.append(helper.make_node("Identity", [value], [name], name=f"{prefix}{name}"))
    if splicer.reasons:
        raise SegmentRefused(where, splicer.reasons)
    return splicer.out
