"""Frontend: one launch of a kernel, read from Warp's own SSA (``_warp_private.kernel_ssa``), into the IR.

Every thread of the launch runs at once. Control flow becomes masks: inside
``if c`` the active mask is ``active & c``; a store writes only active threads
and a load reads a safe index where a thread is inactive. ``return``,
``continue`` and ``break`` clear threads from the mask until the end of their
function, iteration or loop. Loops whose trip count is known when lowering
(read from constants, shapes and the thread index) are unrolled to the
largest count, each iteration masked by its own condition. ``wp.func``
calls are inlined from their own SSA. Anything else is refused by name.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch

from leapp.lowering import torch_backend
from leapp.lowering.ir import KINDS, Graph, Op, Value, kind_of, scalar_of, width_of
from leapp.lowering.table import STATIC_PARAMS, builtin_row, has_rows

__all__ = ["ArrayBinding", "Refusal", "LaunchBinding", "lower_launch", "MAX_TRIPS"]

MAX_TRIPS = 1024  # the most iterations one loop is unrolled to
_SHAPE = re.compile(r"^var_(\w+) = &\(var_(\w+)\.shape\);$")
_COMPARE = {">": "Greater", "<": "Less", ">=": "GreaterEqual", "<=": "LessEqual", "==": "Equal", "!=": "NotEqual"}


class Refusal(Exception):
    """One construct the lowering does not cover (collected, then raised together)."""


class _Cascade(Refusal):
    """A value that depends on a construct already refused: not reported a second time."""


@dataclass(frozen=True)
class ArrayBinding:
    """A launch's array argument: region, element kind, and offset, shape and strides in 32-bit lanes."""

    region: int
    kind: str
    offset: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]


@dataclass
class LaunchBinding:
    """What a launch passed: its dimensions, each array argument, each scalar argument's lanes."""

    dims: tuple[int, ...]
    arrays: dict[str, ArrayBinding]
    scalars: dict[str, tuple]


@dataclass(frozen=True)
class _View:
    """An array (or a view of it, ``prefix`` indices fixed by ``view(arr, i)``)."""

    binding: ArrayBinding
    prefix: tuple = ()


def _strip(type_name: str) -> str:
    return type_name[4:-1] if type_name.startswith("ref[") else type_name


class _Scope:
    """Where ``return`` leads: the enclosing function's returned mask and return values."""

    def __init__(self, outputs: int):
        self.returned = None
        self.results: list = [None] * outputs


class _Loop:
    def __init__(self):
        self.broken = None


FOLD_LIMIT = 65536  # the most elements a value folded into a table may have


class _Launch:
    def __init__(self, graph: Graph, binding: LaunchBinding, known: dict, fold: bool):
        self.g = graph
        self.b = binding
        self.known = known  # value name -> tensor, for values the lowering can compute now
        self.fold = fold  # known per-thread values become tables (not at a dynamic batch: they follow it)
        self.n = math.prod(binding.dims)
        self.active: Value | None = None  # None: every thread
        self.consts: dict = {}
        self.affine: dict[str, tuple[dict, int]] = {}  # int value -> ({tid axis: coefficient}, constant)
        self.refusals: list[str] = []
        self.tids: dict[int, Value] = {}
        self.loads: dict[tuple, Value] = {}

    # ------------------------------------------------------------ emission

    def emit(self, primitive: str, inputs, kind: str, **attrs) -> Value:
        """Appends an op; when its inputs are known its value is computed now (once): a per-thread value then
        becomes one table (``fold``), and any known value stays available for loop bounds."""
        result = None
        if primitive != "Tid" and all(i.name in self.known for i in inputs):
            op = Op(primitive, tuple(inputs), Value("known", kind), tuple(sorted(attrs.items())))
            try:
                result = torch_backend.apply(op, [self.known[i.name] for i in inputs])
            except Exception:  # noqa: BLE001 - a value we cannot compute now is simply not known
                result = None
        if result is not None and self.fold and inputs and self.tabled(result, kind):
            out = self.g.emit("Table", (), kind, rows=tuple(map(tuple, result.tolist())), of=kind)
        else:
            out = self.g.emit(primitive, inputs, kind, **attrs)
        if result is not None:
            self.known[out.name] = result
        return out

    @staticmethod
    def tabled(result: torch.Tensor, kind: str) -> bool:
        """Whether a known value becomes a table: a per-thread value of a value kind (index arithmetic on the
        thread index, a model constant read at it), small enough to hold as a constant."""
        return (kind in KINDS and result.dim() == 2 and result.shape[1] == width_of(kind)
                and result.shape[0] > 1 and result.numel() <= FOLD_LIMIT)

    def const(self, value, kind: str) -> Value:
        values = tuple(value) if isinstance(value, (tuple, list)) else (value,)
        scalar = scalar_of(kind)
        cast = float if scalar == "float32" else bool if scalar == "bool" else int
        key = (kind, tuple(cast(v) for v in values))
        if scalar == "int32":  # never shared: at another batch two equal sizes may differ (lower_dynamic)
            key = key + (len(self.consts),)
        if key not in self.consts:
            v = self.emit("Const", (), kind, value=key[1], of=kind)
            self.consts[key] = v
            if scalar == "int32" and len(values) == 1:
                self.affine[v.name] = ({}, int(values[0]))
        return self.consts[key]

    def tid(self, axis: int) -> Value:
        if axis not in self.tids:
            v = self.emit("Tid", (), "int32", dims=tuple(self.b.dims), axis=axis)
            self.known[v.name] = torch_backend.PRIMITIVES["Tid"](tuple(self.b.dims), axis)
            self.affine[v.name] = ({axis: 1}, 0)
            self.tids[axis] = v
        return self.tids[axis]

    def mask_and(self, a: Value | None, b: Value | None) -> Value | None:
        if a is None:
            return b
        if b is None:
            return a
        return self.emit("And", (a, b), "bool")

    def mask_or(self, a: Value | None, b: Value | None) -> Value | None:
        if a is None or b is None:
            return None
        return self.emit("Or", (a, b), "bool")

    def none(self) -> Value:
        return self.const(False, "bool")

    # ------------------------------------------------------------ memory

    def element_index(self, view: _View, indices: list) -> tuple[Value, tuple | None]:
        """The lane index [N, 1] of ``view[indices]``, and its affine form when the lowering can tell."""
        b = view.binding
        all_idx = list(view.prefix) + list(indices)
        if len(all_idx) != len(b.shape):
            raise Refusal(f"an access with {len(all_idx)} indices into a {len(b.shape)}-D array")
        terms = [self.const(b.offset, "int32")]
        for idx, stride in zip(all_idx, b.strides):
            terms.append(self.arith("Mul", idx, self.const(stride, "int32")))
        index = terms[0]
        for t in terms[1:]:
            index = self.arith("Add", index, t)
        return index, self.affine.get(index.name)

    def arith(self, primitive: str, a: Value, c: Value) -> Value:
        out = self.emit(primitive, (a, c), "int32")
        fa, fc = self.affine.get(a.name), self.affine.get(c.name)
        if fa is not None and fc is not None:
            if primitive in ("Add", "Sub"):
                sign = 1 if primitive == "Add" else -1
                coef = dict(fa[0])
                for k, v in fc[0].items():
                    coef[k] = coef.get(k, 0) + sign * v
                self.affine[out.name] = (coef, fa[1] + sign * fc[1])
            elif primitive == "Mul" and (not fa[0] or not fc[0]):
                scale, form = (fa[1], fc) if not fa[0] else (fc[1], fa)
                self.affine[out.name] = ({k: v * scale for k, v in form[0].items()}, form[1] * scale)
        return out

    def slab(self, form, width: int, lanes: int) -> int | None:
        """The first lane when ``form`` is thread t's ``base + t * width`` over all N threads, inside the region."""
        if form is None:
            return None
        coef, base = form
        dims = self.b.dims
        for axis in range(len(dims)):  # every axis, even of extent 1: the choice must not follow the batch
            if coef.get(axis, 0) != width * math.prod(dims[axis + 1:]):
                return None
        if base < 0 or base + self.n * width > lanes:
            return None
        return base

    def region_value(self, rid: int) -> Value:
        return self.g.current[rid]

    def load(self, view: _View, indices: list) -> Value:
        b = view.binding
        width = width_of(b.kind)
        if b.region < 0:  # a null array: only threads that never read it reach here (zeros, as documented)
            return self.const((0,) * width if width > 1 else 0, b.kind)
        region = self.region_value(b.region)
        index, form = self.element_index(view, indices)
        lanes = self.g.regions[b.region].lanes
        base = self.slab(form, width, lanes)
        if base is not None:
            return self.emit("View", (region,), b.kind, offset=base, width=width, count=self.n,
                             whole=base == 0 and self.n * width == lanes)
        if self.active is not None:
            index = self.emit("Where", (self.active, index, self.const(b.offset, "int32")), "int32")
        return self.emit("Gather", (region, index), b.kind, width=width)

    def store(self, view: _View, indices: list, value: Value) -> None:
        b = view.binding
        if value.kind != b.kind:
            raise Refusal(f"a store of {value.kind} into an array of {b.kind}")
        width = width_of(b.kind)
        if b.region < 0:  # a null array: a store to it is dropped
            return
        region = self.region_value(b.region)
        index, form = self.element_index(view, indices)
        mask = () if self.active is None else (self.active,)
        lanes = self.g.regions[b.region].lanes
        base = self.slab(form, width, lanes)
        if base is not None:
            new = self.emit("Overwrite", (region, value, *mask), "region", offset=base, width=width, count=self.n,
                            whole=base == 0 and self.n * width == lanes)
        else:
            new = self.emit("Scatter", (region, index, value, *mask), "region", width=width)
        self.g.current[b.region] = new


class _Kernel:
    """Runs one SSA (a kernel, or an inlined ``wp.func``) over a launch."""

    def __init__(self, launch: _Launch, ssa: dict, env: dict):
        self.l = launch
        self.ssa = ssa
        self.env = env

    def line(self, event) -> str:
        return f"{self.ssa['file']}:{event[-1] if event[0] != 'call' else event[5]}"

    # ------------------------------------------------------------ operands

    def operand(self, arg):
        tag = arg[0]
        if tag == "const":
            kind = _strip(arg[2])
            if kind not in KINDS:
                raise Refusal(f"constant {arg[1]!r} of type {arg[2]}")
            value = arg[1]
            if hasattr(value, "__len__"):
                value = tuple(float(v) for v in value)
            return self.l.const(value, kind)
        if tag == "var":
            bound = self.env.get(arg[1])
            if isinstance(bound, Value):
                return bound
            if isinstance(bound, tuple):
                if bound[0] == "ref":  # read at each use, as C reads through the pointer
                    region = self.l.g.current.get(bound[1].binding.region)
                    key = (arg[1], region and region.name, None if self.l.active is None else self.l.active.name)
                    if key not in self.l.loads:
                        self.l.loads[key] = self.l.load(bound[1], bound[2])
                    return self.l.loads[key]
                if bound[0] == "unsupported":
                    raise Refusal(bound[1])
                if bound[0] == "cascade":
                    raise _Cascade(bound[1])
            if isinstance(bound, (_View, tuple)):
                return bound
            raise Refusal(f"value `{arg[1]}` of type {arg[2]} that Warp builds outside a call")
        if tag == "tuple":
            return tuple(self.operand(a) for a in arg[1])
        raise Refusal(f"argument {arg!r}")

    def value(self, arg) -> Value:
        v = self.operand(arg)
        if not isinstance(v, Value):
            raise Refusal(f"{arg[1] if len(arg) > 1 else arg!r} used as a value")
        return v

    def array(self, arg) -> _View:
        bound = self.env.get(arg[1]) if arg[0] == "var" else None
        if not isinstance(bound, _View):
            raise Refusal(f"array argument {arg[1] if len(arg) > 1 else arg!r} of type "
                          f"{arg[2] if len(arg) > 2 else '?'} (plain arrays of 32-bit lanes only)")
        return bound

    # ------------------------------------------------------------ events

    def run(self, events: list) -> None:
        i = 0
        while i < len(events):
            event = events[i]
            kind = event[0]
            try:
                if kind == "if":
                    then, i = _block(events, i + 1, "end")
                    orelse = None
                    if i + 1 < len(events) and events[i + 1][0] == "else" and events[i + 1][1] == event[1]:
                        orelse, i = _block(events, i + 2, "end")
                    self.branch(event[1], then, orelse)
                elif kind == "guard":
                    body, i = _block(events, i + 1, "end")
                    self.guard(event[1], event[2], body)
                elif kind == "for":
                    body, i = _block(events, i + 1, "end_for")
                    self.loop(event, body)
                elif kind == "while":
                    body, i = _block(events, i + 1, "end_while")
                    self.while_loop(body)
                else:
                    self.step(event)
            except Refusal as refusal:
                if not isinstance(refusal, _Cascade):
                    self.l.refusals.append(f"{refusal} at {self.line(event)}")
                if kind == "call":
                    for label, _ in event[4]:
                        self.env[label] = ("cascade", str(refusal))
                elif kind in ("compare", "bool"):
                    self.env[event[4] if kind == "compare" else event[2]] = ("cascade", str(refusal))
                elif kind in ("if", "for", "while"):
                    return  # the rest of this block depends on a branch or loop we could not follow
            i += 1

    def step(self, event) -> None:
        kind = event[0]
        if kind == "call":
            self.call(*event[1:5], event[6])
        elif kind == "compare":
            _, ops, left, comps, out, _line = event
            values = [self.value(left)] + [self.value(c) for c in comps]
            result = None
            for op, a, b in zip(ops, values, values[1:]):
                if op not in _COMPARE:
                    raise Refusal(f"comparison `{op}`")
                a, b = self.promote(a, b)
                cmp = self.l.emit(_COMPARE[op], (a, b), "bool")
                result = cmp if result is None else self.l.emit("And", (result, cmp), "bool")
            self.env[out] = result
        elif kind == "bool":
            self.env[event[2]] = self.truth(self.value(event[3]))
        elif kind == "bool_step":
            op = "And" if event[1] else "Or"
            self.env[event[2]] = self.l.emit(op, (self.env[event[2]], self.truth(self.value(event[3]))), "bool")
        elif kind == "return":
            self.ret([self.value(v) for v in event[1]])
        elif kind == "continue":
            self.l.active = self.l.none()
        elif kind == "break":
            loop = self.env["__loop__"]
            here = self.l.active if self.l.active is not None else self.l.const(True, "bool")
            loop.broken = here if loop.broken is None else self.l.emit("Or", (loop.broken, here), "bool")
            self.l.active = self.l.none()
        elif kind == "construct":
            match = _SHAPE.match(event[1].removeprefix("statement `").removesuffix("`"))
            if match and isinstance(self.env.get(match.group(2)), _View):
                self.env[match.group(1)] = ("shape", self.env[match.group(2)])
                return
            raise Refusal(event[1])
        else:
            raise Refusal(f"event {kind}")

    def truth(self, v: Value) -> Value:
        if v.kind == "bool":
            return v
        if v.kind in ("int32", "float32"):
            return self.l.emit("NotEqual", (v, self.l.const(0, v.kind)), "bool")
        raise Refusal(f"{v.kind} used as a condition")

    def promote(self, a: Value, b: Value):
        if a.kind == b.kind:
            return a, b
        raise Refusal(f"a comparison of {a.kind} with {b.kind}")

    def branch(self, cond_label, then, orelse) -> None:
        cond = self.truth(self.value(("var", cond_label, "bool")))
        entry = self.l.active
        self.l.active = self.l.mask_and(entry, cond)
        self.run(then)
        then_end = self.l.active
        if orelse is not None:
            self.l.active = self.l.mask_and(entry, self.l.emit("Not", (cond,), "bool"))
            self.run(orelse)
            self.l.active = self.l.mask_or(then_end, self.l.active)
        else:
            self.l.active = self.l.mask_or(then_end, self.l.mask_and(entry, self.l.emit("Not", (cond,), "bool")))

    def guard(self, label, is_and, body) -> None:
        cond = self.env[label]
        entry = self.l.active
        self.l.active = self.l.mask_and(entry, cond if is_and else self.l.emit("Not", (cond,), "bool"))
        self.run(body)
        self.l.active = entry

    def loop(self, event, body) -> None:
        _, iterator, rng, value_label, _line = event
        if rng is not None:
            start, end, step = (self.l.const(v, "int32") for v in rng)
        else:
            bound = self.env.get(iterator)
            if not (isinstance(bound, tuple) and bound[0] == "range"):
                raise Refusal("a loop over something other than range()")
            start, end, step = bound[1:]
        known = [self.l.known.get(v.name) for v in (start, end, step)]
        if any(k is None for k in known):
            raise Refusal("a loop whose trip count is not known when lowering (dynamic loop)")
        s, e, st = known
        if bool((st == 0).any()):
            raise Refusal("a range() with step 0")
        trips = torch.clamp(torch.div(e - s + st - torch.sign(st), st, rounding_mode="trunc"), min=0)
        count = int(trips.max()) if trips.numel() else 0
        if count > MAX_TRIPS:
            raise Refusal(f"a loop of {count} iterations (more than {MAX_TRIPS} are not unrolled)")
        entry = self.l.active
        state = _Loop()
        outer = self.env.get("__loop__")
        self.env["__loop__"] = state
        scope = self.env["__scope__"]
        for k in range(count):
            value = self.l.arith("Add", start, self.l.arith("Mul", self.l.const(k, "int32"), step))
            going = self.l.emit("Less" if int(st.flatten()[0]) > 0 else "Greater", (value, end), "bool")
            alive = self.l.mask_and(entry, going)
            if state.broken is not None:
                alive = self.l.mask_and(alive, self.l.emit("Not", (state.broken,), "bool"))
            if scope.returned is not None:
                alive = self.l.mask_and(alive, self.l.emit("Not", (scope.returned,), "bool"))
            self.l.active = alive
            self.env[value_label] = value
            self.run(body)
        self.env["__loop__"] = outer
        self.l.active = entry if scope.returned is None else self.l.mask_and(
            entry, self.l.emit("Not", (scope.returned,), "bool"))

    def while_loop(self, events) -> None:
        split = next((j for j, e in enumerate(events) if e[0] == "while_cond"), None)
        if split is None:
            raise Refusal("a while loop whose condition Warp did not load")
        cond_events, label, body = events[:split], events[split][1], events[split + 1:]
        entry = self.l.active
        state = _Loop()
        outer = self.env.get("__loop__")
        self.env["__loop__"] = state
        scope = self.env["__scope__"]
        for _ in range(MAX_TRIPS + 1):
            alive = entry
            if state.broken is not None:
                alive = self.l.mask_and(alive, self.l.emit("Not", (state.broken,), "bool"))
            if scope.returned is not None:
                alive = self.l.mask_and(alive, self.l.emit("Not", (scope.returned,), "bool"))
            self.l.active = alive
            self.run(cond_events)
            cond = self.truth(self.value(("var", label, "bool")))
            going = self.l.mask_and(alive, cond)
            known = self.l.known.get(going.name)
            if known is None:
                raise Refusal("a while loop whose condition is not known when lowering (dynamic loop)")
            if not bool(known.any()):
                break
            self.l.active = going
            self.run(body)
        else:
            raise Refusal(f"a while loop of more than {MAX_TRIPS} iterations (not unrolled)")
        self.env["__loop__"] = outer
        self.l.active = entry if scope.returned is None else self.l.mask_and(
            entry, self.l.emit("Not", (scope.returned,), "bool"))

    def ret(self, values: list[Value]) -> None:
        scope = self.env["__scope__"]
        for j, v in enumerate(values):
            prev = scope.results[j]
            if prev is None or self.l.active is None:
                scope.results[j] = v
            else:
                scope.results[j] = self.l.emit("Where", (self.l.active, v, prev), v.kind)
        done = self.l.active if self.l.active is not None else self.l.const(True, "bool")
        scope.returned = done if scope.returned is None else self.l.emit("Or", (scope.returned, done), "bool")
        self.l.active = self.l.none()

    # ------------------------------------------------------------ calls

    def call(self, key: str, builtin: bool, args: dict, outputs: list, callee) -> None:
        if not builtin:
            self.inline(key, args, outputs, callee)
            return
        handler = getattr(self, f"call_{key}", None)
        if handler is not None:
            handler(args, outputs)
            return
        if not has_rows(key):  # named before its arguments (a format string, a tile's storage) are read
            raise Refusal(f"builtin `{key}`")
        operands = []
        for name, arg in args.items():
            if name in STATIC_PARAMS:
                continue
            for item in arg[1] if arg[0] == "tuple" else [arg]:
                operands.append(self.operand(item))
        kinds = tuple(o.kind if isinstance(o, Value) else "?" for o in operands)
        out_kind = _strip(outputs[0][1]) if len(outputs) == 1 else None
        if key in ("vector", "matrix", "quaternion", "transformation", "spatial_vector") and not operands \
                and out_kind in KINDS:  # wp.vec3(), wp.quat(): zeros, as Warp 1.19 builds them
            self.env[outputs[0][0]] = self.l.const((0.0,) * width_of(out_kind), out_kind)  # Warp: all zeros
            return
        if key in ("vector", "quaternion") and len(operands) == 1 and outputs and kinds[0] == "float32":
            out_kind = _strip(outputs[0][1])  # wp.vec3(s): every component s
            if out_kind in KINDS:
                self.env[outputs[0][0]] = self.l.emit("Concat", operands * width_of(out_kind), out_kind)
                return
        if key in ("load", "copy") and out_kind == "uint32" and kinds in (("float32",), ("int32",)):
            self.env[outputs[0][0]] = operands[0]  # a raw lane moved by leapp's strided copy (lower_segment)
            return
        row = builtin_row(key, kinds)
        if row is None:
            raise Refusal(f"builtin `{key}({', '.join(kinds)})`")
        kind, program = row
        if len(outputs) != 1 or _strip(outputs[0][1]) != kind:
            raise Refusal(f"builtin `{key}({', '.join(kinds)})` returning {[o[1] for o in outputs]}")
        self.env[outputs[0][0]] = self.program(program, operands, kind, key in ("add", "sub", "mul"))

    def program(self, program, operands, kind, affine: bool = False) -> Value:
        steps: dict[str, Value] = {}
        result = None
        for n, (name, primitive, refs, attrs) in enumerate(program):
            fixed = {}
            for attr, val in attrs:
                if isinstance(val, str) and val.startswith("$"):
                    v = operands[int(val[1:])]
                    known = self.l.known.get(v.name)
                    if known is None or known.numel() != 1:
                        raise Refusal("a component index that is not a compile-time constant")
                    val = (int(known.flatten()[0]),)
                fixed[attr] = val
            inputs = []
            for ref in refs:
                if isinstance(ref, float):
                    like = next((x for x in inputs if isinstance(x, Value)), None)
                    scalar = scalar_of(like.kind) if like is not None and like.kind in KINDS else "float32"
                    inputs.append(self.l.const(ref if scalar == "float32" else int(ref), scalar))
                elif ref.startswith("$"):
                    inputs.append(operands[int(ref[1:])])
                else:
                    inputs.append(steps[ref])
            last = n == len(program) - 1
            out_kind = kind if last else _step_kind(primitive, inputs, fixed)
            if affine and primitive in ("Add", "Sub", "Mul") and out_kind == "int32":
                result = steps[name] = self.l.arith(primitive, *inputs)
            else:
                result = steps[name] = self.l.emit(primitive, inputs, out_kind, **fixed)
        return result

    def inline(self, key, args, outputs, callee) -> None:
        if callee is None or "events" not in callee:
            raise Refusal(f"wp.func call `{key}`" + (f": {callee['error']}" if callee else ""))
        env: dict = {"__scope__": _Scope(len(outputs)), "__loop__": None}
        for (name, type_name), arg in zip(callee["args"], args.values()):
            if type_name.startswith("array"):
                env[name] = self.array(arg)
            else:
                env[name] = self.value(arg)
        entry = self.l.active
        body = _Kernel(self.l, callee, env)
        body.run(callee["events"])
        self.l.active = entry
        scope = env["__scope__"]
        for (label, type_name), result in zip(outputs, scope.results):
            if result is None:
                raise Refusal(f"wp.func `{key}` returns no value on some path")
            self.env[label] = result

    # builtins with a memory or structural meaning

    def call_tid(self, args, outputs) -> None:
        dims = self.l.b.dims
        if len(outputs) != len(dims):
            raise Refusal(f"wp.tid() with {len(outputs)} indices in a {len(dims)}-D launch")
        for axis, (label, _) in enumerate(outputs):
            self.env[label] = self.l.tid(axis)

    def indices(self, args) -> list:
        return [self.value(a) for name, a in args.items() if name not in ("arr", "value")]

    def call_address(self, args, outputs) -> None:
        self.env[outputs[0][0]] = ("ref", self.array(args["arr"]), self.indices(args))

    def call_view(self, args, outputs) -> None:
        view = self.array(args["arr"])
        self.env[outputs[0][0]] = _View(view.binding, view.prefix + tuple(self.indices(args)))

    def call_array_store(self, args, outputs) -> None:
        self.l.store(self.array(args["arr"]), self.indices(args), self.value(args["value"]))

    def call_assign(self, args, outputs) -> None:
        dest, src = args["dest"], args["src"]
        new = self.value(src)
        old = self.env.get(dest[1])
        if isinstance(old, Value) and self.l.active is not None:
            new = self.l.emit("Where", (self.l.active, new, old), new.kind)
        self.env[dest[1]] = new

    def call_extract(self, args, outputs) -> None:
        first = next(iter(args.values()))
        bound = self.env.get(first[1]) if first[0] == "var" else None
        if isinstance(bound, tuple) and bound[0] == "shape":
            view = bound[1]
            k = self.value(args["i"])
            known = self.l.known.get(k.name)
            if known is None:
                raise Refusal("a shape index that is not a compile-time constant")
            dims = view.binding.shape[len(view.prefix):]
            self.env[outputs[0][0]] = self.l.const(dims[int(known.flatten()[0])], "int32")
            return
        if first[0] == "var" and _strip(first[2]).startswith("mat"):  # m[i] is row i, m[i, j] one element
            m = self.value(first)
            n = int(m.kind[3])
            picks = []
            for name in [k for k in args if k != next(iter(args))]:
                k = self.l.known.get(self.value(args[name]).name)
                if k is None or k.numel() != 1:
                    raise Refusal("a matrix index that is not a compile-time constant")
                picks.append(int(k.flatten()[0]))
            if len(picks) == 1:
                indices = tuple(range(picks[0] * n, picks[0] * n + n))
            else:
                indices = (picks[0] * n + picks[1],)
            self.env[outputs[0][0]] = self.l.emit("Pick", (m,), kind_of("float32", len(indices)), indices=indices)
            return
        self.call_generic("extract", args, outputs)

    def call_load(self, args, outputs) -> None:
        first = next(iter(args.values()))
        bound = self.env.get(first[1]) if first[0] == "var" else None
        if isinstance(bound, tuple) and bound[0] == "shape":
            self.env[outputs[0][0]] = bound
            return
        self.call_generic("load", args, outputs)

    def call_generic(self, key, args, outputs) -> None:
        handler = getattr(self, f"call_{key}")
        try:
            setattr(self, f"call_{key}", None)
            self.call(key, True, args, outputs, None)
        finally:
            setattr(self, f"call_{key}", handler)

    def inplace(self, args, combine: str | None) -> None:
        """``v[i] = x`` / ``v[i] += x`` / ``v[i] -= x`` on a local vector or matrix: its next value."""
        names = list(args)
        target, value = args[names[0]], self.value(args[names[-1]])
        vec = self.value(target)
        idx = []
        for name in names[1:-1]:
            k = self.l.known.get(self.value(args[name]).name)
            if k is None or k.numel() != 1:
                raise Refusal("a component index that is not a compile-time constant")
            idx.append(int(k.flatten()[0]))
        width = width_of(vec.kind)
        at = idx[0] if len(idx) == 1 else idx[0] * int(vec.kind[3]) + idx[1]
        if len(idx) == 1 and vec.kind.startswith("mat") or value.kind != scalar_of(vec.kind):
            raise Refusal(f"an in-place update of {vec.kind} with {value.kind}")
        if combine is not None:
            old = self.l.emit("Pick", (vec,), value.kind, indices=(at,))
            value = self.l.emit(combine, (old, value), value.kind)
        parts = []
        if at > 0:
            parts.append(self.l.emit("Pick", (vec,), kind_of(scalar_of(vec.kind), at), indices=tuple(range(at))))
        parts.append(value)
        if at + 1 < width:
            parts.append(self.l.emit("Pick", (vec,), kind_of(scalar_of(vec.kind), width - at - 1),
                                     indices=tuple(range(at + 1, width))))
        new = self.l.emit("Concat", parts, vec.kind) if len(parts) > 1 else value
        if self.l.active is not None:
            new = self.l.emit("Where", (self.l.active, new, vec), vec.kind)
        self.env[target[1]] = new

    def call_assign_inplace(self, args, outputs) -> None:
        self.inplace(args, None)

    def call_add_inplace(self, args, outputs) -> None:
        self.inplace(args, "Add")

    def call_sub_inplace(self, args, outputs) -> None:
        self.inplace(args, "Sub")

    def call_range(self, args, outputs) -> None:
        values = [self.value(args[k]) for k in ("start", "end", "step") if k in args]
        if len(values) == 1:
            values = [self.l.const(0, "int32"), values[0], self.l.const(1, "int32")]
        elif len(values) == 2:
            values.append(self.l.const(1, "int32"))
        self.env[outputs[0][0]] = ("range", *values)

    def call_iter_next(self, args, outputs) -> None:
        pass  # the loop binds its value per iteration


def _block(events, i, closer: str):
    """The events of a block that starts at ``i``, up to its matching ``closer``; and the closer's index."""
    depth, j = 0, i
    openers = {"end": ("if", "else", "guard"), "end_for": ("for",), "end_while": ("while",)}
    while j < len(events):
        kind = events[j][0]
        if kind in ("if", "else", "guard", "for", "while"):
            depth += 1
        elif kind in ("end", "end_for", "end_while"):
            if depth == 0:
                if kind != closer:
                    raise Refusal(f"unbalanced control flow ({kind} for {openers[closer]})")
                return events[i:j], j
            depth -= 1
        j += 1
    raise Refusal(f"a block with no `{closer}`")


def _step_kind(primitive: str, inputs, attrs) -> str:
    """A primitive's result kind from its inputs (widths broadcast; reductions, picks and casts change it)."""
    kinds = [i.kind for i in inputs if i.kind in KINDS]
    scalar = scalar_of(kinds[0]) if kinds else "float32"
    if primitive in ("Greater", "Less", "GreaterEqual", "LessEqual", "Equal", "NotEqual", "And", "Or", "Not"):
        return "bool"
    if primitive == "Cast":
        return kind_of(attrs["to"], max(width_of(k) for k in kinds))
    if primitive == "SumLast":
        return scalar
    if primitive == "Pick":
        return kind_of(scalar, len(attrs["indices"]))
    if primitive == "Concat":
        return kind_of(scalar, sum(width_of(k) for k in kinds))
    if primitive == "MatMul":
        return kind_of("float32", attrs["m"] * attrs["n"])
    if primitive == "Where":
        kinds = kinds[1:]
        scalar = scalar_of(kinds[0])
    return max(kinds, key=width_of) if kinds else "float32"


def lower_launch(graph: Graph, ssa: dict, binding: LaunchBinding, known: dict, fold: bool = True) -> list[str]:
    """Appends one launch of the kernel ``ssa`` to ``graph``; returns the refusals (empty when it lowered).
    ``fold``: per-thread values known now become tables (False for a capture of a dynamic-batch node)."""
    launch = _Launch(graph, binding, known, fold)
    env: dict = {"__scope__": _Scope(0), "__loop__": None}
    for name, type_name in ssa["args"]:
        if name in binding.arrays:
            env[name] = _View(binding.arrays[name])
        elif name in binding.scalars and type_name in KINDS:
            lanes = binding.scalars[name]
            env[name] = launch.const(lanes if len(lanes) > 1 else lanes[0], type_name)
        else:
            env[name] = ("unsupported", f"argument `{name}` of type {type_name}")
    _Kernel(launch, ssa, env).run(ssa["events"])
    return list(dict.fromkeys(launch.refusals))

