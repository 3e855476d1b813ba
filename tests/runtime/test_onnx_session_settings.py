"""The numeric settings of leapp.load's ONNX sessions: what eager torch computes, on the node's device."""

from __future__ import annotations

import pytest
import torch

from leapp.runtime.pipeline import cuda_ep_options, onnx_providers, torch_uses_tf32_matmul

CUDA_AND_CPU = ["CUDAExecutionProvider", "CPUExecutionProvider"]


@pytest.fixture
def tf32_matmul():
    """Sets torch's float32-matmul TF32 switch for one test and restores it after."""
    saved = torch.backends.cuda.matmul.allow_tf32

    def set_(on: bool) -> None:
        torch.backends.cuda.matmul.allow_tf32 = on

    yield set_
    torch.backends.cuda.matmul.allow_tf32 = saved


def test_cuda_sessions_follow_torchs_tf32_setting(tf32_matmul):
    tf32_matmul(False)  # torch's default: ORT's default (use_tf32=1) would differ from eager by ~5e-4
    assert not torch_uses_tf32_matmul()
    assert cuda_ep_options(torch.device("cuda:0"))["use_tf32"] == "0"
    tf32_matmul(True)  # a user who opted into TF32 gets it in the exported ONNX nodes too
    assert torch_uses_tf32_matmul()
    assert cuda_ep_options(torch.device("cuda:0"))["use_tf32"] == "1"


def test_cuda_sessions_run_on_the_nodes_device(tf32_matmul):
    tf32_matmul(False)
    assert onnx_providers(torch.device("cuda:1"), CUDA_AND_CPU) == [
        ("CUDAExecutionProvider", {"device_id": "1", "use_tf32": "0"}), "CPUExecutionProvider"]
    assert onnx_providers(torch.device("cuda"), CUDA_AND_CPU)[0][1]["device_id"] == "0"


def test_cpu_nodes_and_cpu_builds_use_the_cpu_ep():
    assert onnx_providers(torch.device("cpu"), CUDA_AND_CPU) == ["CPUExecutionProvider"]
    assert onnx_providers(torch.device("cuda:0"), ["CPUExecutionProvider"]) == ["CPUExecutionProvider"]
