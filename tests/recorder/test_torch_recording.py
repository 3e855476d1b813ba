"""Torch work inside a node becomes an FX graph of aten ops (scoped dispatch mode)."""

from __future__ import annotations

import operator

import pytest
import torch
from recorder_helpers import assert_graphs_replay_samples, trace

import leapp
from leapp import annotate
from leapp.errors import NOT_EXECUTED_TWICE, TraceError

torch.manual_seed(0)
MLP = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
STATE = torch.arange(6.0)


def _ops(record, node):
    return [n.target for n in record.nodes[node].graph.graph.nodes if n.op == "call_function"]


def test_factories_parameters_constants_and_inplace_ops():
    def step(x):
        with leapp.node("n", export_with="pt2"):
            x = annotate.input_tensors("n", {"x": x})
            buf = torch.zeros(x.shape[0], 4)  # factory inside the node
            buf[:, :2] = x[:, :2] * 2  # view + in-place copy into a view
            buf.add_(1.0)  # in-place op
            y = MLP(buf + x) + STATE[:2]  # module parameters and a captured constant
            y = y.relu_()
            annotate.output_tensors("n", {"y": y, "buf": buf})
        return y, buf

    x = torch.randn(3, 4)
    eager = step(x)
    record, results = trace(step, x, passes=3)
    for y, buf in results:
        torch.testing.assert_close(y, eager[0])
        torch.testing.assert_close(buf, eager[1])
    node = record.nodes["n"]
    assert [s.name for s in node.inputs] == ["x"] and [s.name for s in node.outputs] == ["y", "buf"]
    assert node.outputs[0].shape == (3, 2) and node.export_with == "pt2"
    ops = _ops(record, "n")
    assert torch.ops.aten.zeros.default in ops
    assert torch.ops.aten.add_.Tensor in ops and torch.ops.aten.relu_.default in ops
    assert torch.ops.aten.copy_.default in ops
    buffers = dict(node.graph.named_buffers())
    assert len(buffers) == 5  # 2 weights, 2 biases, STATE
    assert any(torch.equal(b, STATE) for b in buffers.values())
    assert len(node.samples) == 2  # capture pass + one sample pass
    assert_graphs_replay_samples(record)
    # The graph is a function of its inputs, not of the traced values.
    x2 = torch.randn(3, 4)
    from warp_replay import run_node_graph

    got = run_node_graph(node, [x2])
    want = step(x2)
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])


def test_constants_are_snapshots_not_references():
    def step(x):
        with leapp.node("n"):
            x = annotate.input_tensors("n", {"x": x})
            annotate.output_tensors("n", {"y": x * STATE[:2]})

    record, _ = trace(step, torch.ones(2))
    (buffer,) = dict(record.nodes["n"].graph.named_buffers()).values()
    assert buffer.data_ptr() != STATE.data_ptr()


@pytest.mark.parametrize("kind", ["tensor", "tuple", "dict"])
def test_decorator_inputs_and_outputs(kind):
    @leapp.node("policy", export_with="onnx", opset_version=18)
    def policy(obs, extra, gain=2.0):
        a = MLP(obs) * gain
        if kind == "tensor":
            return a
        if kind == "tuple":
            return a, extra + 1
        return {"actions": a, "extra": extra - 1}

    obs, extra = torch.randn(5, 4), torch.randn(5)
    record, results = trace(policy, obs, extra)
    node = record.nodes["policy"]
    assert [s.name for s in node.inputs] == ["obs", "extra"]
    expected = {"tensor": ["output"], "tuple": ["output_0", "output_1"], "dict": ["actions", "extra"]}[kind]
    assert [s.name for s in node.outputs] == expected
    assert node.backend_params == {"opset_version": 18}
    assert node.source.endswith("test_torch_recording.py:" + str(policy.__wrapped__.__code__.co_firstlineno))
    assert_graphs_replay_samples(record)


def test_graph_layout_contract():
    def step(x):
        with leapp.node("n"):
            x = annotate.input_tensors("n", {"x": x})
            annotate.output_tensors("n", {"a": x + 1, "b": x * 2})

    record, _ = trace(step, torch.ones(3))
    graph = record.nodes["n"].graph.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    assert [p.target for p in placeholders] == ["x"]
    (output,) = [n for n in graph.nodes if n.op == "output"]
    assert isinstance(output.args[0], tuple) and len(output.args[0]) == 2


def test_views_and_noncontiguous_inputs_become_dense():
    big = torch.arange(24.0).reshape(4, 6)

    def step(v):
        with leapp.node("n"):
            v = annotate.input_tensors("n", {"v": v})
            assert v.is_contiguous() and v.storage_offset() == 0
            annotate.output_tensors("n", {"y": v * 2})

    record, _ = trace(step, big[1:, ::2])
    assert record.nodes["n"].inputs[0].shape == (3, 3)
    assert_graphs_replay_samples(record)


def test_edges_between_nodes():
    def step(x):
        with leapp.node("a"):
            x = annotate.input_tensors("a", {"x": x})
            y = annotate.output_tensors("a", {"y": x + 1})
        with leapp.node("b"):
            y = annotate.input_tensors("b", {"obs": y})
            annotate.output_tensors("b", {"z": y * 3})

    record, _ = trace(step, torch.ones(2))
    assert list(record.nodes) == ["a", "b"]
    assert record.edges == [("a", "y", "b", "obs")]


def test_tensor_of_another_node_without_declaration_is_reported():
    keep = {}

    def step(x):
        with leapp.node("a"):
            x = annotate.input_tensors("a", {"x": x})
            keep["y"] = annotate.output_tensors("a", {"y": x + 1})
        with leapp.node("b"):
            x = annotate.input_tensors("b", {"x": x})
            annotate.output_tensors("b", {"z": x * keep["y"]})

    record, _ = trace(step, torch.ones(2))
    assert any("traced in node 'a'" in note and "baked" in note for note in record.notes)


def test_node_executed_once_fails_at_compile():
    def step(x):
        with leapp.node("once"):
            x = annotate.input_tensors("once", {"x": x})
            annotate.output_tensors("once", {"y": x + 1})

    with leapp.trace("t") as session:
        step(torch.ones(2))
    with pytest.raises(TraceError, match=NOT_EXECUTED_TWICE) as info:
        session.compile()
    assert "leapp.node('once')" in str(info.value) and "test_torch_recording.py:" in str(info.value)


def test_compile_checks_then_calls_the_exporter(monkeypatch):
    import leapp._export.compile as export_compile

    calls = []
    monkeypatch.setattr(export_compile, "compile_session", lambda record, **kw: calls.append((record, kw)) or "ok")

    def step(x):
        with leapp.node("n"):
            x = annotate.input_tensors("n", {"x": x})
            annotate.output_tensors("n", {"y": x + 1})

    leapp.start("script", save_path="somewhere")
    step(torch.ones(2))
    step(torch.ones(2))
    leapp.stop()
    assert leapp.compile_graph(validate=False, rtol=0.1) == "ok"
    (record, kw), = calls
    assert record.name == "script" and record.save_path == "somewhere" and list(record.nodes) == ["n"]
    assert kw == {"validate": False, "rtol": 0.1, "atol": 1e-5}


def test_declaration_errors():
    with leapp.trace("t"):
        with pytest.raises(TraceError, match=r"annotate.input_tensors\('x'\) at .* is outside leapp.node\('x'\)"):
            annotate.input_tensors("x", {"a": torch.ones(1)})
        with leapp.node("a"):
            with pytest.raises(TraceError, match=r"inside leapp.node\('a'\), not leapp.node\('b'\)"):
                annotate.output_tensors("b", {"a": torch.ones(1)})
            with pytest.raises(TraceError, match="nodes cannot be nested"):
                with leapp.node("inner"):
                    pass
            with pytest.raises(TraceError, match="expected a torch.Tensor or a wp.array"):
                annotate.input_tensors("a", {"a": 3.0})


def test_failed_execution_is_not_counted():
    def step(x, fail):
        with leapp.node("n"):
            x = annotate.input_tensors("n", {"x": x})
            if fail:
                raise ValueError("boom")
            annotate.output_tensors("n", {"y": x + 1})

    with leapp.trace("t") as session:
        step(torch.ones(2), False)
        with pytest.raises(ValueError):
            step(torch.ones(2), True)
        step(torch.ones(2), False)
    assert session.record.problems == []
    assert operator.length_hint(session.record.nodes["n"].samples) == 1


def test_one_name_two_places_is_refused():
    with leapp.trace("t"):
        with leapp.node("n"):
            pass
        with pytest.raises(TraceError, match="already traced at .*test_torch_recording.py:"):
            with leapp.node("n"):
                pass
