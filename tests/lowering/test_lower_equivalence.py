"""Lowered ONNX equals Warp eager on the CPU for every table row, on ONNX Runtime and the ONNX reference evaluator.

Tolerance (docs/lowering.md): |lowered - warp| <= 1e-5 * (1 + |warp| * 8) elementwise in float32, since
ReduceSum may add the terms of a dot in another order than Warp's native code.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

wp = pytest.importorskip("warp")
ort = pytest.importorskip("onnxruntime")
from hypothesis import given, settings, HealthCheck  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.extra.numpy import arrays  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

from leapp.lowering import OPSET, lower_kernel  # noqa: E402
from lowering_kernels import KERNELS  # noqa: E402

WIDTH = {"float32": 1, "vec3f": 3, "quatf": 4}
WP_TYPE = {"float32": wp.float32, "vec3f": wp.vec3, "quatf": wp.quat}
RTOL, ATOL = 8e-5, 1e-5
# zeros, negatives, large magnitudes; quaternions are drawn the same way, so most are not unit length
FLOATS = st.one_of(
    st.just(0.0),
    st.floats(-4.0, 4.0, width=32),
    st.floats(-1e4, 1e4, width=32),
)


def _inputs(kinds, n, data):
    feeds = {}
    for index, kind in enumerate(kinds):
        name = f"a{index}"
        if kind == "scalar":
            feeds[name] = np.array(data.draw(FLOATS), dtype=np.float32)
        else:
            shape = (n,) if kind == "float32" else (n, WIDTH[kind])
            feeds[name] = data.draw(arrays(np.float32, shape, elements=FLOATS))
    return feeds


def _warp_eager(kernel, kinds, feeds, n):
    args = []
    for index, kind in enumerate(kinds):
        value = feeds[f"a{index}"]
        args.append(float(value) if kind == "scalar" else wp.array(value, dtype=WP_TYPE[kind], device="cpu"))
    wp.launch(kernel, dim=n, inputs=args, device="cpu")
    return {f"a{i}": a.numpy() for i, a in enumerate(args) if not isinstance(a, float)}


def _named(kernel, feeds):
    """Feeds keyed by the kernel's own parameter names."""
    names = [arg.label for arg in kernel.adj.args]
    return {names[int(k[1:])]: v for k, v in feeds.items()}, names


@pytest.fixture(scope="module")
def lowered():
    wp.init()
    return {kernel: lower_kernel(kernel) for kernel in KERNELS}


def test_every_lowered_model_passes_the_full_checker_in_the_default_domain(lowered):
    for kernel, model in lowered.items():
        onnx.checker.check_model(model, full_check=True)
        assert {o.domain for o in model.opset_import} == {""}, kernel.key
        assert model.opset_import[0].version == OPSET
        assert all(node.domain == "" for node in model.graph.node), kernel.key


@pytest.mark.parametrize("kernel", list(KERNELS), ids=lambda k: k.key)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), n=st.integers(1, 9))
def test_lowered_equals_warp_eager(lowered, kernel, data, n):
    kinds = KERNELS[kernel]
    feeds = _inputs(kinds, n, data)
    expected = _warp_eager(kernel, kinds, feeds, n)
    named, names = _named(kernel, feeds)
    model = lowered[kernel]
    outputs = [o.name for o in model.graph.output]
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for route, got in (
        ("onnxruntime", session.run(outputs, named)),
        ("reference", ReferenceEvaluator(model).run(outputs, named)),
    ):
        for name, value in zip(outputs, got):
            want = expected[f"a{names.index(name[: -len('_out')])}"]
            finite = np.isfinite(want)
            np.testing.assert_allclose(value[finite], want[finite], rtol=RTOL, atol=ATOL, err_msg=f"{route} {name}")
            assert np.array_equal(np.isfinite(value), finite), f"{route} {name}: inf/nan where Warp has none"
