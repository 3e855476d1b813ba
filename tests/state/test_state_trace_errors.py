"""Every TraceError of state declarations (docs/state.md), with its text; and the no-op outside a session."""

from __future__ import annotations

import re

import pytest
import torch

import leapp
from leapp import annotate
from leapp._recorder.observe import observing


def _trace(body, tmp_path, runs: int = 2, **node_kwargs):
    """Runs ``body(step)`` inside leapp.node('n') ``runs`` times in a session; returns the session's record."""
    with leapp.trace("s", save_path=str(tmp_path)) as session:
        for step in range(runs):
            with leapp.node("n", **node_kwargs):
                body(step)
    return session.record


def test_record_holds_state_inputs_outputs_and_first_call_initial_values(tmp_path):
    values = [torch.full((2,), 3.0), torch.full((2,), 7.0)]

    def body(step):
        x = annotate.input_tensors("n", {"x": torch.ones(2)})
        h = annotate.state_tensors("n", {"h": values[step]})
        annotate.update_state("n", {"h": h + x})
        annotate.output_tensors("n", {"y": h * 2})

    node = _trace(body, tmp_path).nodes["n"]
    assert [s.name for s in node.inputs] == ["x", "h"]
    assert [s.name for s in node.outputs] == ["h_out", "y"]
    assert [(s.input, s.output) for s in node.state] == [("h", "h_out")]
    assert torch.equal(node.state[0].initial, torch.full((2,), 3.0))  # the discovery pass's value
    assert node.state[0].initial.device.type == "cpu"
    assert torch.equal(node.samples[0].inputs[1], torch.full((2,), 7.0))  # samples keep each pass's state


def test_outside_a_session_they_return_their_arguments():
    a, b = torch.ones(1), torch.zeros(2)
    assert annotate.state_tensors("n", {"a": a}) is a
    assert annotate.update_state("n", {"a": a, "b": b}) == (a, b)


def test_observation_mode_sees_state_as_inputs_and_updates_as_outputs():
    with observing() as observer:
        with leapp.node("n"):
            h = annotate.state_tensors("n", {"h": torch.ones(2)})
            annotate.update_state("n", {"h": h + 1})
    run = observer.first("n")
    assert list(run.inputs) == ["h"] and list(run.outputs) == ["h_out"]
    assert torch.equal(run.outputs["h_out"], torch.full((2,), 2.0))


def _raises(body, tmp_path, pattern: str, **node_kwargs):
    with pytest.raises(leapp.TraceError, match=pattern) as info:
        _trace(body, tmp_path, **node_kwargs)
    assert re.search(r"test_state_trace_errors\.py:\d+", str(info.value)), str(info.value)
    return str(info.value)


def test_update_of_an_undeclared_state(tmp_path):
    def body(step):
        annotate.state_tensors("n", {"h": torch.ones(2)})
        annotate.update_state("n", {"g": torch.ones(2)})

    _raises(body, tmp_path, r"annotate.update_state\('n'\) at .*: state 'g' was not declared by "
                            r"annotate.state_tensors in this run of node 'n' \(states declared: \['h'\]\)")


def test_state_never_updated(tmp_path):
    def body(step):
        annotate.state_tensors("n", {"h": torch.ones(2)})
        annotate.output_tensors("n", {"y": torch.ones(1)})

    _raises(body, tmp_path, r"node 'n': state 'h' declared by annotate.state_tensors at .* is never updated")


@pytest.mark.parametrize("update, text", [
    (torch.ones(3), r"float32\[3\], the state input .* is float32\[2\]"),
    (torch.ones(2, dtype=torch.float64), r"float64\[2\], the state input .* is float32\[2\]"),
])
def test_update_with_another_dtype_or_shape(tmp_path, update, text):
    def body(step):
        annotate.state_tensors("n", {"h": torch.ones(2)})
        annotate.update_state("n", {"h": update})

    _raises(body, tmp_path, r"the update of state 'h' is " + text)


def test_state_declared_twice(tmp_path):
    def body(step):
        annotate.state_tensors("n", {"h": torch.ones(2)})
        annotate.state_tensors("n", {"h": torch.ones(2)})

    _raises(body, tmp_path, r"state 'h' declared twice \(first at .*test_state_trace_errors\.py:\d+\)")


def test_state_updated_twice(tmp_path):
    def body(step):
        h = annotate.state_tensors("n", {"h": torch.ones(2)})
        annotate.update_state("n", {"h": h})
        annotate.update_state("n", {"h": h})

    _raises(body, tmp_path, r"state 'h' updated twice")


def test_user_output_named_like_an_update_after_it(tmp_path):
    def body(step):
        h = annotate.state_tensors("n", {"h": torch.ones(2)})
        annotate.update_state("n", {"h": h})
        annotate.output_tensors("n", {"h_out": h})

    _raises(body, tmp_path, r"output 'h_out' at .* has the name of the update of state 'h' \(annotate.update_state "
                            r"at .* names it 'h_out'\)")


def test_user_output_named_like_an_update_before_it(tmp_path):
    def body(step):
        h = annotate.state_tensors("n", {"h": torch.ones(2)})
        annotate.output_tensors("n", {"h_out": h})
        annotate.update_state("n", {"h": h})

    _raises(body, tmp_path, r"the update of state 'h' is the node output 'h_out', but node 'n' already declares "
                            r"an output 'h_out'")


def test_state_in_a_dynamic_batch_node(tmp_path):
    def body(step):
        annotate.input_tensors("n", {"x": torch.ones(2, 3)})
        annotate.state_tensors("n", {"h": torch.ones(2, 3)})

    _raises(body, tmp_path, r"node 'n' has dynamic_batch=\(1, 8\); state with a dynamic batch is refused",
            dynamic_batch=(1, 8))


def test_runs_declaring_other_states(tmp_path):
    def body(step):
        name = "h" if step == 0 else "g"
        v = annotate.state_tensors("n", {name: torch.ones(2)})
        annotate.update_state("n", {name: v})

    with pytest.raises(leapp.TraceError, match=r"declares states \['g'\], its first run declared \['h'\]"):
        _trace(body, tmp_path)


def test_outside_the_node(tmp_path):
    with leapp.trace("s", save_path=str(tmp_path)):
        with pytest.raises(leapp.TraceError, match=r"annotate.state_tensors\('n'\) at .* is outside leapp.node"):
            annotate.state_tensors("n", {"h": torch.ones(2)})
