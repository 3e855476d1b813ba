"""A session whose every artifact kind depends on N only through shapes, for the artifact-size tests.

Four nodes on one input ``x`` (float32, N): ``seg_pt2`` / ``seg_onnx`` hold a Warp segment (a scratch
``wp.empty(N)`` and two launches: ``tmp = 2x``, ``y = tmp + x``: benchmarks/replay.py's node) and
``t_pt2`` / ``t_onnx`` are pure torch (``tanh(2x + 1)``). Nothing in them is an N-sized constant, so
an export at N = 64 and one at N = 262,144 must have files of (almost) the same size.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import warp as wp

import leapp

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from replay import make_node as segment_node  # the very node benchmarks/replay.py times

NODES = ("seg_pt2", "seg_onnx", "t_pt2", "t_onnx")


def torch_node(name: str, backend: str):
    @leapp.node(name, export_with=backend)
    def node(x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x * 2.0 + 1.0)

    return node


def export(save_path: Path, n: int, device: str = "cpu", validate: bool = False, names=NODES) -> Path:
    """Traces the nodes ``names`` at size ``n`` on ``device`` (2 passes + 1 sample) and compiles
    ``<save_path>/size_<n>``."""
    wp.init()
    makers = {"seg_pt2": segment_node, "seg_onnx": segment_node, "t_pt2": torch_node, "t_onnx": torch_node}
    nodes = [makers[name](name, name.rsplit("_", 1)[1]) for name in names]
    gen = torch.Generator().manual_seed(n)
    with leapp.trace(f"size_{n}", save_path=str(save_path)) as session:
        for _ in range(3):
            x = torch.randn(n, generator=gen).to(device)
            for node in nodes:
                node(x)
    session.compile(validate=validate)
    return Path(save_path) / f"size_{n}"


def eager(x: torch.Tensor) -> dict[str, torch.Tensor]:
    """What each node computes."""
    return {"seg_pt2": 3.0 * x, "seg_onnx": 3.0 * x, "t_pt2": torch.tanh(x * 2.0 + 1.0),
            "t_onnx": torch.tanh(x * 2.0 + 1.0)}
