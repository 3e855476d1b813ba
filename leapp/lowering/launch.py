"""One ``wp.launch`` on CPU arrays lowered by itself (``leapp.lowering.lower_wp_launch``).

Builds the launch binding from live Warp arrays instead of a capture: each
distinct array is one input region, in argument order; scalars are baked in.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import torch

from leapp import _warp_private
from leapp.errors import ExportError
from leapp.lowering import torch_backend
from leapp.lowering.frontend import ArrayBinding, LaunchBinding, lower_launch
from leapp.lowering.ir import KINDS, Graph, Region, Value, scalar_of

__all__ = ["LoweredLaunch", "lower_wp_launch"]


@dataclass
class LoweredLaunch:
    """The lowered launch: ``graph``, the array argument names in order, and each one's region id."""

    graph: Graph
    arrays: list[str]
    regions: list[int]
    shapes: list[tuple]

    def __call__(self, *tensors: torch.Tensor) -> dict[str, torch.Tensor]:
        """The arrays' tensors (float32/int32, in argument order) -> each array's value after the launch."""
        out = torch_backend.run_graph(self.graph, list(tensors))
        return {name: out[rid].reshape(shape) for name, rid, shape in zip(self.arrays, self.regions, self.shapes)}


def lower_wp_launch(kernel, dim, inputs: list) -> LoweredLaunch:
    import warp as wp

    dims = tuple(dim) if isinstance(dim, (tuple, list)) else (int(dim),)
    graph = Graph(kernel.key)
    arrays: dict[str, ArrayBinding] = {}
    scalars: dict[str, tuple] = {}
    names, regions, shapes = [], [], []
    known: dict[str, torch.Tensor] = {}
    for arg, value in zip(_warp_private.kernel_args(kernel), inputs):
        type_name = _warp_private.kernel_arg_type_name(arg.type)
        if isinstance(value, wp.array):
            kind = type_name.split("d[", 1)[1][:-1] if "d[" in type_name else type_name
            if kind not in KINDS or scalar_of(kind) == "bool":
                continue  # the frontend names the argument, with its file:line, where the kernel uses it
            if not value.is_contiguous:
                raise ExportError(f"kernel `{kernel.key}`: array `{arg.label}` of {type_name} is not contiguous "
                                  "(lower_wp_launch binds contiguous arrays; exports bind any strides)")
            rid = len(regions)
            lanes = value.size * (KINDS[kind][1])
            graph.regions[rid] = Region(rid, scalar_of(kind), lanes, "input", index=rid)
            graph.current[rid] = Value(f"region{rid}_0", "region")
            strides = tuple(s // 4 for s in value.strides)
            arrays[arg.label] = ArrayBinding(rid, kind, 0, tuple(value.shape), strides)
            names.append(arg.label)
            regions.append(rid)
            shapes.append(tuple(value.shape) + ((KINDS[kind][1],) if KINDS[kind][1] > 1 else ()))
        elif type_name in KINDS:
            scalar, width = KINDS[type_name]
            values = tuple(value) if width > 1 else (value,)
            fmt = {"float32": "f", "int32": "i", "bool": "?"}[scalar]
            scalars[arg.label] = struct.unpack(f"<{width}{fmt}", struct.pack(f"<{width}{fmt}", *values))
    refusals = lower_launch(graph, _warp_private.kernel_ssa(kernel), LaunchBinding(dims, arrays, scalars), known)
    if refusals:
        raise ExportError(f"kernel `{kernel.key}` cannot be lowered to standard ops: " + "; ".join(refusals))
    graph.simplify()
    return LoweredLaunch(graph, names, regions, shapes)
