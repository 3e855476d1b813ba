"""Frontend: Warp's own SSA of a kernel (``_warp_private.kernel_ssa``) to the IR, or a refusal naming why.

Warp records ``x[i]`` as ``address`` (+ ``load``/``copy``) and ``out[i] = v`` as
``array_store``; arguments may still be references (``ref[T]``), which read
the array's current value. A store replaces that value, so a later read in
the same thread sees it, as on the device.
"""

from __future__ import annotations

import os

from leapp import _warp_private
from leapp.errors import ExportError
from leapp.lowering.ir import KIND_WIDTH, Graph, Value
from leapp.lowering.table import STATIC_PARAMS, builtin_row

__all__ = ["Refusal", "to_ir"]

_TID = "tid"


class Refusal(Exception):
    """One construct the lowering does not cover (collected, then raised together as an ExportError)."""


class _Cascade(Refusal):
    """A value that depends on a construct already refused: not reported a second time."""


def _kind(type_name: str) -> str:
    return type_name[4:-1] if type_name.startswith("ref[") else type_name


class _Lowerer:
    def __init__(self, ssa: dict):
        self.ssa = ssa
        self.graph = Graph(ssa["name"])
        self.env: dict[str, object] = {}
        self.current: dict[str, Value] = {}
        self.constants: dict[tuple, Value] = {}
        for name, type_name in ssa["args"]:
            if type_name.startswith("array1d[") and type_name[8:-1] in KIND_WIDTH:
                self.graph.arrays.append((name, type_name[8:-1]))
                self.env[name] = ("array", name)
            elif type_name in KIND_WIDTH:
                self.graph.scalars.append((name, type_name))
                self.env[name] = self.graph.emit("LoadScalar", (), type_name, name=name)
            else:
                self.env[name] = ("unsupported", f"argument `{name}` of type {type_name}")

    def read(self, array: str) -> Value:
        if array not in self.current:
            kind = dict(self.graph.arrays)[array]
            self.current[array] = self.graph.emit("LoadArray", (), kind, name=array)
        return self.current[array]

    def operand(self, arg):
        tag = arg[0]
        if tag == "const":
            return ("const", arg[1], arg[2])
        if tag == "var":
            bound = self.env.get(arg[1])
            if isinstance(bound, tuple) and bound[0] == "ref":
                return self.read(bound[1])
            if isinstance(bound, tuple) and bound[0] == "unsupported":
                raise Refusal(bound[1])
            if isinstance(bound, tuple) and bound[0] == "cascade":
                raise _Cascade(bound[1])
            if bound == _TID:
                return ("opaque", None, "int32 wp.tid()")
            if isinstance(bound, tuple) and bound[0] == "array":
                return ("opaque", None, f"array `{bound[1]}`")
            if bound is None:
                raise Refusal(f"value `{arg[1]}` of type {arg[2]} that Warp builds outside a call")
            return bound
        raise Refusal(f"argument {arg!r}")

    def constant(self, value: float) -> Value:
        key = ("float32", float(value))
        if key not in self.constants:
            self.constants[key] = self.graph.emit("Const", (), "float32", value=float(value))
        return self.constants[key]

    def index_is_tid(self, arg) -> bool:
        return arg[0] == "var" and self.env.get(arg[1]) == _TID

    def call(self, key: str, builtin: bool, args: dict, outputs: list):
        if not builtin:
            raise Refusal(f"wp.func call `{key}`")
        if key == "tid":
            if len(outputs) != 1:
                raise Refusal("a launch of more than one dimension (wp.tid() with several indices)")
            self.env[outputs[0][0]] = _TID
            return
        if key in ("address", "array_store"):
            array = args["arr"]
            if array[0] != "var" or self.env.get(array[1]) != ("array", array[1]):
                raise Refusal(f"`{key}` on {array[2] if len(array) > 2 else array!r} (1-D float32/vec3f/quatf arrays only)")
            indices = [a for name, a in args.items() if name not in ("arr", "value")]
            if len(indices) != 1 or not self.index_is_tid(indices[0]):
                raise Refusal(f"array access at an index other than wp.tid() (`{array[1]}`)")
            if key == "address":
                self.env[outputs[0][0]] = ("ref", array[1])
            else:
                value = self.operand(args["value"])
                if not isinstance(value, Value) or value.kind != dict(self.graph.arrays)[array[1]]:
                    raise Refusal(f"store of {args['value']!r} into `{array[1]}`")
                self.current[array[1]] = value
                self.graph.stores[array[1]] = value
            return
        operands = []
        for name, arg in args.items():
            if name in STATIC_PARAMS:
                continue
            for item in arg[1] if arg[0] == "tuple" else [arg]:
                operands.append(self.operand(item))
        kinds = tuple(o.kind if isinstance(o, Value) else o[2] for o in operands)
        row = builtin_row(key, kinds)
        if row is None:
            raise Refusal(f"builtin `{key}({', '.join(kinds)})`")
        kind, program = row
        if len(outputs) != 1 or _kind(outputs[0][1]) != kind:
            raise Refusal(f"builtin `{key}({', '.join(kinds)})` returning {outputs}")
        self.env[outputs[0][0]] = self.run(program, operands, kind)

    def run(self, program, operands, kind):
        steps: dict[str, Value] = {}

        def resolve(ref):
            if isinstance(ref, float):
                return self.constant(ref)
            if ref.startswith("$"):
                value = operands[int(ref[1:])]
                if isinstance(value, Value):
                    return value
                if value[2] != "float32":
                    raise Refusal(f"constant {value[1]!r} of type {value[2]} as an operand")
                return self.constant(value[1])
            return steps[ref]

        result = None
        for name, primitive, refs, attrs in program:
            fixed = {}
            for attr, val in attrs:
                if isinstance(val, str) and val.startswith("$"):
                    const = operands[int(val[1:])]
                    if isinstance(const, Value):
                        raise Refusal("a component index that is not a compile-time constant")
                    val = (int(const[1]),)
                fixed[attr] = tuple(val)
            inputs = [resolve(r) for r in refs]
            out_kind = _step_kind(primitive, inputs, fixed)
            result = steps[name] = self.graph.emit(primitive, inputs, out_kind, **fixed)
        assert result.kind == kind, (result, kind)
        return result


def _step_kind(primitive: str, inputs, attrs) -> str:
    """A primitive's result kind from its inputs (widths broadcast; reductions and picks narrow)."""
    width = {1: "float32", 3: "vec3f", 4: "quatf"}
    if primitive == "SumLast":
        return "float32"
    if primitive == "Pick":
        return width[len(attrs["indices"])]
    if primitive == "Concat":
        return width[sum(KIND_WIDTH[i.kind] for i in inputs)]
    if primitive == "Greater":
        return "bool"
    candidates = [i.kind for i in inputs if i.kind in KIND_WIDTH]
    return max(candidates, key=lambda k: KIND_WIDTH[k])


def to_ir(kernel) -> Graph:
    """Lower ``kernel``'s forward body to the IR; raise ExportError naming every construct that does not lower."""
    ssa = _warp_private.kernel_ssa(kernel)
    lowerer = _Lowerer(ssa)
    where = f"{os.path.basename(ssa['file'])}"
    refusals: list[str] = []
    for event in ssa["events"]:
        try:
            if event[0] == "construct":
                raise Refusal(event[1])
            lowerer.call(*event[1:5])
        except Refusal as refusal:
            if not isinstance(refusal, _Cascade):
                refusals.append(f"{refusal} at {ssa['file']}:{event[-1]}")
            if event[0] == "call":
                for label, _ in event[4]:
                    lowerer.env[label] = ("cascade", str(refusal))
    if not lowerer.graph.stores and not refusals:
        refusals.append(f"no array written at wp.tid() at {ssa['file']}:{ssa['line']}")
    if refusals:
        unique = list(dict.fromkeys(refusals))
        raise ExportError(
            f"Warp kernel `{ssa['name']}` ({where}:{ssa['line']}) cannot be lowered to standard ops: "
            + "; ".join(unique)
        )
    return lowerer.graph
