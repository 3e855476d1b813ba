"""leapp/runtime/pt2_program.py: calling an exported PT2 program without torch's per-call wrapper.

``ExportedProgram.module()`` wraps the graph in a module that, on every call,
flattens the arguments with pytree, checks the input constraints in Python and
unflattens the outputs: host work that costs far more per call than replaying a
Warp segment (figures: benchmarks/results/performance-history.md). A leapp node
is a flat function of tensors whose dtypes and shapes leapp checks at the node
boundary, so :class:`Pt2Program` binds the lifted parameters, buffers and
constants once and calls the graph's own
``forward`` with them and the user's tensors: the same graph, the same ops,
only the wrapper is gone. Programs the direct call cannot serve exactly
(state mutated in place, non-tensor inputs, script objects) use
``ExportedProgram.module()`` instead; :attr:`Pt2Program.direct` says which.
"""

from __future__ import annotations

import torch
from torch.export.graph_signature import InputKind, OutputKind, TensorArgument

__all__ = ["Pt2Program"]

_LIFTED = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)


class Pt2Program:
    """``program(*tensors)`` -> list of the user outputs, in the program's output order."""

    def __init__(self, program: torch.export.ExportedProgram):
        self.program = program
        self.reason = _why_not_direct(program)
        self.direct = self.reason is None
        if self.direct:
            specs = program.graph_signature.input_specs
            self._forward = program.graph_module.forward
            self._lifted = tuple(_lifted_value(program, s) for s in specs if s.kind in _LIFTED)
            self._arity = sum(1 for s in specs if s.kind == InputKind.USER_INPUT)
        else:
            self._module = program.module()

    def __call__(self, *args: torch.Tensor) -> list[torch.Tensor]:
        if not self.direct:
            outs = self._module(*args)
            return [outs] if isinstance(outs, torch.Tensor) else list(outs)
        if len(args) != self._arity:
            raise TypeError(f"the exported program takes {self._arity} tensor input(s), got {len(args)}")
        return list(self._forward(*self._lifted, *args))


def _why_not_direct(program: torch.export.ExportedProgram) -> str | None:
    """None when the graph can be called directly with the same result as ``.module()``; else why not."""
    specs = program.graph_signature.input_specs
    kinds = [s.kind for s in specs]
    for spec in specs:
        if spec.kind not in (*_LIFTED, InputKind.USER_INPUT):
            return f"input {spec.arg.name!r} is a {spec.kind.name}"
        if not isinstance(spec.arg, TensorArgument):
            return f"input {spec.arg.name!r} is not a tensor ({type(spec.arg).__name__})"
    if InputKind.USER_INPUT in kinds and any(
        k in _LIFTED for k in kinds[kinds.index(InputKind.USER_INPUT):]
    ):
        return "lifted state follows a user input"
    for spec in program.graph_signature.output_specs:
        if spec.kind != OutputKind.USER_OUTPUT:
            return f"output {spec.arg.name!r} is a {spec.kind.name} (state written in place)"
    calls = program.module_call_graph
    if calls and calls[0].signature is not None:
        # ((positional...), {}) with one leaf per positional tensor: a flat function of tensors
        top = _children(calls[0].signature.in_spec)
        if len(top) != 2 or _children(top[1]) or any(_children(c) or not c.is_leaf() for c in _children(top[0])):
            return "the inputs are nested or passed by keyword"
    return None


def _lifted_value(program: torch.export.ExportedProgram, spec) -> torch.Tensor:
    """The tensor bound to a lifted input, detached: inference never records autograd history."""
    target = spec.target
    if spec.kind == InputKind.CONSTANT_TENSOR or (spec.kind == InputKind.BUFFER and not spec.persistent):
        value = program.constants[target]
    else:
        value = program.state_dict[target]
    return value.detach()



def _children(spec) -> list:
    """A TreeSpec's children (``children()`` from torch 2.12 on, ``children_specs`` before)."""
    children = getattr(spec, "children", None)
    return list(children() if callable(children) else spec.children_specs)
