"""The recorder's real output goes through the exporter (CPU: structure only, validation needs CUDA)."""

from __future__ import annotations

import pytest
import torch
import yaml
from test_segments import MLP, _quat, design_step

import leapp


def test_design_example_exports(tmp_path):
    quat, joints = _quat(5), torch.randn(5, 4)
    with leapp.trace("go2", save_path=str(tmp_path)) as session:
        for _ in range(3):
            design_step(quat, joints)
    report = session.compile(validate=False)
    folder = tmp_path / "go2"
    assert (folder / "obs.pt2").is_file() and (folder / "policy.onnx").is_file()
    pipeline = yaml.safe_load((folder / "pipeline.yaml").read_text())
    assert "obs" in str(pipeline) and "policy" in str(pipeline)
    assert "obs/warp_segment_0" in str(report)


@pytest.mark.cuda
def test_design_example_exports_and_validates_on_cuda(tmp_path):
    MLP.to("cuda:0")
    try:
        quat, joints = _quat(5, device="cuda:0"), torch.randn(5, 4, device="cuda:0")
        with leapp.trace("go2", save_path=str(tmp_path)) as session:
            for _ in range(4):
                design_step(quat, joints)
        session.compile(validate=True)
    finally:
        MLP.to("cpu")
