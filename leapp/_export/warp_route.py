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

__all__ = ["LOWERED", "WARP_ROUTES", "lower_for_export", "plan_routes"]

WARP_ROUTES = ("replay", "lower", "auto")
LOWERED = "lowered"


def lower_for_export(record: NodeRecord, seg):
    """(LoweredSegment, index of the input that carries the batch or None) of a segment of ``record``.

    Raises:
        SegmentRefused: naming why it does not lower.
    """
    if record.dynamic_batch is None:
        lowered = lower_segment(seg)
        lowered.graph.simplify()
        return lowered, None
    from leapp._export.lower_dynamic import lower_dynamic_segment

    probes = [(p.batch, p.segments[seg.index]) for p in record.probes if seg.index < len(p.segments)]
    return lower_dynamic_segment(seg, probes, int(record.inputs[0].shape[0]))


def plan_routes(record: SessionRecord, warp: str) -> tuple[dict[str, dict[str, str]], dict[str, dict]]:
    """(routes, lowerings): node -> segment id -> "lowered" or "replayed: <why>" (empty for warp="replay"), and
    node -> segment id -> ``lower_for_export``'s result for each lowered segment, which the export reuses;
    raises ExportError for "lower" naming each refusal."""
    if warp not in WARP_ROUTES:
        raise ExportError(f"session '{record.name}': warp={warp!r}; choose one of {list(WARP_ROUTES)}")
    routes: dict[str, dict[str, str]] = {node: {} for node in record.nodes}
    lowerings: dict[str, dict] = {node: {} for node in record.nodes}
    if warp == "replay":  # nothing chosen: the export writes no route, exactly as before warp= existed
        return routes, lowerings
    refused = []
    for node in record.nodes.values():
        for seg in node.segments:
            try:
                lowerings[node.name][seg.id] = lower_for_export(node, seg)
                routes[node.name][seg.id] = LOWERED
            except SegmentRefused as e:
                why = "; ".join(e.reasons)
                routes[node.name][seg.id] = f"replayed: {why}"
                if warp == "lower":
                    refused.append(f"node '{node.name}' segment '{seg.id}' ({seg.source}): {why}")
    if refused:
        raise ExportError(f"session '{record.name}': warp='lower' but {len(refused)} Warp segment(s) cannot be "
                          "lowered to standard ops:\n  " + "\n  ".join(refused))
    return routes, lowerings
