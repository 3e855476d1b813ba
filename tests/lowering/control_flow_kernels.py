"""Kernels of the control-flow and memory tests (test_lower_control_flow.py), shared with the ONNX export test
(test_lower_onnx.py): branches, early returns, loops, wp.func, gathers and scatters, 2-D to 4-D launches."""

from __future__ import annotations

import pytest

wp = pytest.importorskip("warp")

from lowering_harness import Case  # noqa: E402


@wp.kernel
def k_branches(a: wp.array(dtype=float), b: wp.array(dtype=float), out: wp.array(dtype=float),
               flag: wp.array(dtype=int)):
    i = wp.tid()
    x = a[i]
    if x > 0.0:
        out[i] = x * 2.0
        if b[i] > x:
            flag[i] = 1
        else:
            flag[i] = 2
    elif x < -1.0:
        out[i] = b[i]
    else:
        out[i] = -1.0
        flag[i] = 3


@wp.kernel
def k_select_and_or(a: wp.array(dtype=float), b: wp.array(dtype=float), out: wp.array2d(dtype=float)):
    i = wp.tid()
    x = a[i]
    y = b[i]
    out[i, 0] = x if x > y else y * 0.5
    out[i, 1] = wp.where((x > 0.0 and y > 0.0) or x < -2.0, 1.0, 0.0)
    z = float(0.0)
    if x > 0.0 or y > 1.0:
        z = x + y
    if not (x > 0.0 and y < 0.0):
        z = z * 3.0
    out[i, 2] = z


@wp.kernel
def k_early_return(a: wp.array(dtype=float), out: wp.array(dtype=float)):
    i = wp.tid()
    out[i] = 1.0
    if a[i] < 0.0:
        return
    out[i] = a[i] + 1.0
    if a[i] > 2.0:
        out[i] = 5.0
        return
    out[i] = out[i] * 2.0


@wp.kernel
def k_loops(a: wp.array(dtype=float), out: wp.array2d(dtype=float)):
    i = wp.tid()
    s = float(0.0)
    for j in range(4):  # a constant loop: Warp unrolls it
        s = s + a[i] * float(j)
    out[i, 0] = s
    t = float(0.0)
    for j in range(i + 1):  # bound from wp.tid(): known when lowering
        if j == 2:
            continue
        t = t + float(j) * a[i]
    out[i, 1] = t
    u = float(0.0)
    for j in range(a.shape[0]):  # bound from a shape
        u = u + a[j]
        if u > 3.0:
            break
    out[i, 2] = u
    k = int(0)
    w = float(1.0)
    while k < 5:  # a constant-derived condition
        w = w * 0.5 + a[i]
        k += 1
    out[i, 3] = w


@wp.kernel
def k_while_data_break(a: wp.array(dtype=float), out: wp.array(dtype=float)):
    i = wp.tid()
    k = int(0)
    w = float(1.0)
    while k < 5:
        w = w * 0.5 + a[i]
        k += 1
        if w > 100.0:
            break
    out[i] = w


@wp.func
def clipped(x: float, lim: float):
    if x > lim:
        return lim
    if x < -lim:
        return -lim
    return x * 1.5


@wp.kernel
def k_func_static(a: wp.array(dtype=float), out: wp.array2d(dtype=float)):
    i = wp.tid()
    out[i, 0] = clipped(a[i], 2.0)
    out[i, 1] = clipped(a[i] * 3.0, wp.static(1.0 + 0.5))
    s = float(0.0)
    for j in range(wp.static(3)):
        s = s + clipped(a[i], float(j))
    out[i, 2] = s


@wp.kernel
def k_gather_scatter(a: wp.array(dtype=float), v: wp.array(dtype=wp.vec3), idx: wp.array(dtype=int),
                     out: wp.array(dtype=float), vout: wp.array(dtype=wp.vec3)):
    i = wp.tid()
    out[idx[i]] = a[idx[(i + 1) % idx.shape[0]]] * 2.0
    vout[i] = v[idx[i]] + v[i]


@wp.kernel
def k_inplace(v: wp.array(dtype=wp.vec3), s: wp.array(dtype=float), out: wp.array(dtype=wp.vec3),
              m: wp.array(dtype=wp.mat22)):
    i = wp.tid()
    x = v[i]
    x[0] = s[i]
    x[1] += s[i]
    x[2] -= 1.0
    if s[i] > 0.0:
        x[2] = 7.0
    out[i] = x
    y = m[i]
    y[0, 1] = s[i]
    y[1, 0] += 2.0
    m[i] = y


@wp.kernel
def k_2d(a: wp.array2d(dtype=float), out: wp.array2d(dtype=float)):
    i, j = wp.tid()
    out[i, j] = a[i, j] * float(i) + a[j % a.shape[0], i % a.shape[1]]


@wp.kernel
def k_3d(a: wp.array3d(dtype=float), out: wp.array3d(dtype=float)):
    i, j, k = wp.tid()
    if a[i, j, k] > 0.0:
        out[i, j, k] = a[i, j, k] + float(i * 100 + j * 10 + k)


@wp.kernel
def k_4d(a: wp.array4d(dtype=float), out: wp.array4d(dtype=float)):
    i, j, k, l = wp.tid()
    out[i, j, k, l] = a[i, j, k, l] * 2.0 + float(l - k + j - i)


CASES = {
    k_branches: Case("if/elif/else, nested if, stores in branches", ints={"flag": (0, 0)}),
    k_select_and_or: Case("x if c else y, and/or/not", dims={"out": (3,)}),
    k_early_return: Case("early return"),
    k_loops: Case("constant, tid and shape loops, while, break/continue", dims={"out": (4,)}),
    k_func_static: Case("wp.func with early returns, wp.static", dims={"out": (3,)}),
    k_inplace: Case("v[0] = x, v[1] += x, m[0, 1] = x"),
}
