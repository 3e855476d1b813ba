"""A dynamic_batch node lowered: one graph with the node's symbolic batch, right at batch sizes never traced.

The node is tests/e2e/cpu_observation.py's (two launches, a scratch array, a memset and a copy); lowering
compares its capture with the probe's and writes every size as an expression of the batch (docs/lowering.md).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

wp = pytest.importorskip("warp")
ort = pytest.importorskip("onnxruntime")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))

import cpu_observation as obs  # noqa: E402

import leapp  # noqa: E402
from leapp import annotate  # noqa: E402
from leapp.errors import ExportError  # noqa: E402

pytestmark = [obs.warp_cpu, pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")]


def _export(tmp_path, backend: str) -> Path:
    node = leapp.node("obs", export_with=backend, dynamic_batch=(1, 64))(obs.observe)
    with leapp.trace("dyn", save_path=str(tmp_path)) as session:
        for seed in range(3):
            node(obs.quats(obs.BATCH, seed))
    report = session.compile(warp="lower")
    assert report["obs"].routes == {"obs/warp_segment_0": "lowered"}
    return report.path


@pytest.mark.parametrize("batch", [1, 5, 40])
def test_lowered_onnx_keeps_the_symbolic_batch(tmp_path_factory, batch):
    folder = _cached(tmp_path_factory, "onnx")
    model = onnx.load(str(folder / "obs.onnx"))
    assert all(n.domain in ("", "ai.onnx") for n in model.graph.node)
    dim = model.graph.input[0].type.tensor_type.shape.dim[0]
    assert dim.dim_param and not dim.dim_value  # the batch stays a name, as in the replayed export
    q = obs.quats(batch, 100 + batch)
    sess = ort.InferenceSession(str(folder / "obs.onnx"), providers=["CPUExecutionProvider"])
    (got,) = sess.run(None, {model.graph.input[0].name: q.numpy()})
    np.testing.assert_allclose(got, obs.observe(q).numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("batch", [1, 5, 40])
def test_lowered_pt2_keeps_the_symbolic_batch(tmp_path_factory, batch):
    folder = _cached(tmp_path_factory, "pt2")
    program = torch.export.load(str(folder / "obs.pt2"))
    assert not any("warp_segment" in str(n.target) for n in program.graph.nodes)
    q = obs.quats(batch, 200 + batch)
    out = program.module()(q)
    got = out[0] if isinstance(out, (tuple, list)) else out
    torch.testing.assert_close(got, obs.observe(q), rtol=1e-5, atol=1e-6)


_EXPORTS: dict[str, Path] = {}


def _cached(tmp_path_factory, backend: str) -> Path:
    if backend not in _EXPORTS:
        _EXPORTS[backend] = _export(tmp_path_factory.mktemp(backend), backend)
    return _EXPORTS[backend]


@wp.kernel
def first_rows(src: wp.array(dtype=float), n: int, out: wp.array(dtype=float)):
    i = wp.tid()
    total = float(0.0)
    for k in range(n):  # a loop over the batch: its trip count changes with the batch
        total += src[k]
    out[i] = total


def _summed(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    with annotate.warp_op():
        wp.launch(first_rows, dim=x.shape[0], inputs=[wp.from_torch(x), x.shape[0]], outputs=[wp.from_torch(out)],
                  device="cpu")
    return out


def test_a_loop_whose_trip_count_follows_the_batch_is_named(tmp_path):
    node = leapp.node("sum", export_with="onnx", dynamic_batch=(1, 64))(_summed)
    with leapp.trace("loop", save_path=str(tmp_path)) as session:
        for seed in range(3):
            node(torch.randn(8, generator=torch.Generator().manual_seed(seed)))
    with pytest.raises(ExportError) as info:
        session.compile(warp="lower", validate=False)
    text = str(info.value)
    assert "sum/warp_segment_0" in text and "with dynamic_batch" in text, text
