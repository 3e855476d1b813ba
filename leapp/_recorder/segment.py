"""leapp/_recorder/segment.py: ``annotate.warp_op()``, one Warp segment of a node.

Per pass (counted per node, see session.py):

- discovery runs the block eagerly under a ``wp.Tape`` subclass whose
  ``record_launch`` sees every ``wp.launch`` (kernel, device, call site);
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

import gc
import operator
import os
import shutil
import sys
import tempfile
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import warp as wp

from leapp.errors import (
    LINUX_ONLY,
    MIXED_TRACE_CONTEXTS,
    MORE_REGIONS_THAN_DISCOVERY,
    SEGMENT_DIVERGED,
    WARP_OP_OWNER_TOKEN,
    SegmentDivergenceError,
    TraceError,
)

from . import wrp
from .dtypes import array_base, is_warp_array, spec_for_array, warp_dtype_name
from .fx_graph import BlockGuardMode, PendingOutput, storage_ptr, traced_tensors
from .model import KernelRef, SegmentIO, SegmentRecord, TensorSpec, warp_segment_call
from .session import DiscoveredSegment, current_session
from .source import frame_location, user_location

if TYPE_CHECKING:
    from .node import NodeRun
    from .session import Session

__all__ = ["WarpOp"]

_aten = torch.ops.aten


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
            block.close(failed=exc_type is not None)
        return False

    def __call__(self, fn):
        import functools  # noqa: PLC0415

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
        raise ImportError(f"{LINUX_ONLY} (sys.platform is {sys.platform!r}; segment {segment_id} at {source})")
    if session.block is not None:
        raise TraceError(
            f"annotate.warp_op() at {source} (segment {segment_id}): {WARP_OP_OWNER_TOKEN} "
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


class _LaunchObserver(wp.Tape):
    """A tape that records nothing for autodiff; it only reports launches of its own thread."""

    def __init__(self, block: _Block) -> None:
        super().__init__()
        self._block = block
        self._thread = threading.get_ident()

    def record_launch(self, kernel, dim, max_blocks, inputs, outputs, device, block_dim=0, metadata=None):
        if threading.get_ident() != self._thread:
            return
        caller = (metadata or {}).get("caller") or {}
        where = frame_location(caller.get("file", "<unknown>"), caller.get("lineno", 0))
        launch = _Launch(kernel, str(device), int(block_dim or 0), where, list(inputs or []) + list(outputs or []),
                         len(inputs or []))
        self._block.on_launch(launch)

    def record_func(self, backward, arrays):  # wp.copy's adjoint; inference needs none
        return None


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
        self._observer: _LaunchObserver | None = None
        self._guard: BlockGuardMode | None = None
        self._capturing = False
        self._stream = None
        self._census: _AllocationWitness | None = None

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
        self._observer = _LaunchObserver(self)
        try:
            self._observer.__enter__()
        except RuntimeError as e:
            self._observer = None
            raise TraceError(
                f"{self.segment_id} at {self.source}: leapp observes Warp launches with a tape, but another "
                f"wp.Tape is active ({e}). Close it before the segment."
            ) from e
        self._guard = BlockGuardMode(run.recorder, self.check_torch_op)
        self._guard.__enter__()
        self.session.block = self
        run.recorder.block = self
        if run.pass_index == 1:
            try:
                self._begin_capture()
            except BaseException:
                self._release()
                raise

    def _begin_capture(self) -> None:
        device = wp.get_device(self.discovered.device) if self.discovered.device else wp.get_device()
        self.device = str(device)
        self._census = _AllocationWitness()
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
            if self._guard is not None:
                self._guard.__exit__(None, None, None)
                self._guard = None
            if self._observer is not None:
                self._observer.__exit__(None, None, None)
                self._observer = None
            if self.session.block is self:
                self.session.block = None
            self.run.recorder.block = None
        return graph

    def close(self, failed: bool) -> None:
        if self.session.block is not self:
            raise TraceError(f"{self.segment_id}: {WARP_OP_OWNER_TOKEN} (closing a segment that is not open)")
        try:
            graph = self._release()
        except BaseException:
            if failed:
                return  # the body's exception is the one the user needs
            raise
        if failed:
            self._census = None
            return
        try:
            self._record(graph)
        finally:
            self._census = None

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
        if run.pass_index == 1:
            run.segments_met.append(_CaptureAnalysis(self, graph).build())
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
        labels = [a.label for a in launch.kernel.adj.args]
        for i, arg in enumerate(launch.args):
            ptr = _arg_ptr(arg)
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


class _AllocationWitness:
    """Tells whether a Warp array was allocated while a block was open, without scanning the whole heap.

    Objects only move to older GC generations. Warp arrays in the young
    generations (0, 1) at entry are remembered; at exit an array that is young
    now and was not then is new. If a generation-1/2 collection ran meanwhile a
    new array may already be old: the answer is then "not new", which makes it
    a snapshotted constant (always correct, just larger) instead of scratch.
    """

    def __init__(self) -> None:
        self._young_at_entry = _young_warp_arrays()  # strong refs: their ids cannot be reused meanwhile
        self._old_collections = _old_collections()
        self._young_at_exit: dict[int, Any] | None = None

    def created_in_block(self, arr) -> bool:
        if id(arr) in self._young_at_entry or _old_collections() != self._old_collections:
            return False
        if self._young_at_exit is None:
            self._young_at_exit = _young_warp_arrays()
        return self._young_at_exit.get(id(arr)) is arr


def _young_warp_arrays() -> dict[int, Any]:
    try:
        return {id(o): o for g in (0, 1) for o in gc.get_objects(generation=g) if issubclass(type(o), wp.array)}
    except (TypeError, ValueError):  # an interpreter without these generations: everything counts as old
        return {}


def _old_collections() -> tuple[int, ...]:
    return tuple(stat.get("collections", 0) for stat in gc.get_stats()[1:])


def _arg_ptr(arg) -> int:
    if is_warp_array(arg):
        return array_base(arg)[1] or 0
    if isinstance(arg, torch.Tensor):
        return storage_ptr(arg)
    return 0


class _CaptureAnalysis:
    """Turn one APIC-captured segment into a SegmentRecord and its FX call."""

    def __init__(self, block: _Block, graph) -> None:
        self.block = block
        self.graph = graph
        self.run = block.run
        self.rec = block.run.recorder
        self.device = wp.get_device(block.device)

    def build(self) -> SegmentRecord:
        block, rec = self.block, self.rec
        capture = self.graph._apic_capture
        regions: dict[int, tuple[int, int, Any]] = {}
        for region_id, ptr, capacity, base in capture._regions.values():
            if region_id not in regions or capacity > regions[region_id][1]:
                regions[region_id] = (ptr, capacity, base)
        kinds: dict[int, str] = {}  # classified first: the allocation witness wants as few allocations as possible
        for region_id, (ptr, _capacity, base) in sorted(regions.items()):
            native = getattr(base, "_storage_base_ptr", None) is None
            if ptr in rec.pending:
                kinds[region_id] = "chained"
            elif rec.live_storage(ptr):
                kinds[region_id] = "traced"
            elif region_id in capture._transient_regions or (native and block._census.created_in_block(base)):
                kinds[region_id] = "created"
            else:
                kinds[region_id] = "external"
        wrp_bytes, modules = self._save(regions)
        ops = wrp.read_ops(wrp_bytes)
        written = {op.dst_region for op in ops if op.dst_region is not None and op.dst_region > 0}
        declared_out = {_arg_ptr(a) for launch in block.launches for a in launch.args[launch.n_inputs:]}
        arrays = self._launch_arrays()

        before = {}
        with rec.paused_recording():
            for region_id, kind in kinds.items():
                ptr, capacity, _ = regions[region_id]
                if kind in ("traced", "chained", "external"):
                    before[region_id] = _read_region(ptr, capacity, self.device)
            self._launch()
            for region_id, snapshot in before.items():
                ptr, capacity, _ = regions[region_id]
                if kinds[region_id] != "external" and _read_region(ptr, capacity, self.device) != snapshot:
                    written.add(region_id)
        written |= {rid for rid, (ptr, _, _) in regions.items() if ptr in declared_out}

        segment = SegmentRecord(
            id=block.segment_id,
            node=self.run.name,
            index=block.index,
            source=block.source,
            device=str(self.device),
            ops=list(block.discovered.ops),
            wrp=wrp_bytes,
            kernels=self._kernels(capture),
            inputs=[],
            outputs=[],
            constants={},
            scratch={},
            captured_ops=[f"launch:{op.kernel_key}" if op.kind == "launch" else op.kind for op in ops],
            call_sites=list(block.discovered.call_sites),
            modules=modules,
        )
        in_nodes, writes = [], []
        for region_id, kind in kinds.items():
            ptr, capacity, base = regions[region_id]
            if kind in ("traced", "chained"):
                node, spec = self._region_value(kind, ptr, capacity, arrays.get(ptr))
                spec.name = f"in{len(segment.inputs)}"
                segment.inputs.append(SegmentIO(spec, region_id, capacity))
                in_nodes.append(node)
                if region_id in written:
                    writes.append((region_id, capacity, spec, node))
            elif kind == "external":
                segment.constants[region_id] = before[region_id]
                self.block.session.constants_report.append(
                    f"{segment.id} ({segment.source}): untraced {_describe(base, capacity)} (region {region_id}) "
                    "snapshotted as a constant"
                    + ("; the segment writes it, and that write is not part of the export" if region_id in written
                       else "")
                )
            else:
                segment.scratch[region_id] = capacity

        call = None
        if rec.build:
            call = rec.graph.call_function(warp_segment_call, (segment.id, in_nodes))
        for k, (region_id, capacity, spec, node) in enumerate(writes):
            out_spec = TensorSpec(f"out{k}", spec.dtype, spec.shape, spec.warp_dtype, spec.logical_shape)
            segment.outputs.append(SegmentIO(out_spec, region_id, capacity))
            if rec.build:
                value = rec.graph.call_function(operator.getitem, (call, k))
                rec.graph.call_function(_aten.copy_.default, (node, value))
        for region_id, kind in kinds.items():
            if kind == "created":
                ptr, capacity, base = regions[region_id]
                rec.pending[ptr] = PendingOutput(
                    segment, call, region_id, capacity, _created_spec(base, capacity), base, base.dtype
                )
        return segment

    # ---- steps ----

    def _save(self, regions) -> tuple[bytes, dict[str, bytes]]:
        folder = tempfile.mkdtemp(prefix="leapp-segment-")
        try:
            stem = os.path.join(folder, "segment")
            bindings = {f"r{region_id}": base for region_id, (_, _, base) in regions.items()}
            wp.capture_save(self.graph, stem, inputs=bindings)
            with open(stem + ".wrp", "rb") as f:
                data = f.read()
            modules = {}
            modules_dir = stem + "_modules"
            for name in sorted(os.listdir(modules_dir)) if os.path.isdir(modules_dir) else []:
                with open(os.path.join(modules_dir, name), "rb") as f:
                    modules[name] = f.read()
            return data, modules
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def _launch(self) -> None:
        if self.device.is_cpu:
            wp.capture_launch(self.graph)
            return
        stream = wp.stream_from_torch(torch.cuda.current_stream(torch.device(str(self.device))))
        wp.capture_launch(self.graph, stream=stream)
        wp.synchronize_stream(stream)

    def _launch_arrays(self) -> dict[int, Any]:
        """First Warp array seen per region base pointer (for warp dtype / logical shape)."""
        arrays: dict[int, Any] = {}
        for launch in self.block.launches:
            for a in launch.args:
                if is_warp_array(a):
                    arrays.setdefault(array_base(a)[1], a)
        return arrays

    def _region_value(self, kind: str, ptr: int, capacity: int, array) -> tuple[Any, TensorSpec]:
        if kind == "chained":
            pending = self.rec.pending[ptr]
            node = pending.materialize(self.rec.graph)
            s = pending.spec
            return node, TensorSpec("", s.dtype, s.shape, s.warp_dtype, s.logical_shape)
        node, spec, _ = self.rec.storage_value(ptr, capacity)
        if array is not None and _array_covers(array, ptr, capacity):
            full = spec_for_array("", array)
            if full.dtype.itemsize * _numel(full.shape) == capacity:
                spec.warp_dtype, spec.logical_shape = full.warp_dtype, full.logical_shape
        return node, spec

    def _kernels(self, capture) -> list[KernelRef]:
        by_key = {}
        for launch in self.block.launches:
            by_key.setdefault(launch.kernel.key, launch)
        refs = []
        for info in capture.collected_kernels.values():
            launch = by_key.get(info["kernel_key"])
            if launch is not None:
                refs.append(KernelRef(launch.kernel, int(info["block_dim"]), info["kernel_key"]))
        return refs


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _array_covers(arr, ptr: int, capacity: int) -> bool:
    return arr.ptr == ptr and arr.is_contiguous and arr.capacity == capacity


def _created_spec(base, capacity: int) -> TensorSpec:
    try:
        return spec_for_array("", base)
    except Exception:  # noqa: BLE001 - e.g. @wp.struct: refused only if it crosses the boundary
        return TensorSpec("", torch.uint8, (capacity,), warp_dtype_name(base.dtype), tuple(base.shape))


def _describe(base, capacity: int) -> str:
    if getattr(base, "_storage_base_ptr", None) is not None:
        return f"torch storage ({capacity} bytes)"
    return f"wp.array {warp_dtype_name(base.dtype)} {tuple(base.shape)} ({capacity} bytes)"


def _read_region(ptr: int, nbytes: int, device) -> bytes:
    """Bytes of a region, for constant snapshots and write detection (host copy on CUDA)."""
    if nbytes == 0:
        return b""
    if device.is_cpu:
        import ctypes  # noqa: PLC0415

        return ctypes.string_at(ptr, nbytes)
    view = wp.array(ptr=ptr, dtype=wp.uint8, shape=(nbytes,), device=device)
    return view.numpy().tobytes()
