"""A segment output whose content before the segment is undefined is not a segment input.

``y = torch.empty_like(x)`` (or ``torch.empty``, ``new_empty``, ``empty_strided``)
written by a Warp segment before any torch op wrote it holds undefined bytes,
so the segment needs no copy of them: the bundle's output starts with init
"none" and the exported program neither allocates nor copies ``y`` for the
call. A tensor torch initialized (``zeros_like``, ``clone``, a write before
the block) keeps ``init: {"input": j}``. CPU capture, PT2 export without validation.
"""

from __future__ import annotations

import pytest
import recorder_kernels as K
import torch
import warp as wp
from recorder_helpers import assert_graphs_replay_samples

import leapp
from leapp import annotate
from leapp._contract.records import warp_segment_call
from leapp.bundle import read_bundle
from leapp.runtime.runners import load_pt2

wp.init()
N = 4
_aten = torch.ops.aten
FACTORIES = {_aten.empty.memory_format, _aten.empty_like.default, _aten.empty_strided.default,
             _aten.new_empty.default, _aten.new_empty_strided.default}


@pytest.fixture(scope="module", autouse=True)
def _sm90_only():
    """One cubin target keeps the export fast; the buffers and graph do not depend on it."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LEAPP_CUDA_ARCHS", "90")
        yield


def _scale_into(make):
    """Node ``n``: y = make(x), then one segment writes y = 2 * x."""

    def step(x):
        with leapp.node("n", export_with="pt2"):
            x = annotate.input_tensors("n", {"x": x})
            y = make(x)
            with annotate.warp_op():
                wp.launch(K.scale, dim=N, inputs=[wp.from_torch(x), 2.0], outputs=[wp.from_torch(y)], device="cpu")
            annotate.output_tensors("n", {"y": y})
        return y

    return step


def _export(step, tmp_path, *inputs, passes=3):
    with leapp.trace("u", save_path=str(tmp_path)) as session:
        results = [step(*inputs) for _ in range(passes)]
    session.compile(validate=False)
    record = session.record
    assert_graphs_replay_samples(record)
    return record, results, load_pt2(tmp_path / "u" / "n.pt2")


def _bundles(program) -> list:
    state = program.state_dict
    keys = sorted((k for k in state if k.startswith("warp_segment_")), key=lambda k: int(k.split("_")[2]))
    return [read_bundle(state[k].numpy().tobytes()) for k in keys]


def _op_calls(program) -> list:
    op = torch.ops.leapp.warp_segment.default
    return [n for n in program.graph.nodes if n.op == "call_function" and n.target is op]


def _write_first(y):
    y[:1] = 3.0
    return y


UNINITIALIZED = {
    "empty_like": lambda x: torch.empty_like(x),
    "empty": lambda x: torch.empty(N),
    "new_empty": lambda x: x.new_empty((N,)),
    "empty_strided": lambda x: torch.empty_strided((N,), (1,)),
}
INITIALIZED = {
    "zeros_like": lambda x: torch.zeros_like(x),
    "clone": lambda x: x.clone(),
    "fill_": lambda x: torch.empty_like(x).fill_(7.0),
    "slice_write": lambda x: _write_first(torch.empty_like(x)),
    "out=": lambda x: torch.mul(x, 0.5, out=torch.empty_like(x)),
}


@pytest.mark.parametrize("make", UNINITIALIZED.values(), ids=UNINITIALIZED.keys())
def test_uninitialized_output_is_not_an_input(tmp_path, make):
    x = torch.arange(float(N))
    record, results, program = _export(_scale_into(make), tmp_path, x)
    for r in results:
        torch.testing.assert_close(r, x * 2)
    node = record.nodes["n"]
    (seg,) = node.segments
    (x_in,) = seg.inputs
    (y_out,) = seg.outputs
    assert x_in.spec.shape == (N,) and not x_in.undefined_before
    assert y_out.undefined_before and y_out.region_id != x_in.region_id
    # the recorded graph: the segment takes x only; y's value is the segment's output (no copy_, no factory left)
    (call,) = [n for n in node.graph.graph.nodes if n.target is warp_segment_call]
    assert [a.op for a in call.args[1]] == ["placeholder"]
    assert not any(n.target in FACTORIES or n.target is _aten.copy_.default for n in node.graph.graph.nodes)

    (bundle,) = _bundles(program)
    assert [(b["role"], b.get("io"), b["init"]) for b in bundle.buffers] == [("input", 0, "none"),
                                                                             ("output", 0, "none")]
    assert len(bundle.inputs) == 1
    # the exported program: the op is fed the graph input only; nothing allocates or copies y around it
    (op,) = _op_calls(program)
    (fed,) = op.args[0]
    assert fed.op == "placeholder"
    targets = [n.target for n in program.graph.nodes if n.op == "call_function"]
    assert not any(t in FACTORIES or "copy" in str(t) for t in targets), targets


@pytest.mark.parametrize("make", INITIALIZED.values(), ids=INITIALIZED.keys())
def test_output_initialized_by_torch_stays_an_input(tmp_path, make):
    x = torch.arange(float(N))
    record, results, program = _export(_scale_into(make), tmp_path, x)
    for r in results:
        torch.testing.assert_close(r, x * 2)
    (seg,) = record.nodes["n"].segments
    x_in, y_in = seg.inputs
    (y_out,) = seg.outputs
    assert y_out.region_id == y_in.region_id and not y_out.undefined_before
    (bundle,) = _bundles(program)
    assert [(b["role"], b["init"]) for b in bundle.buffers] == [("input", "none"), ("input", "none"),
                                                                ("output", {"input": 1})]
    (op,) = _op_calls(program)
    assert len(op.args[0]) == 2


def test_a_live_alias_keeps_the_write_back(tmp_path):
    """A view of y made before the block must see the segment's write: the copy_ stays, the input still goes."""

    def step(x):
        with leapp.node("n", export_with="pt2"):
            x = annotate.input_tensors("n", {"x": x})
            y = torch.empty(2 * N)
            head = y[:N]
            with annotate.warp_op():
                wp.launch(K.scale, dim=2 * N, inputs=[wp.from_torch(x), 2.0], outputs=[wp.from_torch(y)],
                          device="cpu")
            annotate.output_tensors("n", {"head": head + 1.0, "y": y})
        return head + 1.0

    x = torch.arange(2.0 * N)
    record, results, program = _export(step, tmp_path, x)
    for r in results:
        torch.testing.assert_close(r, x[:N] * 2 + 1)
    (seg,) = record.nodes["n"].segments
    assert len(seg.inputs) == 1 and seg.outputs[0].undefined_before
    graph = record.nodes["n"].graph.graph
    assert sum(n.target is _aten.copy_.default for n in graph.nodes) == 1
    (bundle,) = _bundles(program)
    assert [(b["role"], b["init"]) for b in bundle.buffers] == [("input", "none"), ("output", "none")]


def test_second_segment_sees_the_first_ones_write(tmp_path):
    """Once a segment wrote y, y is defined: a later segment that updates it in place gets it as an input."""

    def step(x):
        with leapp.node("n", export_with="pt2"):
            x = annotate.input_tensors("n", {"x": x})
            y = torch.empty_like(x)
            with annotate.warp_op():
                wp.launch(K.scale, dim=N, inputs=[wp.from_torch(x), 2.0], outputs=[wp.from_torch(y)], device="cpu")
            with annotate.warp_op():
                wp.launch(K.add_one, dim=N, inputs=[wp.from_torch(y)], device="cpu")
            annotate.output_tensors("n", {"y": y})
        return y

    x = torch.arange(float(N))
    record, results, program = _export(step, tmp_path, x)
    for r in results:
        torch.testing.assert_close(r, x * 2 + 1)
    first, second = record.nodes["n"].segments
    assert len(first.inputs) == 1 and first.outputs[0].undefined_before
    assert len(second.inputs) == 1 and second.outputs[0].region_id == second.inputs[0].region_id
    assert not second.outputs[0].undefined_before
    b0, b1 = _bundles(program)
    assert [b["init"] for b in b0.buffers if b["role"] == "output"] == ["none"]
    assert [b["init"] for b in b1.buffers if b["role"] == "output"] == [{"input": 0}]


def test_partially_written_empty_tensor(tmp_path):
    """The kernel writes half of y: the other half stays undefined, as in eager; the node reads the written half."""

    def step(x):
        with leapp.node("n", export_with="pt2"):
            x = annotate.input_tensors("n", {"x": x})
            y = torch.empty(2 * N)
            with annotate.warp_op():
                wp.launch(K.scale, dim=N, inputs=[wp.from_torch(x), 2.0], outputs=[wp.from_torch(y)], device="cpu")
            head = y[:N] + 0.0
            annotate.output_tensors("n", {"head": head})
        return head

    x = torch.arange(float(N))
    record, results, program = _export(step, tmp_path, x)
    for r in results:
        torch.testing.assert_close(r, x * 2)
    (seg,) = record.nodes["n"].segments
    assert len(seg.inputs) == 1 and seg.outputs[0].undefined_before and seg.outputs[0].nbytes == 8 * N
    (bundle,) = _bundles(program)
    assert [(b["role"], b["init"]) for b in bundle.buffers] == [("input", "none"), ("output", "none")]
