"""One small Warp kernel per family of lowered builtins, each with how to feed it (``lowering_harness.Case``).

Every result goes to its own column of a 2-D output, so one launch checks a
family's overloads together and a mismatch names its column.
"""

from __future__ import annotations

import warp as wp

from lowering_harness import SMALL_FLOATS, Case


@wp.kernel
def k_f32_arith(a: wp.array(dtype=float), b: wp.array(dtype=float), out: wp.array2d(dtype=float)):
    i = wp.tid()
    x = a[i]
    y = b[i]
    out[i, 0] = x + y
    out[i, 1] = x - y
    out[i, 2] = x * y
    out[i, 3] = x / y
    out[i, 4] = -x
    out[i, 5] = +x
    out[i, 6] = wp.mod(x, y)
    out[i, 7] = x * 2.0 + 1.0 - y / 3.0
    out[i, 8] = x // y


@wp.kernel
def k_i32_arith(a: wp.array(dtype=int), b: wp.array(dtype=int), out: wp.array2d(dtype=int)):
    i = wp.tid()
    x = a[i]
    y = b[i]
    out[i, 0] = x + y
    out[i, 1] = x - y
    out[i, 2] = x * y
    out[i, 3] = x / y
    out[i, 4] = x % y
    out[i, 5] = -x
    out[i, 6] = wp.abs(x)
    out[i, 7] = wp.min(x, y)
    out[i, 8] = wp.max(x, y)
    out[i, 9] = wp.clamp(x, -3, y)
    out[i, 10] = x // y
    out[i, 11] = x * 3 + 7 - y


@wp.kernel
def k_math(a: wp.array(dtype=float), b: wp.array(dtype=float), out: wp.array2d(dtype=float)):
    i = wp.tid()
    x = a[i]
    y = b[i]
    out[i, 0] = wp.sqrt(x)
    out[i, 1] = wp.sin(x)
    out[i, 2] = wp.cos(x)
    out[i, 3] = wp.tan(x)
    out[i, 4] = wp.asin(x)
    out[i, 5] = wp.acos(x)
    out[i, 6] = wp.atan(x)
    out[i, 7] = wp.sinh(x)
    out[i, 8] = wp.cosh(x)
    out[i, 9] = wp.tanh(x)
    out[i, 10] = wp.exp(x)
    out[i, 11] = wp.log(x)
    out[i, 12] = wp.log2(x)
    out[i, 13] = wp.log10(x)
    out[i, 14] = wp.floor(x)
    out[i, 15] = wp.ceil(x)
    out[i, 16] = wp.round(x)
    out[i, 17] = wp.trunc(x)
    out[i, 18] = wp.pow(x, y)
    out[i, 19] = wp.atan2(x, y)
    out[i, 20] = wp.round(wp.floor(y) + 0.5)  # exact halves: Warp rounds them away from zero
    out[i, 21] = wp.rint(wp.floor(y) + 0.5)  # and rint to even
    out[i, 22] = wp.frac(x)
    out[i, 23] = wp.degrees(x)
    out[i, 24] = wp.radians(x)


@wp.kernel
def k_minmax(a: wp.array(dtype=float), b: wp.array(dtype=float), c: wp.array(dtype=float),
             out: wp.array2d(dtype=float)):
    i = wp.tid()
    out[i, 0] = wp.min(a[i], b[i])
    out[i, 1] = wp.max(a[i], b[i])
    out[i, 2] = wp.clamp(a[i], b[i], c[i])
    out[i, 3] = wp.abs(a[i])
    out[i, 4] = wp.sign(a[i])
    out[i, 5] = wp.min(wp.sqrt(a[i]), b[i])  # nan operand: Warp's fminf returns the other
    out[i, 6] = wp.max(b[i], wp.log(a[i]))


@wp.kernel
def k_vec3(a: wp.array(dtype=wp.vec3), b: wp.array(dtype=wp.vec3), s: wp.array(dtype=float),
           out: wp.array2d(dtype=wp.vec3)):
    i = wp.tid()
    x = a[i]
    y = b[i]
    out[i, 0] = x + y
    out[i, 1] = x - y
    out[i, 2] = x * s[i]
    out[i, 3] = s[i] * y
    out[i, 4] = x / s[i]
    out[i, 5] = -x
    out[i, 6] = wp.cw_mul(x, y)
    out[i, 7] = wp.cw_div(x, y)
    out[i, 8] = wp.min(x, y)
    out[i, 9] = wp.max(x, y)
    out[i, 10] = wp.abs(x)
    out[i, 11] = s[i] / y
    out[i, 12] = +x


@wp.kernel
def k_geometry(a: wp.array(dtype=wp.vec3), b: wp.array(dtype=wp.vec3), out: wp.array2d(dtype=wp.vec3),
               sc: wp.array2d(dtype=float)):
    i = wp.tid()
    x = a[i]
    y = b[i]
    out[i, 0] = wp.cross(x, y)
    out[i, 1] = wp.normalize(x)
    out[i, 2] = wp.normalize(x * 0.0)  # a zero vector normalizes to zero
    sc[i, 0] = wp.dot(x, y)
    sc[i, 1] = wp.length(x)
    sc[i, 2] = wp.length_sq(y)


@wp.kernel
def k_other_vecs(a2: wp.array(dtype=wp.vec2), a4: wp.array(dtype=wp.vec4), a6: wp.array(dtype=wp.spatial_vector),
                 o2: wp.array(dtype=wp.vec2), o4: wp.array(dtype=wp.vec4), o6: wp.array(dtype=wp.spatial_vector),
                 sc: wp.array2d(dtype=float)):
    i = wp.tid()
    o2[i] = wp.normalize(a2[i]) * 2.0 - a2[i] / 3.0
    o4[i] = wp.max(a4[i], -a4[i]) + wp.cw_mul(a4[i], a4[i])
    o6[i] = a6[i] * 0.5 + a6[i]
    sc[i, 0] = wp.dot(a2[i], a2[i])
    sc[i, 1] = wp.length(a4[i])
    sc[i, 2] = wp.dot(a6[i], a6[i])
    sc[i, 3] = wp.length_sq(a4[i])


@wp.kernel
def k_int_vecs(a: wp.array(dtype=wp.vec3i), b: wp.array(dtype=wp.vec3i), out: wp.array2d(dtype=wp.vec3i),
               sc: wp.array2d(dtype=int)):
    i = wp.tid()
    out[i, 0] = a[i] + b[i]
    out[i, 1] = a[i] - b[i]
    out[i, 2] = -a[i]
    out[i, 3] = wp.vec3i(a[i][2], b[i].x, 7)
    sc[i, 0] = a[i][1]
    sc[i, 1] = b[i].z


@wp.kernel
def k_quat(q: wp.array(dtype=wp.quat), r: wp.array(dtype=wp.quat), v: wp.array(dtype=wp.vec3),
           s: wp.array(dtype=float), out: wp.array2d(dtype=wp.quat), vout: wp.array2d(dtype=wp.vec3),
           sc: wp.array2d(dtype=float)):
    i = wp.tid()
    out[i, 0] = q[i] * r[i]
    out[i, 1] = q[i] + r[i]
    out[i, 2] = q[i] - r[i]
    out[i, 3] = q[i] * s[i]
    out[i, 4] = s[i] * q[i]
    out[i, 5] = q[i] / s[i]
    out[i, 6] = -q[i]
    out[i, 7] = wp.quat_inverse(q[i])
    out[i, 8] = wp.normalize(q[i])
    out[i, 9] = wp.quat_from_axis_angle(v[i], s[i])
    out[i, 10] = wp.quat(v[i], s[i])
    out[i, 11] = wp.quat(s[i], q[i].x, q[i][2], 1.0)
    out[i, 12] = wp.quat()  # zeros in Warp 1.19
    vout[i, 0] = wp.quat_rotate(q[i], v[i])
    vout[i, 1] = wp.quat_rotate_inv(q[i], v[i])
    vout[i, 2] = wp.quat_rotate(wp.normalize(q[i]), v[i])
    sc[i, 0] = wp.dot(q[i], r[i])
    sc[i, 1] = wp.length(q[i])
    sc[i, 2] = wp.length_sq(q[i])
    sc[i, 3] = q[i].w
    sc[i, 4] = q[i][1]


@wp.kernel
def k_transform(t: wp.array(dtype=wp.transform), p: wp.array(dtype=wp.vec3), q: wp.array(dtype=wp.quat),
                tout: wp.array2d(dtype=wp.transform), vout: wp.array2d(dtype=wp.vec3), qout: wp.array(dtype=wp.quat)):
    i = wp.tid()
    tout[i, 0] = wp.transform(p[i], q[i])
    tout[i, 1] = t[i] + wp.transform(p[i], q[i])
    tout[i, 2] = t[i] - wp.transform(p[i], q[i])
    vout[i, 0] = wp.transform_point(t[i], p[i])
    vout[i, 1] = wp.transform_vector(t[i], p[i])
    vout[i, 2] = wp.transform_get_translation(t[i]) + wp.vec3(t[i][0], t[i][6], 1.0)
    qout[i] = wp.transform_get_rotation(t[i])


@wp.kernel
def k_spatial(a: wp.array(dtype=wp.vec3), b: wp.array(dtype=wp.vec3), s: wp.array(dtype=float),
              out: wp.array2d(dtype=wp.spatial_vector), vout: wp.array2d(dtype=wp.vec3)):
    i = wp.tid()
    w = wp.spatial_vector(a[i], b[i])
    out[i, 0] = w
    out[i, 1] = wp.spatial_vector(s[i], 1.0, a[i].x, b[i][1], 2.0, s[i])
    vout[i, 0] = wp.spatial_top(w)
    vout[i, 1] = wp.spatial_bottom(w)


@wp.kernel
def k_matrix(m: wp.array(dtype=wp.mat33), n: wp.array(dtype=wp.mat33), v: wp.array(dtype=wp.vec3),
             s: wp.array(dtype=float), out: wp.array2d(dtype=wp.mat33), vout: wp.array2d(dtype=wp.vec3),
             sc: wp.array2d(dtype=float)):
    i = wp.tid()
    out[i, 0] = m[i] + n[i]
    out[i, 1] = m[i] - n[i]
    out[i, 2] = m[i] * s[i]
    out[i, 3] = s[i] * m[i]
    out[i, 4] = m[i] / s[i]
    out[i, 5] = -m[i]
    out[i, 6] = wp.transpose(m[i])
    out[i, 7] = wp.mat33(s[i], 1.0, 2.0, v[i].x, v[i][1], 5.0, 6.0, 7.0, s[i])
    vout[i, 0] = m[i] * v[i]
    vout[i, 1] = v[i] * m[i]
    vout[i, 2] = m[i][1]
    sc[i, 0] = m[i][2, 0]
    sc[i, 1] = m[i][0, 2]


@wp.kernel
def k_matmul(m: wp.array(dtype=wp.mat33), n: wp.array(dtype=wp.mat33), a: wp.array(dtype=wp.mat22),
             b: wp.array(dtype=wp.mat22), c: wp.array(dtype=wp.mat44), d: wp.array(dtype=wp.mat44),
             o3: wp.array(dtype=wp.mat33), o2: wp.array(dtype=wp.mat22), o4: wp.array(dtype=wp.mat44),
             v4: wp.array(dtype=wp.vec4)):
    i = wp.tid()
    o3[i] = m[i] * n[i]
    o2[i] = a[i] * b[i] + wp.transpose(a[i]) - b[i] * 2.0
    o4[i] = c[i] * d[i] + wp.transpose(c[i])
    v4[i] = c[i] * wp.vec4(1.0, 2.0, -3.0, 0.5)


@wp.kernel
def k_compare(a: wp.array(dtype=float), b: wp.array(dtype=float), ia: wp.array(dtype=int), ib: wp.array(dtype=int),
              out: wp.array2d(dtype=int)):
    i = wp.tid()
    x = a[i]
    y = b[i]
    out[i, 0] = int(x < y)
    out[i, 1] = int(x <= y)
    out[i, 2] = int(x > y)
    out[i, 3] = int(x >= y)
    out[i, 4] = int(x == y)
    out[i, 5] = int(x != y)
    out[i, 6] = int(ia[i] < ib[i])
    out[i, 7] = int(ia[i] == ib[i])
    out[i, 8] = int(-1.0 < x < y)
    out[i, 9] = int(ia[i] >= 0 and ib[i] >= 0)
    out[i, 10] = int(ia[i] > 5 or x > 0.0)
    out[i, 11] = int(not (x > y))


@wp.kernel
def k_where_cast(a: wp.array(dtype=float), b: wp.array(dtype=float), ia: wp.array(dtype=int),
                 v: wp.array(dtype=wp.vec3), out: wp.array2d(dtype=float), iout: wp.array2d(dtype=int),
                 vout: wp.array2d(dtype=wp.vec3)):
    i = wp.tid()
    x = a[i]
    out[i, 0] = wp.where(x > b[i], x, b[i])
    out[i, 1] = wp.where(ia[i], x, 2.0)
    out[i, 2] = wp.where(bool(x), 1.0, b[i])
    out[i, 3] = float(ia[i])
    out[i, 4] = wp.float32(ia[i]) * 0.5
    out[i, 5] = float(x > 0.0)
    out[i, 6] = x if ia[i] > 0 else b[i]
    iout[i, 0] = int(x)
    iout[i, 1] = wp.int32(b[i])
    iout[i, 2] = int(bool(ia[i]))
    iout[i, 3] = int(bool(x))
    iout[i, 4] = wp.where(x < 0.0, ia[i], 3)
    vout[i, 0] = wp.where(ia[i] > 0, v[i], -v[i])


@wp.kernel
def k_constructors(a: wp.array(dtype=float), b: wp.array(dtype=float), v2: wp.array(dtype=wp.vec2),
                   v3: wp.array(dtype=wp.vec3), v4: wp.array(dtype=wp.vec4), m2: wp.array(dtype=wp.mat22),
                   m4: wp.array(dtype=wp.mat44), sc: wp.array2d(dtype=float)):
    i = wp.tid()
    v2[i] = wp.vec2(a[i], b[i])
    v3[i] = wp.vec3(a[i]) + wp.vec3() + wp.vec3(1.0, b[i], 2.0)
    v4[i] = wp.vec4(a[i], b[i], 3.0, a[i] * b[i])
    m2[i] = wp.mat22(a[i], b[i], 1.0, -a[i])
    m4[i] = wp.mat44(a[i], 0.0, 0.0, 1.0, 0.0, b[i], 0.0, 2.0, 0.0, 0.0, 1.0, 3.0, 0.0, 0.0, 0.0, 1.0)
    w = v4[i]
    sc[i, 0] = w.x + w.y * 2.0
    sc[i, 1] = w[2] - w.w
    sc[i, 2] = v3[i].z


# kernel -> how to feed it; the family names the rows it covers (the report's table)
CASES = {
    k_f32_arith: Case("float32 arithmetic (+ - * / neg pos mod //)", dims={"out": (9,)}),
    k_i32_arith: Case("int32 arithmetic, abs/min/max/clamp", dims={"out": (12,)}, ints={"b": "nonzero"}),
    k_math: Case("math functions", dims={"out": (25,)}),
    k_minmax: Case("min/max/clamp/abs/sign float32", dims={"out": (7,)}),
    k_vec3: Case("vec3 arithmetic, cw_mul/cw_div, min/max/abs", dims={"out": (13,)}),
    k_geometry: Case("dot/length/length_sq/normalize/cross", dims={"out": (3,), "sc": (3,)}),
    k_other_vecs: Case("vec2/vec4/vec6 arithmetic, dot, length", dims={"sc": (4,)}),
    k_int_vecs: Case("vec3i arithmetic, constructor, extract", dims={"out": (4,), "sc": (2,)}),
    k_quat: Case("quaternions", dims={"out": (13,), "vout": (3,), "sc": (5,)}),
    k_transform: Case("transforms", dims={"tout": (3,), "vout": (3,)}),
    k_spatial: Case("spatial vectors", dims={"out": (2,), "vout": (2,)}),
    k_matrix: Case("mat33 arithmetic, mat*vec, transpose, rows, elements", dims={"out": (8,), "vout": (3,),
                                                                                     "sc": (2,)}),
    k_matmul: Case("mat22/33/44 products", floats=SMALL_FLOATS),
    k_compare: Case("comparisons, and/or/not", dims={"out": (12,)}, ints={"ia": (-8, 8), "ib": (-8, 8)}),
    k_where_cast: Case("where, x if c else y, casts float<->int<->bool", dims={"out": (7,), "iout": (5,),
                                                                                "vout": (1,)}),
    k_constructors: Case("vector/matrix constructors, extract", dims={"sc": (3,)}),
}

