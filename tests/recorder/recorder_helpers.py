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
