"""``leapp inspect EXPORT --graph OUT``: the pipeline drawn to SVG and PNG from an export made on the CPU."""

from __future__ import annotations

import struct
import sys
import xml.etree.ElementTree as ET

import pytest

import compile_records as cr
from leapp import cli
from leapp._export.compile import compile_session
from leapp.cli import graph

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")
pytest.importorskip("matplotlib")


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    """obs (PT2, one segment) -> action (ONNX, two segments); policy (TorchScript) beside them."""
    tmp = tmp_path_factory.mktemp("graph")
    record = cr.session(tmp, cr.segment_node("obs", "pt2", n=5), cr.segment_node("action", "onnx", n=5, segments=2),
                        cr.mlp_node("policy", "torchscript"), edges=[("obs", "out", "action", "x")], name="go2")
    compile_session(record, validate=False, bundles=cr.example_bundles)
    return tmp / "go2"


def test_svg_names_nodes_backends_segments_and_tensors(export, tmp_path, capsys):
    out = tmp_path / "go2.svg"
    assert cli.main(["inspect", str(export), "--graph", str(out)]) == 0
    assert f"graph: {out}" in capsys.readouterr().out
    texts = [t.text or "" for t in ET.parse(out).getroot().iter("{http://www.w3.org/2000/svg}text")]
    text = "\n".join(texts)
    for expected in ("obs", "action", "policy", "pt2 on cpu: obs.pt2", "onnx on cpu: action.onnx",
                     "torchscript on cpu: policy.pt", "segment warp_segment_0: example_scale",
                     "segment warp_segment_1: example_scale", "out -> x", "float32[5]", "input obs", "float32[2, 5]",
                     "output actions", "float32[2, 3]", "no Warp segments"):
        assert any(expected in t for t in texts), (expected, text)


def test_png_is_a_png_of_a_sane_size(export, tmp_path):
    out = graph.draw_graph(export, tmp_path / "go2.png")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert 300 < width < 5000 and 300 < height < 5000, (width, height)


def test_layout_rows_follow_the_data_flow_and_boxes_do_not_overlap():
    spec = {"dtype": "float32", "shape": [3]}
    node = lambda name, backend: {"name": name, "backend": backend, "device": "cuda:0", "artifact": f"{name}.onnx",  # noqa: E731
                                  "segments": [], "inputs": [{"name": "x", **spec}], "outputs": [{"name": "y", **spec}]}
    pipeline = {
        "nodes": [node("a", "onnx"), node("b", "pt2"), node("c", "onnx")],
        "edges": [{"from_node": "a", "from_output": "y", "to_node": "b", "to_input": "x"},
                  {"from_node": "b", "from_output": "y", "to_node": "c", "to_input": "x"},
                  {"from_node": "c", "from_output": "y", "to_node": "a", "to_input": "x", "feedback": True}],
        "inputs": [],
        "outputs": [{"name": "y", "node": "c", "output": "y", **spec}],
    }
    boxes, arrows, width, height = graph.layout(pipeline)
    rows = {b.key: b.row for b in boxes}
    assert rows == {"a": 1, "b": 2, "c": 3, "out:y": 4}  # the feedback edge places nothing
    assert [a.feedback for a in arrows] == [False, False, True, False]
    for first in boxes:
        assert 0 <= first.x and first.x + first.width <= width and 0 <= first.y and first.y + first.height <= height
        for second in boxes:
            if first is not second:
                apart = (first.x + first.width <= second.x or second.x + second.width <= first.x
                         or first.y + first.height <= second.y or second.y + second.height <= first.y)
                assert apart, (first.key, second.key)


def test_graph_refuses_without_matplotlib_a_bad_suffix_and_a_single_artifact(export, tmp_path, capsys, monkeypatch):
    assert cli.main(["inspect", str(export), "--graph", str(tmp_path / "g.txt")]) == 1
    assert "one of .svg, .png, .pdf" in capsys.readouterr().err
    assert cli.main(["inspect", str(export / "obs.pt2"), "--graph", str(tmp_path / "g.svg")]) == 1
    assert "--graph draws an export folder's pipeline.yaml" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert cli.main(["inspect", str(export), "--graph", str(tmp_path / "g.svg")]) == 1
    assert "pip install 'leapp[graph]'" in capsys.readouterr().err and not (tmp_path / "g.svg").exists()


def test_an_arrow_over_a_row_goes_around_its_boxes_and_ends_show_metadata():
    spec = {"dtype": "float32", "shape": [3]}
    node = lambda name, inputs: {"name": name, "backend": "onnx", "device": "cpu", "artifact": f"{name}.onnx",  # noqa: E731
                                 "segments": [], "inputs": [{"name": i, **spec} for i in inputs],
                                 "outputs": [{"name": "y", **spec}]}
    pipeline = {
        "nodes": [node("a", ["x"]), node("b", ["y", "j"])],
        "edges": [{"from_node": "a", "from_output": "y", "to_node": "b", "to_input": "y"}],
        "inputs": [{"name": "x", **spec, "consumers": [{"node": "a", "input": "x"}]},
                   {"name": "j", **spec, "metadata": {"kind": "joint_positions"},
                    "consumers": [{"node": "b", "input": "j"}]}],
        "outputs": [{"name": "y", "node": "b", "output": "y", **spec}],
    }
    boxes, arrows, _, _ = graph.layout(pipeline)
    by_key = {b.key: b for b in boxes}
    assert by_key["in:j"].lines == ["input j", "float32[3]", '{"kind": "joint_positions"}']
    routes = graph._routes(boxes, arrows)
    around = routes[[a.source for a in arrows].index("in:j")]
    a = by_key["a"]
    assert len(around) == 4 and not (a.x <= around[1][0] <= a.x + a.width)  # beside node a, which it skips
    assert [len(r) for r in routes].count(2) == len(routes) - 1
