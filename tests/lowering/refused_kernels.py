"""Kernels the lowering refuses, each for one named construct (test_lower_refusals)."""

from __future__ import annotations

import warp as wp


@wp.kernel
def k_atomic(a: wp.array(dtype=float), out: wp.array(dtype=float)):
    i = wp.tid()
    wp.atomic_add(out, 0, a[i])


@wp.kernel
def k_data_loop(a: wp.array(dtype=float), n: wp.array(dtype=int), out: wp.array(dtype=float)):
    i = wp.tid()
    s = float(0.0)
    for _j in range(n[i]):
        s = s + a[i]
    out[i] = s


@wp.kernel
def k_data_while(a: wp.array(dtype=float), out: wp.array(dtype=float)):
    i = wp.tid()
    x = a[i]
    while x > 1.0:
        x = x * 0.5
    out[i] = x


@wp.kernel
def k_printf(a: wp.array(dtype=float), out: wp.array(dtype=float)):
    i = wp.tid()
    wp.printf("%f\n", a[i])
    out[i] = a[i]


@wp.kernel
def k_tile(a: wp.array(dtype=float), out: wp.array(dtype=float)):
    wp.tid()
    t = wp.tile_load(a, shape=4)
    wp.tile_store(out, t)


@wp.kernel
def k_float64(a: wp.array(dtype=wp.float64), out: wp.array(dtype=wp.float64)):
    i = wp.tid()
    out[i] = a[i] * wp.float64(2.0)


@wp.kernel
def k_mesh(mesh: wp.uint64, p: wp.array(dtype=wp.vec3), out: wp.array(dtype=float)):
    i = wp.tid()
    q = wp.mesh_query_point(mesh, p[i], 10.0)
    out[i] = q.u


# kernel -> the construct its refusal must name (a regular expression)
REFUSED = {
    k_atomic: r"builtin `atomic_add`",
    k_data_loop: r"loop whose trip count is not known when lowering \(dynamic loop\)",
    k_data_while: r"while loop whose condition is not known when lowering \(dynamic loop\)",
    k_printf: r"builtin `printf`",
    k_tile: r"builtin `tile_load`",
    k_float64: r"array argument 'a' of type array1d\[float64\]",
    k_mesh: r"builtin `mesh_query_point`",
}
