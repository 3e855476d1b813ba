"""Strided views and constant arrays, lowered through ``lower_launch`` with bindings made the way a recorded
segment makes them (a region per base array; a view's offset, shape and strides in lanes), equal Warp eager.

``lower_wp_launch`` takes contiguous arrays only, and every array is an input
there; a segment also binds views (``a[:, 1]``, transposes, vec3 arrays viewed
as float) and captured constant arrays, whose values the lowering may read
(loop bounds indexed by wp.tid()). Tolerance: lowering_harness.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

wp = pytest.importorskip("warp")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.extra.numpy import arrays  # noqa: E402

import lowering_harness as harness  # noqa: E402
from leapp import _warp_private  # noqa: E402
from leapp.errors import ExportError  # noqa: E402
from leapp.lowering import ArrayBinding, Graph, LaunchBinding, lower_launch  # noqa: E402
from leapp.lowering import torch_backend  # noqa: E402
from leapp.lowering.ir import KINDS, Region, Value  # noqa: E402


def _kind(dtype) -> str:
    return _warp_private.kernel_arg_type_name(dtype)


def lower_views(kernel, dims, bases: dict, args: list, constants=()):
    """Lowers ``wp.launch(kernel, dims, args)`` where every array in ``args`` is a view of one of ``bases``;
    the bases named in ``constants`` are captured constants (their values known when lowering).
    Returns {base name: flat lanes after the launch} as a function of the bases' numpy values."""
    graph = Graph(kernel.key)
    known, order = {}, list(bases)
    for rid, name in enumerate(order):
        base = bases[name]
        scalar, width = KINDS[_kind(base.dtype)]
        graph.regions[rid] = Region(rid, scalar, base.size * width, "input", index=rid)
        graph.current[rid] = Value(f"region{rid}_0", "region")
        if name in constants:
            known[f"region{rid}_0"] = torch.from_numpy(base.numpy().reshape(-1).copy())
    bindings, scalars = {}, {}
    for arg, value in zip(_warp_private.kernel_args(kernel), args):
        if not isinstance(value, wp.array):
            scalars[arg.label] = (value,)
            continue
        rid = next(r for r, n in enumerate(order)
                   if bases[n].ptr <= value.ptr < bases[n].ptr + bases[n].capacity)
        bindings[arg.label] = ArrayBinding(rid, _kind(value.dtype), (value.ptr - bases[order[rid]].ptr) // 4,
                                           tuple(value.shape), tuple(s // 4 for s in value.strides))
    dims = tuple(dims) if isinstance(dims, tuple) else (dims,)
    refusals = lower_launch(graph, _warp_private.kernel_ssa(kernel), LaunchBinding(dims, bindings, scalars), known,
                            f"kernel `{kernel.key}`")
    if refusals:
        raise ExportError("; ".join(refusals))

    def run(values: dict) -> dict:
        out = torch_backend.run_graph(graph, [torch.from_numpy(values[n].reshape(-1).copy()) for n in order])
        return {n: out[rid].numpy() for rid, n in enumerate(order)}

    return run


@wp.kernel
def k_strided(col: wp.array(dtype=float), t: wp.array2d(dtype=float), flat: wp.array2d(dtype=float),
              out: wp.array2d(dtype=float)):
    i = wp.tid()
    out[i, 0] = col[i] * 2.0
    out[i, 1] = t[0, i] - t[1, i]
    out[i, 2] = flat[i, 1] + flat[i, 2]
    col[i] = col[i] + 1.0  # a store through a strided view
    flat[i, 0] = -flat[i, 0]  # and through a vec3 array viewed as float


@wp.kernel
def k_ranges(start: wp.array(dtype=int), count: wp.array(dtype=int), a: wp.array(dtype=float),
             out: wp.array(dtype=float)):
    i = wp.tid()
    s = float(0.0)
    for j in range(start[i], start[i] + count[i]):  # bounds from a constant array indexed by wp.tid()
        s = s + a[j] * float(j + 1)
    out[i] = s


@settings(max_examples=15, deadline=None)
@given(data=st.data(), n=st.integers(2, 5))
def test_strided_views_equal_warp_eager(data, n):
    values = {
        "grid": data.draw(arrays(np.float32, (n, 4), elements=harness.FLOATS)),
        "vecs": data.draw(arrays(np.float32, (n, 3), elements=harness.FLOATS)),
        "out": np.zeros((n, 3), np.float32),
    }

    def launch_args(bases):
        return [bases["grid"][:, 1], bases["grid"].transpose(), bases["vecs"].view(dtype=float), bases["out"]]

    def fresh():
        return {"grid": wp.array(values["grid"], dtype=float), "vecs": wp.array(values["vecs"], dtype=wp.vec3),
                "out": wp.array(values["out"], dtype=float)}

    bases = fresh()
    run = lower_views(k_strided, n, bases, launch_args(bases))
    wp.launch(k_strided, dim=n, inputs=launch_args(bases), device="cpu")
    got = run(values)
    for name, base in bases.items():
        harness.assert_close(got[name], base.numpy().reshape(-1), what=name)


@settings(max_examples=15, deadline=None)
@given(data=st.data(), n=st.integers(1, 6))
def test_loop_bounds_from_a_constant_array_indexed_by_tid(data, n):
    m = 8
    values = {
        "start": data.draw(arrays(np.int32, n, elements=st.integers(0, m - 1))),
        "count": data.draw(arrays(np.int32, n, elements=st.integers(-1, 4))),
        "a": data.draw(arrays(np.float32, m + 4, elements=harness.FLOATS)),
        "out": np.zeros(n, np.float32),
    }
    bases = {k: wp.array(v, dtype=int if v.dtype == np.int32 else float) for k, v in values.items()}
    args = [bases["start"], bases["count"], bases["a"], bases["out"]]
    run = lower_views(k_ranges, n, bases, args, constants=("start", "count"))
    wp.launch(k_ranges, dim=n, inputs=args, device="cpu")
    got = run(values)
    harness.assert_close(got["out"], bases["out"].numpy(), what="out")


def test_the_same_loop_on_an_input_array_is_refused():
    bases = {k: wp.zeros(4, dtype=d) for k, d in (("start", int), ("count", int), ("a", float), ("out", float))}
    with pytest.raises(ExportError, match=r"loop whose trip count is not known when lowering"):
        lower_views(k_ranges, 4, bases, list(bases.values()))
