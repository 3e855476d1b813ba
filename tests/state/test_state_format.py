"""The export folder of a pipeline with state: pipeline.yaml's state edges and initial_values, and the strict
check of initial_values.safetensors (docs/pipeline-format.md, "State")."""

from __future__ import annotations

import hashlib
import json
import struct

import pytest
import torch
from safetensors.torch import load

from leapp.pipeline_format import (INITIAL_VALUES_FILE, PipelineError, StateEdge, check_initial_values,
                                   read_pipeline, validate_description)

from state_helpers import ACT, HIDDEN, export_policy


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    return export_policy(tmp_path_factory.mktemp("fmt"), validate=False)


def test_state_edges_initial_values_and_no_state_in_pipeline_io(exported):
    _, desc = read_pipeline(exported)
    state = [e for e in desc["edges"] if e.get("state")]
    assert state == [
        {"from_node": "policy", "from_output": "h_out", "to_node": "policy", "to_input": "h", "feedback": True,
         "state": True},
        {"from_node": "policy", "from_output": "last_action_out", "to_node": "policy", "to_input": "last_action",
         "feedback": True, "state": True},
    ]
    assert [e["name"] for e in desc["inputs"]] == ["obs"]
    assert [e["name"] for e in desc["outputs"]] == ["action"]
    data = (exported / INITIAL_VALUES_FILE).read_bytes()
    assert desc["initial_values"] == {"path": INITIAL_VALUES_FILE, "sha256": hashlib.sha256(data).hexdigest()}
    values = load(data)
    assert set(values) == {"policy/h", "policy/last_action"}
    assert torch.equal(values["policy/h"], torch.zeros(1, HIDDEN))
    assert torch.equal(values["policy/last_action"], torch.zeros(1, ACT))


EDGES = [StateEdge("p", "h", "h_out", "float32", [2, 3]), StateEdge("p", "c", "c_out", "int64", [4])]


def _file(header: dict, data: bytes, length: int | None = None) -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text) if length is None else length) + text + data


def _good_header() -> dict:
    return {"p/h": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
            "p/c": {"dtype": "I64", "shape": [4], "data_offsets": [24, 56]}}


def test_a_good_file_reads():
    out = check_initial_values(_file(_good_header(), bytes(56)), "iv", EDGES)
    assert {k: len(v) for k, v in out.items()} == {"p/h": 24, "p/c": 32}


def _changed(key, field, value):
    header = _good_header()
    header[key][field] = value
    return header


@pytest.mark.parametrize("header, data, text", [
    (_changed("p/h", "dtype", "F64"), bytes(56), r"'p/h': dtype 'F64', but state input 'h' of node 'p' is float32"),
    (_changed("p/h", "shape", [3, 2]), bytes(56), r"'p/h': shape \[3, 2\], but state input 'h' of node 'p' has shape \[2, 3\]"),
    ({"p/h": _good_header()["p/h"]}, bytes(24), r"no initial value for state input 'p/c'"),
    (_good_header() | {"p/x": {"dtype": "F32", "shape": [0], "data_offsets": [56, 56]}}, bytes(56),
     r"key 'p/x' is no state input of the pipeline"),
    (_changed("p/c", "data_offsets", [16, 48]), bytes(48), r"'p/c': data_offsets \[16, 48\] overlaps the entry before it"),
    (_changed("p/c", "data_offsets", [32, 64]), bytes(64), r"'p/c': data_offsets \[32, 64\] leaves a gap of 8 bytes"),
    (_changed("p/c", "data_offsets", [24, 48]), bytes(48), r"'p/c': data_offsets \[24, 48\] hold 24 bytes, int64\[4\] is 32"),
    (_good_header(), bytes(60), r"the entries' data ends at byte 56 of 60 data bytes"),
    (_good_header(), bytes(40), r"the entries' data ends at byte 56 of 40 data bytes"),
], ids=["dtype", "shape", "missing-key", "extra-key", "overlap", "gap", "length", "trailing-data", "past-the-end"])
def test_hostile_entries_are_refused_naming_file_and_key(header, data, text):
    with pytest.raises(PipelineError, match=r"^iv: " + text):
        check_initial_values(_file(header, data), "iv", EDGES)


def test_header_length_past_the_file_and_huge_header():
    with pytest.raises(PipelineError, match=r"^iv: header length 1000 runs past the end of the file"):
        check_initial_values(_file(_good_header(), bytes(56), length=1000), "iv", EDGES)
    with pytest.raises(PipelineError, match=r"^iv: header length 1099511627776 is more than 16777216 bytes"):
        check_initial_values(_file(_good_header(), bytes(56), length=1 << 40), "iv", EDGES)
    with pytest.raises(PipelineError, match=r"^iv: 3 bytes, too short"):
        check_initial_values(b"abc", "iv", EDGES)
    with pytest.raises(PipelineError, match=r"^iv: header: .*duplicate key"):
        text = b'{"p/h": {}, "p/h": {}}'
        check_initial_values(struct.pack("<Q", len(text)) + text, "iv", EDGES)


def _description(exported) -> dict:
    return read_pipeline(exported)[1]


def test_a_state_edge_across_two_nodes_is_refused(exported):
    desc = _description(exported)
    edge = next(e for e in desc["edges"] if e.get("state"))
    desc["nodes"].append(dict(desc["nodes"][0], name="other"))
    edge["to_node"] = "other"
    desc["inputs"][0]["consumers"].append({"node": "other", "input": "obs"})
    with pytest.raises(PipelineError, match=r"edges\[0\].state: a state edge goes from a node to itself, not from "
                                            r"'policy' to 'other'"):
        validate_description(desc, "p.yaml")


def test_state_without_feedback_and_initial_values_missing_or_stray(exported):
    desc = _description(exported)
    del desc["edges"][0]["feedback"]
    with pytest.raises(PipelineError, match=r"edges\[0\].state: a state edge needs 'feedback: true'"):
        validate_description(desc, "p.yaml")
    desc = _description(exported)
    del desc["initial_values"]
    with pytest.raises(PipelineError, match=r"initial_values: missing \(the state edges \['edges\[0\]', 'edges\[1\]'\]"):
        validate_description(desc, "p.yaml")
    desc = _description(exported)
    for edge in desc["edges"]:
        edge.pop("state")
    with pytest.raises(PipelineError, match=r"initial_values: present, but no edge has 'state: true'"):
        validate_description(desc, "p.yaml")


def test_a_state_output_is_never_a_pipeline_output(exported):
    desc = _description(exported)
    desc["outputs"].append({"name": "h_out", "node": "policy", "output": "h_out", "dtype": "float32",
                            "shape": [1, HIDDEN]})
    with pytest.raises(PipelineError, match=r"outputs\[1\]: output 'h_out' of node 'policy' is the state update of "
                                            r"edges\[0\], never a pipeline output"):
        validate_description(desc, "p.yaml")


def test_an_old_reader_would_find_the_state_input_unfed(exported):
    """What a reader that ignores 'state' sees: the state input fed by nothing (docs/state.md, 'Old readers')."""
    desc = _description(exported)
    for edge in desc["edges"]:
        edge.pop("state")
    desc.pop("initial_values")
    with pytest.raises(PipelineError, match=r"input 'h' of node 'policy' is fed by no edge and no pipeline input"):
        validate_description(desc, "p.yaml")


def test_the_twin_carries_the_state(exported):
    twin = json.loads((exported / "pipeline.json").read_text())
    assert twin["initial_values"]["path"] == INITIAL_VALUES_FILE
    assert sum(1 for e in twin["edges"] if e.get("state")) == 2


def test_inspect_shows_state_edges_and_the_checked_initial_values(exported, tmp_path):
    import io
    import shutil

    from leapp.cli.inspect import inspect_path

    out = io.StringIO()
    assert inspect_path(exported, out) == 0
    text = out.getvalue()
    assert "edge policy.h_out -> policy.h (state, carried by the runtime)" in text
    assert f"initial values: {INITIAL_VALUES_FILE} (sha256 " in text
    assert "state policy/last_action <- policy/last_action_out: float32[1, 2]" in text
    copy = tmp_path / "changed"
    shutil.copytree(exported, copy)
    (copy / INITIAL_VALUES_FILE).write_bytes(b"\0" * 8)
    out = io.StringIO()
    assert inspect_path(copy, out) == 1
    assert "initial values: artifact" in out.getvalue() and "has sha256" in out.getvalue()


def test_an_export_with_state_and_its_leapp_bundle_are_byte_reproducible(tmp_path):
    """Two exports of one recurrent policy into different folders: every file (the artifact, pipeline.yaml and
    its twin, initial_values.safetensors, the LEAPP bundle's yaml) is byte-identical."""
    from leapp.interchange import write_leapp_bundle

    folders = [export_policy(tmp_path / name, validate=False) for name in ("a", "b")]
    for folder in folders:
        write_leapp_bundle(folder)
    names = sorted(p.name for p in folders[0].iterdir())
    assert {INITIAL_VALUES_FILE, "pipeline.yaml", "pipeline.json", "recurrent.yaml"} <= set(names)
    assert names == sorted(p.name for p in folders[1].iterdir())
    for name in names:
        assert (folders[0] / name).read_bytes() == (folders[1] / name).read_bytes(), name
