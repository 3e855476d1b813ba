"""GPU: state carried through the CUDA graph paths of ``leapp.load`` (docs/state.md, "CUDA graphs").

Two PT2 nodes on cuda:0 (``pre`` scales the observation, ``policy`` is the GRU policy with its state),
so a plain call may replay one graph (``plain_call_graph``) and ``cuda_graphs=True`` the whole-pipeline
graph: the state buffers are extra inputs of the graph and the state outputs, the graph's own tensors,
are copied out after each replay. Every step must equal the eager loop, across resets.
"""

from __future__ import annotations

import pytest
import torch

import leapp
from leapp import annotate

from state_helpers import ACT, HIDDEN, OBS, Policy

pytestmark = [pytest.mark.cuda, pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")]


class TwoNodes:
    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.reset()

    def reset(self) -> None:
        self.h = torch.zeros(1, HIDDEN, device="cuda")
        self.last = torch.zeros(1, ACT, device="cuda")

    def step(self, obs: torch.Tensor) -> torch.Tensor:
        with leapp.node("pre", export_with="pt2"):
            obs = annotate.input_tensors("pre", {"obs": obs})
            scaled = annotate.output_tensors("pre", {"scaled": obs * 2.0})
        with leapp.node("policy", export_with="pt2"):
            scaled = annotate.input_tensors("policy", {"scaled": scaled})
            h, last = annotate.state_tensors("policy", {"h": self.h, "last_action": self.last})
            action, h = self.policy(scaled, h, last)
            self.h, self.last = annotate.update_state("policy", {"h": h, "last_action": action})
            annotate.output_tensors("policy", {"action": action})
        return action


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cuda_state")
    loop = TwoNodes(Policy().cuda())
    with torch.no_grad(), leapp.trace("cuda_state", save_path=str(folder)) as session:
        for i in range(3):
            loop.step(torch.randn(1, OBS, device="cuda"))
    session.compile()
    return folder / "cuda_state"


@pytest.mark.parametrize("cuda_graphs", [False, True])
def test_graph_paths_carry_the_state(exported, cuda_graphs):
    pipeline = leapp.load(exported, cuda_graphs=cuda_graphs)
    assert pipeline.state["policy/h"].device.type == "cuda"
    eager = TwoNodes(Policy().cuda())
    gen = torch.Generator(device="cuda").manual_seed(4)
    with torch.no_grad():
        for step in range(8):
            if step == 5:
                pipeline.reset()
                eager.reset()
            obs = torch.randn(1, OBS, device="cuda", generator=gen)
            torch.testing.assert_close(pipeline(obs=obs)["action"], eager.step(obs))
        torch.testing.assert_close(pipeline.state["policy/h"], eager.h)
