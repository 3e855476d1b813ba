"""leapp/_recorder/session.py: the trace session, its pass counting and the SessionRecord it yields.

NOTE: the active session lives in a ``contextvars.ContextVar`` of this module:
leapp's own state, one per thread / async context. Nothing in ``torch`` or
``warp`` is touched when a session starts or stops.

Pass counting is per node: the first execution of a node in a session is
discovery, the second is capture, later ones are validation samples (at most
``MAX_SAMPLES`` kept, the capture pass's own sample included).
"""

from __future__ import annotations

import contextvars
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic

import torch

from leapp._contract.exporter import Exporter, Report
from leapp._contract.names import NAME_RULE, name_problem, shown
from leapp._contract.records import NodeRecord, SessionRecord
from leapp.errors import NOT_EXECUTED_TWICE, TraceError

from .fx_graph import OwnerMap, storage_ptr
from .source import user_location

if TYPE_CHECKING:
    from .node import NodeRun

__all__ = ["Session", "current_session", "start", "stop", "last_session", "MAX_SAMPLES", "DiscoveredSegment"]

MAX_SAMPLES = 4

_ACTIVE: contextvars.ContextVar[Session | None] = contextvars.ContextVar("leapp_session", default=None)
_LAST: list[Session] = []  # the most recent session started in this process (for compile_graph)


def current_session() -> Session | None:
    """The active session of this thread / context, or None (the cheap no-op path)."""
    return _ACTIVE.get()


@dataclass
class DiscoveredSegment:
    """What the discovery pass learned about one Warp segment."""

    index: int
    id: str
    source: str
    ops: list[str]
    call_sites: list[str]
    device: str | None


@dataclass
class NodeState:
    name: str
    export_with: str
    backend_params: dict
    source: str
    runs: int = 0
    discovered: list[DiscoveredSegment] = field(default_factory=list)
    record: NodeRecord | None = None
    skipped: list[DiscoveredSegment] = field(default_factory=list)
    dynamic_batch: tuple[int, int] | None = None  # (min, max): docs/recorder.md section 1.0
    # state name -> its value at the node's first run (detached CPU clone): the initial value (docs/state.md)
    initial_state: dict[str, torch.Tensor] = field(default_factory=dict)


class Session(Generic[Report]):
    """One ``leapp.trace(name, save_path)`` session.

    Enter it (``with`` or ``leapp.start``), run the traced code at least twice,
    then call ``compile()``. ``record`` is the plain data model the exporter
    consumes; ``export`` (``leapp._contract.exporter.Exporter``) is the exporter
    ``compile()`` hands it to, and its report what ``compile()`` returns
    (``leapp.trace`` passes it: the recorder never imports the exporter).
    """

    def __init__(self, name: str, save_path: str = ".", *, export: Exporter[Report] | None = None) -> None:
        problem = name_problem(name)
        if problem is not None:
            raise TraceError(
                f"leapp.trace({shown(name)}) at {user_location()}: invalid session name ({problem}). A session's name is "
                f"the folder it exports into (<save_path>/<name>/), so it must be {NAME_RULE}."
            )
        self.name = name
        self.save_path = str(save_path)
        self.owners = OwnerMap()
        self.current: NodeRun | None = None
        self.block = None  # the open Warp segment (holds the owner token)
        self._nodes: dict[str, NodeState] = {}
        self._edges: list[tuple[str, str, str, str]] = []
        self._outputs: dict[int, tuple[str, str, weakref.ref]] = {}  # storage ptr -> (node, output name, tensor)
        self.constants_report: list[str] = []
        self.notes: list[str] = []
        self._token: contextvars.Token | None = None
        self._export = export

    # ---- lifecycle ----

    def __enter__(self) -> Session:
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.stop()
        return False

    def start(self) -> None:
        other = _ACTIVE.get()
        if other is not None:
            raise TraceError(
                f"leapp.trace('{self.name}') at {user_location()}: session '{other.name}' is still active; "
                "sessions cannot be nested (leapp.stop() ends the script-style session)."
            )
        self._token = _ACTIVE.set(self)
        _LAST[:] = [self]
        if self._export is not None:
            self._export.prepare()  # the exporter's head start while this session traces (its validation worker)

    def stop(self) -> None:
        if self._token is None:
            return
        if self.current is not None:
            # A node left open (an exception escaped past it): close its scoped state.
            self.current.abort()
        _ACTIVE.reset(self._token)
        self._token = None

    @property
    def active(self) -> bool:
        return self._token is not None

    # ---- nodes ----

    def node_state(self, name: str, export_with: str, backend_params: dict, source: str,
                   dynamic_batch: tuple[int, int] | None = None) -> NodeState:
        state = self._nodes.get(name)
        if state is None:
            other = next((s for n, s in self._nodes.items() if n.lower() == name.lower()), None)
            if other is not None:
                raise TraceError(
                    f"leapp.node('{name}') at {source}: node '{other.name}' at {other.source} differs only in case; "
                    "their artifacts would be one file on a case-insensitive file system. Rename one of them."
                )
            state = self._nodes[name] = NodeState(name, export_with, dict(backend_params), source,
                                                  dynamic_batch=dynamic_batch)
        elif state.source != source:
            raise TraceError(
                f"leapp.node('{name}') at {source}: a node of that name is already traced at {state.source}; "
                "each node needs its own name (passes are counted per node)."
            )
        elif state.export_with != export_with:
            raise TraceError(
                f"leapp.node('{name}') at {source} has export_with='{export_with}', but the same node was "
                f"declared with export_with='{state.export_with}' at {state.source}."
            )
        elif state.dynamic_batch != dynamic_batch:
            raise TraceError(
                f"leapp.node('{name}') at {source} has dynamic_batch={dynamic_batch}, but the same node was "
                f"declared with dynamic_batch={state.dynamic_batch} at {state.source}."
            )
        return state

    def register_output(self, node: str, name: str, t: torch.Tensor) -> None:
        ptr = storage_ptr(t)
        if ptr:
            self._outputs[ptr] = (node, name, weakref.ref(t))

    def record_edge(self, node: str, name: str, t: torch.Tensor) -> None:
        entry = self._outputs.get(storage_ptr(t))
        if entry is None or entry[2]() is None or entry[0] == node:
            return
        edge = (entry[0], entry[1], node, name)
        if edge not in self._edges:
            self._edges.append(edge)

    # ---- results ----

    @property
    def record(self) -> SessionRecord:
        """The SessionRecord so far: captured nodes in order of first execution, plus pending problems."""
        problems = []
        for state in self._nodes.values():
            if state.record is None:
                segs = "".join(f"; Warp segment {d.id} at {d.source}" for d in state.discovered)
                problems.append(
                    f"leapp.node('{state.name}') at {state.source} was {NOT_EXECUTED_TWICE} "
                    f"(executed {state.runs} time(s) in session '{self.name}'; run the traced code at least twice)"
                    f"{segs}."
                )
                continue
            for d in state.skipped:
                problems.append(
                    f"Warp segment {d.id} at {d.source} of node '{state.name}' was discovered but "
                    f"{NOT_EXECUTED_TWICE} (the capture pass met {len(state.record.segments)} of "
                    f"{len(state.discovered)} discovered segments)."
                )
            problem = probe_problem(state)
            if problem:
                problems.append(problem)
            if not state.record.outputs:
                problems.append(
                    f"leapp.node('{state.name}') at {state.source} declared no outputs "
                    "(use annotate.output_tensors or return tensors from the decorated function)."
                )
        return SessionRecord(
            name=self.name,
            save_path=self.save_path,
            nodes={n: s.record for n, s in self._nodes.items() if s.record is not None},
            edges=list(self._edges),
            constants_report=list(self.constants_report),
            problems=problems,
            notes=list(self.notes),
        )

    def compile(self, validate: bool = True, rtol: float = 1e-3, atol: float = 1e-5, *,
                warp: str = "replay", leapp_bundle: bool = False) -> Report:
        """Check the passes, then export every node (with the ``export`` the session was made with).

        ``warp``: "replay" (default), "lower" or "auto": whether Warp segments are written as standard ops
        (docs/lowering.md). ``leapp_bundle``: also write ``<name>.yaml`` for other tools (docs/leapp-bundle.md).

        Raises:
            TraceError: a node ran only once, or the capture pass skipped a
                discovered Warp segment (text: ``not executed a second time
                for APIC capture``).
        """
        if self.active:
            self.stop()
        record = self.record
        record.check_complete()
        if self._export is None:
            raise TraceError(f"session '{self.name}' has no exporter to compile with; "
                             "begin sessions with leapp.trace or leapp.start")
        # exporters written before an option need not know it: only the options asked for are passed
        options = ({"warp": warp} if warp != "replay" else {}) | ({"leapp_bundle": True} if leapp_bundle else {})
        return self._export(record, validate=validate, rtol=rtol, atol=atol, **options)


def probes_needed(lo: int, hi: int) -> int:
    """Probe captures a dynamic node needs: two (three batches in all), fewer only when the range is that small."""
    return min(2, hi - lo)


def probe_problem(state: NodeState) -> str | None:
    record = state.record
    if record is None or state.dynamic_batch is None or not record.segments:
        return None
    lo, hi = state.dynamic_batch
    need = probes_needed(lo, hi)
    if len(record.probes) >= need:
        return None
    seen = [record.inputs[0].shape[0]] + [p.batch for p in record.probes] if record.inputs else []
    return (
        f"leapp.node('{state.name}') at {state.source} declares dynamic_batch=({lo}, {hi}) and has Warp segments, "
        f"but it ran at only {len(seen)} distinct batch size(s) {seen}; leapp learns how each segment depends on "
        f"the batch from {need + 1} batch sizes. Run the node at {need + 1 - len(seen)} more batch size(s) in "
        "the range (the decorator form, @leapp.node(...), does this itself)."
    )


def start(name: str, save_path: str = ".", *, export: Exporter[Report] | None = None) -> Session[Report]:
    session = Session(name, save_path, export=export)
    session.start()
    return session


def stop() -> Session:
    session = _ACTIVE.get()
    if session is None:
        raise TraceError("leapp.stop(): no leapp session is active (leapp.start(name) begins one).")
    session.stop()
    return session


def last_session() -> Session:
    session = _ACTIVE.get() or (_LAST[0] if _LAST else None)
    if session is None:
        raise TraceError("leapp.compile_graph(): no leapp session was started (use leapp.start or leapp.trace).")
    return session
