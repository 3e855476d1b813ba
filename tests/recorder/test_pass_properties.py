"""Property-based tests of the pass logic and of the recorded graphs (hypothesis, CPU Warp arrays)."""

from __future__ import annotations

import pytest
import recorder_kernels as K
import torch
import warp as wp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from recorder_helpers import assert_graphs_replay_samples
from warp_replay import run_node_graph

import leapp
from leapp import annotate
from leapp.errors import MORE_REGIONS_THAN_DISCOVERY, NOT_EXECUTED_TWICE, SEGMENT_DIVERGED, TraceError

wp.init()
DEVICE = "cpu"
OPS = ("scale", "add_one")
SETTINGS = settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow], derandomize=True)

programs = st.lists(st.lists(st.sampled_from(OPS), min_size=0, max_size=3), min_size=0, max_size=3)


def run_program(x, program):
    """One execution of node "n": each inner list is one Warp segment with those launches."""
    with leapp.node("n", export_with="pt2"):
        x = annotate.input_tensors("n", {"x": x})
        y = x * 1.0
        for segment in program:
            with annotate.warp_op():
                for op in segment:
                    if op == "scale":
                        wp.launch(K.scale, dim=y.shape[0], inputs=[wp.from_torch(y), 2.0],
                                  outputs=[wp.from_torch(y)], device=DEVICE)
                    else:
                        wp.launch(K.add_one, dim=y.shape[0], inputs=[wp.from_torch(y)], device=DEVICE)
            y = y + 0.5
        annotate.output_tensors("n", {"y": y})
    return y


def expected_outcome(p1, p2) -> str:
    """The pass contract of docs/recorder.md section 2 for a discovery pass p1 and a capture pass p2."""
    for i, segment in enumerate(p2):
        if i >= len(p1):
            return MORE_REGIONS_THAN_DISCOVERY
        if segment != p1[i]:
            return SEGMENT_DIVERGED
    return NOT_EXECUTED_TWICE if len(p2) < len(p1) else "ok"


@st.composite
def pass_pairs(draw):
    p1 = draw(programs)
    kind = draw(st.sampled_from(["same", "same", "other", "add_segment", "drop_segment", "change_op"]))
    if kind == "same":
        return p1, [list(s) for s in p1]
    if kind == "other":
        return p1, draw(programs)
    p2 = [list(s) for s in p1]
    if kind == "add_segment":
        p2.insert(draw(st.integers(0, len(p2))), draw(st.lists(st.sampled_from(OPS), max_size=3)))
    elif kind == "drop_segment" and p2:
        p2.pop(draw(st.integers(0, len(p2) - 1)))
    elif kind == "change_op" and any(p2):
        i = draw(st.sampled_from([i for i, s in enumerate(p2) if s]))
        j = draw(st.integers(0, len(p2[i]) - 1))
        p2[i][j] = "scale" if p2[i][j] == "add_one" else "add_one"
    return p1, p2


@SETTINGS
@given(pass_pairs())
def test_capture_against_discovery(pair):
    p1, p2 = pair
    want = expected_outcome(p1, p2)
    x = torch.arange(4.0)
    with leapp.trace("prop") as session:
        run_program(x, p1)
        if want in (SEGMENT_DIVERGED, MORE_REGIONS_THAN_DISCOVERY):
            with pytest.raises(TraceError, match=want):
                run_program(x, p2)
            return
        eager = run_program(x, p2)
    record = session.record
    if want == NOT_EXECUTED_TWICE:
        with pytest.raises(TraceError, match=NOT_EXECUTED_TWICE):
            record.check_complete()
        assert f"n/warp_segment_{len(p2)}" in "\n".join(record.problems)
        return
    record.check_complete()
    node = record.nodes["n"]
    assert [s.ops for s in node.segments] == [[f"launch:{op}" for op in seg] for seg in p1]
    assert [s.id for s in node.segments] == [f"n/warp_segment_{i}" for i in range(len(p1))]
    torch.testing.assert_close(node.samples[0].outputs[0], eager)
    assert_graphs_replay_samples(record)


# ---- recorded graphs reproduce eager execution ----

STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 7), st.integers(0, 7)),
        st.tuples(st.just("mul"), st.integers(0, 7), st.floats(-2, 2, allow_nan=False, width=32)),
        st.tuples(st.just("relu"), st.integers(0, 7)),
        st.tuples(st.just("inplace_add"), st.integers(0, 7), st.integers(0, 7)),
        st.tuples(st.just("view_write"), st.integers(0, 7), st.integers(1, 3)),
        st.tuples(st.just("flip_cat"), st.integers(0, 7)),
        st.tuples(st.just("warp_scale"), st.integers(0, 7), st.floats(-2, 2, allow_nan=False, width=32)),
        st.tuples(st.just("warp_inplace"), st.integers(0, 7)),
        st.tuples(st.just("warp_created"), st.integers(0, 7), st.integers(0, 7)),
    ),
    min_size=1,
    max_size=8,
)


def run_steps(x, w, steps):
    """A random node program over 1-D float tensors of length 4 (torch ops and Warp segments)."""
    with leapp.node("g", export_with="pt2"):
        x, w = annotate.input_tensors("g", {"x": x, "w": w})
        vals = [x, w]

        def pick(i):
            return vals[i % len(vals)]

        for step in steps:
            kind = step[0]
            if kind == "add":
                vals.append(pick(step[1]) + pick(step[2]))
            elif kind == "mul":
                vals.append(pick(step[1]) * step[2])
            elif kind == "relu":
                vals.append(torch.relu(pick(step[1])))
            elif kind == "inplace_add":
                t = pick(step[1]) * 1.0
                t.add_(pick(step[2]))
                vals.append(t)
            elif kind == "view_write":
                t = pick(step[1]).clone()
                t[: step[2]] *= 2.0
                vals.append(t)
            elif kind == "flip_cat":
                vals.append(torch.cat([pick(step[1])[2:], pick(step[1])[:2].flip(0)]))
            elif kind == "warp_scale":
                out = torch.empty(4)
                with annotate.warp_op():
                    wp.launch(K.scale, dim=4, inputs=[wp.from_torch(pick(step[1])), step[2]],
                              outputs=[wp.from_torch(out)], device=DEVICE)
                vals.append(out)
            elif kind == "warp_inplace":
                t = pick(step[1]) + 0.0
                with annotate.warp_op():
                    wp.launch(K.add_one, dim=4, inputs=[wp.from_torch(t[1:])], device=DEVICE)
                vals.append(t)
            else:
                with annotate.warp_op():
                    made = wp.empty(4, dtype=float, device=DEVICE)
                    wp.launch(K.add_arrays, dim=4, inputs=[wp.from_torch(pick(step[1])), wp.from_torch(pick(step[2]))],
                              outputs=[made], device=DEVICE)
                vals.append(wp.to_torch(made) * 1.0)
        outs = annotate.output_tensors("g", {"a": vals[-1], "b": vals[len(vals) // 2]})
    return outs


@SETTINGS
@given(STEPS, st.integers(0, 2**16))
def test_recorded_graph_equals_eager(steps, seed):
    gen = torch.Generator().manual_seed(seed)
    x, w = torch.randn(4, generator=gen), torch.randn(4, generator=gen)
    with leapp.trace("prop") as session:
        for _ in range(3):
            run_steps(x.clone(), w.clone(), steps)
    record = session.record
    record.check_complete()
    assert_graphs_replay_samples(record)
    # Fresh values: the graph computes what eager code computes, not what it saw while tracing.
    x2, w2 = torch.randn(4, generator=gen), torch.randn(4, generator=gen)
    want = run_steps(x2.clone(), w2.clone(), steps)
    got = run_node_graph(record.nodes["g"], [x2, w2])
    for g, e in zip(got, want):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)
