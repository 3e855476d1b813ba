"""Small exports for the leapp.testing tests: a pure-torch pipeline (PT2 + ONNX, or all ONNX) and a Warp node (PT2).

The eager functions are module-level so that a test can compare an export with a slightly
changed copy of the code (``step_off``: one constant off by 0.05 in node 'post').
"""

from __future__ import annotations

from pathlib import Path

import torch
import warp as wp

import leapp
from leapp import annotate

N = 8


def _pre(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.relu(x * 2.0 + 1.0) + y


pre = leapp.node("pre", export_with="pt2")(_pre)
pre_onnx = leapp.node("pre", export_with="onnx")(_pre)  # the all-ONNX export that leapp-run runs without packages


@leapp.node("post", export_with="onnx")
def post(z: torch.Tensor) -> torch.Tensor:
    return torch.tanh(z * 0.5) * 3.0


def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return post(pre(x, y))


@leapp.node("post", export_with="onnx")
def post_off(z: torch.Tensor) -> torch.Tensor:
    return torch.tanh(z * 0.55) * 3.0  # the exported code says 0.5


def step_off(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return post_off(pre(x, y))


def onnx_step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return post(pre_onnx(x, y))


def onnx_step_off(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return post_off(pre_onnx(x, y))


def export_torch_pipeline(folder: Path, name: str = "torchpipe", fn=step) -> Path:
    """Traces ``fn`` (three passes) and exports it as ``name``: 'torchpipe' = pre.pt2 + post.onnx
    (``step``); 'onnxpipe' = pre.onnx + post.onnx (``onnx_step``)."""
    gen = torch.Generator().manual_seed(0)
    with leapp.trace(name, save_path=str(folder)) as session:
        for _ in range(3):
            fn(torch.randn(N, 3, generator=gen), torch.randn(N, 3, generator=gen))
    session.compile(validate=False)
    return folder / name


@wp.kernel
def shift(x: wp.array(dtype=float), y: wp.array(dtype=float)):
    i = wp.tid()
    y[i] = x[i] + 1.0


def warp_step(x: torch.Tensor) -> torch.Tensor:
    with leapp.node("shifted", export_with="pt2"):
        x = annotate.input_tensors("shifted", {"x": x})
        y = torch.empty_like(x)
        with annotate.warp_op():
            wp.launch(shift, dim=x.shape[0], inputs=[wp.from_torch(x)], outputs=[wp.from_torch(y)], device=str(x.device))
        annotate.output_tensors("shifted", {"y": y})
    return y


def export_warp_pipeline(folder: Path, device: str = "cpu") -> Path:
    """Traces ``warp_step`` on ``device`` and exports it as 'warppipe' (no validation: on the CPU it cannot run)."""
    gen = torch.Generator().manual_seed(0)
    with leapp.trace("warppipe", save_path=str(folder)) as session:
        for _ in range(2):
            warp_step(torch.randn(N, generator=gen).to(device))
    session.compile(validate=False)
    return folder / "warppipe"
