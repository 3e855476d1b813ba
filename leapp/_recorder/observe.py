"""leapp/_recorder/observe.py: observation mode, node boundary tensors of an eager run without a trace.

``leapp.testing`` localises a mismatch by running the user's eager code once
more and looking at what each ``leapp.node`` received and returned. Inside
``observing()`` (and outside any session) the node entry code hands every
declared input and output to the ``NodeObserver`` of this context, which keeps
a detached copy; the user's code sees exactly what it sees outside a session
(same values, no dense copies, no modes, no tapes). An active session wins:
nodes are recorded, not observed.

NOTE: the observer lives in a ``contextvars.ContextVar`` of this module, like
the active session: one per thread / async context, nothing process-wide.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

__all__ = ["NodeObservation", "NodeObserver", "ObservedRun", "current_observer", "observing"]

_OBSERVER: contextvars.ContextVar[NodeObserver | None] = contextvars.ContextVar("leapp_observer", default=None)


def current_observer() -> NodeObserver | None:
    """The observer of this thread / context, or None (read only when no session is active)."""
    return _OBSERVER.get()


@dataclass
class NodeObservation:
    """One eager execution of one node: its declared inputs and outputs (detached copies), in order."""

    name: str
    inputs: dict[str, torch.Tensor] = field(default_factory=dict)
    outputs: dict[str, torch.Tensor] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    finished: bool = False


def _copy(value: Any) -> torch.Tensor | None:
    """A detached copy of a tensor or ``wp.array`` as the export sees it (expanded layout), else None."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if type(value).__module__.startswith("warp"):
        from .dtypes import is_warp_array  # Warp is imported by whoever made the array

        if is_warp_array(value):
            import warp as wp

            return wp.to_torch(value, requires_grad=False).detach().clone()
    return None


class ObservedRun:
    """One observed execution; duck-types ``NodeRun.declare_input`` / ``declare_output`` for the decorator's
    argument and result walkers, which name values exactly as the recorder does."""

    def __init__(self, observation: NodeObservation, observer: NodeObserver) -> None:
        self.observation = observation
        self.observer = observer
        self.name = observation.name

    def declare_input(self, name: str, value: Any, where: str) -> Any:
        self._keep(self.observation.inputs, "input", name, value, where)
        return value

    def declare_output(self, name: str, value: Any, where: str) -> Any:
        self._keep(self.observation.outputs, "output", name, value, where)
        return value

    def _keep(self, into: dict, kind: str, name: str, value: Any, where: str) -> None:
        if name in into:
            self.observation.notes.append(f"{kind} {name!r} declared twice (at {where}); the first is kept")
            return
        copy = _copy(value)
        if copy is None:
            self.observation.notes.append(f"{kind} {name!r} at {where} is a {type(value).__name__}, not observed")
            return
        into[name] = copy

    def end(self, failed: bool) -> None:
        self.observation.finished = not failed
        if self in self.observer.open:
            self.observer.open.remove(self)


class NodeObserver:
    """Collects the node executions of one eager run, in execution order."""

    def __init__(self) -> None:
        self.runs: list[NodeObservation] = []
        self.open: list[ObservedRun] = []  # nodes entered and not yet left

    def begin(self, name: str) -> ObservedRun:
        run = ObservedRun(NodeObservation(name), self)
        self.runs.append(run.observation)
        self.open.append(run)
        return run

    def declare(self, node: str, values: dict, outputs: bool, where: str) -> None:
        """``annotate.input_tensors`` / ``output_tensors`` of ``node``: kept on its open execution."""
        run = next((r for r in reversed(self.open) if r.name == node), None)
        if run is None:
            run = ObservedRun(NodeObservation(node, notes=[f"declared outside leapp.node({node!r}) at {where}"]), self)
            self.runs.append(run.observation)
        for name, value in values.items():
            (run.declare_output if outputs else run.declare_input)(name, value, where)

    def first(self, node: str) -> NodeObservation | None:
        return next((r for r in self.runs if r.name == node), None)


@contextlib.contextmanager
def observing() -> Iterator[NodeObserver]:
    """Observe the node boundaries of the eager code run in this block (this context only)."""
    observer = NodeObserver()
    token = _OBSERVER.set(observer)
    try:
        yield observer
    finally:
        _OBSERVER.reset(token)
