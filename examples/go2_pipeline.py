"""A legged-robot policy pipeline exported with leapp: the README's main example.

Three nodes, as a robot's inference step has them:
  obs     (PT2)   Warp kernels: projected gravity from the base quaternion, joint
                  offsets from the default pose through a scratch buffer, scaling.
  policy  (ONNX)  a small MLP.
  action  (ONNX)  a Warp clamp-and-scale kernel on the policy output.

The script traces the pipeline (two passes plus validation samples), exports it to
./exports/go2, reloads it with leapp.load and compares it with the eager result.
Without a GPU it stops after the export: Warp segments replay on CUDA only, so
validation is switched off there and the script says so.

``--warp lower`` writes every Warp segment as standard ops (ATen in obs.pt2, ONNX in action.onnx), so the
export runs without leapp; ``auto`` lowers what it can and replays the rest (docs/lowering.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import warp as wp

import leapp
from leapp import annotate
from leapp.errors import ValidationError

sys.path.insert(0, str(Path(__file__).resolve().parent))  # quiet_output.py, also when loaded by path
from quiet_output import quiet_output

NUM_JOINTS = 12
JOINTS = [f"{leg}_{part}" for leg in ("FL", "FR", "RL", "RR") for part in ("hip", "thigh", "calf")]
CONTROL_RATE_HZ = 50
# What a deployment routes robot signals by, written to pipeline.yaml (docs/pipeline-format.md, "Metadata")
INPUT_METADATA = {"quat": {"kind": "base_quat", "order": "xyzw", "frame": "world"},
                  "joints": {"kind": "joint_positions", "units": "rad", "joints": JOINTS}}
ACTION_METADATA = {"action": {"kind": "joint_position_targets", "units": "rad", "joints": JOINTS,
                              "control_rate_hz": CONTROL_RATE_HZ}}


@wp.kernel
def projected_gravity(q: wp.array(dtype=wp.quat), g: wp.vec3, out: wp.array(dtype=wp.vec3)):
    i = wp.tid()
    out[i] = wp.quat_rotate_inv(q[i], g)


@wp.kernel
def joint_offsets(pos: wp.array2d(dtype=float), rest: wp.array(dtype=float), offsets: wp.array2d(dtype=float)):
    i, j = wp.tid()
    offsets[i, j] = pos[i, j] - rest[j]


@wp.kernel
def scale(src: wp.array2d(dtype=float), factor: float, out: wp.array2d(dtype=float)):
    i, j = wp.tid()
    out[i, j] = src[i, j] * factor


@wp.kernel
def clamp_scale(a: wp.array2d(dtype=float), lo: float, hi: float, factor: float, out: wp.array2d(dtype=float)):
    i, j = wp.tid()
    out[i, j] = wp.clamp(a[i, j], lo, hi) * factor


class Policy(torch.nn.Module):
    def __init__(self, n_in: int, n_out: int):
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(n_in, 64), torch.nn.ELU(), torch.nn.Linear(64, 64), torch.nn.ELU(),
            torch.nn.Linear(64, n_out),
        )

    def forward(self, obs):
        return self.net(obs)


class Go2:
    """The robot's inference step; annotations are no-ops outside a leapp session."""

    def __init__(self, device: str, dynamic_batch: tuple[int, int] | None = None, obs_with: str = "pt2"):
        self.device = device
        self.obs_with = obs_with  # the obs node's format (tests export it as ONNX too)
        self.dynamic = dynamic_batch  # export once for every number of robots in [min, max] (docs/recorder.md 1.0)
        self.default_pose = wp.array([0.1, 0.8, -1.5] * 4, dtype=float, device=device)
        torch.manual_seed(0)
        POLICY_NET.append(Policy(3 + NUM_JOINTS, NUM_JOINTS).to(device).eval())

    def observe(self, quat: torch.Tensor, joints: torch.Tensor) -> torch.Tensor:
        with leapp.node("obs", export_with=self.obs_with, dynamic_batch=self.dynamic):
            quat, joints = annotate.input_tensors("obs", {"quat": quat, "joints": joints}, metadata=INPUT_METADATA)
            n = quat.shape[0]
            grav = torch.empty(n, 3, device=quat.device)
            joint_obs = torch.empty(n, NUM_JOINTS, device=quat.device)
            with annotate.warp_op():
                offsets = wp.empty((n, NUM_JOINTS), dtype=float, device=self.device)  # scratch
                wp.launch(projected_gravity, dim=n,
                          inputs=[wp.from_torch(quat, dtype=wp.quat), wp.vec3(0.0, 0.0, -1.0)],
                          outputs=[wp.from_torch(grav, dtype=wp.vec3)], device=self.device)
                wp.launch(joint_offsets, dim=(n, NUM_JOINTS),
                          inputs=[wp.from_torch(joints), self.default_pose], outputs=[offsets],
                          device=self.device)
                wp.launch(scale, dim=(n, NUM_JOINTS), inputs=[offsets, 0.5],
                          outputs=[wp.from_torch(joint_obs)], device=self.device)
            obs = torch.cat([grav, joint_obs], dim=-1)
            annotate.output_tensors("obs", {"obs": obs})
        return obs

    def act(self, raw: torch.Tensor) -> torch.Tensor:
        with leapp.node("action", export_with="onnx", dynamic_batch=self.dynamic):
            raw = annotate.input_tensors("action", {"raw": raw})
            action = torch.empty_like(raw)
            with annotate.warp_op():
                wp.launch(clamp_scale, dim=raw.shape, inputs=[wp.from_torch(raw), -1.0, 1.0, 0.25],
                          outputs=[wp.from_torch(action)], device=self.device)
            annotate.output_tensors("action", {"action": action}, metadata=ACTION_METADATA)
        return action

    def policy_any_batch(self, obs: torch.Tensor) -> torch.Tensor:
        with leapp.node("policy", export_with="onnx", dynamic_batch=self.dynamic):
            obs = annotate.input_tensors("policy", {"obs": obs})
            raw = POLICY_NET[-1](obs)
            annotate.output_tensors("policy", {"output": raw})
        return raw

    def step(self, quat: torch.Tensor, joints: torch.Tensor) -> torch.Tensor:
        obs = self.observe(quat, joints)
        raw = policy(obs) if self.dynamic is None else self.policy_any_batch(obs)
        return self.act(raw)


POLICY_NET: list[Policy] = []  # the trained network, as a deployment script would load it


@leapp.node("policy", export_with="onnx")
def policy(obs: torch.Tensor) -> torch.Tensor:
    return POLICY_NET[-1](obs)


def random_state(n: int, device: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    quat = torch.nn.functional.normalize(torch.randn(n, 4, generator=g), dim=-1)
    joints = torch.randn(n, NUM_JOINTS, generator=g)
    return quat.to(device), joints.to(device)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, default=64, help="robots simulated in parallel")
    parser.add_argument("--out", default="exports", help="export folder")
    parser.add_argument("--dynamic-batch", default=None, metavar="MIN,MAX",
                        help="export once for any number of robots in [MIN, MAX] (also traced at MIN and MAX)")
    parser.add_argument("--check-batches", default=None, metavar="N,N,...",
                        help="with --dynamic-batch: numbers of robots the loaded export is compared with eager at")
    parser.add_argument("--warp", choices=("replay", "lower", "auto"), default="replay",
                        help="Warp segments: replay their bundles (default), lower them to standard ops (refused "
                        "when one cannot lower), or lower what can (docs/lowering.md)")
    parser.add_argument("--verbose", action="store_true", help="also Warp's banner and torch's exporter notes")
    args = parser.parse_args(argv)
    dynamic = tuple(int(v) for v in args.dynamic_batch.split(",")) if args.dynamic_batch else None
    quiet_output(args.verbose)
    wp.init()
    gpu = torch.cuda.is_available() and wp.is_cuda_available()
    device = "cuda:0" if gpu else "cpu"
    robot = Go2(device, dynamic)
    batches = [random_state(args.envs, device, seed) for seed in range(4)]
    if dynamic is not None:  # the probe passes: the same step at the smallest and largest batch
        batches += [random_state(n, device, 10 + n % 7) for n in dynamic]

    with leapp.trace("go2", save_path=args.out) as session:
        for quat, joints in batches:  # pass 1: discovery, pass 2: capture, then validation samples
            robot.step(quat, joints)
    try:
        report = session.compile(validate=True, warp=args.warp)
    except ValidationError as e:
        # Without a GPU and without their CPU code (no C++ compiler at export: docs/export-cpu.md) the nodes
        # with Warp segments cannot be replayed ("needs-cuda"); the others were validated on the CPU. Anything
        # else is a real failure.
        if any(r.status != "needs-cuda" for r in e.results):
            raise
        print(e.report)
        need = [r.node for r in e.results]
        done = [n.node for n in e.report.nodes if n.status == "passed"]
        print(f"No CUDA device: validated {done} on the CPU; {need} have no CPU code here, replay Warp segments "
              "on CUDA only and were not validated.")
        print(f"Exported to {args.out}/go2. Run this script on a machine with an NVIDIA GPU to replay and compare.")
        if args.check_batches:
            print(f"--check-batches {args.check_batches}: not compared (the comparison replays the export, which "
                  "needs the GPU).")
        return 0
    print(report)

    pipeline = leapp.load(f"{args.out}/go2")
    quat, joints = random_state(args.envs, device, seed=123)
    eager = robot.step(quat, joints)
    # ONNX Runtime's CPU execution provider hands its outputs back on the host.
    exported = pipeline(quat=quat, joints=joints)["action"].to(eager.device)
    err = (exported - eager).abs().max().item()
    print(f"max |exported - eager| over {args.envs} robots: {err:.3e}")
    worst = err
    for n in [int(v) for v in args.check_batches.split(",")] if args.check_batches else []:
        quat, joints = random_state(n, device, seed=1000 + n)
        eager = robot.step(quat, joints)
        err = (pipeline(quat=quat, joints=joints)["action"].to(eager.device) - eager).abs().max().item()
        print(f"max |exported - eager| over {n} robots (same export): {err:.3e}")
        worst = max(worst, err)
    return 0 if worst <= 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
