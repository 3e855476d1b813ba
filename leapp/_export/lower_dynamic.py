"""A dynamic-batch segment lowered: the IR at the traced batch, with its sizes as expressions of the batch.

The segment is lowered once per capture (the traced batch and each probe,
docs/recorder.md section 1.0). The graphs must have the same structure: the
same ops on the same values; only integers may differ, and each one must be
affine in the batch (``fit_affine``, as the replayed bundle's rules). Those
become ``Affine`` attributes that ``LoweredCall`` evaluates at the batch of its
input, a SymInt while torch.export or torch.onnx traces it, so the lowered
graph keeps the same symbolic batch as the rest of the node.
"""

from __future__ import annotations

from dataclasses import replace

from leapp._export.dynamic_batch import fit_affine
from leapp._export.lower_segment import LoweredSegment, SegmentRefused, lower_segment
from leapp.lowering.ir import Affine, Graph, Op

__all__ = ["lower_dynamic_segment"]


class _Mismatch(Exception):
    pass


def _merge(values: list, batches: list[int], what: str):
    """One value of the traced graph from its value in every graph: equal, or an Affine of the batch."""
    first = values[0]
    if all(v == first for v in values[1:]):
        return first
    if isinstance(first, tuple):
        if any(not isinstance(v, tuple) or len(v) != len(first) for v in values):
            raise _Mismatch(f"{what} has a different length at another batch")
        return tuple(_merge([v[i] for v in values], batches, f"{what}[{i}]") for i in range(len(first)))
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        fit = fit_affine(batches, values)
        if fit is None:
            raise _Mismatch(f"{what} is {values} at batches {batches}, not affine in the batch")
        return Affine(*fit)
    raise _Mismatch(f"{what} is {values} at batches {batches}")


def _merge_graphs(graphs: list[Graph], batches: list[int]) -> Graph:
    base = graphs[0]
    out = Graph(base.name, counter=base.counter)
    for g in graphs[1:]:
        if set(g.regions) != set(base.regions) or len(g.ops) != len(base.ops):
            raise _Mismatch("the segment's memory or operations change with the batch")
    for rid, region in base.regions.items():
        others = [g.regions[rid] for g in graphs]
        if any((r.scalar, r.source, r.index) != (region.scalar, region.source, region.index) for r in others):
            raise _Mismatch(f"region {rid} changes role with the batch")
        if region.source == "constant" and any(r.data != region.data for r in others):
            raise _Mismatch(f"constant region {rid} ({region.lanes} lanes at the traced batch) holds other bytes at "
                            "another batch (per-batch data the segment only reads)")
        lanes = _merge([r.lanes for r in others], batches, f"region {rid}'s size")
        out.regions[rid] = replace(region, lanes=lanes)
    for k, op in enumerate(base.ops):
        ops = [g.ops[k] for g in graphs]
        if any((o.primitive, o.inputs, o.output) != (op.primitive, op.inputs, op.output) for o in ops):
            raise _Mismatch(f"operation {k} ({op.primitive}) differs at another batch")
        attrs = []
        for j, (name, value) in enumerate(op.attrs):
            values = [o.attrs[j][1] for o in ops]
            attrs.append((name, _merge(values, batches, f"{op.primitive}.{name} of operation {k}")))
        out.ops.append(Op(op.primitive, op.inputs, op.output, tuple(attrs)))
    out.current = dict(base.current)
    if any(g.current != base.current for g in graphs[1:]):
        raise _Mismatch("the segment's last memory versions differ at another batch")
    return out


def lower_dynamic_segment(seg, probes, traced_batch: int) -> tuple[LoweredSegment, int]:
    """``seg`` lowered with batch-affine sizes, and the index of the input whose dim 0 is the batch.

    Args:
        seg: the capture pass's SegmentRecord.
        probes: ``(batch, SegmentRecord)`` of the same segment at other batch sizes.
        traced_batch: the capture's batch.

    Raises:
        SegmentRefused: a capture does not lower, or the graphs differ in more than batch-affine integers.
    """
    where = f"segment '{seg.id}' ({seg.source})"
    if not probes:
        raise SegmentRefused(where, ["dynamic_batch needs a capture at a second batch size"])
    lowered = [lower_segment(seg, fold=False)] + [lower_segment(s, fold=False) for _, s in probes]
    batches = [traced_batch] + [int(b) for b, _ in probes]
    try:
        graph = _merge_graphs([low.graph for low in lowered], batches)
        outputs = []
        for k, (rid, shape, dtype) in enumerate(lowered[0].outputs):
            shapes = [low.outputs[k][1] for low in lowered]
            outputs.append((rid, _merge(shapes, batches, f"output {k}'s shape"), dtype))
    except _Mismatch as e:
        raise SegmentRefused(where, [f"with dynamic_batch: {e}"]) from None
    batch_input = next((j for j, io in enumerate(seg.inputs)
                        if io.spec.shape and int(io.spec.shape[0]) == traced_batch
                        and all(int(s.inputs[j].spec.shape[0]) == b for b, s in probes)), None)
    if batch_input is None:
        raise SegmentRefused(where, ["with dynamic_batch: no input of the segment has the batch as dim 0"])
    graph.simplify()
    return LoweredSegment(seg.id, lowered[0].kernels, graph, outputs), batch_input
