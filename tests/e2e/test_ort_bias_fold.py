"""benchmarks/ort_bias_fold.py measures what it claims: every form of the policy computes the same MLP.

The GPU timings are in docs/performance.md; here each form's ONNX model runs on ONNX Runtime's CPU
EP and is compared with a float64 reference of the same weights, so the fold (ones column, bias
rows, the carried 1) is checked wherever the suite runs.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from bench_scripts import benchmark_module
from hypothesis import given, settings
from hypothesis import strategies as st

ort = pytest.importorskip("onnxruntime")
fold = benchmark_module("ort_bias_fold")

def _run(form: str, layers, x: torch.Tensor) -> np.ndarray:
    session = ort.InferenceSession(fold.model(form, layers, x.shape[0]).SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x.numpy()})[0]


@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), rows=st.sampled_from([1, 7, 256]))
def test_every_form_computes_the_reference_mlp(seed, rows):
    layers = fold.weights(seed)
    x = torch.randn(rows, fold.SIZES[0], generator=torch.Generator().manual_seed(seed))
    want = fold.reference(layers, x).numpy()
    for form in fold.FORMS:
        got = _run(form, layers, x)
        assert got.shape == (rows, fold.SIZES[-1]), form
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=form)


def test_a_folded_model_has_no_add_and_one_matmul_per_layer():
    model = fold.model("ones-65", fold.weights(), 4)
    ops = [n.op_type for n in model.graph.node]
    assert ops == ["Pad", "MatMul", "Elu", "MatMul", "Elu", "MatMul"], ops
