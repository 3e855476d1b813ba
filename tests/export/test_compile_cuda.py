"""GPU: exported segment nodes == eager through the real runtime (PT2 op library, ORT op library)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import compile_records as cr
from leapp._export.compile import compile_session
from leapp._contract.records import Sample
from leapp.runtime import pipeline as rt

pytestmark = [pytest.mark.cuda, pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")]


def _backends():
    out = ["pt2"]
    try:
        import onnxscript  # noqa: F401 - torch's ONNX exporter needs it

        out.append("onnx")
    except ImportError:
        pass
    return out


@pytest.mark.parametrize("backend", ["pt2", "onnx"])
def test_segment_node_validates_and_loads(tmp_path, backend):
    if backend not in _backends():
        pytest.skip("onnxscript is not installed (torch.onnx.export(dynamo=True) needs it)")
    node = cr.segment_node("obs", backend, n=300, segments=2, device="cuda", samples=2)
    report = compile_session(cr.session(tmp_path, node), bundles=cr.example_bundles)
    entry = report["obs"]
    assert entry.status == "passed", str(report)
    assert entry.validation.samples == 2 and all(o.max_abs <= 1e-5 for o in entry.validation.outputs)

    pipe = rt.load(tmp_path / "demo")
    x = torch.randn(300, device="cuda")
    out = pipe(x=x)
    expected = cr.expected_segment_outputs(x, 2)
    torch.testing.assert_close(out["out"].to(x.device), expected[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out["h"].to(x.device), expected[1], rtol=1e-5, atol=1e-5)


@settings(max_examples=8)
@given(n=st.integers(1, 2000), segments=st.integers(1, 3), scale=st.floats(1e-3, 1e3), backend=st.sampled_from(_backends()))
def test_exported_equals_eager_property(tmp_path_factory, n, segments, scale, backend):
    node = cr.segment_node("obs", backend, n=n, segments=segments, device="cuda", samples=0)
    gen = torch.Generator(device="cuda").manual_seed(n)
    for _ in range(2):
        x = torch.randn(n, device="cuda", generator=gen) * scale
        node.samples.append(Sample([x], cr.expected_segment_outputs(x, segments)))
    report = compile_session(cr.session(tmp_path_factory.mktemp("prop"), node), rtol=1e-5, atol=1e-5, bundles=cr.example_bundles)
    assert report["obs"].status == "passed", str(report)


def test_mismatch_on_gpu_is_reported(tmp_path):
    node = cr.segment_node("obs", "pt2", n=16, device="cuda")
    node.samples[0].outputs[0] = node.samples[0].outputs[0] + 1.0
    from leapp.errors import ValidationError

    with pytest.raises(ValidationError, match=r"(?s)Model validation failed for 1 node\(s\): \['obs'\].*output 'out' differs"):
        compile_session(cr.session(tmp_path, node), bundles=cr.example_bundles)
