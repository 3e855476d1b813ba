"""Runs one Warp kernel launch two ways, Warp eager on the CPU and ``lower_wp_launch``, and compares every array.

Inputs come from hypothesis: zeros, values in [-4, 4] and large magnitudes
(up to 1e4) for floats, so quaternions and vectors are mostly not unit length.
Tolerance: |lowered - warp| <= atol + rtol * |warp| elementwise (default
1e-5 + 8e-5 * |warp|); where Warp gives nan or inf the lowered value must be
the same nan or inf; int and bool arrays must be equal.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
import warp as wp
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from leapp import _warp_private
from leapp.lowering import lower_wp_launch
from leapp.lowering.ir import KINDS

TOL = (1e-5, 8e-5)
FLOATS = st.one_of(st.just(0.0), st.floats(-4.0, 4.0, width=32), st.floats(-1e4, 1e4, width=32))
SMALL_FLOATS = st.one_of(st.just(0.0), st.floats(-4.0, 4.0, width=32))
WP_DTYPE = {"float32": wp.float32, "int32": wp.int32, "vec2f": wp.vec2, "vec3f": wp.vec3, "vec4f": wp.vec4,
            "vec6f": wp.spatial_vector, "quatf": wp.quat, "transformf": wp.transform, "mat22f": wp.mat22,
            "mat33f": wp.mat33, "mat44f": wp.mat44, "vec3i": wp.vec3i, "vec2i": wp.vec2i, "vec4i": wp.vec4i}


@dataclass
class Case:
    """How to feed one kernel: extra trailing dims per array (after n), int ranges, tolerance, float elements."""

    family: str
    dims: dict = field(default_factory=dict)  # array name -> trailing shape after the launch size n
    ints: dict = field(default_factory=dict)  # int array or scalar name -> (lo, hi), or "nonzero"
    tol: tuple = TOL
    floats: object = None  # float element strategy (FLOATS unless given)
    scalars: dict = field(default_factory=dict)  # fixed scalar values by name


def arg_kinds(kernel) -> list[tuple[str, str, int]]:
    """(name, element kind, ndim) per parameter; ndim 0 for a scalar."""
    out = []
    for arg in _warp_private.kernel_args(kernel):
        name = _warp_private.kernel_arg_type_name(arg.type)
        if name.startswith("array"):
            out.append((arg.label, name.split("d[", 1)[1][:-1], int(name[5])))
        else:
            out.append((arg.label, name, 0))
    return out


def element_shape(kind: str) -> tuple:
    if kind.startswith("mat"):
        return (int(kind[3]), int(kind[4]))
    width = KINDS[kind][1]
    return (width,) if width > 1 else ()


def draw(data, kernel, case: Case, n: int) -> dict:
    """Random inputs for every parameter of ``kernel`` (numpy arrays and Python scalars), by name."""
    feeds = {}
    for name, kind, ndim in arg_kinds(kernel):
        scalar = KINDS[kind][0]
        lo_hi = case.ints.get(name, (-50, 50))
        if scalar == "int32":
            if lo_hi == "nonzero":
                elements = st.one_of(st.integers(-50, -1), st.integers(1, 50))
            else:
                elements = st.integers(*lo_hi)
        else:
            elements = FLOATS if case.floats is None else case.floats
        if ndim == 0:
            feeds[name] = case.scalars[name] if name in case.scalars else data.draw(elements, label=name)
            continue
        shape = (n, *case.dims.get(name, ())) + element_shape(kind)
        dtype = np.int32 if scalar == "int32" else np.float32
        feeds[name] = data.draw(arrays(dtype, shape, elements=elements), label=name)
    return feeds


def warp_args(kernel, feeds: dict) -> list:
    args = []
    for name, kind, ndim in arg_kinds(kernel):
        value = feeds[name]
        args.append(wp.array(value.copy(), dtype=WP_DTYPE[kind], device="cpu") if ndim else value)
    return args


def warp_eager(kernel, dim, feeds: dict) -> dict:
    args = warp_args(kernel, feeds)
    wp.launch(kernel, dim=dim, inputs=args, device="cpu")
    return {name: a.numpy() for (name, _, ndim), a in zip(arg_kinds(kernel), args) if ndim}


def lower(kernel, dim, feeds: dict):
    return lower_wp_launch(kernel, dim, warp_args(kernel, feeds))


def lowered_run(kernel, dim, feeds: dict) -> dict:
    launch = lower(kernel, dim, feeds)
    tensors = [torch.from_numpy(feeds[name].copy()) for name, _, ndim in arg_kinds(kernel) if ndim]
    return {name: value.numpy() for name, value in launch(*tensors).items()}


def assert_close(got: np.ndarray, want: np.ndarray, tol=TOL, what: str = "") -> None:
    got = np.asarray(got).reshape(want.shape)
    if want.dtype.kind != "f":
        np.testing.assert_array_equal(got, want, err_msg=what)
        return
    atol, rtol = tol
    finite = np.isfinite(want)
    nan = np.isnan(got) != np.isnan(want)
    assert not nan.any(), f"{what}: nan mismatch at {np.argwhere(nan)[:4].tolist()}: lowered {got[nan][:4]} " \
        f"vs Warp {want[nan][:4]}"
    inf = np.isinf(want) & (got != want)
    assert not inf.any(), f"{what}: Warp inf at {np.argwhere(inf)[:4].tolist()}, lowered {got[inf][:4]}"
    err = np.abs(got[finite].astype(np.float64) - want[finite])
    bound = atol + rtol * np.abs(want[finite].astype(np.float64))
    bad = err > bound
    where = np.argwhere(finite)[bad][:4].tolist()
    assert not bad.any(), (f"{what}: at {where} lowered {got[finite][bad][:4]} vs Warp {want[finite][bad][:4]} "
                           f"(error {err[bad][:4]})")


def check(kernel, dim, feeds: dict, tol=TOL) -> dict:
    """Warp eager and the lowered launch on ``feeds``; asserts every array agrees; returns Warp's arrays."""
    want = warp_eager(kernel, dim, feeds)
    got = lowered_run(kernel, dim, feeds)
    for name, value in want.items():
        assert_close(got[name], value, tol, f"{kernel.key}.{name}")
    return want
