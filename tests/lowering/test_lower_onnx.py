"""Lowered launches exported with torch.onnx (dynamo) are standard ONNX: the full checker passes, every node is
in the default domain, and ONNX Runtime (CPU EP) and onnx.reference both equal Warp eager (lowering_harness's
tolerance)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

wp = pytest.importorskip("warp")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx.reference import ReferenceEvaluator  # noqa: E402

import lowering_harness as harness  # noqa: E402
import lowering_kernels as lk  # noqa: E402
import control_flow_kernels as cf  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning",
                                        "ignore::UserWarning")
N = 6
SPECIAL = np.array([0.0, -0.0, 1e4, -1e4, 0.5, -2.5, 3.75, -1.0], np.float32)


class _Launch(torch.nn.Module):
    def __init__(self, launch):
        super().__init__()
        self.launch = launch

    def forward(self, *arrays):
        out = self.launch(*arrays)
        return tuple(out[name] for name in self.launch.arrays)


def _feeds(kernel, dims, seed):
    rng = np.random.default_rng(seed)
    feeds = {}
    for name, kind, ndim in harness.arg_kinds(kernel):
        shape = (N, *dims.get(name, ())) + harness.element_shape(kind)
        if harness.KINDS[kind][0] == "int32":
            feeds[name] = rng.permutation(N).astype(np.int32) if name == "idx" else \
                rng.integers(-5, 6, size=shape).astype(np.int32)
        else:
            values = rng.normal(size=shape).astype(np.float32) * 3.0
            flat = values.reshape(-1)
            flat[: len(SPECIAL)] = SPECIAL[: flat.size]  # zeros, large magnitudes, exact halves
            feeds[name] = values
    return feeds


CASES = [
    (lk.k_quat, lk.CASES[lk.k_quat].dims),
    (lk.k_matrix, lk.CASES[lk.k_matrix].dims),
    (lk.k_minmax, lk.CASES[lk.k_minmax].dims),
    (lk.k_where_cast, lk.CASES[lk.k_where_cast].dims),
    (cf.k_branches, {}),
    (cf.k_loops, cf.CASES[cf.k_loops].dims),
    (cf.k_func_static, cf.CASES[cf.k_func_static].dims),
    (cf.k_gather_scatter, {}),
]


@pytest.mark.parametrize("kernel, dims", CASES, ids=[k.key for k, _ in CASES])
def test_onnx_export_is_standard_and_equals_warp_eager(kernel, dims, tmp_path):
    feeds = _feeds(kernel, dims, 0)
    launch = harness.lower(kernel, N, feeds)
    names = [name for name, _, ndim in harness.arg_kinds(kernel) if ndim]
    example = tuple(torch.from_numpy(feeds[name]) for name in names)
    path = tmp_path / f"{kernel.key}.onnx"
    torch.onnx.export(_Launch(launch), example, str(path), dynamo=True, input_names=names,
                      output_names=[f"{name}_out" for name in names])
    model = onnx.load(str(path))
    onnx.checker.check_model(model, full_check=True)
    assert {node.domain for node in model.graph.node} <= {""}, {node.domain for node in model.graph.node}
    assert {o.domain for o in model.opset_import} <= {"", "ai.onnx"}
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    reference = ReferenceEvaluator(model)
    for seed in (1, 2):
        inputs = _feeds(kernel, dims, seed)
        want = harness.warp_eager(kernel, N, inputs)
        graph_inputs = {i.name: inputs[i.name] for i in model.graph.input}
        for route, got in (("onnxruntime", session.run(None, graph_inputs)),
                           ("reference", reference.run(None, graph_inputs))):
            for name, value in zip(names, got):
                harness.assert_close(value, want[name], what=f"{kernel.key} {route} {name}")
