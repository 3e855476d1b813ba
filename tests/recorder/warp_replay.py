"""Run a recorded node graph, with segments replayed from their ``.wrp`` bytes by Warp itself.

This is how the recorder's tests check a recording without the exporter:
``warp_segment_call`` nodes are executed by loading the
segment's ``.wrp`` with ``wp.capture_load_from_bytes``, binding the inputs
(``set_param``), launching, and reading the outputs back (``get_param``).
Every region is bound in the ``.wrp`` under the name ``r<region_id>``.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.fx
import warp as wp

from leapp._contract.records import NodeRecord, SegmentRecord, warp_segment_call

__all__ = ["run_node_graph", "WarpReplayer", "region_name"]


def region_name(region_id: int) -> str:
    """The binding name of a region in the recorder's ``.wrp`` files."""
    return f"r{region_id}"


def _as_bytes_array(t: torch.Tensor):
    flat = t.detach().contiguous().reshape(-1).view(torch.uint8)
    return flat, wp.from_torch(flat, dtype=wp.uint8)


class WarpReplayer:
    """Replays segments with Warp itself (one loaded graph per segment, cached)."""

    def __init__(self, segments: Sequence[SegmentRecord]) -> None:
        self._segments = {s.id: s for s in segments}
        self._graphs: dict[str, object] = {}

    def __call__(self, segment_id: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        segment = self._segments[segment_id]
        graph = self._graphs.get(segment_id)
        if graph is None:
            graph = self._graphs[segment_id] = wp.capture_load_from_bytes(
                segment.wrp, segment.modules, device=segment.device
            )
        keep = []
        for io, value in zip(segment.inputs, inputs):
            flat, arr = _as_bytes_array(value.to(segment.device))
            if arr.capacity != io.nbytes:
                raise ValueError(
                    f"{segment_id}: input {io.spec.name} has {arr.capacity} bytes, the region has {io.nbytes}"
                )
            keep.append(flat)
            graph.set_param(region_name(io.region_id), arr)
        wp.capture_launch(graph)
        outputs = []
        for io in segment.outputs:
            out = torch.empty(io.nbytes, dtype=torch.uint8, device=segment.device)
            graph.get_param(region_name(io.region_id), wp.from_torch(out, dtype=wp.uint8))
            outputs.append(out.view(io.spec.dtype).reshape(io.spec.shape))
        return outputs


class _SegmentInterpreter(torch.fx.Interpreter):
    def __init__(self, module: torch.fx.GraphModule, segment_fn: Callable) -> None:
        super().__init__(module)
        self._segment_fn = segment_fn

    def call_function(self, target, args, kwargs):
        if target is warp_segment_call:
            return self._segment_fn(*args, **kwargs)
        return super().call_function(target, args, kwargs)


def run_node_graph(
    record: NodeRecord, inputs: Sequence[torch.Tensor], segment_fn: Callable | None = None
) -> list[torch.Tensor]:
    """Run ``record.graph`` on ``inputs`` (cloned first: the graph may write into them)."""
    fn = segment_fn or WarpReplayer(record.segments)
    args = [t.clone() for t in inputs]
    return list(_SegmentInterpreter(record.graph, fn).run(*args))
