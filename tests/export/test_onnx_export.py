"""ONNX export: segments become single leapp.warp::WarpSegment nodes; pure-torch nodes export and run."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
import torch
from hypothesis import given, settings
from onnx import numpy_helper

import compile_records as cr
from leapp._export.exportable import build_exportable
from leapp._export.onnx_export import DOMAIN, OP_TYPE, export_onnx
from leapp._export.validate import validate_node
from leapp.bundle import read_bundle
from leapp.runtime import libraries
from leapp.runtime.io import IOSpec
from leapp.runtime.onnx_runner import OnnxRunner

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")


def _segment_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.domain == DOMAIN and n.op_type == OP_TYPE]


def _value_types(model: onnx.ModelProto) -> dict[str, tuple[int, list[int]]]:
    """name -> (elem_type, static dims) for graph inputs, outputs and value_info."""
    out = {}
    for v in list(model.graph.input) + list(model.graph.output) + list(model.graph.value_info):
        t = v.type.tensor_type
        out[v.name] = (t.elem_type, [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim])
    return out


def test_segments_become_warp_segment_nodes_with_bundle_initializer_last(tmp_path):
    node = cr.segment_node("obs", "onnx", n=6, segments=2)
    exp = build_exportable(node, cr.example_bundles)
    path, extra = export_onnx(exp, tmp_path)
    assert path == tmp_path / "obs.onnx" and extra == []

    model = onnx.load(str(path))
    onnx.checker.check_model(model, full_check=True)
    assert {(o.domain, o.version) for o in model.opset_import} >= {(DOMAIN, 1)}
    found = _segment_nodes(model)
    assert len(found) == 2
    initializers = {i.name: i for i in model.graph.initializer}
    for onnx_node, seg in zip(found, exp.segments):
        attrs = {a.name: a for a in onnx_node.attribute}
        assert set(attrs) == {"signature"}
        assert attrs["signature"].type == onnx.AttributeProto.STRING
        assert attrs["signature"].s.decode() == seg.signature
        assert json.loads(seg.signature)["digest"] == read_bundle(seg.bundle).digest
        bundle_init = initializers[onnx_node.input[-1]]
        assert bundle_init.data_type == onnx.TensorProto.UINT8
        assert numpy_helper.to_array(bundle_init).tobytes() == seg.bundle
        assert len(onnx_node.input) == 2 and len(onnx_node.output) == 1
    # graph I/O carry the node's names, static shapes and dtypes
    types = _value_types(model)
    assert [i.name for i in model.graph.input] == ["x"]
    assert [o.name for o in model.graph.output] == ["out", "h"]
    for onnx_node in found:
        assert types[onnx_node.output[0]] == (onnx.TensorProto.FLOAT, [6])


def test_list_output_segment_is_one_node_with_n_outputs(tmp_path):
    node = cr.two_output_node("multi", "onnx", n=4)
    exp = build_exportable(node, cr.two_output_bundles)
    path, _ = export_onnx(exp, tmp_path)
    model = onnx.load(str(path))
    onnx.checker.check_model(model, full_check=True)
    (seg_node,) = _segment_nodes(model)
    assert len(seg_node.output) == 2
    types = _value_types(model)
    assert types[seg_node.output[0]] == (onnx.TensorProto.FLOAT, [4])
    assert types[seg_node.output[1]] == (onnx.TensorProto.INT32, [2, 2])
    assert types["count1"] == (onnx.TensorProto.INT32, [2, 2])


def test_unused_segment_output_still_declared(tmp_path):
    node = cr.two_output_node("multi", "onnx", n=4)
    # drop the use of output 1: the node returns only y * 2
    graph = node.graph.graph
    out_node = next(n for n in graph.nodes if n.op == "output")
    first = out_node.args[0][0]
    out_node.args = ((first,),)
    graph.eliminate_dead_code()
    node.graph.recompile()
    node.outputs = node.outputs[:1]
    model = onnx.load(str(export_onnx(build_exportable(node, cr.two_output_bundles), tmp_path)[0]))
    (seg_node,) = _segment_nodes(model)
    assert len(seg_node.output) == 2  # the op's arity follows its signature, not the graph's uses


def test_external_data_on_request(tmp_path):
    node = cr.segment_node("obs", "onnx", n=4)
    node.backend_params = {"external_data": True}
    path, extra = export_onnx(build_exportable(node, cr.example_bundles), tmp_path)
    assert extra and all(p.is_file() for p in extra)
    onnx.checker.check_model(str(path))
    bare = onnx.load(str(path), load_external_data=False)
    bundle = next(i for i in bare.graph.initializer if i.name == _segment_nodes(bare)[0].input[-1])
    assert bundle.data_location == onnx.TensorProto.EXTERNAL
    full = onnx.load(str(path))
    init = next(i for i in full.graph.initializer if i.name == bundle.name)
    assert numpy_helper.to_array(init).tobytes() == cr.example_bundles(node.segments[0])


def test_onnxruntime_loads_segment_model_with_op_library(tmp_path):
    """ORT resolves leapp.warp::WarpSegment through libleapp_warp_ort.so (running needs a GPU)."""
    ort = pytest.importorskip("onnxruntime")
    path, _ = export_onnx(build_exportable(cr.segment_node("obs", "onnx", n=4), cr.example_bundles), tmp_path)
    library = libraries.require_library("onnx")
    options = ort.SessionOptions()
    options.register_custom_ops_library(str(library))
    try:
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as e:
        if "is not a registered function/op" in str(e):
            pytest.skip(f"{library.name} does not register {DOMAIN}::{OP_TYPE} yet: {e}")
        raise
    assert [i.name for i in session.get_inputs()] == ["x"]
    assert [o.name for o in session.get_outputs()] == ["out", "h"]


def test_without_op_library_onnxruntime_rejects_the_model(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    path, _ = export_onnx(build_exportable(cr.segment_node("obs", "onnx", n=4), cr.example_bundles), tmp_path)
    with pytest.raises(Exception, match="WarpSegment"):
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def test_pure_torch_node_exports_without_custom_domain(tmp_path):
    node = cr.mlp_node("policy", "onnx")
    path, _ = export_onnx(build_exportable(node), tmp_path)
    model = onnx.load(str(path))
    onnx.checker.check_model(model, full_check=True)
    assert not _segment_nodes(model)
    assert [i.name for i in model.graph.input] == ["obs"] and [o.name for o in model.graph.output] == ["actions"]


@settings(max_examples=6)
@given(**cr.MLP_CASES)
def test_pure_torch_mlp_onnx_matches_eager(tmp_path_factory, batch, n_in, hidden, n_out, seed, scale):
    gen = torch.Generator().manual_seed(seed)
    samples = [torch.randn(batch, n_in, generator=gen) * scale for _ in range(2)]
    node = cr.mlp_node("policy", "onnx", batch, n_in, hidden, n_out, samples=samples, seed=seed)
    folder = tmp_path_factory.mktemp("onnx")
    path, _ = export_onnx(build_exportable(node), folder)
    result = validate_node(node, "onnx", path, rtol=1e-4, atol=1e-5)
    assert result.status == "passed", result.reason
    assert result.samples == 2 and result.outputs[0].max_abs < 1e-4
    # and the runner by itself agrees
    runner = OnnxRunner(path, [IOSpec("obs", torch.float32, (batch, n_in))], [IOSpec("actions", torch.float32, (batch, n_out))], "cpu", False)
    got = runner([samples[1]])[0]
    np.testing.assert_allclose(got.numpy(), node.samples[1].outputs[0].numpy(), rtol=1e-4, atol=1e-5)


def test_constant_copied_into_memory_exports_and_runs(tmp_path):
    """A node that writes a constant into memory it does not own (as MuJoCo Warp nodes put back the world rows
    of Data) and then its input: the exported ONNX runs on ONNX Runtime equal to eager, and two exports are the
    same bytes. torch's ONNX exporter before 2.13 renamed the constant's initializer there
    (pytorch/pytorch#178868); clone_copied_constants sidesteps that."""
    import leapp

    memory, rows = torch.zeros(4, 3), torch.arange(12.0).reshape(4, 3)

    @leapp.node("put_back", export_with="onnx")
    def put_back(x):
        memory.copy_(rows)
        memory[1:].add_(x[1:])
        return memory * 2.0

    def export(folder):
        with leapp.trace("put_back", save_path=str(folder)) as session:
            for seed in range(3):
                put_back(torch.randn(4, 3, generator=torch.Generator().manual_seed(seed)))
        return session.compile(validate=True)

    report, again = export(tmp_path / "a"), export(tmp_path / "b")
    assert report.nodes[0].validation.status == "passed", str(report)
    artifact = report.nodes[0].artifact
    assert (report.path / artifact).read_bytes() == (again.path / artifact).read_bytes()  # reproducible
    import onnxruntime as ort

    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(99))
    model = ort.InferenceSession(str(report.path / report.nodes[0].artifact), providers=["CPUExecutionProvider"])
    (got,) = model.run(None, {"x": x.numpy()})
    np.testing.assert_allclose(got, put_back(x).numpy(), rtol=0, atol=0)


def test_clone_copied_constants_clones_constant_sources_only():
    from leapp._export.onnx_export import clone_copied_constants

    root = torch.nn.Module()
    root.register_buffer("rows", torch.ones(2, 3))
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    rows = graph.get_attr("rows")
    dst = graph.call_function(torch.ops.aten.zeros.default, ([2, 3],), {"dtype": torch.float32})
    from_rows = graph.call_function(torch.ops.aten.copy_.default, (dst, rows))
    from_input = graph.call_function(torch.ops.aten.copy_.default, (graph.call_function(torch.ops.aten.clone.default,
                                                                                        (dst,)), x))
    graph.output((from_rows, from_input))
    gm = torch.fx.GraphModule(root, graph)
    x_value = torch.randn(2, 3)
    before = [t.clone() for t in gm(x_value)]
    assert clone_copied_constants(gm) == 1
    assert from_rows.args[1].target is torch.ops.aten.clone.default and from_rows.args[1].args == (rows,)
    assert from_input.args[1] is x
    after = gm(x_value)
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    assert clone_copied_constants(gm) == 0  # the clone is no constant: nothing left to change
