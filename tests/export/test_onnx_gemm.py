"""A linear layer's Gemm written as MatMul + Add (leapp/_export/onnx_gemm.py), and the session config that keeps it so."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import compile_records as cr
import leapp
from leapp._export.exportable import build_exportable
from leapp._export.onnx_export import export_onnx
from leapp._export.onnx_gemm import split_gemm_bias
from leapp.runtime.onnx_runner import CUDA_SESSION_CONFIG, session_options

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")

KEY = "optimization.disable_specified_optimizers"


def _gemm_model(m, k, n, alpha, beta, trans_a, trans_b, bias_shape, w_is_input, bias_is_input, seed):
    rng = np.random.default_rng(seed)
    a_shape = (k, m) if trans_a else (m, k)
    w = rng.standard_normal((n, k) if trans_b else (k, n)).astype(np.float32)
    bias = rng.standard_normal(bias_shape).astype(np.float32)
    inputs = [helper.make_tensor_value_info("a", TensorProto.FLOAT, a_shape)]
    initializers = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(bias, "bias")]
    if w_is_input:  # an initializer a caller may override: its transpose cannot be stored
        inputs.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, w.shape))
    if bias_is_input:
        inputs.append(helper.make_tensor_value_info("bias", TensorProto.FLOAT, bias.shape))
    node = helper.make_node("Gemm", ["a", "w", "bias"], ["y"], name="fc", alpha=alpha, beta=beta,
                            transA=trans_a, transB=trans_b)
    graph = helper.make_graph([node, helper.make_node("Relu", ["y"], ["out"])], "g", inputs,
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, (m, n))], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), rng.standard_normal(a_shape)


def _rewrite(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    irm = ir.serde.deserialize_model(model)
    count = split_gemm_bias(irm)
    out = ir.serde.serialize_model(irm)
    onnx.checker.check_model(out, full_check=True)
    return out, count


def _run(model: onnx.ModelProto, feeds: dict, keep_pairs: bool) -> np.ndarray:
    options = ort.SessionOptions()
    if keep_pairs:  # the form leapp's CUDA EP sessions run, here on the CPU EP
        options.add_session_config_entry(KEY, "MatMulAddFusion")
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


# Each way a Gemm departs from a linear layer, one at a time (None: a linear layer), so every rule is exercised
DEPARTURES = [None, "alpha", "beta", "transA", "bias (1, n)", "bias (m, n)", "scalar bias", "bias input",
              "transposed weight input"]


@settings(max_examples=60, deadline=None)
@given(m=st.integers(1, 9), k=st.integers(1, 9), n=st.integers(1, 9), departure=st.sampled_from(DEPARTURES),
       trans_b=st.integers(0, 1), w_is_input=st.booleans(), seed=st.integers(0, 10_000))
def test_rewrite_keeps_every_gemms_values_and_rewrites_only_linear_layers(m, k, n, departure, trans_b, w_is_input,
                                                                          seed):
    alpha = 0.5 if departure == "alpha" else 1.0
    beta = 2.0 if departure == "beta" else 1.0
    bias_shape = {"bias (1, n)": (1, n), "bias (m, n)": (m, n), "scalar bias": ()}.get(departure, (n,))
    if departure == "transposed weight input":
        trans_b, w_is_input = 1, True
    elif trans_b:  # a transposed weight must be a constant to be rewritten
        w_is_input = False
    bias_is_input = departure == "bias input"
    model, a = _gemm_model(m, k, n, alpha, beta, int(departure == "transA"), trans_b, bias_shape, w_is_input,
                           bias_is_input, seed)
    rewritten, count = _rewrite(model)
    linear = departure is None
    assert count == int(linear), departure
    ops = [node.op_type for node in rewritten.graph.node]
    assert ops == (["MatMul", "Add", "Relu"] if linear else ["Gemm", "Relu"])
    feeds = {"a": a.astype(np.float32)}
    if w_is_input:  # a caller's own weights: the rewritten model must use them, not the stored ones
        feeds["w"] = np.random.default_rng(seed + 1).standard_normal(
            (n, k) if trans_b else (k, n)).astype(np.float32)
    if bias_is_input:
        feeds["bias"] = np.random.default_rng(seed + 2).standard_normal(bias_shape).astype(np.float32)
    expected = _run(model, feeds, keep_pairs=False)
    np.testing.assert_allclose(_run(rewritten, feeds, keep_pairs=True), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_run(rewritten, feeds, keep_pairs=False), expected, rtol=1e-5, atol=1e-5)
    assert [o.name for o in rewritten.graph.output] == ["out"]


def test_shared_transposed_weight_is_stored_once_and_names_stay_unique():
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")
    taken = numpy_helper.from_array(np.zeros(1, np.float32), "w_transposed")  # a name the rewrite must not reuse
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["h"], name="fc1", transB=1),
             helper.make_node("Relu", ["h"], ["h_matmul"]),  # likewise
             helper.make_node("Slice", ["h_matmul", "zero", "three", "one"], ["h3"]),
             helper.make_node("Gemm", ["h3", "w", "b"], ["y"], name="fc2", transB=1),
             helper.make_node("Add", ["y", "w_transposed"], ["out"])]
    consts = [numpy_helper.from_array(np.array([v], np.int64), name) for v, name in ((0, "zero"), (3, "three"))]
    consts.append(numpy_helper.from_array(np.array([1], np.int64), "one"))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (2, 3))],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, (2, 4))],
                              [w, b, taken, *consts])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    rewritten, count = _rewrite(model)
    assert count == 2
    names = [i.name for i in rewritten.graph.initializer]
    assert "w" not in names and sum(name.startswith("w_transposed") for name in names) == 2  # the user's + one transpose
    values = [o for node in rewritten.graph.node for o in node.output]
    assert len(values) == len(set(values)) and "h_matmul" in values
    x = {"x": rng.standard_normal((2, 3)).astype(np.float32)}
    np.testing.assert_allclose(_run(rewritten, x, keep_pairs=True), _run(model, x, keep_pairs=False),
                               rtol=1e-5, atol=1e-6)


def test_exported_mlp_has_matmul_add_and_optimize_false_keeps_the_exporters_gemm(tmp_path):
    node = cr.mlp_node("policy", "onnx")
    (tmp_path / "default").mkdir()
    (tmp_path / "raw").mkdir()
    path, _ = export_onnx(build_exportable(node), tmp_path / "default")
    ops = [n.op_type for n in onnx.load(str(path)).graph.node]
    assert "Gemm" not in ops and ops.count("MatMul") == 2 and ops.count("Add") == 2, ops
    node.backend_params["optimize"] = False
    raw, _ = export_onnx(build_exportable(node), tmp_path / "raw")
    assert [n.op_type for n in onnx.load(str(raw)).graph.node].count("Gemm") == 2


def test_cuda_sessions_keep_matmul_add_pairs_and_cpu_sessions_fuse_them():
    cuda, cpu = session_options(ort, True, None), session_options(ort, False, None)
    assert cuda.get_session_config_entry(KEY) == CUDA_SESSION_CONFIG[KEY] == "MatMulAddFusion"
    with pytest.raises(Exception):  # ORT raises its own type for a missing key
        cpu.get_session_config_entry(KEY)


def _policy_net(n_in: int, n_out: int, device: str = "cpu") -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(n_in, 64), torch.nn.ELU(), torch.nn.Linear(64, n_out)).to(device).eval()


def _export_policy(folder, net: torch.nn.Module, rows: int, device: str = "cpu"):
    """Traces ``net`` as an ONNX node ``policy`` (two passes on seeded inputs), exports it without validation;
    returns the export folder."""
    @leapp.node("policy", export_with="onnx")
    def policy(obs):
        return net(obs)

    gen = torch.Generator().manual_seed(1)
    with leapp.trace("mlp", save_path=str(folder)) as session, torch.no_grad():
        for _ in range(2):
            policy(torch.randn(rows, net[0].in_features, generator=gen).to(device))
    session.compile(validate=False)
    return folder / "mlp"


def test_a_traced_onnx_policy_loads_and_equals_eager(tmp_path):
    """Through the public API: trace a Linear MLP node, export it, load it (CPU EP here) and compare."""
    net = _policy_net(6, 3)
    export = _export_policy(tmp_path, net, rows=5)
    ops = [n.op_type for n in onnx.load(str(export / "policy.onnx")).graph.node]
    assert "Gemm" not in ops and ops.count("MatMul") == 2, ops
    x = torch.randn(5, 6)
    (got,) = leapp.load(export)(obs=x).values()
    with torch.no_grad():
        torch.testing.assert_close(got, net(x), rtol=1e-5, atol=1e-6)


def test_rewritten_policy_exports_are_byte_identical(tmp_path):
    """The rewrite's names and initializers are the same on every export (two exports into two folders)."""
    net = _policy_net(6, 3)
    first, second = (_export_policy(tmp_path / name, net, rows=5) for name in ("a", "b"))
    assert (first / "policy.onnx").read_bytes() == (second / "policy.onnx").read_bytes()


@pytest.mark.cuda
def test_cuda_ep_session_runs_the_pairs_unfused_and_leapp_load_equals_eager(tmp_path):
    """On the GPU: ORT's optimized CUDA EP graph keeps MatMul + Add (no Gemm, no FusedGemm) under
    ``session_options``, and a traced CUDA policy node loaded with leapp.load equals eager."""
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip(f"onnxruntime {ort.__version__} has no CUDAExecutionProvider (onnxruntime-gpu is not installed)")
    from leapp.runtime.onnx_runner import cuda_ep_options

    net = _policy_net(15, 12, "cuda")
    export = _export_policy(tmp_path, net, rows=256, device="cuda")
    model = export / "policy.onnx"
    options = session_options(ort, True, None)
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(str(model), options,
                         providers=[("CUDAExecutionProvider", cuda_ep_options(torch.device("cuda:0")))])
    ops = [n.op_type for n in onnx.load(str(tmp_path / "optimized.onnx")).graph.node]
    assert "Gemm" not in ops and "FusedGemm" not in ops and ops.count("MatMul") == 2, ops
    pipeline = leapp.load(export)
    assert pipeline.nodes["policy"].runner.session.get_providers()[0] == "CUDAExecutionProvider"
    x = torch.randn(256, 15, device="cuda")
    for _ in range(3):  # direct, captured, replayed (the node graph)
        (got,) = pipeline(obs=x).values()
    with torch.no_grad():
        torch.testing.assert_close(got, net(x), rtol=1e-5, atol=1e-6)
