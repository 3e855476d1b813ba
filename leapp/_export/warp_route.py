"""Which route each Warp segment takes (``compile(warp="replay" | "lower" | "auto")``, docs/lowering.md).

"replay" (the default) leaves every export as it was. "lower" and "auto" try
each segment through ``lower_segment``; a lowered segment is written into the
node's graph as torch ops (``build_exportable``), so the PT2 holds ATen ops and
the ONNX model standard ops in its place. "lower" refuses, before anything is
written, every segment that cannot lower.
"""

from __future__ import annotations

from leapp._contract.records import NodeRecord, SessionRecord
from leapp._export.lower_segment import SegmentRefused, lower_segment
from leapp.errors import ExportError

__all__ = ["LOWERED", "WARP_ROUTES", "plan_routes"]

WARP_ROUTES = ("replay", "lower", "auto")
LOWERED = "lowered"


def _why(record: NodeRecord, seg) -> str | None:
    """None when the segment lowers, else why not."""
    if record.dynamic_batch is not None:
        return "lowering keeps the traced batch (dynamic_batch nodes are not lowered yet)"
    try:
        lower_segment(seg)
    except SegmentRefused as e:
        return "; ".join(e.reasons)
    return None


def plan_routes(record: SessionRecord, warp: str) -> dict[str, dict[str, str]]:
    """node -> segment id -> "lowered" or "replayed: <why>" (empty for warp="replay"); raises ExportError for "lower"
    naming each refusal."""
    if warp not in WARP_ROUTES:
        raise ExportError(f"session '{record.name}': warp={warp!r}; choose one of {list(WARP_ROUTES)}")
    routes: dict[str, dict[str, str]] = {node: {} for node in record.nodes}
    if warp == "replay":  # nothing chosen: the export writes no route, exactly as before warp= existed
        return routes
    refused = []
    for node in record.nodes.values():
        for seg in node.segments:
            why = _why(node, seg)
            routes[node.name][seg.id] = LOWERED if why is None else f"replayed: {why}"
            if why is not None and warp == "lower":
                refused.append(f"node '{node.name}' segment '{seg.id}' ({seg.source}): {why}")
    if refused:
        raise ExportError(f"session '{record.name}': warp='lower' but {len(refused)} Warp segment(s) cannot be "
                          "lowered to standard ops:\n  " + "\n  ".join(refused))
    return routes
