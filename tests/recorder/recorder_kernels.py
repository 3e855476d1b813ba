"""Warp kernels shared by the recorder tests (one Warp module: compiled once, then cached)."""

from __future__ import annotations

from typing import Any

import warp as wp


@wp.kernel
def projected_gravity(q: wp.array(dtype=wp.quat), g: wp.vec3, out: wp.array(dtype=wp.vec3)):
    i = wp.tid()
    out[i] = wp.quat_rotate_inv(q[i], g)


@wp.kernel
def scale(src: wp.array(dtype=float), s: float, dst: wp.array(dtype=float)):
    i = wp.tid()
    dst[i] = src[i] * s


@wp.kernel
def add_one(a: wp.array(dtype=float)):
    i = wp.tid()
    a[i] = a[i] + 1.0


@wp.kernel
def add_arrays(a: wp.array(dtype=float), b: wp.array(dtype=float), out: wp.array(dtype=float)):
    i = wp.tid()
    out[i] = a[i] + b[i]


@wp.kernel
def scale_strided(src: wp.array2d(dtype=float), s: float, dst: wp.array2d(dtype=float)):
    i, j = wp.tid()
    dst[i, j] = src[i, j] * s


@wp.struct
class Pair:
    a: float
    b: float


@wp.kernel
def fill_pairs(src: wp.array(dtype=float), out: wp.array(dtype=Pair)):
    i = wp.tid()
    p = Pair()
    p.a = src[i]
    p.b = src[i] * 2.0
    out[i] = p


@wp.kernel
def copy2d(src: wp.array2d(dtype=Any), dst: wp.array2d(dtype=Any)):
    i, j = wp.tid()
    dst[i, j] = src[i, j]


SCALAR_DTYPES = [
    wp.bool, wp.int8, wp.uint8, wp.int16, wp.uint16, wp.int32, wp.uint32, wp.int64, wp.uint64,
    wp.float16, wp.float32, wp.float64,
]
COMPOUND_DTYPES = [wp.vec3, wp.quat, wp.mat33, wp.transform]

for _dtype in SCALAR_DTYPES + COMPOUND_DTYPES:
    wp.overload(copy2d, {"src": wp.array2d(dtype=_dtype), "dst": wp.array2d(dtype=_dtype)})
