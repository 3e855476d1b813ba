"""Which route each Warp segment takes (``compile(warp="replay" | "lower" | "auto")``, docs/lowering.md).

"replay" (the default) leaves every export as it was. "lower" and "auto" try
each segment of an ONNX node through ``lower_segment``; a lowered segment's
``leapp.warp`` node and bundle initializer are replaced by standard ops in the
written model. "lower" refuses, before anything is written, every segment that
cannot lower (PT2 nodes: lowering to ATen is not implemented yet).
"""

from __future__ import annotations

import json
from pathlib import Path

from leapp._contract.records import NodeRecord, SessionRecord
from leapp._export.lower_segment import SegmentRefused, lower_segment
from leapp.errors import ExportError

__all__ = ["LOWERED", "WARP_ROUTES", "plan_routes", "lower_onnx_file"]

WARP_ROUTES = ("replay", "lower", "auto")
LOWERED = "lowered"
_PT2 = "lowering to ATen (PT2 nodes) is not implemented yet"


def _batch(record: NodeRecord) -> int:
    return int(record.inputs[0].shape[0]) if record.inputs and record.inputs[0].shape else -1


def _why(record: NodeRecord, seg) -> str | None:
    """None when the segment lowers, else why not."""
    if record.export_with != "onnx":
        return _PT2
    names = [f"i{i}" for i in range(len(seg.inputs))]
    outs = [f"o{i}" for i in range(len(seg.outputs))]
    try:
        lower_segment(seg, names, outs, _batch(record), "check_")
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


def lower_onnx_file(record: NodeRecord, path: Path, routes: dict[str, str]) -> None:
    """Rewrites the ONNX model at ``path``: each lowered segment's WarpSegment node becomes standard ops."""
    import onnx

    from leapp._export.onnx_export import DOMAIN, OP_TYPE

    lowered = {sid for sid, route in routes.items() if route == LOWERED}
    if not lowered:
        return
    model = onnx.load(str(path))
    by_id = {seg.id: seg for seg in record.segments}
    graph = model.graph
    nodes: list = []
    dropped: set[str] = set()
    for node in graph.node:
        if node.domain != DOMAIN or node.op_type != OP_TYPE:
            nodes.append(node)
            continue
        signature = next(json.loads(a.s.decode()) for a in node.attribute if a.name == "signature")
        seg = by_id[signature["segment"]]
        if seg.id not in lowered:
            nodes.append(node)
            continue
        low = lower_segment(seg, list(node.input[:-1]), list(node.output), _batch(record), f"lw{seg.index}_")
        nodes.extend(low.nodes)
        graph.initializer.extend(low.initializers)
        dropped.add(node.input[-1])
    del graph.node[:]
    graph.node.extend(nodes)
    still = {name for n in graph.node for name in n.input}
    keep = [t for t in graph.initializer if t.name not in dropped or t.name in still]
    del graph.initializer[:]
    graph.initializer.extend(keep)
    if not any(n.domain == DOMAIN for n in graph.node):
        opsets = [o for o in model.opset_import if o.domain != DOMAIN]
        del model.opset_import[:]
        model.opset_import.extend(opsets)
    onnx.save(model, str(path))
    try:
        onnx.checker.check_model(str(path), full_check=not any(n.domain == DOMAIN for n in graph.node))
    except Exception as e:
        raise ExportError(f"node '{record.name}': onnx.checker rejected the lowered model {path}: {e}") from e
