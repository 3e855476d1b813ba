"""Node and session declarations: names (they become file names), backends and backend parameters.

Bad values are refused where they are declared, with the user's file:line,
in a session and outside one (the decorator at decoration time).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import leapp
from leapp import annotate
from leapp._contract.backends import BACKEND_PARAMS
from leapp._contract.names import MAX_NAME_LENGTH, NAME_RULE, name_problem
from leapp.errors import TraceError

THIS = "test_declarations.py:"
BAD_NAMES = ["../escape", "a/b", "", "x" * 300, ".hidden", "..", "-rf", "a b", "obs\n", "é", "a\\b", 3, None]
GOOD_NAMES = ["obs", "policy.v2", "go2-robot_1", "0", "A" * MAX_NAME_LENGTH, "pipeline", "pipeline.yaml"]


def _node_body(x, name="n", **kwargs):
    with leapp.node(name, **kwargs):
        x = annotate.input_tensors(name, {"x": x})
        annotate.output_tensors(name, {"y": x + 1})


@pytest.mark.parametrize("name", BAD_NAMES, ids=repr)
def test_bad_node_names_are_refused_where_declared(name, tmp_path):
    line = _node_body.__code__.co_firstlineno + 1
    with leapp.trace("t", save_path=str(tmp_path)):
        with pytest.raises(TraceError, match="invalid node name") as info:
            _node_body(torch.ones(2), name)
    text = str(info.value)
    assert f"{THIS}{line}:" in text and NAME_RULE in text
    assert len(text) < 600, "a long name is cut in the message"
    with pytest.raises(TraceError, match="invalid node name") as info:  # outside a session, as a decorator

        @leapp.node(name)
        def f(x):
            return x

    assert THIS in str(info.value)
    assert list(tmp_path.parent.glob("escape*")) == [] and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", BAD_NAMES, ids=repr)
def test_bad_session_names_are_refused(name, tmp_path):
    save = tmp_path / "save"
    with pytest.raises(TraceError, match="invalid session name") as info:
        leapp.trace(name, save_path=str(save))
    assert THIS in str(info.value) and NAME_RULE in str(info.value)
    with pytest.raises(TraceError, match="invalid session name"):
        leapp.start(name, save_path=str(save))
    assert leapp._recorder.session.current_session() is None and not save.exists()


@pytest.mark.parametrize("name", GOOD_NAMES)
def test_good_names_export_inside_the_session_folder(name, tmp_path):
    with leapp.trace(name, save_path=str(tmp_path)) as session:
        for _ in range(2):
            _node_body(torch.ones(2), name, export_with="torchscript")
    session.compile(validate=False)
    assert sorted(p.name for p in (tmp_path / name).iterdir()) == sorted([f"{name}.pt", "pipeline.json", "pipeline.yaml"])
    assert [p.name for p in tmp_path.iterdir()] == [name]


@settings(max_examples=300)
@given(st.text(max_size=80))
def test_name_rule_is_one_plain_path_component(name):
    """Accepted names are exactly the ones that stay a single, visible, portable file name."""
    ok = name_problem(name) is None
    expected = (
        0 < len(name) <= MAX_NAME_LENGTH
        and all(c.isascii() and (c.isalnum() or c in "_.-") for c in name)
        and name[0] not in ".-"
    )
    assert ok == expected
    if ok:
        assert "/" not in name and "\\" not in name and name not in (".", "..")


def test_node_names_differing_only_in_case_are_refused():
    with leapp.trace("t"):
        _node_body(torch.ones(2), "obs")
        with pytest.raises(TraceError, match="differs only in case") as info:
            _node_body(torch.ones(2), "Obs")
    assert "leapp.node('Obs')" in str(info.value) and "node 'obs'" in str(info.value)


def test_unknown_backend_is_refused_where_declared():
    with pytest.raises(TraceError, match=r"unknown export_with='tensorrt'") as info:
        leapp.node("n", export_with="tensorrt")
    text = str(info.value)
    assert THIS in text and all(repr(b) in text for b in BACKEND_PARAMS)
    with leapp.trace("t"), pytest.raises(TraceError, match="unknown export_with"):
        _node_body(torch.ones(2), export_with="TensorRT")


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"export_wth": "pt2"}, r"export_with='onnx' takes opset_version, optimize, external_data, not export_wth"),
        ({"export_with": "pt2", "opset_version": 18}, r"export_with='pt2' takes strict, not opset_version"),
        ({"export_with": "torchscript", "strict": True}, r"export_with='torchscript' takes no parameters, not strict"),
        ({"opset": 18}, r"not opset \("),
        ({"opset_version": "18"}, r"opset_version='18' for export_with='onnx' must be of type int"),
        ({"opset_version": True}, r"opset_version=True .* must be of type int"),
        ({"optimize": 0}, r"optimize=0 .* must be of type bool"),
    ],
)
def test_unknown_or_mistyped_backend_params_are_refused(kwargs, message):
    with pytest.raises(TraceError, match=message) as info:
        leapp.node("n", **kwargs)
    text = str(info.value)
    assert THIS in text and ("pt2: strict" in text or "must be of type" in text)


def test_accepted_backend_params_reach_the_record():
    @leapp.node("policy", export_with="onnx", opset_version=18, optimize=False, external_data=False)
    def policy(obs):
        return obs * 2

    with leapp.trace("t") as session:
        policy(torch.ones(2))
        policy(torch.ones(2))
    assert session.record.nodes["policy"].backend_params == {
        "opset_version": 18, "optimize": False, "external_data": False,
    }
