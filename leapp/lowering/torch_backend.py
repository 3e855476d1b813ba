"""Backend: the IR run as torch ops, so that torch.export records ATen ops and torch.onnx writes standard ONNX.

``run_graph(graph, inputs)`` evaluates a lowered segment on its input tensors
and returns every region's last version; ``PRIMITIVES`` maps each IR primitive
to the few torch ops that compute it. The same functions evaluate the values
the frontend knows at lowering time (loop bounds), so there is one definition
of every primitive.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from leapp.lowering.ir import Graph, Op, Region, resolve, scalar_of

__all__ = ["PRIMITIVES", "DTYPES", "apply", "const_tensor", "constant_tensor", "pick_index", "table_tensor", "region_tensor", "run_graph"]

DTYPES = {"float32": torch.float32, "int32": torch.int32, "bool": torch.bool}


def _lanes(width: int, like: torch.Tensor) -> torch.Tensor:
    return torch.arange(width, dtype=torch.int64, device=like.device)


def _index(index: torch.Tensor, width: int) -> torch.Tensor:
    """[N, 1] element index (lanes) -> [N, width] lane indices, int64."""
    return index.to(torch.int64) + _lanes(width, index)


def _gather(region, index, width):
    idx = _index(index, width)  # index_select: one ONNX Gather (advanced indexing writes GatherND)
    return torch.index_select(region, 0, idx.reshape(-1)).reshape(idx.shape)


def _scatter(region, index, value, *mask, width):
    idx = _index(index, width)
    n = max(idx.shape[0], value.shape[0])
    idx = idx.expand(n, width)
    value = value.to(region.dtype).expand(n, width)
    if not mask:  # scatter (ONNX ScatterElements) rather than index_put (ScatterND)
        return region.scatter(0, idx.reshape(-1), value.reshape(-1))
    # masked-off threads write into one extra element past the end, which is then dropped
    size = region.shape[0]
    padded = torch.cat([region, region.new_zeros(width)])
    idx = torch.where(mask[0], idx, size + _lanes(width, idx))
    return padded.scatter(0, idx.reshape(-1), value.reshape(-1))[:size]


def _view(region, offset, width, count, whole=False):
    if whole:  # the launch reads the whole region: no slice
        return region.reshape(count, width)
    return region[offset:offset + count * width].reshape(count, width)


def _overwrite(region, value, *mask, offset, width, count, whole=False):
    slab = (value if value.dtype == region.dtype else value.to(region.dtype)).expand(count, width)
    if mask:
        slab = torch.where(mask[0], slab, _view(region, offset, width, count, whole))
    if whole:  # the launch writes the whole region: its next version is the value
        return slab.reshape(-1)
    return torch.cat([region[:offset], slab.reshape(-1), region[offset + count * width:]])


def _fill(region, offset, count, pattern):
    reps = count // len(pattern)
    slab = torch.tensor(list(pattern), dtype=region.dtype, device=region.device).repeat(reps)
    return torch.cat([region[:offset], slab, region[offset + count:]])


def _copy(dst, src, dst_offset, src_offset, count):
    return torch.cat([dst[:dst_offset], src[src_offset:src_offset + count].to(dst.dtype), dst[dst_offset + count:]])


def _tid(dims, axis, device=None):
    inner = math.prod(dims[axis + 1:])
    t = torch.arange(math.prod(dims), dtype=torch.int32, device=device)
    if axis + 1 < len(dims):
        t = t // inner
    if axis > 0:
        t = t % dims[axis]
    return t.reshape(-1, 1)


def const_tensor(value, of: str) -> torch.Tensor:
    """The [1, width] tensor of a ``Const`` op (its ``value`` and kind ``of``)."""
    dtype = DTYPES[scalar_of(of)]
    if all(isinstance(v, (int, float, bool)) for v in value):
        return torch.tensor([list(value)], dtype=dtype)
    # a batch-dependent integer while exporting (a SymInt): full() keeps it symbolic
    return torch.cat([torch.full((1, 1), v, dtype=dtype) for v in value], dim=1)


def table_tensor(rows, of: str) -> torch.Tensor:
    """The [threads, width] tensor of a ``Table`` op (a per-thread value computed at lowering time)."""
    return torch.tensor([list(r) for r in rows], dtype=DTYPES[scalar_of(of)])


def _int_div(a, b):
    safe = torch.where(b == 0, torch.ones_like(b), b)  # Warp's result for 0 is undefined; never raise here
    return torch.div(a, safe, rounding_mode="trunc")


def _int_mod(a, b):
    safe = torch.where(b == 0, torch.ones_like(b), b)
    return torch.fmod(a, safe)


def _int_floor_div(a, b):  # builtin.h floordiv_signed: C's quotient, one less where the signs differ
    safe = torch.where(b == 0, torch.ones_like(b), b)
    return torch.div(a, safe, rounding_mode="floor")


def _fmin(a, b):  # C fminf: a nan operand yields the other one
    return torch.where(torch.isnan(a), b, torch.where(torch.isnan(b), a, torch.minimum(a, b)))


def _fmax(a, b):
    return torch.where(torch.isnan(a), b, torch.where(torch.isnan(b), a, torch.maximum(a, b)))


def _round(a):  # C roundf: halves away from zero (torch.round rounds them to even)
    t = torch.trunc(a)
    return torch.where(torch.abs(a - t) >= 0.5, t + _sign(a), t)


def _sum_last(a):
    """Warp's ``ret += a[i]`` in component order (vec.h dot), so float32 rounding matches term by term."""
    out = a[:, 0:1]
    for k in range(1, a.shape[1]):
        out = out + a[:, k:k + 1]
    return out


def _matmul(a, b, m, k, n):
    """mat.h mul: ``r = a[:, 0] * b[0]; r += a[:, i] * b[i]`` in Warp's order of k (mat*mat uses fmaf there,
    which no standard op fuses: one rounding more per product)."""
    a, b = a.reshape(-1, m, k), b.reshape(-1, k, n)
    out = a[:, :, 0:1] * b[:, 0:1, :]
    for i in range(1, k):
        out = out + a[:, :, i:i + 1] * b[:, i:i + 1, :]
    return out.reshape(-1, m * n)


def _transpose(a, m, n):
    return a.reshape(-1, m, n).transpose(1, 2).reshape(-1, m * n)


def _concat(*parts):
    n = max(p.shape[0] for p in parts)
    return torch.cat([p.expand(n, p.shape[1]) for p in parts], dim=-1)


def pick_index(indices) -> torch.Tensor:
    """The index tensor of a non-consecutive pick (a module holds it as a buffer: ``run_graph``'s ``picks``)."""
    return torch.tensor(list(indices), dtype=torch.int64)


def _pick(a, indices, index=None):
    """Components ``indices`` of each value: a slice when they are consecutive, else one index_select (ONNX
    Gather) on ``index`` (made here when not given)."""
    first = indices[0]
    if list(indices) == list(range(first, first + len(indices))):
        return a[:, first:first + len(indices)]
    if index is None:
        index = pick_index(indices).to(a.device)
    return torch.index_select(a, 1, index)


def _sign(a):  # Warp: sign(x) = x < 0 ? -1 : 1
    return torch.where(a < 0, -torch.ones_like(a), torch.ones_like(a))


PRIMITIVES = {
    "Add": lambda a, b: a + b,
    "Sub": lambda a, b: a - b,
    "Mul": lambda a, b: a * b,
    "Div": lambda a, b: a / b,
    "IDiv": _int_div,
    "IMod": _int_mod,
    "IFloorDiv": _int_floor_div,
    "FMin": _fmin,
    "FMax": _fmax,
    "FMod": torch.fmod,
    "Min": torch.minimum,
    "Max": torch.maximum,
    "Pow": torch.pow,
    "Atan2": torch.atan2,
    "Neg": torch.neg,
    "Sqrt": torch.sqrt,
    "Sin": torch.sin,
    "Cos": torch.cos,
    "Tan": torch.tan,
    "Asin": torch.asin,
    "Acos": torch.acos,
    "Atan": torch.atan,
    "Sinh": torch.sinh,
    "Cosh": torch.cosh,
    "Tanh": torch.tanh,
    "Exp": torch.exp,
    "Log": torch.log,
    "Abs": torch.abs,
    "Floor": torch.floor,
    "Ceil": torch.ceil,
    "Round": _round,
    "Rint": torch.round,  # C rintf in the default mode: halves to even, as torch.round
    "Trunc": torch.trunc,
    "Sign": _sign,
    "Greater": lambda a, b: a > b,
    "Less": lambda a, b: a < b,
    "GreaterEqual": lambda a, b: a >= b,
    "LessEqual": lambda a, b: a <= b,
    "Equal": lambda a, b: a == b,
    "NotEqual": lambda a, b: a != b,
    "And": torch.logical_and,
    "Or": torch.logical_or,
    "Not": torch.logical_not,
    "Where": lambda c, a, b: torch.where(c, a, b),
    "Cast": lambda a, to: a.to(DTYPES[to]),
    "Identity": lambda a: a,
    "Pick": _pick,
    "Concat": _concat,
    "SumLast": _sum_last,
    "MatMul": _matmul,
    "Transpose": _transpose,
    "Const": const_tensor,
    "Table": table_tensor,
    "Tid": _tid,
    "Gather": _gather,
    "Scatter": _scatter,
    "View": _view,
    "Overwrite": _overwrite,
    "Fill": _fill,
    "Copy": _copy,
}


def apply(op: Op, args: list[torch.Tensor]) -> torch.Tensor:
    """One primitive on tensors (the backend's single definition of it)."""
    return PRIMITIVES[op.primitive](*args, **dict(op.attrs))


def constant_tensor(region: Region) -> torch.Tensor:
    """A constant region's captured lanes."""
    array = np.frombuffer(region.data, dtype=np.float32 if region.scalar == "float32" else np.int32)
    return torch.from_numpy(array.copy())


def region_tensor(region: Region, inputs, constants=None, batch=None) -> torch.Tensor:
    """A region's first version: its input's lanes, its captured bytes (``constants[id]`` when given), or zeros."""
    dtype = DTYPES[region.scalar]
    if region.source == "input":
        return inputs[region.index].reshape(-1).to(dtype)
    if region.source == "constant":
        return constants[region.id] if constants is not None else constant_tensor(region)
    device = inputs[0].device if inputs else None
    return torch.zeros(resolve(region.lanes, batch), dtype=dtype, device=device)


def run_graph(graph: Graph, inputs, constants=None, batch=None, preset=None,
              picks=None) -> dict[int, torch.Tensor]:
    """Evaluates ``graph`` on the segment's input tensors (and its constant regions' tensors, region id ->
    flat lanes, else their captured bytes); region id -> its last version (flat lanes). ``batch`` evaluates
    the graph's ``Affine`` sizes (a dynamic-batch segment); ``preset`` gives values by name (the ``Const``
    ops that a module holds as buffers, so that they are not rebuilt at every call) and ``picks`` the index
    tensors of non-consecutive picks by their indices, likewise."""
    device = inputs[0].device if inputs else torch.device("cpu")
    values: dict[str, torch.Tensor] = dict(preset or {})
    for region in graph.regions.values():
        values[f"region{region.id}_0"] = region_tensor(region, inputs, constants, batch).to(device)
    for op in graph.ops:
        if op.output.name in values:
            continue
        attrs = {k: resolve(v, batch) for k, v in op.attrs}
        if op.primitive == "Pick" and picks and attrs["indices"] in picks:
            attrs["index"] = picks[attrs["indices"]]
        if op.primitive == "Tid":
            attrs["device"] = device
            values[op.output.name] = _tid(**attrs)
            continue
        out = PRIMITIVES[op.primitive](*[values[v.name] for v in op.inputs], **attrs)
        values[op.output.name] = out.to(device) if op.primitive in ("Const", "Table") else out
    return {rid: values[v.name] for rid, v in graph.current.items()}
