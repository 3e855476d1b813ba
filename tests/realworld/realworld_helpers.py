"""Trace a node over several passes and compare its recorded graph with eager code on new inputs."""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from recorder_helpers import assert_graphs_replay_samples
from warp_replay import run_node_graph

import leapp
from leapp._contract.records import SessionRecord

__all__ = ["trace_passes", "assert_graph_matches_eager", "check_recording"]


def trace_passes(fn: Callable, passes: Sequence[Sequence[torch.Tensor]], name: str = "realworld") -> SessionRecord:
    """Run ``fn(*inputs)`` once per entry of ``passes`` in one session (discovery, capture, samples)."""
    with leapp.trace(name) as session:
        for inputs in passes:
            fn(*inputs)
    return session.record


def assert_graph_matches_eager(record: SessionRecord, node: str, fn: Callable, inputs: Sequence[torch.Tensor],
                               rtol: float = 1e-5, atol: float = 1e-6) -> None:
    """The recorded graph (segments replayed by Warp from their .wrp bytes) on ``inputs`` equals eager ``fn``.

    Outside a session ``fn`` runs eagerly. Inputs the trace never saw catch state baked in as a constant.
    """
    got = run_node_graph(record.nodes[node], inputs)
    expected = fn(*inputs)
    expected = list(expected) if isinstance(expected, (tuple, list)) else [expected]
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=rtol, atol=atol)


def check_recording(record: SessionRecord, node: str, fn: Callable, new_inputs: Sequence[torch.Tensor]) -> None:
    """Both checks: the recorded samples replay, and the graph equals eager on inputs it was not traced with.

    Eager results on ``new_inputs`` must differ from every recorded sample's outputs, so that a graph that
    replays a baked trace-time result cannot pass.
    """
    assert_graphs_replay_samples(record)
    expected = fn(*new_inputs)
    expected = list(expected) if isinstance(expected, (tuple, list)) else [expected]
    for sample in record.nodes[node].samples:
        assert any(not torch.equal(e, s) for e, s in zip(expected, sample.outputs)), "new inputs change nothing"
    assert_graph_matches_eager(record, node, fn, new_inputs)
