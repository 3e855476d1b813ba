"""A recurrent legged-robot policy with state: a GRU's hidden state and the last action, carried by the runtime.

Two ONNX nodes, plain torch on the CPU:
  obs     projected gravity from the base quaternion, joint offsets from the default pose.
  policy  a GRU cell and a linear head. Its observation ends with the action of the previous
          step, and the GRU's hidden state is carried from step to step: both are state
          (annotate.state_tensors / annotate.update_state), so the export takes only the robot's
          quat and joints, and every runtime (leapp.load, leapp-run, the ROS 2 node) feeds the
          state back itself, from the initial values recorded at the first traced call (zeros).

The script traces a few steps, exports to ./exports/recurrent_policy (with recurrent_policy.yaml,
the LEAPP bundle other tools read), validates every node, reloads the export with leapp.load and
runs a short episode next to the eager policy: each step's action must equal eager's, then after
reset() the first step again. `leapp-run exports/recurrent_policy --describe` lists the state.
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

# the robot (its joints, default pose and metadata) and its observation are cpu_policy.py's
from cpu_policy import (
    ACTION_METADATA,
    DEFAULT_POSE,
    INPUT_METADATA,
    JOINTS,
    NUM_JOINTS,
    projected_gravity,
    random_state,
)

NAME = "recurrent_policy"
HIDDEN = 32
STATE_METADATA = {"last_action": {"kind": "joint_position_targets", "units": "rad", "joints": JOINTS}}


class RecurrentPolicy(torch.nn.Module):
    """A GRU cell over (gravity, joint offsets, last action), a linear head to joint targets.

    ``h`` and ``last_action`` are the eager code's state: ``step`` reads and replaces them, ``reset``
    zeroes them (a new episode), which is the export's initial value as well.
    """

    def __init__(self, envs: int = 1):
        super().__init__()
        torch.manual_seed(0)
        self.gru = torch.nn.GRUCell(3 + 2 * NUM_JOINTS, HIDDEN)
        self.head = torch.nn.Linear(HIDDEN, NUM_JOINTS)
        self.envs = envs
        self.reset()

    def reset(self) -> None:
        self.h = torch.zeros(self.envs, HIDDEN)
        self.last_action = torch.zeros(self.envs, NUM_JOINTS)

    def step(self, quat: torch.Tensor, joints: torch.Tensor) -> torch.Tensor:
        """The robot's inference step; annotations are no-ops outside a leapp session."""
        with leapp.node("obs", export_with="onnx"):
            quat, joints = annotate.input_tensors("obs", {"quat": quat, "joints": joints}, metadata=INPUT_METADATA)
            obs = torch.cat([projected_gravity(quat), (joints - DEFAULT_POSE) * 0.5], dim=-1)
            annotate.output_tensors("obs", {"obs": obs})
        with leapp.node("policy", export_with="onnx"):
            obs = annotate.input_tensors("policy", {"obs": obs})
            h, last_action = annotate.state_tensors("policy", {"h": self.h, "last_action": self.last_action},
                                                    metadata=STATE_METADATA)
            h = self.gru(torch.cat([obs, last_action], dim=-1), h)
            action = torch.tanh(self.head(h)) * 0.25
            self.h, self.last_action = annotate.update_state("policy", {"h": h, "last_action": action})
            annotate.output_tensors("policy", {"action": action}, metadata=ACTION_METADATA)
        return action


def export(policy: RecurrentPolicy, out: str, steps: int = 4) -> str:
    """Traces ``steps`` steps from the reset state (the first one's state is the initial value) and compiles,
    with a LEAPP bundle for the existing tool's InferenceManager (docs/leapp-bundle.md); returns the report."""
    policy.reset()
    with leapp.trace(NAME, save_path=out) as session, torch.no_grad():
        for seed in range(steps):  # pass 1: discovery, pass 2: capture, then validation samples
            policy.step(*random_state(policy.envs, seed))
    return str(session.compile(validate=True, leapp_bundle=True))


def episode(policy: RecurrentPolicy, pipeline, steps: int, seed: int = 100) -> list[float]:
    """Both reset, then ``steps`` steps on the same random observations: max |exported - eager| per step."""
    policy.reset()
    pipeline.reset()
    errors = []
    with torch.no_grad():
        for i in range(steps):
            quat, joints = random_state(policy.envs, seed + i)
            eager = policy.step(quat, joints)
            errors.append((pipeline(quat=quat, joints=joints)["action"] - eager).abs().max().item())
    return errors


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, default=1, help="robots per step (one robot on the robot)")
    parser.add_argument("--steps", type=int, default=8, help="steps of the episode compared with eager")
    parser.add_argument("--out", default="exports", help="export folder")
    parser.add_argument("--verbose", action="store_true", help="also torch's exporter notes")
    args = parser.parse_args(argv)
    quiet_output(args.verbose)

    policy = RecurrentPolicy(args.envs).eval()
    print(export(policy, args.out))

    pipeline = leapp.load(f"{args.out}/{NAME}")
    for key, spec in pipeline.state_specs.items():
        print(f"state {key}: {spec.describe()}")
    errors = episode(policy, pipeline, args.steps)
    print(f"max |exported - eager| over {args.steps} steps with state: {max(errors):.3e}")
    again = episode(policy, pipeline, 1)  # reset() starts a new episode from the initial values
    print(f"max |exported - eager| at the first step after reset(): {again[0]:.3e}")
    return 0 if max(errors + again) <= 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main())
