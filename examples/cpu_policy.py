"""A legged-robot policy pipeline for a robot without a GPU: the C++ controller's CPU example.

The same step as go2_pipeline.py, written in torch instead of Warp kernels, because
exported Warp segments replay on CUDA devices only (docs/portability.md):
  obs     (ONNX)  projected gravity from the base quaternion, joint offsets from the
                  default pose, scaling.
  policy  (ONNX)  a small MLP.
  action  (ONNX)  clamp and scale of the policy output.

The script traces the pipeline on the CPU, exports it to ./exports/go2_cpu, validates
every node there (no GPU needed), reloads it with leapp.load and compares it with the
eager result. examples/cpp runs the export with `--device cpu` (its README).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

import leapp
from leapp import annotate

sys.path.insert(0, str(Path(__file__).resolve().parent))  # quiet_output.py, also when loaded by path
from quiet_output import quiet_output

NUM_JOINTS = 12
JOINTS = [f"{leg}_{part}" for leg in ("FL", "FR", "RL", "RR") for part in ("hip", "thigh", "calf")]
DEFAULT_POSE = torch.tensor([0.1, 0.8, -1.5] * 4)
INPUT_METADATA = {"quat": {"kind": "base_quat", "order": "xyzw", "frame": "world"},
                  "joints": {"kind": "joint_positions", "units": "rad", "joints": JOINTS}}
ACTION_METADATA = {"action": {"kind": "joint_position_targets", "units": "rad", "joints": JOINTS,
                              "control_rate_hz": 50}}


def projected_gravity(quat: torch.Tensor) -> torch.Tensor:
    """World gravity (0, 0, -1) in the base frame: the inverse rotation of an xyzw quaternion."""
    xyz, w = quat[:, :3], quat[:, 3:]
    g = torch.tensor([0.0, 0.0, -1.0]).expand_as(xyz)
    t = 2.0 * torch.linalg.cross(xyz, g, dim=-1)
    return g - w * t + torch.linalg.cross(xyz, t, dim=-1)


class Policy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(3 + NUM_JOINTS, 64), torch.nn.ELU(),
                                       torch.nn.Linear(64, NUM_JOINTS))

    def forward(self, obs):
        return self.net(obs)


POLICY = Policy().eval()


def step(quat: torch.Tensor, joints: torch.Tensor) -> torch.Tensor:
    """The robot's inference step; annotations are no-ops outside a leapp session."""
    with leapp.node("obs", export_with="onnx"):
        quat, joints = annotate.input_tensors("obs", {"quat": quat, "joints": joints}, metadata=INPUT_METADATA)
        obs = torch.cat([projected_gravity(quat), (joints - DEFAULT_POSE) * 0.5], dim=-1)
        annotate.output_tensors("obs", {"obs": obs})
    with leapp.node("policy", export_with="onnx"):
        obs = annotate.input_tensors("policy", {"obs": obs})
        raw = POLICY(obs)
        annotate.output_tensors("policy", {"raw": raw})
    with leapp.node("action", export_with="onnx"):
        raw = annotate.input_tensors("action", {"raw": raw})
        action = torch.clamp(raw, -1.0, 1.0) * 0.25
        annotate.output_tensors("action", {"action": action}, metadata=ACTION_METADATA)
    return action


def random_state(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.nn.functional.normalize(torch.randn(n, 4, generator=g), dim=-1), torch.randn(n, NUM_JOINTS, generator=g)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, default=1, help="robots per step (one robot on the robot)")
    parser.add_argument("--out", default="exports", help="export folder")
    parser.add_argument("--verbose", action="store_true", help="also torch's exporter notes")
    args = parser.parse_args(argv)
    quiet_output(args.verbose)

    with leapp.trace("go2_cpu", save_path=args.out) as session, torch.no_grad():
        for seed in range(4):  # pass 1: discovery, pass 2: capture, then validation samples
            step(*random_state(args.envs, seed))
    print(session.compile(validate=True))

    pipeline = leapp.load(f"{args.out}/go2_cpu")
    quat, joints = random_state(args.envs, seed=123)
    with torch.no_grad():
        eager = step(quat, joints)
    err = (pipeline(quat=quat, joints=joints)["action"] - eager).abs().max().item()
    print(f"max |exported - eager| over {args.envs} robot(s): {err:.3e}")
    return 0 if err <= 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main())
