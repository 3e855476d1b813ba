"""The lowering's IR: typed values and primitive ops over the threads of Warp launches and the segment's memory.

A value holds one Warp value per thread of one launch: shape [N, width]
(width 1 for a scalar, 3 for vec3f, 9 for mat33f, ...), or [1, width] when
every thread shares it (a constant). Memory is a set of regions, each a flat
1-D tensor of 32-bit lanes (float32 or int32); a store yields the region's
next version, so the graph stays pure. Every primitive is a handful of
standard tensor ops (``torch_backend.PRIMITIVES``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["KINDS", "SCALARS", "Affine", "Value", "Op", "Region", "Graph", "kind_of", "resolve", "scalar_of",
           "width_of"]

SCALARS = ("float32", "int32", "bool")

# Warp value kinds the lowering carries: name -> (scalar kind, component count).
KINDS: dict[str, tuple[str, int]] = {
    "float32": ("float32", 1),
    "int32": ("int32", 1),
    "bool": ("bool", 1),
    **{f"vec{n}f": ("float32", n) for n in range(2, 11)},
    **{f"vec{n}i": ("int32", n) for n in (2, 3, 4)},
    "quatf": ("float32", 4),
    "transformf": ("float32", 7),
    **{f"mat{n}{n}f": ("float32", n * n) for n in (2, 3, 4)},
}
# The kind of an n-component float32 value that no Warp type names more precisely (a Pick's result)
_FLOAT_OF_WIDTH = {1: "float32", **{n: f"vec{n}f" for n in range(2, 11)}, 16: "mat44f"}
_INT_OF_WIDTH = {1: "int32", 2: "vec2i", 3: "vec3i", 4: "vec4i"}


def width_of(kind: str) -> int:
    return KINDS[kind][1]


def scalar_of(kind: str) -> str:
    return KINDS[kind][0]


def kind_of(scalar: str, width: int) -> str:
    """The plain kind of ``width`` components of ``scalar`` (vec3f for 3 floats, int32 for 1 int)."""
    if scalar == "bool":
        if width != 1:
            raise KeyError(f"bool[{width}]")
        return "bool"
    return (_FLOAT_OF_WIDTH if scalar == "float32" else _INT_OF_WIDTH)[width]


@dataclass(frozen=True)
class Affine:
    """An integer that follows the batch: ``a * batch + c`` (a dynamic-batch segment's sizes and offsets)."""

    a: int
    c: int

    def at(self, batch):
        return self.a * batch + self.c


def resolve(value, batch):
    """``value`` with every Affine in it evaluated at ``batch`` (an int, or a torch SymInt while exporting)."""
    if isinstance(value, Affine):
        return value.at(batch)
    if isinstance(value, tuple):
        return tuple(resolve(v, batch) for v in value)
    return value


@dataclass(frozen=True)
class Value:
    """One SSA value: a name in the graph and its Warp kind ("region" for a memory version)."""

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
class Region:
    """One memory region of a segment: ``lanes`` 32-bit lanes of ``scalar``; where its first version comes from.

    ``source`` is "input" (a segment input, by position ``index``), "constant"
    (``data``: bytes captured at trace time) or "zeros" (scratch, or an output
    nothing defined before the segment).
    """

    id: int
    scalar: str
    lanes: "int | Affine"
    source: str
    index: int = -1
    data: bytes = b""


@dataclass
class Graph:
    """A lowered segment: its regions, the ops of every launch in order, and each region's last version."""

    name: str
    regions: dict[int, Region] = field(default_factory=dict)
    ops: list[Op] = field(default_factory=list)
    current: dict[int, Value] = field(default_factory=dict)
    counter: int = 0

    def fresh(self, kind: str, hint: str = "t") -> Value:
        self.counter += 1
        return Value(f"{hint}_{self.counter}", kind)

    def emit(self, primitive: str, inputs, kind: str, **attrs) -> Value:
        out = self.fresh(kind, primitive.lower())
        self.ops.append(Op(primitive, tuple(inputs), out, tuple(sorted(attrs.items()))))
        return out

    def simplify(self) -> None:
        """Common subexpressions merged (the same primitive on the same values with the same attributes: an
        index computed for two loads, a mask built twice), then ``prune``. Run on the final graph (after a
        dynamic-batch merge, whose ``Affine`` values compare exactly), so that merging never depends on two
        sizes being equal at one batch only."""
        rename: dict[str, Value] = {}
        seen: dict[tuple, Value] = {}
        ops = []
        for op in self.ops:
            inputs = tuple(rename.get(i.name, i) for i in op.inputs)
            if op.primitive == "Identity" and inputs[0].kind == op.output.kind:  # a value read or copied as is
                rename[op.output.name] = inputs[0]
                continue
            key = (op.primitive, tuple(i.name for i in inputs), op.attrs, op.output.kind)
            if key in seen:
                rename[op.output.name] = seen[key]
                continue
            seen[key] = op.output
            ops.append(Op(op.primitive, inputs, op.output, op.attrs))
        self.ops = ops
        self.current = {rid: rename.get(v.name, v) for rid, v in self.current.items()}
        self.prune()

    def prune(self) -> None:
        """Drops every op that no region's last version depends on (index arithmetic of a slice, values
        computed and never stored): the exported graph holds only what the segment's memory needs."""
        live = {v.name for v in self.current.values()}
        kept = []
        for op in reversed(self.ops):
            if op.output.name in live:
                kept.append(op)
                live.update(i.name for i in op.inputs)
        self.ops = kept[::-1]
