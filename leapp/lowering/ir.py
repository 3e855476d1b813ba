"""The lowering's IR: typed values and primitive ops over a batch of Warp threads.

A value holds one Warp value per thread: shape [N, width] (width 1 for a scalar,
3 for vec3, 4 for quat) so scalars broadcast over vectors without reshapes, or
shape [width] for a constant every thread shares. Every primitive is one
standard ONNX operator (see onnx_backend.PRIMITIVES).
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["KIND_WIDTH", "Value", "Op", "Graph"]

# Warp value kinds the lowering carries, and their component count.
KIND_WIDTH = {"float32": 1, "vec3f": 3, "quatf": 4}


@dataclass(frozen=True)
class Value:
    """One SSA value: a name in the emitted graph and its Warp kind."""

    name: str
    kind: str


@dataclass(frozen=True)
class Op:
    """One primitive: ``output = primitive(*inputs, **attrs)``."""

    primitive: str
    inputs: tuple[Value, ...]
    output: Value
    attrs: tuple[tuple[str, object], ...] = ()


@dataclass
class Graph:
    """A lowered kernel: array inputs (name, kind), scalar inputs, ops, and each written array's last value."""

    name: str
    arrays: list[tuple[str, str]] = field(default_factory=list)
    scalars: list[tuple[str, str]] = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)
    stores: dict[str, Value] = field(default_factory=dict)
    counter: int = 0

    def fresh(self, kind: str, hint: str = "t") -> Value:
        self.counter += 1
        return Value(f"{hint}_{self.counter}", kind)

    def emit(self, primitive: str, inputs, kind: str, **attrs) -> Value:
        out = self.fresh(kind, primitive.lower())
        self.ops.append(Op(primitive, tuple(inputs), out, tuple(sorted(attrs.items()))))
        return out
