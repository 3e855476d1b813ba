"""Shared by tests/state: a recurrent policy (GRU cell + last action fed back) traced and exported, and the
eager code stepping its own state."""

from __future__ import annotations

from pathlib import Path

import torch

import leapp
from leapp import annotate

OBS, HIDDEN, ACT = 4, 8, 2


class Policy(torch.nn.Module):
    """A GRU cell and a head that also reads the last action."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.cell = torch.nn.GRUCell(OBS, HIDDEN)
        self.head = torch.nn.Linear(HIDDEN + ACT, ACT)

    def forward(self, obs, h, last):
        h = self.cell(obs, h)
        return torch.tanh(self.head(torch.cat([h, last], -1))), h


class EagerLoop:
    """The user's code: ``step(obs)`` runs the node and carries the state itself."""

    def __init__(self, policy: Policy, backend: str = "onnx") -> None:
        self.policy, self.backend = policy, backend
        self.reset()

    def reset(self) -> None:
        self.h = torch.zeros(1, HIDDEN)
        self.last = torch.zeros(1, ACT)

    def step(self, obs: torch.Tensor) -> torch.Tensor:
        with leapp.node("policy", export_with=self.backend):
            obs = annotate.input_tensors("policy", {"obs": obs})
            h, last = annotate.state_tensors("policy", {"h": self.h, "last_action": self.last})
            action, h = self.policy(obs, h, last)
            self.h, self.last = annotate.update_state("policy", {"h": h, "last_action": action})
            annotate.output_tensors("policy", {"action": action})
        return action


def export_policy(tmp: Path, backend: str = "onnx", steps: int = 3, validate: bool = True) -> Path:
    """Traces ``steps`` steps of the eager loop from its reset state and exports; returns the folder."""
    loop = EagerLoop(Policy(), backend)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad(), leapp.trace("recurrent", save_path=str(tmp)) as session:
        for _ in range(steps):
            loop.step(torch.randn(1, OBS, generator=gen))
    session.compile(validate=validate)
    return Path(tmp) / "recurrent"
