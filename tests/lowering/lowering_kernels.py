"""One small Warp kernel per lowered builtin overload (the equivalence tests launch each and lower each)."""

from __future__ import annotations

import warp as wp

# kernel -> kinds of its array arguments in order (the last one is written)
F, V, Q = "float32", "vec3f", "quatf"


@wp.kernel
def k_add_f(a: wp.array(dtype=float), b: wp.array(dtype=float), out: wp.array(dtype=float)):
    i = wp.tid()
    out[i] = a[i] + b[i] - a[i] * b[i] / (b[i] + 3.0) + (-a[i])


@wp.kernel
def k_vec_ops(a: wp.array(dtype=wp.vec3), b: wp.array(dtype=wp.vec3), s: wp.array(dtype=float),
              out: wp.array(dtype=wp.vec3)):
    i = wp.tid()
    out[i] = (a[i] + b[i]) * s[i] - 2.0 * b[i] + a[i] / (wp.abs(s[i]) + 1.0) - (-a[i])


@wp.kernel
def k_math(a: wp.array(dtype=float), b: wp.array(dtype=float), out: wp.array(dtype=float)):
    i = wp.tid()
    out[i] = wp.sqrt(wp.abs(a[i])) + wp.sin(a[i]) * wp.cos(b[i]) + wp.min(a[i], b[i]) - wp.max(a[i], 0.5)


@wp.kernel
def k_clamp(a: wp.array(dtype=float), b: wp.array(dtype=float), out: wp.array(dtype=float)):
    i = wp.tid()
    out[i] = wp.clamp(a[i], -1.0, b[i])


@wp.kernel
def k_vec_build(a: wp.array(dtype=float), b: wp.array(dtype=wp.vec3), out: wp.array(dtype=wp.vec3)):
    i = wp.tid()
    v = wp.vec3(a[i], 2.0, b[i].z)
    out[i] = wp.vec3(v[1] * b[i].x, v.x, v[2])


@wp.kernel
def k_dot_cross(a: wp.array(dtype=wp.vec3), b: wp.array(dtype=wp.vec3), out: wp.array(dtype=wp.vec3)):
    i = wp.tid()
    out[i] = wp.cross(a[i], b[i]) * wp.dot(a[i], b[i])


@wp.kernel
def k_length_normalize(a: wp.array(dtype=wp.vec3), s: wp.array(dtype=float), out: wp.array(dtype=wp.vec3)):
    i = wp.tid()
    out[i] = wp.normalize(a[i] * s[i]) * wp.length(a[i])


@wp.kernel
def k_quat_rotate(q: wp.array(dtype=wp.quat), v: wp.array(dtype=wp.vec3), out: wp.array(dtype=wp.vec3)):
    i = wp.tid()
    out[i] = wp.quat_rotate(q[i], v[i])


@wp.kernel
def k_quat_rotate_inv(q: wp.array(dtype=wp.quat), v: wp.array(dtype=wp.vec3), out: wp.array(dtype=wp.vec3)):
    i = wp.tid()
    out[i] = wp.quat_rotate_inv(q[i], v[i])


@wp.kernel
def k_quat_build(a: wp.array(dtype=float), q: wp.array(dtype=wp.quat), out: wp.array(dtype=wp.quat)):
    i = wp.tid()
    p = wp.quat(q[i].w, a[i], q[i][0], 1.0)
    out[i] = wp.normalize(p + q[i]) * wp.length(q[i]) - q[i] * wp.dot(p, q[i])


@wp.kernel
def k_read_after_write(a: wp.array(dtype=float), out: wp.array(dtype=float), out2: wp.array(dtype=float)):
    i = wp.tid()
    out[i] = a[i] * 2.0
    out2[i] = out[i] + 1.0
    out[i] = out2[i] * out[i]


@wp.kernel
def k_scalar_param(a: wp.array(dtype=wp.vec3), scale: float, out: wp.array(dtype=wp.vec3)):
    i = wp.tid()
    out[i] = a[i] * scale


KERNELS = {
    k_add_f: [F, F, F],
    k_vec_ops: [V, V, F, V],
    k_math: [F, F, F],
    k_clamp: [F, F, F],
    k_vec_build: [F, V, V],
    k_dot_cross: [V, V, V],
    k_length_normalize: [V, F, V],
    k_quat_rotate: [Q, V, V],
    k_quat_rotate_inv: [Q, V, V],
    k_quat_build: [F, Q, Q],
    k_read_after_write: [F, F, F],
    k_scalar_param: [V, "scalar", V],
}
