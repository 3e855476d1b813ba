"""Isaac Lab 3.0's Warp-first ObservationManager, traced by leapp on the CPU.

The real manager (``isaaclab_experimental.managers.ObservationManager``) computes a concatenated policy group
from real Warp-first terms into its persistent group buffer: one ``wp.zeros((N, total))`` and, per term, a
column view ``wp.array(ptr=base_ptr + start * col_stride, strides=(row_stride, col_stride))``. The terms pass
those views to ``wp.launch`` in ``inputs=`` and the manager clips and scales them in place. The node copies
its inputs into the articulation's buffers through ``ProxyArray.torch`` (Isaac Lab's cached torch view), so
that state is traced.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.realworld
pytest.importorskip("isaaclab_experimental",
                    reason="Isaac Lab 3.0 is not installed (bash scripts/install-realworld.sh)")

import torch  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from isaaclab_experimental.envs.mdp import observations as obs  # noqa: E402
from isaaclab_experimental.managers import (  # noqa: E402
    ObservationGroupCfg,
    ObservationManager,
    ObservationTermCfg,
    SceneEntityCfg,
)
from isaaclab_standin import make_env, random_root_and_joints  # noqa: E402
from realworld_helpers import assert_graph_matches_eager, check_recording, trace_passes  # noqa: E402

import leapp  # noqa: E402
from leapp import annotate  # noqa: E402
from leapp.errors import TraceError  # noqa: E402

N = 6
JOINTS = ["hip_l", "knee_l", "hip_r", "knee_r"]
GROUP_DIM = 3 + 3 + 3 + 2 + 4 + 4  # the terms below


def _policy_group(with_last_action: bool = False) -> ObservationGroupCfg:
    """A locomotion policy group: root velocities, gravity, joint terms with a subset, a clip and a scale."""
    group = ObservationGroupCfg()
    group.base_lin_vel = ObservationTermCfg(func=obs.base_lin_vel)
    group.base_ang_vel = ObservationTermCfg(func=obs.base_ang_vel, scale=0.25)
    group.projected_gravity = ObservationTermCfg(func=obs.projected_gravity)
    group.hip_pos = ObservationTermCfg(func=obs.joint_pos_rel,
                                       params={"asset_cfg": SceneEntityCfg("robot", joint_names=["hip_.*"])})
    group.joint_pos_norm = ObservationTermCfg(func=obs.joint_pos_limit_normalized,
                                              params={"asset_cfg": SceneEntityCfg("robot")})
    group.joint_vel = ObservationTermCfg(func=obs.joint_vel, params={"asset_cfg": SceneEntityCfg("robot")},
                                         clip=(-4.0, 4.0))
    if with_last_action:
        group.actions = ObservationTermCfg(func=obs.last_action)
    return group


def make_observe(with_last_action: bool = False, n: int = N, device: str = "cpu", backend: str = "onnx"):
    """A fresh env and manager, and the node that runs the manager's policy group on given state."""
    env = make_env(n, JOINTS, num_actions=len(JOINTS), device=device)
    manager = ObservationManager({"policy": _policy_group(with_last_action)}, env)
    data = env.scene["robot"].data

    @leapp.node("policy_obs", export_with=backend)
    def observe(root_pose, root_vel, joint_pos, joint_vel):
        data.root_link_pose_w.torch.copy_(root_pose)
        data.root_com_vel_w.torch.copy_(root_vel)
        data.joint_pos.torch.copy_(joint_pos)
        data.joint_vel.torch.copy_(joint_vel)
        with annotate.warp_op():
            group = manager.compute_group("policy")
        return group.clone()

    return observe, manager


def _inputs(seed: int) -> list[torch.Tensor]:
    """Root pose, root velocity, joint positions and velocities for all envs."""
    return random_root_and_joints(N, len(JOINTS), seed)


@pytest.fixture(scope="module")
def traced():
    """The node traced over three passes with different states (discovery, capture, one sample)."""
    observe, manager = make_observe()
    return trace_passes(observe, [_inputs(seed) for seed in (1, 2, 3)]), observe, manager


def test_group_buffer_is_one_segment_output_that_follows_new_state(traced):
    """The group buffer and its column views are one region, exported as the segment's output; the recorded
    graph replays the samples and equals the eager manager on a state it was not traced with."""
    record, observe, manager = traced
    assert manager.group_obs_dim["policy"] == (GROUP_DIM,)
    (segment,) = record.nodes["policy_obs"].segments
    assert [tuple(io.spec.shape) for io in segment.outputs] == [(N, GROUP_DIM)]
    check_recording(record, "policy_obs", observe, _inputs(7))


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_graph_equals_eager_manager_on_random_states(traced, seed):
    """Hypothesis draws states; the graph (segments replayed from .wrp) equals Isaac Lab's eager manager."""
    record, observe, _ = traced
    assert_graph_matches_eager(record, "policy_obs", observe, _inputs(seed))


def test_same_inputs_every_pass():
    """recorder_helpers.trace's way, the same inputs on all three passes: the terms pass the group buffer's
    columns in ``inputs=``, so the capture pass rewriting the same bytes must still count as a write."""
    observe, _ = make_observe()
    inputs = _inputs(1)
    record = trace_passes(observe, [inputs] * 3)
    check_recording(record, "policy_obs", observe, _inputs(7))


def test_last_action_term_is_refused_on_cpu():
    """``last_action`` does ``wp.copy(out, action)`` into a strided column of the group buffer; Warp's CPU
    capture cannot record a non-contiguous copy, and leapp says so naming Isaac Lab's line."""
    observe, _ = make_observe(with_last_action=True)
    source = Path(obs.__file__).read_text().splitlines()
    line = next(i for i, text in enumerate(source, 1) if "wp.copy(out, env.action_manager.action)" in text)
    with pytest.raises(TraceError) as info:
        trace_passes(observe, [_inputs(seed) for seed in (1, 2, 3)])
    message = str(info.value)
    assert f"observations.py:{line}" in message and "non-contiguous" in message, message
    assert "policy_obs/warp_segment_0" in message, message


@pytest.mark.parametrize("backend", ["onnx", "pt2"])
def test_exported_policy_group_runs_on_the_cpu_from_its_cpu_code(tmp_path, backend):
    """The real manager's policy group exported as traced on the CPU: its segment carries Isaac Lab's Warp terms
    as CPU code (docs/export-cpu.md), validates on the CPU, and leapp.load equals the eager manager on new
    states, with no GPU."""
    import shutil

    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("needs a C++ compiler: the export compiles Warp's CPU source")
    observe, _ = make_observe(backend=backend)
    with leapp.trace("isaaclab_obs", save_path=str(tmp_path)) as session:
        for seed in (1, 2, 3):
            observe(*_inputs(seed))
    report = session.compile(validate=True)
    assert report["policy_obs"].status == "passed", str(report)
    pipeline = leapp.load(tmp_path / "isaaclab_obs")
    names = ("root_pose", "root_vel", "joint_pos", "joint_vel")
    for seed in (11, 12):
        inputs = _inputs(seed)
        (got,) = pipeline(**dict(zip(names, inputs))).values()
        torch.testing.assert_close(got, observe(*inputs), rtol=1e-5, atol=1e-6)
