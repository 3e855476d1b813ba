"""Kernels the first lowering slice refuses, each for one named construct."""

from __future__ import annotations

import warp as wp


@wp.func
def twice(x: float):
    return 2.0 * x


@wp.kernel
def k_branch(a: wp.array(dtype=float), out: wp.array(dtype=float)):
    i = wp.tid()
    v = a[i]
    if v > 0.0:
        v = -v
    out[i] = v


@wp.kernel
def k_loop(a: wp.array(dtype=float), n: int, out: wp.array(dtype=float)):
    i = wp.tid()
    s = float(0.0)
    for _j in range(n):
        s = s + a[i]
    out[i] = s


@wp.kernel
def k_gather(a: wp.array(dtype=float), idx: wp.array(dtype=wp.int32), out: wp.array(dtype=float)):
    i = wp.tid()
    out[i] = a[idx[i]]


@wp.kernel
def k_atomic(a: wp.array(dtype=float), out: wp.array(dtype=float)):
    i = wp.tid()
    wp.atomic_add(out, 0, a[i])


@wp.kernel
def k_func(a: wp.array(dtype=float), out: wp.array(dtype=float)):
    i = wp.tid()
    out[i] = twice(a[i])


@wp.kernel
def k_2d(a: wp.array2d(dtype=float), out: wp.array2d(dtype=float)):
    i, j = wp.tid()
    out[i, j] = a[i, j]


@wp.kernel
def k_exp(a: wp.array(dtype=float), out: wp.array(dtype=float)):
    i = wp.tid()
    out[i] = wp.exp(a[i])


# kernel -> the construct its refusal must name
REFUSED = {
    k_branch: "if/else on data",
    k_loop: "loop",
    k_gather: "index other than wp.tid()",
    k_atomic: "atomic_add",
    k_func: "wp.func call `twice`",
    k_2d: "more than one dimension",
    k_exp: "builtin `exp(float32)`",
}
