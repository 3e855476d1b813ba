"""leapp/_recorder/memory.py: what a captured segment reads and writes, decided by address ranges.

APIC names a region after the Python object that carries the memory. Real
simulator code reaches one allocation through several objects: a view at an
offset (``wp.array(ptr=base.ptr + offset, strides=...)``, Isaac Lab's
observation-manager columns), a strided view, a wrapper, the persistent array
itself. This module groups the regions of one capture into *pieces*, one per
piece of memory:

- a region that lies inside a storage the node traced, inside an array an
  earlier segment created (chained), or inside a live Warp array or torch
  storage that owns it (found by one heap scan, only when some region is a
  view that owns no memory), takes that whole allocation as its range;
- regions whose ranges overlap are one piece;
- each piece keeps one region id (``rep``); the others are folded into it at
  their byte offset (``leapp/_apic/merge.py`` rewrites the ``.wrp``).

A piece is then classified once: traced, chained, created (memory allocated
inside the block) or external (anything else). docs/real-warp-code.md states
the rules.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any


from leapp import _warp_private as wpp
from leapp.errors import TraceError

__all__ = ["Piece", "plan_pieces"]


@dataclass
class Piece:
    """One piece of memory a segment addresses."""

    rep: int  # the region id kept for it in the .wrp
    ptr: int
    nbytes: int
    kind: str  # "traced", "chained", "created" or "external"
    base: Any  # the object that best describes it (a wp.array or a tensor), for specs and messages
    members: dict[int, int] = field(default_factory=dict)  # region id -> byte offset inside the piece
    resized: bool = False  # the rep region's own capacity differs from the piece's

    @property
    def end(self) -> int:
        return self.ptr + self.nbytes

    def contains(self, ptr: int) -> bool:
        return self.ptr <= ptr < self.end

    @property
    def merged(self) -> bool:
        """Whether the .wrp must be rewritten for it (regions folded, or its rep region resized)."""
        return len(self.members) > 1 or self.resized


@dataclass
class _Span:
    start: int
    end: int
    kind: str | None  # "traced" / "chained" when the range is a traced storage or a pending array
    base: Any


def _owns_memory(arr) -> bool:
    return (getattr(arr, "deleter", None) is not None or wpp.views_torch_storage(arr)
            or getattr(arr, "_ref", None) is not None)


def plan_pieces(regions: dict[int, tuple[int, int, Any]], transient: set[int], recorder, witness, live,
                where: str) -> list[Piece]:
    """Group the regions of one capture (id -> (base pointer, capacity, base object)) into pieces.

    ``recorder``: the node's GraphRecorder (traced storages, pending arrays); ``witness``: the block's
    AllocationWitness; ``live``: the segment's ``handles.LiveObjects`` (its heap scan finds the owner of a view
    made from a pointer); ``where``: names the segment in errors.
    """
    traced = recorder.traced_ranges()  # [(start, nbytes, tensor)]
    pending = [(ptr, p.nbytes, p.array) for ptr, p in recorder.pending.items()]
    known = sorted([(s, s + n, "traced", t) for s, n, t in traced] + [(s, s + n, "chained", a) for s, n, a in pending])
    starts = [k[0] for k in known]

    def span_of(region_id: int, ptr: int, capacity: int, base) -> _Span:
        i = bisect.bisect_right(starts, ptr) - 1
        if i >= 0 and known[i][0] <= ptr < known[i][1]:
            s, e, kind, obj = known[i]
            return _Span(s, e, kind, obj)
        if region_id not in transient and not _owns_memory(base):
            found = live.allocation_containing(ptr)
            if found is not None:
                return _Span(found[0], found[1], None, found[2])
        return _Span(ptr, ptr + capacity, None, base)

    spans = sorted(((span_of(rid, ptr, cap, base), rid) for rid, (ptr, cap, base) in regions.items()),
                   key=lambda x: (x[0].start, -x[0].end, x[1]))
    groups: list[list] = []  # [start, end, [(span, region id)]]
    for span, rid in spans:
        if groups and span.start < groups[-1][1]:
            groups[-1][1] = max(groups[-1][1], span.end)
            groups[-1][2].append((span, rid))
        else:
            groups.append([span.start, span.end, [(span, rid)]])

    pieces = []
    for start, end, items in groups:
        members = [rid for _, rid in items]
        owner = next((s for s, _ in items if s.kind), None)
        if owner is not None and ((owner.start, owner.end) != (start, end)
                                  or any(s.kind and s.base is not owner.base for s, _ in items)):
            what = "tensor storage the node traced" if owner.kind == "traced" else "array an earlier segment made"
            raise TraceError(
                f"{where}: Warp arrays at [{start:#x}, {end:#x}) overlap the {what} at [{owner.start:#x}, "
                f"{owner.end:#x}) only in part; pass views of that memory (wp.from_torch of a slice, a Warp slice "
                "of the array), not arrays reaching past it."
            )
        exact = [rid for rid in members if regions[rid][0] == start and regions[rid][1] == end - start]
        rep = exact[0] if exact else min(members)
        whole = next((s.base for s, _ in items if (s.start, s.end) == (start, end)), regions[rep][2])
        piece = Piece(rep, start, end - start, owner.kind if owner else "", owner.base if owner else whole,
                      {rid: regions[rid][0] - start for rid in members}, regions[rep][1] != end - start)
        if not piece.kind:
            created = all(rid in transient or (not wpp.views_torch_storage(regions[rid][2])
                                               and regions[rid][2].deleter is not None
                                               and witness.created_in_block(regions[rid][2])) for rid in members)
            piece.kind = "created" if created else "external"
        if piece.kind == "created" and (len(members) > 1 or piece.nbytes != regions[rep][1]):
            raise TraceError(
                f"{where}: several Warp arrays view one allocation made inside the segment at offsets "
                "(wp.array(ptr=...) over it); leapp cannot fold memory allocated inside a capture. Launch on the "
                "allocated array or its slices instead."
            )
        pieces.append(piece)
    return pieces
