"""A CPU-runnable copy of the README pipeline's shape, for the reproducible-export tests.

obs (PT2, a Warp segment), policy (an MLP whose output requires grad, as
``examples/go2_pipeline.py``'s does; PT2 here, since every ONNX export costs
seconds) and action (ONNX, a Warp segment on that output). ``export(save_path)`` traces it and compiles without validation (CPU
segments replay on CUDA only). Run in a fresh process by importing this module
(never as ``__main__``: the Warp module's name is part of the bundle).
"""

from __future__ import annotations

import torch
import warp as wp

import leapp
from leapp import annotate

N = 12
# user metadata is written to pipeline.yaml/json: byte identity covers it too
JOINTS_METADATA = {"kind": "joint_positions", "units": "rad", "names": [f"joint_{i}" for i in range(N)]}


@wp.kernel
def joint_offsets(pos: wp.array(dtype=float), rest: wp.array(dtype=float), out: wp.array(dtype=float)):
    i = wp.tid()
    out[i] = pos[i] - rest[i]


@wp.kernel
def clamp_scale(a: wp.array(dtype=float), lo: float, hi: float, factor: float, out: wp.array(dtype=float)):
    i = wp.tid()
    out[i] = wp.clamp(a[i], lo, hi) * factor


class Robot:
    def __init__(self) -> None:
        self.rest = wp.array([0.1, 0.8, -1.5] * (N // 3), dtype=float, device="cpu")
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(2 * N, 16), torch.nn.ELU(), torch.nn.Linear(16, N))

    def observe(self, joints: torch.Tensor) -> torch.Tensor:
        with leapp.node("obs", export_with="pt2"):
            joints = annotate.input_tensors("obs", {"joints": joints}, metadata={"joints": JOINTS_METADATA})
            offsets = torch.empty_like(joints)
            with annotate.warp_op():
                wp.launch(joint_offsets, dim=N, inputs=[wp.from_torch(joints), self.rest],
                          outputs=[wp.from_torch(offsets)], device="cpu")
            obs = torch.cat([offsets * 0.5, joints])
            annotate.output_tensors("obs", {"obs": obs})
        return obs

    def act(self, raw: torch.Tensor) -> torch.Tensor:
        with leapp.node("action", export_with="onnx"):
            raw = annotate.input_tensors("action", {"raw": raw})
            action = torch.empty_like(raw)
            with annotate.warp_op():
                wp.launch(clamp_scale, dim=N, inputs=[wp.from_torch(raw), -1.0, 1.0, 0.25],
                          outputs=[wp.from_torch(action)], device="cpu")
            annotate.output_tensors("action", {"action": action}, metadata={"action": {"kind": "joint_targets",
                                                                                       "rate_hz": 50.0}})
        return action

    def step(self, joints: torch.Tensor) -> torch.Tensor:
        raw = policy(self, self.observe(joints))
        assert raw.requires_grad  # the README case: the policy's output requires grad
        return self.act(raw)


@leapp.node("policy", export_with="pt2")
def policy(robot: Robot, obs: torch.Tensor) -> torch.Tensor:
    return robot.net(obs)


def export(save_path: str) -> None:
    """Trace three steps (discovery, capture, a sample) and compile ``<save_path>/go2``."""
    wp.init()
    robot = Robot()
    with leapp.trace("go2", save_path=str(save_path)) as session:
        for seed in range(3):
            robot.step(torch.randn(N, generator=torch.Generator().manual_seed(seed)))
    session.compile(validate=False)
