"""The pipelines the LEAPP-bundle tests export: eager functions that are also their own reference."""

from __future__ import annotations

import torch

import leapp
from leapp import annotate

JOINTS = {"kind": "state/joint/position", "element_names": ["hip", "knee"], "units": "rad"}
ACTION = {"kind": "target/joint/position", "element_names": [["a0", "a1", "a2"]]}
GEN = torch.Generator().manual_seed(7)
W1, W2 = torch.randn(6, 8, generator=GEN) * 0.4, torch.randn(8, 3, generator=GEN) * 0.4
WX, WH, WO = torch.randn(5, 4, generator=GEN) * 0.5, torch.randn(4, 4, generator=GEN) * 0.5, torch.randn(4, 2, generator=GEN)
B = 2


def obs_act(quat: torch.Tensor, joints: torch.Tensor) -> torch.Tensor:
    """obs (ONNX) -> act (PT2): a stateless pipeline with metadata on both ends."""
    with leapp.node("obs", export_with="onnx"):
        q, j = annotate.input_tensors("obs", {"quat": quat, "joints": joints}, metadata={"joints": JOINTS})
        obs = annotate.output_tensors("obs", {"obs": torch.cat([q * 0.5, j], dim=-1)})
    with leapp.node("act", export_with="pt2"):
        o = annotate.input_tensors("act", {"obs": obs})
        action = annotate.output_tensors("act", {"action": torch.tanh(torch.relu(o @ W1) @ W2)},
                                         metadata={"action": ACTION})
    return action


def record_obs_act(save_path, name="robot", **compile_options):
    with leapp.trace(name, save_path=str(save_path)) as session, torch.no_grad():
        for seed in range(3):
            g = torch.Generator().manual_seed(seed)
            obs_act(torch.randn(B, 4, generator=g), torch.randn(B, 2, generator=g))
    session.compile(validate=False, **compile_options)
    return save_path / name


H0, LAST0 = torch.full((B, 4), 0.1), torch.full((B, 2), -0.2)  # non-zero: the client must load them


def recurrent(obs: torch.Tensor, h: torch.Tensor, last: torch.Tensor, backend: str) -> tuple:
    """A recurrent policy with its last action fed back: (h, last) is the state; returns (action, h, last)."""
    with leapp.node("policy", export_with=backend):
        o = annotate.input_tensors("policy", {"obs": obs})
        h, last = annotate.state_tensors("policy", {"h": h, "last_action": last})
        h = torch.tanh(torch.cat([o, last], dim=-1) @ WX + h @ WH)
        action = torch.tanh(h @ WO)
        annotate.update_state("policy", {"h": h, "last_action": action * 1.0})
        annotate.output_tensors("policy", {"action": action}, metadata={"action": {"kind": "target/joint/position"}})
    return action, h, action * 1.0


def record_recurrent(save_path, backend: str, name="rnn"):
    h, last = H0, LAST0
    with leapp.trace(name, save_path=str(save_path)) as session, torch.no_grad():
        for seed in range(3):
            _, h, last = recurrent(torch.randn(B, 3, generator=torch.Generator().manual_seed(seed)), h, last, backend)
    session.compile(validate=False, leapp_bundle=True)
    return save_path / name
