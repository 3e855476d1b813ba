"""Isaac Lab 3.0's Warp-first JointPositionAction, traced by leapp on the CPU.

The path Isaac Lab's action manager takes each step: ``process_actions`` (scale, default-position offset and
per-joint clip into the term's persistent raw/processed buffers, passed to ``wp.launch`` in ``inputs=``), then
``apply_actions`` (``set_joint_position_target_index`` -> the actuator collection's ``ActuatorTargetCommand``
writes the articulation's persistent position-target buffer with an indexed kernel).
"""

from __future__ import annotations


import pytest

pytestmark = [
    pytest.mark.realworld,
    pytest.mark.filterwarnings("ignore:Articulation.set_joint_position_target_index is deprecated"),
]
pytest.importorskip("isaaclab_experimental",
                    reason="Isaac Lab 3.0 is not installed (bash scripts/install-realworld.sh)")

import torch  # noqa: E402
import warp as wp  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from isaaclab_experimental.envs.mdp.actions import JointPositionAction, JointPositionActionCfg  # noqa: E402
from isaaclab_standin import make_env  # noqa: E402
from realworld_helpers import assert_graph_matches_eager, check_recording, trace_passes  # noqa: E402

import leapp  # noqa: E402
from leapp import annotate  # noqa: E402

N = 5
JOINTS = ["hip_l", "knee_l", "hip_r", "knee_r"]
SCALE = 0.5
HIP_CLIP = (-0.4, 0.4)


def make_apply(joint_names=(".*",), device: str = "cpu"):
    """A fresh env on ``device`` and JointPositionAction, and the node that processes and applies one action
    batch."""
    env = make_env(N, JOINTS, num_actions=len(JOINTS), device=device)
    robot = env.scene["robot"]
    cfg = JointPositionActionCfg(asset_name="robot", joint_names=list(joint_names), scale=SCALE,
                                 use_default_offset=True, clip={"hip_.*": HIP_CLIP})
    term = JointPositionAction(cfg, env)

    @leapp.node("joint_targets")
    def apply(actions):
        with annotate.warp_op():
            term.process_actions(wp.from_torch(actions))
            term.apply_actions()
        return robot.actuators.target_command.position.torch.clone(), wp.to_torch(term.processed_actions).clone()

    return apply, term, robot


def _actions(seed: int, dim: int = len(JOINTS)) -> torch.Tensor:
    """Policy actions, wide enough that the hip clip is active for some envs."""
    return 2.0 * torch.randn(N, dim, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def traced():
    """The node traced over three passes with different actions (discovery, capture, one sample)."""
    apply, term, robot = make_apply()
    return trace_passes(apply, [[_actions(seed)] for seed in (1, 2, 3)]), apply, robot


def test_targets_follow_new_actions(traced):
    """The recorded graph replays its samples and equals the eager term on actions it was not traced with;
    eager itself is Isaac Lab's affine map: clip(scale * a + default joint pos) on the hips."""
    record, apply, robot = traced
    actions = _actions(7)
    check_recording(record, "joint_targets", apply, [actions])
    target, processed = apply(actions)
    expected = SCALE * actions + robot.data.default_joint_pos.torch
    hips = [i for i, name in enumerate(JOINTS) if name.startswith("hip_")]
    expected[:, hips] = expected[:, hips].clamp(*HIP_CLIP)
    torch.testing.assert_close(processed, expected)
    torch.testing.assert_close(target, expected)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_graph_equals_eager_on_random_actions(traced, seed):
    record, apply, _ = traced
    assert_graph_matches_eager(record, "joint_targets", apply, [_actions(seed)])


def test_same_actions_every_pass():
    """recorder_helpers.trace's way, the same actions on all three passes: ``process_actions`` passes the
    processed buffer in ``inputs=``, so it must be the segment's output even when the capture pass rewrites
    the bytes it already held (else it is baked and new actions return the traced ones)."""
    apply, _, _ = make_apply()
    record = trace_passes(apply, [[_actions(1)]] * 3)
    check_recording(record, "joint_targets", apply, [_actions(7)])


def test_partial_joint_command_keeps_the_other_targets_of_the_trace():
    """Commanding the hips only writes part of the persistent position-target buffer: the hips' targets follow
    the actions, the knees' targets (bytes no kernel of the node writes) keep their trace values, and the
    constants report says so."""
    apply, term, _ = make_apply(joint_names=("hip_.*",))
    assert term.action_dim == 2
    with leapp.trace("partial") as session:
        for seed in (1, 2, 3):
            apply(_actions(seed, dim=2))
    assert any("bytes it never writes keep their trace values" in line for line in session.constants_report)
    check_recording(session.record, "joint_targets", apply, [_actions(7, dim=2)])
