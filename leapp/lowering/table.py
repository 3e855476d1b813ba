"""The builtin table: Warp builtin name + argument kinds -> result kind and a program of IR primitives.

Data, not code per builtin: a row's program is a tuple of steps
``(name, primitive, operands, attrs)``; an operand is ``$k`` (the call's k-th
argument, in Warp's parameter order), an earlier step's name, or a float
literal (a shared constant). The last step is the result. ``attrs`` values
may be ``$k`` too: that argument must then be a compile-time constant.
Formulas follow Warp's native headers (warp/native/quat.h, vec.h, builtin.h),
term by term in Warp's order, so float32 rounding stays close.
"""

from __future__ import annotations

__all__ = ["BUILTINS", "STATIC_PARAMS", "builtin_row"]

# Keyword parameters Warp binds from the output type (e.g. wp.vec3's length and dtype): checked, not computed.
STATIC_PARAMS = frozenset({"length", "dtype"})

F, V3, Q = "float32", "vec3f", "quatf"


def _unary(primitive: str):
    return (("r", primitive, ("$0",), ()),)


def _binary(primitive: str):
    return (("r", primitive, ("$0", "$1"), ()),)


_DOT = (("p", "Mul", ("$0", "$1"), ()), ("r", "SumLast", ("p",), ()))
_LENGTH = (("p", "Mul", ("$0", "$0"), ()), ("s", "SumLast", ("p",), ()), ("r", "Sqrt", ("s",), ()))
# Warp: l = length(a); l > 0 ? a / l : 0
_NORMALIZE = _LENGTH[:2] + (
    ("l", "Sqrt", ("s",), ()),
    ("q", "Div", ("$0", "l"), ()),
    ("z", "Mul", ("$0", 0.0), ()),
    ("c", "Greater", ("l", 0.0), ()),
    ("r", "Where", ("c", "q", "z"), ()),
)
# cross(a, b) = a.yzx * b.zxy - a.zxy * b.yzx
_CROSS = (
    ("a1", "Pick", ("$0",), (("indices", (1, 2, 0)),)),
    ("b1", "Pick", ("$1",), (("indices", (2, 0, 1)),)),
    ("a2", "Pick", ("$0",), (("indices", (2, 0, 1)),)),
    ("b2", "Pick", ("$1",), (("indices", (1, 2, 0)),)),
    ("m1", "Mul", ("a1", "b1"), ()),
    ("m2", "Mul", ("a2", "b2"), ()),
    ("r", "Sub", ("m1", "m2"), ()),
)


def _cross_of(a: str, b: str, prefix: str):
    """_CROSS with its operands renamed: ``a`` x ``b``, step names under ``prefix``."""
    names = {"$0": a, "$1": b}
    return tuple(
        (prefix + n, p, tuple(names.get(o, prefix + o) for o in ops), attrs) for n, p, ops, attrs in _CROSS
    )


def _rotate(sign: str):
    """quat.h quat_rotate (sign Add) / quat_rotate_inv (Sub): x*c + q.xyz*d +- cross(q.xyz, x)*w*2."""
    return (
        ("qv", "Pick", ("$0",), (("indices", (0, 1, 2)),)),
        ("w", "Pick", ("$0",), (("indices", (3,)),)),
        ("w2", "Mul", (2.0, "w"), ()),
        ("ww", "Mul", ("w2", "w"), ()),
        ("c", "Sub", ("ww", 1.0), ()),
        ("qx", "Mul", ("qv", "$1"), ()),
        ("sd", "SumLast", ("qx",), ()),
        ("d", "Mul", (2.0, "sd"), ()),
        *_cross_of("qv", "$1", "x_"),
        ("xw", "Mul", ("x_r", "w"), ()),
        ("xw2", "Mul", ("xw", 2.0), ()),
        ("t1", "Mul", ("$1", "c"), ()),
        ("t2", "Mul", ("qv", "d"), ()),
        ("t12", "Add", ("t1", "t2"), ()),
        ("r", sign, ("t12", "xw2"), ()),
    )


# (Warp builtin key, argument kinds) -> (result kind, program)
BUILTINS: dict[tuple[str, tuple[str, ...]], tuple[str, tuple]] = {
    **{("add", (k, k)): (k, _binary("Add")) for k in (F, V3, Q)},
    **{("sub", (k, k)): (k, _binary("Sub")) for k in (F, V3, Q)},
    **{("neg", (k,)): (k, _unary("Neg")) for k in (F, V3, Q)},
    **{("pos", (k,)): (k, (("r", "Add", ("$0", 0.0), ()),)) for k in (F, V3, Q)},
    ("mul", (F, F)): (F, _binary("Mul")),
    ("mul", (V3, F)): (V3, _binary("Mul")),
    ("mul", (F, V3)): (V3, _binary("Mul")),
    ("mul", (Q, F)): (Q, _binary("Mul")),
    ("mul", (F, Q)): (Q, _binary("Mul")),
    ("div", (F, F)): (F, _binary("Div")),
    ("div", (V3, F)): (V3, _binary("Div")),
    ("div", (F, V3)): (V3, _binary("Div")),
    ("sqrt", (F,)): (F, _unary("Sqrt")),
    ("sin", (F,)): (F, _unary("Sin")),
    ("cos", (F,)): (F, _unary("Cos")),
    ("abs", (F,)): (F, _unary("Abs")),
    ("abs", (V3,)): (V3, _unary("Abs")),
    ("min", (F, F)): (F, _binary("Min")),
    ("max", (F, F)): (F, _binary("Max")),
    ("min", (V3, V3)): (V3, _binary("Min")),
    ("max", (V3, V3)): (V3, _binary("Max")),
    # builtin.h: clamp(x, a, b) = min(max(a, x), b)
    ("clamp", (F, F, F)): (F, (("m", "Max", ("$1", "$0"), ()), ("r", "Min", ("m", "$2"), ()))),
    ("dot", (V3, V3)): (F, _DOT),
    ("dot", (Q, Q)): (F, _DOT),
    ("length", (V3,)): (F, _LENGTH),
    ("length", (Q,)): (F, _LENGTH),
    ("normalize", (V3,)): (V3, _NORMALIZE),
    ("normalize", (Q,)): (Q, _NORMALIZE),
    ("cross", (V3, V3)): (V3, _CROSS),
    ("quat_rotate", (Q, V3)): (V3, _rotate("Add")),
    ("quat_rotate_inv", (Q, V3)): (V3, _rotate("Sub")),
    ("vector", (F, F, F)): (V3, (("r", "Concat", ("$0", "$1", "$2"), ()),)),
    ("quaternion", (F, F, F, F)): (Q, (("r", "Concat", ("$0", "$1", "$2", "$3"), ()),)),
    ("extract", (V3, "int32")): (F, (("r", "Pick", ("$0",), (("indices", "$1"),)),)),
    ("extract", (Q, "int32")): (F, (("r", "Pick", ("$0",), (("indices", "$1"),)),)),
    # a value read through a reference, or copied on assignment, is the value itself
    **{("load", (k,)): (k, (("r", "Identity", ("$0",), ()),)) for k in (F, V3, Q)},
    **{("copy", (k,)): (k, (("r", "Identity", ("$0",), ()),)) for k in (F, V3, Q)},
}


def builtin_row(key: str, kinds: tuple[str, ...]):
    """The row for a call, or None when the table has none."""
    return BUILTINS.get((key, kinds))
