"""Helpers for the recorder tests: run a traced function for N passes, check the FX graph against eager."""

from __future__ import annotations

import torch
from warp_replay import run_node_graph

import leapp
from leapp._contract.records import SessionRecord


def trace(fn, *args, passes: int = 2, name: str = "t") -> tuple[SessionRecord, list]:
    """Run ``fn(*args)`` ``passes`` times in a session; returns the record and each pass's result."""
    results = []
    with leapp.trace(name) as session:
        for _ in range(passes):
            results.append(fn(*args))
    return session.record, results


def assert_graphs_replay_samples(record: SessionRecord, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    """Every node's FX graph, with segments replayed from their .wrp bytes, reproduces every sample."""
    for node in record.nodes.values():
        assert node.samples, node.name
        for sample in node.samples:
            got = run_node_graph(node, sample.inputs)
            assert len(got) == len(sample.outputs), node.name
            for g, e in zip(got, sample.outputs):
                assert g.dtype == e.dtype and g.shape == e.shape, (node.name, g.dtype, e.dtype, g.shape, e.shape)
                if e.dtype.is_floating_point:
                    torch.testing.assert_close(g, e, rtol=rtol, atol=atol)
                else:
                    assert torch.equal(g, e), node.name


def chained_step(device: str, between=None):
    """Node "n": segment 0 writes ``tmp = 2x`` into an array it creates, torch computes ``x2 = 10x``, segment 1
    reads ``tmp`` and ``x2`` into ``y`` (= 12x). ``between()`` runs between the two segments."""
    import recorder_kernels as K
    import warp as wp

    from leapp import annotate

    def step(x):
        with leapp.node("n"):
            x = annotate.input_tensors("n", {"x": x})
            with annotate.warp_op():
                tmp = wp.empty(x.shape[0], dtype=float, device=device)
                wp.launch(K.scale, dim=x.shape[0], inputs=[wp.from_torch(x), 2.0], outputs=[tmp], device=device)
            if between is not None:
                between()
            x2 = x * 10  # torch between the segments
            with annotate.warp_op():
                out = wp.empty(x.shape[0], dtype=float, device=device)
                wp.launch(K.add_arrays, dim=x.shape[0], inputs=[tmp, wp.from_torch(x2)], outputs=[out],
                          device=device)
            annotate.output_tensors("n", {"y": out})
        return wp.to_torch(out)

    return step
