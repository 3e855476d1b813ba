"""The builtin table: Warp builtin name + argument kinds -> result kind and a program of IR primitives.

Data, not code per builtin: a row's program is a tuple of steps
``(name, primitive, operands, attrs)``; an operand is ``$k`` (the call's k-th
argument, in Warp's parameter order), an earlier step's name, or a float
literal (a shared constant). The last step is the result. ``attrs`` values
may be ``$k`` too: that argument must then be a compile-time constant.
Formulas follow Warp's native headers (warp/native/quat.h, vec.h, mat.h,
spatial.h, builtin.h), term by term in Warp's order, so float32 rounding
stays close. docs/lowering.md lists the rows.
"""

from __future__ import annotations

__all__ = ["BUILTINS", "STATIC_PARAMS", "builtin_row", "has_rows"]

# Keyword parameters Warp binds from the output type (e.g. wp.vec3's length and dtype): checked, not computed.
STATIC_PARAMS = frozenset({"length", "dtype", "shape"})

F, I, B, Q, T = "float32", "int32", "bool", "quatf", "transformf"
VECS = tuple(f"vec{n}f" for n in range(2, 11))
IVECS = ("vec2i", "vec3i", "vec4i")
MATS = {"mat22f": 2, "mat33f": 3, "mat44f": 4}
FLOAT_KINDS = (F, *VECS, Q, T, *MATS)
ALL_KINDS = (F, I, B, *VECS, *IVECS, Q, T, *MATS)
V3 = "vec3f"


def _unary(primitive: str, **attrs):
    return (("r", primitive, ("$0",), tuple(attrs.items())),)


def _binary(primitive: str):
    return (("r", primitive, ("$0", "$1"), ()),)


def _pick(src: str, *indices: int, name: str = "r"):
    return (name, "Pick", (src,), (("indices", tuple(indices)),))


def _rename(program, mapping: dict[str, str], prefix: str):
    """``program`` with operands renamed by ``mapping`` and its own steps put under ``prefix``."""
    out = []
    for n, p, ops, attrs in program:
        ops = tuple(o if isinstance(o, float) else mapping.get(o, prefix + o) for o in ops)
        out.append((prefix + n, p, ops, attrs))
    return tuple(out)


_DOT = (("p", "Mul", ("$0", "$1"), ()), ("r", "SumLast", ("p",), ()))
_LENGTH_SQ = (("p", "Mul", ("$0", "$0"), ()), ("r", "SumLast", ("p",), ()))
_LENGTH = (("p", "Mul", ("$0", "$0"), ()), ("s", "SumLast", ("p",), ()), ("r", "Sqrt", ("s",), ()))
# vec.h / quat.h: l = length(a); l > 0 ? a / l : 0
_NORMALIZE = _LENGTH[:2] + (
    ("l", "Sqrt", ("s",), ()),
    ("q", "Div", ("$0", "l"), ()),
    ("z", "Mul", ("$0", 0.0), ()),
    ("c", "Greater", ("l", 0.0), ()),
    ("r", "Where", ("c", "q", "z"), ()),
)
# quat.h normalize(q): l = length(q); l > 0 ? q * (1 / l) : identity (0, 0, 0, 1)
_QUAT_NORMALIZE = _LENGTH[:2] + (
    ("l", "Sqrt", ("s",), ()),
    ("il", "Div", (1.0, "l"), ()),
    ("q", "Mul", ("$0", "il"), ()),
    ("z", "Mul", ("$0", 0.0), ()),
    _pick("z", 0, 1, 2, name="zv"),
    _pick("z", 3, name="zw"),
    ("one", "Add", ("zw", 1.0), ()),
    ("i", "Concat", ("zv", "one"), ()),
    ("c", "Greater", ("l", 0.0), ()),
    ("r", "Where", ("c", "q", "i"), ()),
)
# cross(a, b) = a.yzx * b.zxy - a.zxy * b.yzx
_CROSS = (
    _pick("$0", 1, 2, 0, name="a1"),
    _pick("$1", 2, 0, 1, name="b1"),
    _pick("$0", 2, 0, 1, name="a2"),
    _pick("$1", 1, 2, 0, name="b2"),
    ("m1", "Mul", ("a1", "b1"), ()),
    ("m2", "Mul", ("a2", "b2"), ()),
    ("r", "Sub", ("m1", "m2"), ()),
)


def _rotate(sign: str):
    """quat.h quat_rotate (sign Add) / quat_rotate_inv (Sub): x*c + q.xyz*d +- cross(q.xyz, x)*w*2."""
    return (
        _pick("$0", 0, 1, 2, name="qv"),
        _pick("$0", 3, name="w"),
        ("w2", "Mul", (2.0, "w"), ()),
        ("ww", "Mul", ("w2", "w"), ()),
        ("c", "Sub", ("ww", 1.0), ()),
        ("qx", "Mul", ("qv", "$1"), ()),
        ("sd", "SumLast", ("qx",), ()),
        ("d", "Mul", (2.0, "sd"), ()),
        *_rename(_CROSS, {"$0": "qv", "$1": "$1"}, "x_"),
        ("xw", "Mul", ("x_r", "w"), ()),
        ("xw2", "Mul", ("xw", 2.0), ()),
        ("t1", "Mul", ("$1", "c"), ()),
        ("t2", "Mul", ("qv", "d"), ()),
        ("t12", "Add", ("t1", "t2"), ()),
        ("r", sign, ("t12", "xw2"), ()),
    )


# quat.h mul(a, b), term by term: xyz = a.w*b.xyz + b.w*a.xyz + a.yzx*b.zxy - b.yzx*a.zxy,
# w = a.w*b.w - a.x*b.x - a.y*b.y - a.z*b.z
_QUAT_MUL = (
    _pick("$0", 0, 1, 2, name="av"),
    _pick("$0", 3, name="aw"),
    _pick("$1", 0, 1, 2, name="bv"),
    _pick("$1", 3, name="bw"),
    ("t1", "Mul", ("aw", "bv"), ()),
    ("t2", "Mul", ("bw", "av"), ()),
    ("t12", "Add", ("t1", "t2"), ()),
    _pick("$0", 1, 2, 0, name="a1"),
    _pick("$1", 2, 0, 1, name="b1"),
    ("m1", "Mul", ("a1", "b1"), ()),
    _pick("$1", 1, 2, 0, name="b2"),
    _pick("$0", 2, 0, 1, name="a2"),
    ("m2", "Mul", ("b2", "a2"), ()),
    ("s1", "Add", ("t12", "m1"), ()),
    ("v", "Sub", ("s1", "m2"), ()),
    ("pd", "Mul", ("av", "bv"), ()),
    _pick("pd", 0, name="px"),
    _pick("pd", 1, name="py"),
    _pick("pd", 2, name="pz"),
    ("ww", "Mul", ("aw", "bw"), ()),
    ("w1", "Sub", ("ww", "px"), ()),
    ("w2", "Sub", ("w1", "py"), ()),
    ("w", "Sub", ("w2", "pz"), ()),
    ("r", "Concat", ("v", "w"), ()),
)
# quat.h quat_inverse(q) = (-x, -y, -z, w)
_QUAT_INVERSE = (
    _pick("$0", 0, 1, 2, name="v"),
    ("n", "Neg", ("v",), ()),
    _pick("$0", 3, name="w"),
    ("r", "Concat", ("n", "w"), ()),
)
# quat.h quat_from_axis_angle(axis, angle): half = angle * 0.5; (axis * sin(half), cos(half))
_AXIS_ANGLE = (
    ("h", "Mul", ("$1", 0.5), ()),
    ("s", "Sin", ("h",), ()),
    ("c", "Cos", ("h",), ()),
    ("v", "Mul", ("$0", "s"), ()),
    ("r", "Concat", ("v", "c"), ()),
)
# transform (p, q): transform_point(t, x) = rotate(q, x) + p; transform_vector(t, x) = rotate(q, x)
_T_VECTOR = (_pick("$0", 3, 4, 5, 6, name="q"), *_rename(_rotate("Add"), {"$0": "q", "$1": "$1"}, "rot_"),
             ("r", "Identity", ("rot_r",), ()))
_T_POINT = _T_VECTOR[:-1] + (_pick("$0", 0, 1, 2, name="p"), ("r", "Add", ("rot_r", "p"), ()))


def _elementwise(key: str, primitive: str, kinds, arity: int):
    return {(key, (k,) * arity): (k, _unary(primitive) if arity == 1 else _binary(primitive)) for k in kinds}


def _math(kinds=(F,)):
    names = {"sqrt": "Sqrt", "sin": "Sin", "cos": "Cos", "tan": "Tan", "atan": "Atan", "sinh": "Sinh",
             "cosh": "Cosh", "tanh": "Tanh", "exp": "Exp", "log": "Log",
             "floor": "Floor", "ceil": "Ceil", "round": "Round", "trunc": "Trunc", "rint": "Rint"}
    rows = {}
    for key, prim in names.items():
        rows.update(_elementwise(key, prim, kinds, 1))
    return rows


def _cast(to: str):
    return (("r", "Cast", ("$0",), (("to", to),)),)


# (Warp builtin key, argument kinds) -> (result kind, program)
BUILTINS: dict[tuple[str, tuple[str, ...]], tuple[str, tuple]] = {
    **_elementwise("add", "Add", (F, I, *VECS, *IVECS, Q, T, *MATS), 2),
    **_elementwise("sub", "Sub", (F, I, *VECS, *IVECS, Q, T, *MATS), 2),
    **_elementwise("neg", "Neg", (F, I, *VECS, *IVECS, Q, *MATS), 1),
    **{("pos", (k,)): (k, (("r", "Identity", ("$0",), ()),)) for k in (F, I, *VECS, Q)},
    ("mul", (F, F)): (F, _binary("Mul")),
    ("mul", (I, I)): (I, _binary("Mul")),
    **{("mul", (k, F)): (k, _binary("Mul")) for k in (*VECS, Q, *MATS)},
    **{("mul", (F, k)): (k, _binary("Mul")) for k in (*VECS, Q, *MATS)},
    **{("mul", (m, f"vec{n}f")): (f"vec{n}f", (("r", "MatMul", ("$0", "$1"), (("k", n), ("m", n), ("n", 1))),))
       for m, n in MATS.items()},
    **{("mul", (f"vec{n}f", m)): (f"vec{n}f", (("r", "MatMul", ("$0", "$1"), (("k", n), ("m", 1), ("n", n))),))
       for m, n in MATS.items()},
    **{("mul", (m, m)): (m, (("r", "MatMul", ("$0", "$1"), (("k", n), ("m", n), ("n", n))),)) for m, n in MATS.items()},
    ("mul", (Q, Q)): (Q, _QUAT_MUL),
    ("div", (F, F)): (F, _binary("Div")),
    ("div", (I, I)): (I, _binary("IDiv")),
    **{("div", (k, F)): (k, _binary("Div")) for k in (*VECS, Q, *MATS)},
    **{("div", (F, k)): (k, _binary("Div")) for k in VECS},
    ("mod", (I, I)): (I, _binary("IMod")),
    ("mod", (F, F)): (F, _binary("FMod")),
    # builtin.h floordiv: floorf(a / b) for floats, floordiv_signed (toward -inf) for ints
    ("floordiv", (F, F)): (F, (("q", "Div", ("$0", "$1"), ()), ("r", "Floor", ("q",), ()))),
    ("floordiv", (I, I)): (I, _binary("IFloorDiv")),
    **_math(),
    # builtin.h asin/acos: of min(max(x, -1), 1) (fminf/fmaxf, so a nan argument reads as -1)
    **{(key, (F,)): (F, (("lo", "FMax", ("$0", -1.0), ()), ("c", "FMin", ("lo", 1.0), ()), ("r", prim, ("c",), ())))
       for key, prim in (("asin", "Asin"), ("acos", "Acos"))},
    ("frac", (F,)): (F, (("t", "Trunc", ("$0",), ()), ("r", "Sub", ("$0", "t"), ()))),
    ("degrees", (F,)): (F, (("r", "Mul", ("$0", 57.29577951308232), ()),)),
    ("radians", (F,)): (F, (("r", "Mul", ("$0", 0.017453292519943295), ()),)),
    # builtin.h unot(b) = !b
    ("unot", (B,)): (B, _unary("Not")),
    **{("unot", (k,)): (B, (("r", "Equal", ("$0", 0.0), ()),)) for k in (F, I)},
    ("log2", (F,)): (F, (("l", "Log", ("$0",), ()), ("r", "Div", ("l", 0.6931471805599453), ()))),
    ("log10", (F,)): (F, (("l", "Log", ("$0",), ()), ("r", "Div", ("l", 2.302585092994046), ()))),
    ("pow", (F, F)): (F, _binary("Pow")),
    ("atan2", (F, F)): (F, _binary("Atan2")),
    **_elementwise("abs", "Abs", (F, I, *VECS), 1),
    ("sign", (F,)): (F, _unary("Sign")),
    # builtin.h: float min/max are fminf/fmaxf (a nan operand yields the other), int ones a < b ? a : b
    **_elementwise("min", "FMin", (F, *VECS), 2),
    **_elementwise("max", "FMax", (F, *VECS), 2),
    **_elementwise("min", "Min", (I,), 2),
    **_elementwise("max", "Max", (I,), 2),
    # builtin.h: clamp(x, a, b) = min(max(a, x), b)
    ("clamp", (F, F, F)): (F, (("m", "FMax", ("$1", "$0"), ()), ("r", "FMin", ("m", "$2"), ()))),
    ("clamp", (I, I, I)): (I, (("m", "Max", ("$1", "$0"), ()), ("r", "Min", ("m", "$2"), ()))),
    **{("dot", (k, k)): (F, _DOT) for k in (*VECS, Q)},
    **{("length", (k,)): (F, _LENGTH) for k in (*VECS, Q)},
    **{("length_sq", (k,)): (F, _LENGTH_SQ) for k in (*VECS, Q)},
    **{("normalize", (k,)): (k, _NORMALIZE) for k in VECS},
    ("normalize", (Q,)): (Q, _QUAT_NORMALIZE),
    ("cross", (V3, V3)): (V3, _CROSS),
    **{("cw_mul", (k, k)): (k, _binary("Mul")) for k in VECS},
    **{("cw_div", (k, k)): (k, _binary("Div")) for k in VECS},
    ("quat_rotate", (Q, V3)): (V3, _rotate("Add")),
    ("quat_rotate_inv", (Q, V3)): (V3, _rotate("Sub")),
    ("quat_inverse", (Q,)): (Q, _QUAT_INVERSE),
    ("quat_from_axis_angle", (V3, F)): (Q, _AXIS_ANGLE),
    ("quaternion", (F, F, F, F)): (Q, (("r", "Concat", ("$0", "$1", "$2", "$3"), ()),)),
    ("quaternion", (V3, F)): (Q, (("r", "Concat", ("$0", "$1"), ()),)),
    **{("vector", (F,) * n): (f"vec{n}f", (("r", "Concat", tuple(f"${i}" for i in range(n)), ()),))
       for n in (2, 3, 4, 5, 6)},
    **{("vector", (I,) * n): (f"vec{n}i", (("r", "Concat", tuple(f"${i}" for i in range(n)), ()),)) for n in (2, 3, 4)},
    ("vector", (V3, V3)): ("vec6f", (("r", "Concat", ("$0", "$1"), ()),)),
    ("spatial_vector", (F,) * 6): ("vec6f", (("r", "Concat", tuple(f"${i}" for i in range(6)), ()),)),
    ("spatial_vector", (V3, V3)): ("vec6f", (("r", "Concat", ("$0", "$1"), ()),)),
    **{("matrix", (F,) * (n * n)): (m, (("r", "Concat", tuple(f"${i}" for i in range(n * n)), ()),))
       for m, n in MATS.items()},
    **{("extract", (k, I)): (F, (("r", "Pick", ("$0",), (("indices", "$1"),)),)) for k in (*VECS, Q, T)},
    **{("extract", (k, I)): (I, (("r", "Pick", ("$0",), (("indices", "$1"),)),)) for k in IVECS},
    ("spatial_top", ("vec6f",)): (V3, (_pick("$0", 0, 1, 2),)),
    ("spatial_bottom", ("vec6f",)): (V3, (_pick("$0", 3, 4, 5),)),
    ("transformation", (V3, Q)): (T, (("r", "Concat", ("$0", "$1"), ()),)),
    ("transform_get_translation", (T,)): (V3, (_pick("$0", 0, 1, 2),)),
    ("transform_get_rotation", (T,)): (Q, (_pick("$0", 3, 4, 5, 6),)),
    ("transform_point", (T, V3)): (V3, _T_POINT),
    ("transform_vector", (T, V3)): (V3, _T_VECTOR),
    **{("transpose", (m,)): (m, (("r", "Transpose", ("$0",), (("m", n), ("n", n))),)) for m, n in MATS.items()},
    **{("where", (c, k, k)): (k, (("b", "NotEqual", ("$0", 0.0), ()), ("r", "Where", ("b", "$1", "$2"), ())))
       for c in (F,) for k in ALL_KINDS},
    **{("where", (B, k, k)): (k, (("r", "Where", ("$0", "$1", "$2"), ()),)) for k in ALL_KINDS},
    **{("where", (I, k, k)): (k, (("b", "NotEqual", ("$0", 0.0), ()), ("r", "Where", ("b", "$1", "$2"), ())))
       for k in ALL_KINDS},
    ("float32", (I,)): (F, _cast(F)),
    ("float32", (F,)): (F, _unary("Identity")),
    ("float32", (B,)): (F, _cast(F)),
    ("int32", (F,)): (I, _cast(I)),  # C's conversion: toward zero, as Cast does
    ("int32", (I,)): (I, _unary("Identity")),
    ("int32", (B,)): (I, _cast(I)),
    ("float", (I,)): (F, _cast(F)),
    ("float", (F,)): (F, _unary("Identity")),
    ("float", (B,)): (F, _cast(F)),
    ("int", (B,)): (I, _cast(I)),
    ("int", (F,)): (I, _cast(I)),
    ("int", (I,)): (I, _unary("Identity")),
    ("bool", (I,)): (B, (("r", "NotEqual", ("$0", 0.0), ()),)),
    ("bool", (F,)): (B, (("r", "NotEqual", ("$0", 0.0), ()),)),
    ("bool", (B,)): (B, _unary("Identity")),
    # a value read through a reference, or copied on assignment, is the value itself
    **{("load", (k,)): (k, _unary("Identity")) for k in ALL_KINDS},
    **{("copy", (k,)): (k, _unary("Identity")) for k in ALL_KINDS},
}


_KEYS = frozenset(key for key, _ in BUILTINS)


def has_rows(key: str) -> bool:
    """Whether any row lowers builtin ``key`` (for some argument kinds)."""
    return key in _KEYS


def builtin_row(key: str, kinds: tuple[str, ...]):
    """The row for a call, or None when the table has none."""
    return BUILTINS.get((key, kinds))
