"""leapp/_recorder/capture.py: turn one APIC-captured Warp segment into a SegmentRecord and its FX call.

Each memory region of the capture is classified once, right after
``capture_end``:

- traced: the storage of a tensor traced in this node -> a segment input, and
  an output (written back with ``aten.copy_``) if the segment writes it; a
  written storage that still holds an uninitialized factory's undefined bytes
  (``torch.empty`` and nothing wrote it since) is an output only (init
  "none"), and when that tensor is its storage's only live alias its FX value
  simply becomes the segment's output (no ``copy_``);
- chained: an array an earlier segment of the node created -> an input;
- created: allocated while the block was open -> scratch, or an output once
  something uses it after the block (``PendingOutput``);
- external: anything else -> a constant (bytes snapshotted before the launch)
  and a line in the session's constants report.

Writes are what ``outputs=`` of ``wp.launch`` names, what copies and fills
target, and any region whose bytes changed when the captured graph ran.
"""

from __future__ import annotations

import gc
import logging
import operator
import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any

import torch
import warp as wp

from leapp import _warp_private as wpp
from leapp._apic import wrp
from leapp._contract.records import KernelRef, SegmentIO, SegmentRecord, TensorSpec, warp_segment_call

from .dtypes import is_warp_array, spec_for_array, warp_dtype_name
from .fx_graph import UNINITIALIZED_FACTORIES, PendingOutput, storage_ptr
from .handles import LiveObjects, check_constant_handles, check_launch_handles

__all__ = ["AllocationWitness", "ClosedSegment", "CaptureAnalysis", "arg_ptr"]

_aten = torch.ops.aten
log = logging.getLogger(__name__)


class AllocationWitness:
    """Tells whether a Warp array was allocated while a block was open, without scanning the whole heap.

    Objects only move to older GC generations. Warp arrays in the young
    generations (0, 1) at entry are remembered; at exit an array that is young
    now and was not then is new. If a generation-1/2 collection ran meanwhile a
    new array may already be old: the answer is then "not new", which makes it
    a snapshotted constant (always correct, just larger) instead of scratch.

    NOTE: automatic collection is paused while the block is open (and resumed by
    ``close()``, also when the block raised), so the answer does not depend on
    when the interpreter happens to collect; only an explicit ``gc.collect()``
    in the user's block can still make a new array look old.
    """

    def __init__(self) -> None:
        self._young_at_entry = _young_warp_arrays()  # strong refs: their ids cannot be reused meanwhile
        self._old_collections = _old_collections()
        self._young_at_exit: dict[int, Any] | None = None
        self._collected_meanwhile = False
        self._resume_gc = gc.isenabled()
        gc.disable()

    def close(self) -> None:
        """Takes the exit snapshot and resumes automatic collection if it was on; idempotent."""
        if self._young_at_exit is None:
            self._young_at_exit = _young_warp_arrays()
            self._collected_meanwhile = _old_collections() != self._old_collections
        if self._resume_gc:
            self._resume_gc = False
            gc.enable()

    def allocates(self, ptr: int) -> bool:
        """While the block is open: does Warp memory allocated since entry start at ``ptr``?

        Only arrays that own their memory count (``wp.empty``, ``wp.zeros``, the
        gradient ``wp.from_torch`` allocates), not views of torch storages.
        """
        return any(
            id(arr) not in self._young_at_entry and arr.deleter is not None and arr.ptr == ptr
            and not wpp.views_torch_storage(arr)
            for arr in _young_warp_arrays().values()
        )

    def created_in_block(self, arr) -> bool:
        self.close()
        if id(arr) in self._young_at_entry or self._collected_meanwhile:
            return False
        return self._young_at_exit.get(id(arr)) is arr


def _young_warp_arrays() -> dict[int, Any]:
    try:
        return {id(o): o for g in (0, 1) for o in gc.get_objects(generation=g) if issubclass(type(o), wp.array)}
    except (TypeError, ValueError):  # an interpreter without these generations: everything counts as old
        return {}


def _old_collections() -> tuple[int, ...]:
    return tuple(stat.get("collections", 0) for stat in gc.get_stats()[1:])



def arg_ptr(arg) -> int:
    if is_warp_array(arg):
        return wpp.array_base(arg)[1] or 0
    if isinstance(arg, torch.Tensor):
        return storage_ptr(arg)
    return 0



@dataclass
class ClosedSegment:
    """What the capture pass knew about one segment when its block closed."""

    segment_id: str
    node: str
    index: int
    source: str
    device: str  # the device the capture ran on
    launches: list  # the block's launch records (kernel, args, n_inputs, caller), in order
    ops: list[str]  # what discovery ran
    call_sites: list[str]
    witness: AllocationWitness  # which Warp arrays were allocated while the block was open


class CaptureAnalysis:
    """Turn one APIC-captured segment into a SegmentRecord and its FX call.

    ``recorder`` is the node's graph recorder (traced storages, pending outputs,
    the FX graph); untraced constants are reported into ``constants_report``.
    """

    def __init__(self, block: ClosedSegment, graph, recorder, constants_report: list[str]) -> None:
        self.block = block
        self.graph = graph
        self.rec = recorder
        self.constants_report = constants_report
        self.device = wp.get_device(block.device)

    def build(self) -> SegmentRecord:
        block, rec = self.block, self.rec
        regions = wpp.apic_regions(self.graph)
        transient = wpp.apic_transient_regions(self.graph)
        kinds: dict[int, str] = {}  # classified first: the allocation witness wants as few allocations as possible
        for region_id, (ptr, _capacity, base) in sorted(regions.items()):
            native = not wpp.views_torch_storage(base)
            if ptr in rec.pending:
                kinds[region_id] = "chained"
            elif rec.live_storage(ptr):
                kinds[region_id] = "traced"
            elif region_id in transient or (native and block.witness.created_in_block(base)):
                kinds[region_id] = "created"
            else:
                kinds[region_id] = "external"
        live = LiveObjects()
        check_launch_handles(block.launches, self._where, live)
        wrp_bytes, modules = self._save(regions)
        ops = wrp.read_ops(wrp_bytes)
        written = {op.dst_region for op in ops if op.dst_region is not None and op.dst_region > 0}
        written_by_ops = set(written)
        declared_out = {arg_ptr(a) for launch in block.launches for a in launch.args[launch.n_inputs:]}
        arrays = self._launch_arrays()

        before = {}
        with rec.paused_recording():
            for region_id, kind in kinds.items():
                ptr, capacity, _ = regions[region_id]
                if kind in ("traced", "chained", "external"):
                    before[region_id] = _read_region(ptr, capacity, self.device)
            self._check_constants(kinds, regions, before, live)
            self._launch()
            for region_id, snapshot in before.items():
                ptr, capacity, _ = regions[region_id]
                if kinds[region_id] == "external":
                    continue
                after = _read_region(ptr, capacity, self.device)
                if after != snapshot:
                    written.add(region_id)
                    if ptr not in declared_out and region_id not in written_by_ops and log.isEnabledFor(logging.DEBUG):
                        log.debug("%s: region %d (%s, %#x, %d bytes) changed while the segment replayed, though no "
                                  "launch passes it as an output: %s", block.segment_id, region_id, kinds[region_id],
                                  ptr, capacity, _first_difference(snapshot, after))
        written |= {rid for rid, (ptr, _, _) in regions.items() if ptr in declared_out}
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s: regions %s; written %s (by ops %s)", block.segment_id,
                      {rid: (kinds[rid], hex(ptr), capacity) for rid, (ptr, capacity, _) in sorted(regions.items())},
                      sorted(written), sorted(written_by_ops))

        segment = SegmentRecord(
            id=block.segment_id,
            node=block.node,
            index=block.index,
            source=block.source,
            device=str(self.device),
            ops=list(block.ops),
            wrp=wrp_bytes,
            kernels=self._kernels(),
            inputs=[],
            outputs=[],
            constants={},
            scratch={},
            captured_ops=[f"launch:{op.kernel_key}" if op.kind == "launch" else op.kind for op in ops],
            call_sites=list(block.call_sites),
            modules=modules,
        )
        in_nodes, writes = [], []
        for region_id, kind in kinds.items():
            ptr, capacity, base = regions[region_id]
            if kind in ("traced", "chained"):
                undefined = kind == "traced" and region_id in written and rec.is_uninitialized(ptr)
                node, spec, tensor = self._region_value(kind, ptr, capacity, arrays.get(ptr))
                if not undefined:  # undefined bytes need no copy in: the output starts with init "none"
                    spec.name = f"in{len(segment.inputs)}"
                    segment.inputs.append(SegmentIO(spec, region_id, capacity))
                    in_nodes.append(node)
                if region_id in written:
                    rebind = rec.sole_binding(ptr, tensor) if undefined and tensor is not None else None
                    writes.append((region_id, capacity, spec, node, undefined, rebind))
                    rec.mark_written(ptr)
            elif kind == "external":
                segment.constants[region_id] = before[region_id]
                self.constants_report.append(
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
        for k, (region_id, capacity, spec, node, undefined, rebind) in enumerate(writes):
            out_spec = TensorSpec(f"out{k}", spec.dtype, spec.shape, spec.warp_dtype, spec.logical_shape)
            segment.outputs.append(SegmentIO(out_spec, region_id, capacity, undefined_before=undefined))
            if rec.build:
                value = rec.graph.call_function(operator.getitem, (call, k))
                if rebind is not None:  # no alias to update: the tensor's value is now the segment's output
                    rebind.node = value
                    if not node.users and node.target in UNINITIALIZED_FACTORIES:
                        rec.graph.erase_node(node)
                else:
                    rec.graph.call_function(_aten.copy_.default, (node, value))
        for region_id, kind in kinds.items():
            if kind == "created":
                ptr, capacity, base = regions[region_id]
                rec.pending[ptr] = PendingOutput(
                    segment, call, region_id, capacity, _created_spec(base, capacity), base, base.dtype
                )
        return segment

    # ---- steps ----

    def _where(self, launch) -> str:
        block = self.block
        return (f"wp.launch('{launch.kernel.key}') at {launch.caller} in segment {block.segment_id} "
                f"(opened at {block.source}) of node '{block.node}'")

    def _check_constants(self, kinds, regions, before, live: LiveObjects) -> None:
        """Refuse constant 64-bit integer arrays that hold live Mesh/BVH/HashGrid/Volume ids."""
        for launch in self.block.launches:
            labels = [a.label for a in wpp.kernel_args(launch.kernel)]
            for i, arg in enumerate(launch.args):
                if not is_warp_array(arg) or arg.dtype not in (wp.int64, wp.uint64):
                    continue
                base_ptr = wpp.array_base(arg)[1]
                for region_id, (ptr, _capacity, _base) in regions.items():
                    if ptr == base_ptr and kinds[region_id] == "external":
                        name = f"'{labels[i] if i < len(labels) else i}' ({_describe(_base, _capacity)})"
                        check_constant_handles(name, before[region_id], self._where(launch), live)

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
                    arrays.setdefault(wpp.array_base(a)[1], a)
        return arrays

    def _region_value(self, kind: str, ptr: int, capacity: int, array) -> tuple[Any, TensorSpec, Any]:
        """(FX value, spec, the traced tensor covering the region or None) of a traced or chained region."""
        if kind == "chained":
            pending = self.rec.pending[ptr]
            node = pending.materialize(self.rec.graph)
            s = pending.spec
            return node, TensorSpec("", s.dtype, s.shape, s.warp_dtype, s.logical_shape), None
        node, spec, tensor = self.rec.storage_value(ptr, capacity)
        if array is not None and _array_covers(array, ptr, capacity):
            full = spec_for_array("", array)
            if full.dtype.itemsize * _numel(full.shape) == capacity:
                spec.warp_dtype, spec.logical_shape = full.warp_dtype, full.logical_shape
        return node, spec, tensor

    def _kernels(self) -> list[KernelRef]:
        by_key = {}
        for launch in self.block.launches:
            by_key.setdefault(launch.kernel.key, launch)
        refs = []
        for key, block_dim in wpp.apic_kernels(self.graph):
            launch = by_key.get(key)
            if launch is not None:
                refs.append(KernelRef(launch.kernel, block_dim, key))
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
    if wpp.views_torch_storage(base):
        return f"torch storage ({capacity} bytes)"
    return f"wp.array {warp_dtype_name(base.dtype)} {tuple(base.shape)} ({capacity} bytes)"


def _first_difference(before: bytes, after: bytes) -> str:
    """Where two snapshots of a region first differ, for the write check's DEBUG line (a kernel writing through
    an input argument is legal Warp; a change nothing wrote points at a read that raced its producer)."""
    at = next((i for i, (a, b) in enumerate(zip(before, after)) if a != b), min(len(before), len(after)))
    return (f"first at byte {at} of {len(before)}: {before[at:at + 8].hex() or '-'} before, "
            f"{after[at:at + 8].hex() or '-'} after; {sum(a != b for a, b in zip(before, after))} byte(s) differ")


def _read_region(ptr: int, nbytes: int, device) -> bytes:
    """Bytes of a region, for constant snapshots and write detection (on CUDA, in torch's stream order)."""
    if nbytes == 0:
        return b""
    if device.is_cpu:
        import ctypes  # noqa: PLC0415

        return ctypes.string_at(ptr, nbytes)
    # Read on torch's current stream, where the user's torch work made these values and where the
    # segment replays (_launch): on Warp's own stream the copy could overtake a producer still
    # queued on a side stream, and a write would be seen where there was none.
    view = wp.array(ptr=ptr, dtype=wp.uint8, shape=(nbytes,), device=device)
    with wp.ScopedStream(wp.stream_from_torch(torch.cuda.current_stream(torch.device(str(device))))):
        return view.numpy().tobytes()
