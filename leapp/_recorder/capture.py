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

import numpy as np
import torch
import warp as wp

from leapp import _warp_private as wpp
from leapp._apic import wrp
from leapp._apic.merge import merge_regions
from leapp._contract.records import KernelRef, SegmentIO, SegmentRecord, TensorSpec, warp_segment_call
from leapp.errors import TraceError

from .dtypes import is_warp_array, spec_for_array, warp_dtype_name
from .fx_graph import UNINITIALIZED_FACTORIES, PendingOutput, storage_ptr
from .handles import LiveObjects, check_constant_handles, check_launch_handles
from .memory import Piece, plan_pieces

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
        where = f"segment {block.segment_id} (opened at {block.source}) of node '{block.node}'"
        regions = wpp.apic_regions(self.graph)
        transient = set(wpp.apic_transient_regions(self.graph))
        # classified first: the allocation witness wants as few allocations as possible
        live = LiveObjects()  # one heap scan, on first use, for views' owners and baked handles alike
        pieces = {p.rep: p for p in sorted(plan_pieces(regions, transient, rec, block.witness, live, where),
                                           key=lambda p: p.rep)}
        kinds = {rid: p.kind for rid, p in pieces.items()}
        check_launch_handles(block.launches, self._where, live)
        for piece in pieces.values():  # views reaching past the allocation they view: snapshot what exists
            for rid in piece.members:
                ptr, capacity, _ = regions[rid]
                if ptr + capacity > piece.end:
                    wpp.clamp_apic_region(self.graph, rid, piece.end - ptr)
                    piece.resized |= rid == piece.rep
        wrp_bytes, modules = self._save(regions)

        before = {}
        with rec.paused_recording():
            for rid, piece in pieces.items():
                if piece.kind != "created":
                    before[rid] = _read_region(piece.ptr, piece.nbytes, self.device)
        wrp_bytes = self._merge(wrp_bytes, pieces, before)
        ops = wrp.read_ops(wrp_bytes)
        self._check_observed(ops)
        written = {op.dst_region for op in ops if op.dst_region is not None and op.dst_region > 0}
        written_by_ops = set(written)
        declared_out = {rid for launch in block.launches for i, a in enumerate(launch.args)
                        if (i >= launch.n_inputs or i in wpp.written_args(launch.kernel, launch.block_dim or 1))
                        and (rid := self._piece_of(pieces, _arg_address(a))) is not None}
        arrays = self._launch_arrays()

        with rec.paused_recording():
            self._check_constants(pieces, before, live)
            self._launch()
            # memory allocated in the block is not read: on CUDA a graph may free it before the graph ends
            after = {rid: _read_region(pieces[rid].ptr, pieces[rid].nbytes, self.device) for rid in before}
            for rid, snapshot in before.items():
                if after[rid] != snapshot:
                    written.add(rid)
                    if (rid not in declared_out and rid not in written_by_ops and kinds[rid] != "external"
                            and log.isEnabledFor(logging.DEBUG)):
                        log.debug("%s: region %d (%s, %#x, %d bytes) changed while the segment replayed, though no "
                                  "launch passes it as an output: %s", block.segment_id, rid, kinds[rid],
                                  pieces[rid].ptr, pieces[rid].nbytes, _first_difference(snapshot, after[rid]))
            written |= declared_out
            state = [rid for rid in written if kinds[rid] == "external"]
            if state:
                kinds.update(self._classify_state(pieces, state, before, after))
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s: regions %s; written %s (by ops %s)", block.segment_id,
                      {rid: (kinds[rid], hex(p.ptr), p.nbytes, sorted(p.members)) for rid, p in sorted(pieces.items())},
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
            piece = pieces[region_id]
            ptr, capacity, base = piece.ptr, piece.nbytes, piece.base
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
            elif kind == "external" or kind == "seeded":
                segment.constants[region_id] = before[region_id]
                self.constants_report.append(
                    f"{segment.id} ({segment.source}): untraced {_describe(base, capacity)} (region {region_id}) "
                    + ("snapshotted as a constant" if kind == "external" else
                       "written by the segment; the bytes it never writes keep their trace values")
                )
                if kind == "seeded":
                    segment.scratch[region_id] = capacity
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
            if kind in ("created", "made", "seeded"):
                piece = pieces[region_id]
                spec = _created_spec(piece.base, piece.nbytes)
                warp_dtype = piece.base.dtype if spec.warp_dtype is not None else wp.dtype_from_torch(spec.dtype)
                rec.pending[piece.ptr] = PendingOutput(segment, call, region_id, piece.nbytes, spec, piece.base,
                                                       warp_dtype)
        return segment

    # ---- steps ----

    def _where(self, launch) -> str:
        block = self.block
        return (f"wp.launch('{launch.kernel.key}') at {launch.caller} in segment {block.segment_id} "
                f"(opened at {block.source}) of node '{block.node}'")

    def _check_constants(self, pieces: dict[int, Piece], before, live: LiveObjects) -> None:
        """Refuse constant 64-bit integer arrays that hold live Mesh/BVH/HashGrid/Volume ids."""
        for launch in self.block.launches:
            labels = [a.label for a in wpp.kernel_args(launch.kernel)]
            for i, arg in enumerate(launch.args):
                if not is_warp_array(arg) or arg.dtype not in (wp.int64, wp.uint64):
                    continue
                rid = self._piece_of(pieces, _arg_address(arg))
                if rid is not None and pieces[rid].kind == "external":
                    piece = pieces[rid]
                    name = f"'{labels[i] if i < len(labels) else i}' ({_describe(piece.base, piece.nbytes)})"
                    check_constant_handles(name, before[rid], self._where(launch), live)

    def _check_observed(self, ops) -> None:
        """Refuse launches the capture recorded but leapp's launch observer did not see.

        ``wp.launch(..., record_cmd=True)`` returns a ``wp.Launch`` without launching, and its ``launch()``
        bypasses the tape that observes ``wp.launch``: discovery and the later passes cannot check such a
        launch, and the exporter does not know its kernel object.
        """
        seen: dict[str, int] = {}
        for launch in self.block.launches:
            seen[launch.kernel.key] = seen.get(launch.kernel.key, 0) + 1
        for op in ops:
            if op.kind != "launch":
                continue
            if seen.get(op.kernel_key, 0) == 0:
                block = self.block
                raise TraceError(
                    f"segment {block.segment_id} (opened at {block.source}) of node '{block.node}' launched kernel "
                    f"'{op.kernel_key}' through a recorded launch (wp.launch(..., record_cmd=True) and then "
                    "Launch.launch(), as launch caches do), which leapp does not observe. Call wp.launch directly "
                    "inside annotate.warp_op() (Isaac Lab's _WarpLaunchCache does when the device is capturing)."
                )
            seen[op.kernel_key] -= 1

    @staticmethod
    def _piece_of(pieces: dict[int, Piece], address: int) -> int | None:
        return next((rid for rid, p in pieces.items() if address and p.contains(address)), None)

    def _merge(self, wrp_bytes: bytes, pieces: dict[int, Piece], before: dict[int, bytes]) -> bytes:
        """The .wrp with every piece of memory as one region (leapp/_apic/merge.py)."""
        merges = {rid: (p.rep, offset) for p in pieces.values() for rid, offset in p.members.items()
                  if rid != p.rep or offset}
        sizes = {p.rep: p.nbytes for p in pieces.values() if p.resized}
        if not merges and not sizes:
            return wrp_bytes
        try:
            return merge_regions(wrp_bytes, merges, sizes, {rid: before.get(rid) for rid in sizes})
        except wrp.WrpError as e:
            block = self.block
            raise TraceError(f"segment {block.segment_id} (opened at {block.source}) of node '{block.node}': Warp "
                             f"arrays view one allocation at several offsets, and {e}") from e

    def _classify_state(self, pieces: dict[int, Piece], state: list[int], before, after) -> dict[int, str]:
        """Untraced memory the segment writes: "made" by it, "seeded" (bytes it never writes keep their trace
        values), or refused.

        Such memory (a persistent Warp array, a buffer allocated outside the node) is exported as the segment's
        own: that is right when the segment's results do not depend on what the bytes it writes held before.
        Per piece, the segment is replayed twice with the piece filled with noise: bytes that still hold the
        noise afterwards are bytes the segment never writes (MuJoCo Warp's world-body row); they keep their
        trace values, like any constant. Then it is replayed once more with those bytes as traced and noise in
        all the others: if anything in any piece comes out different, the segment reads bytes before it writes
        them (``out[i] += x[i]``), and the trace is refused naming every such piece. The user's values are
        restored by a last replay on the original bytes.
        """
        rng = np.random.default_rng(0x1EA99)
        found, refused = {}, []
        try:
            for rid in state:
                piece = pieces[rid]
                size = _element_size(piece.base, piece.nbytes)
                noise = [_noise(piece.base, before[rid], k, rng) for k in range(3)]
                kept = np.ones(piece.nbytes // size, dtype=bool)  # per element: floats share bytes by chance
                for pattern in noise[:2]:
                    result = self._replay_with(pieces, before, rid, pattern.tobytes())
                    same = np.frombuffer(result[rid], dtype=np.uint8) == pattern
                    kept &= same.reshape(-1, size).all(axis=1)
                kept = np.repeat(kept, size)
                seeded = np.where(kept, np.frombuffer(before[rid], dtype=np.uint8), noise[2])
                result = self._replay_with(pieces, before, rid, seeded.tobytes())
                if any(result[other] != after[other] for other in result):
                    refused.append(rid)
                else:
                    found[rid] = "seeded" if kept.any() else "made"
        finally:
            self._restore(pieces, before)
            self._launch()
        if refused:
            raise self._state_refusal(pieces, refused)
        return found

    def _replay_with(self, pieces: dict[int, Piece], before, rid: int, data: bytes) -> dict[int, bytes]:
        """Every piece's bytes after one replay from the traced bytes, with piece ``rid`` holding ``data``."""
        self._restore(pieces, before)
        _write_region(pieces[rid].ptr, data, self.device)
        self._launch()
        return {other: _read_region(pieces[other].ptr, pieces[other].nbytes, self.device) for other in before}

    def _restore(self, pieces: dict[int, Piece], before) -> None:
        for rid, snapshot in before.items():
            _write_region(pieces[rid].ptr, snapshot, self.device)

    def _state_refusal(self, pieces: dict[int, Piece], refused: list[int]) -> TraceError:
        block = self.block
        where = []
        for rid in refused:
            piece, site = pieces[rid], None
            for launch in block.launches:
                labels = [a.label for a in wpp.kernel_args(launch.kernel)]
                for i, arg in enumerate(launch.args):
                    if piece.contains(_arg_address(arg)) and (site is None or i >= launch.n_inputs):
                        site = (launch, labels[i] if i < len(labels) else f"#{i}")
            what = _describe(piece.base, piece.nbytes)
            where.append(f"wp.launch('{site[0].kernel.key}') at {site[0].caller}, argument '{site[1]}' ({what})"
                         if site else f"{what} (written by a Warp operation of the segment)")
        return TraceError(
            f"segment {block.segment_id} (opened at {block.source}) of node '{block.node}' writes memory the node "
            "did not trace (allocated outside it: persistent simulator state, a buffer made once), and its results "
            "depend on what that memory held before it ran (it reads bytes before writing them): "
            + "; ".join(where) + ". An export would bake this trace's bytes. Make that state a node input "
            "(wp.from_torch of a tensor passed into the node, or copy the input into it with torch inside the "
            "node), or write it in the segment before reading it."
        )

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
    """The spec a piece of memory made in a segment has as an output: its array's, when that covers it."""
    if is_warp_array(base) and base.is_contiguous and base.capacity == capacity:
        try:
            spec = spec_for_array("", base)
        except Exception:  # noqa: BLE001 - e.g. @wp.struct: refused only if it crosses the boundary
            return TensorSpec("", torch.uint8, (capacity,), warp_dtype_name(base.dtype), tuple(base.shape))
        if spec.dtype.itemsize * _numel(spec.shape) == capacity:
            return spec
    if isinstance(base, torch.Tensor) and base.is_contiguous() and base.numel() * base.element_size() == capacity:
        return TensorSpec("", base.dtype, tuple(base.shape))
    return TensorSpec("", torch.uint8, (capacity,))


def _arg_address(arg) -> int:
    """The first byte a launch argument addresses (0 for scalars and empty arrays)."""
    if is_warp_array(arg):
        return arg.ptr or 0
    if isinstance(arg, torch.Tensor):
        return arg.data_ptr()
    return 0


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


_FLOATS = {wp.float16: np.float16, wp.float32: np.float32, wp.float64: np.float64,
           torch.float16: np.float16, torch.float32: np.float32, torch.float64: np.float64}


def _element_size(base, nbytes: int) -> int:
    """Bytes of one scalar of the memory's dtype (1 when unknown or when it does not divide the piece)."""
    dtype = getattr(base, "dtype", None)
    if is_warp_array(base):
        size = wp.types.type_size_in_bytes(getattr(dtype, "_wp_scalar_type_", dtype))
    else:
        size = getattr(base, "itemsize", 1)
    size = int(size) if isinstance(size, int) and size > 0 else 1
    return size if nbytes % size == 0 else 1


def _noise(base, before: bytes, k: int, rng) -> np.ndarray:
    """Bytes that differ from ``before`` in every element, and that a kernel reading them cannot misuse.

    Floating-point memory gets values in [-1, 1] (no NaN, no huge magnitudes); anything else (indices,
    counts, flags, structs) gets one low bit of each element's first byte flipped, so an index read by
    mistake moves by one instead of anywhere in the address space.
    """
    raw = np.frombuffer(before, dtype=np.uint8).copy()
    dtype = getattr(base, "dtype", None)
    scalar = _FLOATS.get(getattr(dtype, "_wp_scalar_type_", dtype))
    if scalar is not None:
        size = np.dtype(scalar).itemsize
        count = len(raw) // size
        values = rng.uniform(-1.0, 1.0, count).astype(scalar)
        raw[: count * size] = np.frombuffer(values.tobytes(), dtype=np.uint8)
        raw[count * size:] ^= 1 << k
        return raw
    raw[::_element_size(base, len(raw))] ^= 1 << k
    return raw


def _write_region(ptr: int, data: bytes, device) -> None:
    """Write bytes into a region (the write-only check's noise and restores), in torch's stream order on CUDA."""
    if not data:
        return
    if device.is_cpu:
        import ctypes

        ctypes.memmove(ptr, data, len(data))
        return
    view = wp.array(ptr=ptr, dtype=wp.uint8, shape=(len(data),), device=device)
    src = wp.array(np.frombuffer(data, dtype=np.uint8), dtype=wp.uint8, device="cpu")
    stream = wp.stream_from_torch(torch.cuda.current_stream(torch.device(str(device))))
    wp.copy(view, src, stream=stream)
    wp.synchronize_stream(stream)


def _read_region(ptr: int, nbytes: int, device) -> bytes:
    """Bytes of a region, for constant snapshots and write detection (on CUDA, in torch's stream order)."""
    if nbytes == 0:
        return b""
    if device.is_cpu:
        import ctypes

        return ctypes.string_at(ptr, nbytes)
    # Read on torch's current stream, where the user's torch work made these values and where the
    # segment replays (_launch): on Warp's own stream the copy could overtake a producer still
    # queued on a side stream, and a write would be seen where there was none.
    view = wp.array(ptr=ptr, dtype=wp.uint8, shape=(nbytes,), device=device)
    with wp.ScopedStream(wp.stream_from_torch(torch.cuda.current_stream(torch.device(str(device))))):
        return view.numpy().tobytes()
