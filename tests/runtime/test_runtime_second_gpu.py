"""A segment traced, exported and replayed on the second GPU (cuda:1), not on cuda:0.

Runs where two GPUs are present (the lent nvidia-h200-x2 machine); elsewhere it is skipped
with the reason. Checks that capture, validation and replay follow the data's device and the
current stream of that device.
"""

from __future__ import annotations

import pytest
import torch

import leapp
from leapp import annotate

wp = pytest.importorskip("warp")

pytestmark = pytest.mark.cuda


@wp.kernel
def affine(x: wp.array(dtype=float), a: float, y: wp.array(dtype=float)):
    i = wp.tid()
    y[i] = x[i] * a + 1.0


def step(x: torch.Tensor) -> torch.Tensor:
    with leapp.node("second_gpu", export_with="pt2"):
        x = annotate.input_tensors("second_gpu", {"x": x})
        y = torch.empty_like(x)
        with annotate.warp_op():
            wp.launch(affine, dim=x.shape[0], inputs=[wp.from_torch(x), 3.0], outputs=[wp.from_torch(y)],
                      device=str(x.device))
        annotate.output_tensors("second_gpu", {"y": y})
    return y


def test_segment_on_the_second_gpu(tmp_path):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices (cuda:1)")
    wp.init()
    dev = "cuda:1"
    with leapp.trace("gpu1", save_path=str(tmp_path)) as session:
        for seed in range(3):
            step(torch.randn(1000, generator=torch.Generator().manual_seed(seed)).to(dev))
    report = session.compile(validate=True)
    assert "passed" in str(report)
    assert session.record.nodes["second_gpu"].segments[0].device == dev

    pipeline = leapp.load(str(tmp_path / "gpu1"))
    x = torch.randn(1000, device=dev)
    side = torch.cuda.Stream(device=dev)
    with torch.cuda.device(dev), torch.cuda.stream(side):  # the op must follow cuda:1's current stream
        got = pipeline(x=x)["y"]
    side.synchronize()
    assert got.device == torch.device(dev)
    torch.testing.assert_close(got, x * 3.0 + 1.0)
