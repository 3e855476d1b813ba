"""leapp/_recorder/segment.py: ``annotate.warp_op()``, one Warp segment of a node.

Per pass (counted per node, see session.py):

- discovery runs the block eagerly under a ``wp.Tape`` subclass
  (``leapp._warp_private.launch_observer``) that sees every ``wp.launch``
  (kernel, device, call site);
- capture wraps the block in ``wp.capture_begin(device, apic=True)`` on the
  device discovery saw, saves the graph with ``wp.capture_save`` into a
  temporary folder, reads the bytes back, then launches the graph (CUDA: on
  torch's current stream) so the values the user sees are real;
- later passes run eagerly again and must meet the same launches.

NOTE: ``runtime.tape`` and the APIC capture slot are Warp's own per-process
slots, used the way Warp's public API uses them (``wp.Tape``,
``capture_begin/end``) and always released on exit, also when the block
raised. Nothing is patched.
"""

from __future__ import annotations

import functools
import sys
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import warp as wp

from leapp._warp_private import kernel_args, launch_observer, recorded_launch_args, recorded_launch_observer
from leapp.errors import (
    LINUX_ONLY,
    MIXED_TRACE_CONTEXTS,
    MORE_REGIONS_THAN_DISCOVERY,
    SEGMENT_DIVERGED,
    WARP_OP_OWNER_TOKEN,
    LeappError,
    SegmentDivergenceError,
    TraceError,
    UnsupportedPlatform,
)

from .capture import AllocationWitness, CaptureAnalysis, ClosedSegment, arg_ptr
from .fx_graph import BlockGuardMode, traced_tensors
from .session import DiscoveredSegment, current_session
from .strided_copy import copy_plan, launch_copy
from .source import frame_location, raised_in_warp, traceback_location, user_location

if TYPE_CHECKING:
    from .node import NodeRun
    from .session import Session

__all__ = ["WarpOp"]


class WarpOp:
    """``annotate.warp_op(node=None)``: context manager (or decorator) for one Warp segment.

    The block holds an owner token: another ``warp_op`` cannot begin while it
    is open, and only its own exit closes it.
    """

    __slots__ = ("_node", "_states")

    def __init__(self, node: str | None = None) -> None:
        self._node = node
        self._states: list[_Block | None] = []

    def __enter__(self) -> WarpOp:
        session = current_session()
        self._states.append(None if session is None else _open(session, self._node, user_location()))
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        block = self._states.pop() if self._states else None
        if block is not None:
            block.close(failed=exc_type is not None, error=exc)
        return False

    def __call__(self, fn):
        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            with WarpOp(self._node):
                return fn(*args, **kwargs)

        return wrapped


def _open(session: Session, node: str | None, source: str) -> _Block:
    run = session.current
    if run is None:
        raise TraceError(f"annotate.warp_op() at {source} is outside any leapp.node; Warp segments belong to a node.")
    if node is not None and node != run.name:
        raise TraceError(
            f"annotate.warp_op(node='{node}') at {source} is inside leapp.node('{run.name}'), not '{node}'."
        )
    segment_id = f"{run.name}/warp_segment_{len(run.segments_met)}"
    if not sys.platform.startswith("linux"):
        raise UnsupportedPlatform(f"{LINUX_ONLY} (sys.platform is {sys.platform!r}; segment {segment_id} at {source})")
    if session.block is not None:
        raise TraceError(
            f"annotate.warp_op() at {source} in node '{run.name}': {WARP_OP_OWNER_TOKEN} "
            f"The active WarpOp is segment {session.block.segment_id} opened at {session.block.source}; "
            "Warp segments cannot be nested."
        )
    block = _Block(session, run, len(run.segments_met), segment_id, source)
    block.open()
    return block


@dataclass
class _Launch:
    kernel: Any
    device: str
    block_dim: int
    caller: str
    args: list  # wp.array / tensor / scalar arguments in kernel order
    n_inputs: int


def _launch_observer(block: _Block):
    """A tape that reports the launches of this thread (only) to ``block``."""
    thread = threading.get_ident()

    def on_launch(kernel, device, block_dim, file, line, inputs, outputs) -> None:
        if threading.get_ident() != thread:
            return
        launch = _Launch(kernel, str(device), int(block_dim or 0), frame_location(file, line),
                         list(inputs or []) + list(outputs or []), len(inputs or []))
        block.on_launch(launch)

    return launch_observer(on_launch)


def _recorded_launch_observer(block: _Block):
    """Reports ``Launch.launch()`` calls (recorded launches, launch caches) of this thread to ``block``, and makes
    its non-contiguous ``wp.copy`` calls with leapp's copy kernel (leapp/_recorder/strided_copy.py)."""

    def on_recorded(launch, file, line) -> None:
        caller = frame_location(file, line)
        args = recorded_launch_args(launch)
        if args is None:
            raise TraceError(
                f"Launch.launch() of kernel '{launch.kernel.key}' at {caller} in segment {block.segment_id} of node "
                f"'{block.run.name}': its arguments were set by index (set_param_at_index), so Warp's capture "
                "cannot record it. Record it with wp.launch(..., record_cmd=True) and its inputs/outputs, or call "
                "wp.launch inside the block."
            )
        block.on_launch(_Launch(launch.kernel, str(launch.device), int(launch.block_dim or 0), caller, args,
                                len(args)))

    def on_copy(dest, src, dest_offset, src_offset, count, stream, file, line) -> bool:
        """A ``wp.copy`` between non-contiguous arrays: made by leapp's copy kernel in every pass, so the capture
        records it as a launch (Warp's capture refuses such a copy) and discovery sees the same operations."""
        plan = copy_plan(dest, src, dest_offset, src_offset, count, stream)
        if plan is None:
            return False
        caller = frame_location(file, line)
        where = f"wp.copy at {caller} in segment {block.segment_id} of node '{block.run.name}'"
        kernel, args = launch_copy(*plan, where)
        block.on_launch(_Launch(kernel, str(plan[0].device), 0, caller, args, 1))
        return True

    return recorded_launch_observer(on_recorded, on_copy)


class _Block:
    """The state of one open segment; ``session.block`` holding it is the owner token."""

    def __init__(self, session: Session, run: NodeRun, index: int, segment_id: str, source: str) -> None:
        self.session = session
        self.run = run
        self.index = index
        self.segment_id = segment_id
        self.source = source
        self.launches: list[_Launch] = []
        self.discovered: DiscoveredSegment | None = None
        self.device: str | None = None
        self._observer = None  # the launch-observing tape while the block is open
        self._recorded = None  # the profile function that sees Launch.launch() while the block is open
        self._guard: BlockGuardMode | None = None
        self._capturing = False
        self._stream = None
        self._census: AllocationWitness | None = None
        self._closed = False

    # ---- open / close ----

    def open(self) -> None:
        run = self.run
        if run.pass_index >= 1:
            discovered = run.state.discovered
            if self.index >= len(discovered):
                raise SegmentDivergenceError(
                    f"{self.segment_id} at {self.source}: {MORE_REGIONS_THAN_DISCOVERY} "
                    f"(node '{run.name}', {run.pass_name}: discovery met {len(discovered)} Warp segment(s))."
                )
            self.discovered = discovered[self.index]
        self._observer = _launch_observer(self)
        try:
            self._observer.__enter__()
        except RuntimeError as e:
            self._observer = None
            raise TraceError(
                f"{self.segment_id} at {self.source}: leapp observes Warp launches with a tape, but another "
                f"wp.Tape is active ({e}). Close it before the segment."
            ) from e
        self._recorded = _recorded_launch_observer(self).__enter__()
        self._guard = BlockGuardMode(run.recorder, self.check_torch_op)
        self._guard.__enter__()
        self.session.block = self
        run.recorder.block = self
        if run.capturing:
            try:
                self._begin_capture()
            except BaseException:
                self._release()
                raise

    def _begin_capture(self) -> None:
        device = wp.get_device(self.discovered.device) if self.discovered.device else wp.get_device()
        self.device = str(device)
        self._census = AllocationWitness()
        self._stream = wp.get_stream(device) if device.is_cuda else None
        try:
            wp.capture_begin(device=device, stream=self._stream, apic=True)
        except RuntimeError as e:
            raise TraceError(
                f"{self.segment_id} at {self.source}: cannot begin the APIC capture on {device}: {e}"
            ) from e
        self._capturing = True

    def _release(self) -> Any:
        """Give back every scoped thing this block took; returns the captured graph, if any."""
        graph = None
        try:
            if self._capturing:
                self._capturing = False
                graph = wp.capture_end(device=self.device, stream=self._stream)
        finally:
            if self._census is not None:
                self._census.close()
            if self._guard is not None:
                self._guard.__exit__(None, None, None)
                self._guard = None
            if self._observer is not None:
                self._observer.__exit__(None, None, None)
                self._observer = None
            if self._recorded is not None:
                self._recorded.__exit__(None, None, None)
                self._recorded = None
            if self.session.block is self:
                self.session.block = None
            self.run.recorder.block = None
        return graph

    def close(self, failed: bool, error: BaseException | None = None) -> None:
        """Called by the owning ``WarpOp``'s exit (or when its node / session unwinds after an error).

        A Warp error raised while the block was captured is Warp's capture refusing an operation: it is
        raised again as a TraceError that names the node, the segment and the user's line.
        """
        if self._closed:
            return
        if self.session.block is not self:
            raise TraceError(f"{self.segment_id}: {WARP_OP_OWNER_TOKEN} (closing a segment that is not open)")
        self._closed = True
        try:
            graph = self._release()
        except BaseException:
            if failed:  # the body's exception is the one the user needs (a refused op also ends the capture)
                self._census = None
                self._raise_capture_refusal(error)
                return
            raise
        if failed:
            self._census = None
            self._raise_capture_refusal(error)
            return
        try:
            self._record(graph)
        finally:
            self._census = None

    def _raise_capture_refusal(self, error: BaseException | None) -> None:
        if self.run.capturing and isinstance(error, Exception) and not isinstance(error, LeappError) \
                and raised_in_warp(error.__traceback__):
            raise self._capture_refusal(error) from error

    def _capture_refusal(self, error: Exception) -> TraceError:
        text = (str(error).strip() or type(error).__name__).rstrip(".")
        low = text.lower()
        if "contiguous" in low:
            advice = ("Warp captures copies between contiguous arrays only: copy with a kernel, or copy contiguous "
                      "arrays (a torch copy_ outside the block works too).")
        elif "host" in low or "d2h" in low or "cpu" in low and "cuda" in low:
            advice = ("Copies to or from host memory cannot be captured: keep readbacks (wp.copy into a CPU array, "
                      ".numpy()) after the block, and host data as node inputs.")
        else:
            advice = ("Everything in annotate.warp_op() is captured, as by wp.ScopedCapture: keep only "
                      "capturable Warp work there (launches, wp.copy between device arrays, zero_/fill_).")
        return TraceError(
            f"Warp refused to capture an operation at {traceback_location(error.__traceback__)} in segment "
            f"{self.segment_id} (opened at {self.source}) of node '{self.run.name}' ({self.run.pass_name}): "
            f"{type(error).__name__}: {text}. {advice}"
        )

    def _record(self, graph) -> None:
        run = self.run
        ops = [f"launch:{launch.kernel.key}" for launch in self.launches]
        sites = [launch.caller for launch in self.launches]
        if run.pass_index == 0:
            devices = sorted({launch.device for launch in self.launches})
            if len(devices) > 1:
                raise TraceError(
                    f"{self.segment_id} at {self.source}: one Warp segment launches on several devices {devices}; "
                    "split it into one annotate.warp_op() per device."
                )
            run.segments_met.append(
                DiscoveredSegment(self.index, self.segment_id, self.source, ops, sites, devices[0] if devices else None)
            )
            return
        self._check_same_ops(ops, sites)
        if run.capturing:
            closed = ClosedSegment(self.segment_id, run.name, self.index, self.source, self.device, self.launches,
                                   self.discovered.ops, self.discovered.call_sites, self._census)
            run.captured_graphs.append(graph)
            analysis = CaptureAnalysis(closed, graph, run.recorder, self.session.constants_report)
            run.segments_met.append(analysis.build())
        else:
            run.segments_met.append(self.discovered)

    def _check_same_ops(self, ops: list[str], sites: list[str]) -> None:
        expected = self.discovered.ops
        if ops == expected:
            return
        first = next((i for i, (a, b) in enumerate(zip(ops, expected)) if a != b), min(len(ops), len(expected)))
        here = sites[first] if first < len(sites) else self.source
        raise SegmentDivergenceError(
            f"{self.segment_id} at {self.source}: {SEGMENT_DIVERGED} (node '{self.run.name}', {self.run.pass_name}): "
            f"discovery ran {expected}, this pass ran {ops}; first difference at operation {first} ({here})."
        )

    # ---- checks while open ----

    def allocates(self, ptr: int) -> bool:
        """True in the capture pass if Warp memory starting at ``ptr`` was allocated inside this open block."""
        return self._census is not None and self._census.allocates(ptr)

    def check_torch_op(self, name: str, args: tuple, kwargs: dict) -> None:
        traced = traced_tensors(self.run.recorder, args, kwargs)
        if traced:
            t = traced[0]
            if self._guard is not None and self._guard.current and not name.startswith("host readback"):
                name = f"{self._guard.current[-1]} ({name})"
            raise TraceError(
                f"{name} on a traced {tuple(t.shape)} {t.dtype} tensor at {user_location()} runs inside Warp segment "
                f"{self.segment_id} (opened at {self.source}) of node '{self.run.name}'. Only Warp work may run in "
                "annotate.warp_op(); move torch work and host readbacks (.numpy(), .item(), .tolist(), .cpu()) "
                "before or after the block."
            )

    def on_launch(self, launch: _Launch) -> None:
        self.launches.append(launch)
        owners: dict[str, list[str]] = {}
        params = kernel_args(launch.kernel)
        labels = [a.label for a in params]
        for param, arg in zip(params, launch.args):
            if isinstance(arg, wp.array) and arg.ptr and str(arg.device) != launch.device:
                raise TraceError(
                    f"wp.launch('{launch.kernel.key}') at {launch.caller} in segment {self.segment_id} of node "
                    f"'{self.run.name}' runs on {launch.device}, but its argument '{param.label}' is an array on "
                    f"{arg.device}. Warp's capture leaves such an argument out; launch on the arrays' device "
                    "(device=..., or wp.ScopedDevice around the block for code that launches on the current device)."
                )
            if arg is not None and wp.types.is_array(param.type) and not isinstance(arg, wp.array):
                raise TraceError(
                    f"wp.launch('{launch.kernel.key}') at {launch.caller} in segment {self.segment_id} of node "
                    f"'{self.run.name}': argument '{param.label}' is a {type(arg).__module__}.{type(arg).__name__}, "
                    "not a wp.array. Warp launches it through its array interface, but its capture (which leapp "
                    "exports) records wp.array arguments only: pass wp.from_torch(tensor) for a torch tensor, or the "
                    "wrapped wp.array (for example ProxyArray.warp)."
                )
        for i, arg in enumerate(launch.args):
            ptr = arg_ptr(arg)
            owner = self.session.owners.owner_of(ptr) if ptr else None
            if owner is not None:
                owners.setdefault(owner, []).append(labels[i] if i < len(labels) else f"#{i}")
        foreign = [n for n in owners if n != self.run.name]
        if foreign:
            detail = ", ".join(f"node '{n}': {', '.join(args)}" for n, args in owners.items())
            raise TraceError(
                f"wp.launch('{launch.kernel.key}') at {launch.caller} in segment {self.segment_id} "
                f"{MIXED_TRACE_CONTEXTS} Arguments by node: {detail}. Pass values between nodes with "
                "annotate.output_tensors / annotate.input_tensors."
            )
