"""Isaac Lab 3.0's Warp-first ObservationManager, traced by leapp on the CPU.

The real manager (``isaaclab_experimental.managers.ObservationManager``) computes a concatenated policy group
from real Warp-first terms into its persistent group buffer: one ``wp.zeros((N, total))`` and, per term, a
column view ``wp.array(ptr=base_ptr + start * col_stride, strides=(row_stride, col_stride))``. The terms pass
those views to ``wp.launch`` in ``inputs=`` and the manager clips and scales them in place. The node copies
its inputs into the articulation's buffers through ``ProxyArray.torch`` (Isaac Lab's cached torch view), so
that state is traced.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.realworld
pytest.importorskip("isaaclab_experimental",
                    reason="Isaac Lab 3.0 is not installed (bash scripts/install-realworld.sh)")

import torch  # noqa: E402
import warp as wp  # noqa: E402
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

N = 6
JOINTS = ["hip_l", "knee_l", "hip_r", "knee_r"]
GROUP_DIM = 3 + 3 + 3 + 2 + 4 + 4  # the terms below
LOCOMOTION_DIM = 3 + 3 + 3 + 3 + 3 * len(JOINTS)  # velocities, gravity, command, joint pos/vel, action


def _policy_group(locomotion: bool = False) -> ObservationGroupCfg:
    """A policy group: root velocities, gravity, joint terms with a subset, a clip and a scale; or, with
    ``locomotion``, Isaac Lab's velocity-locomotion policy group as deployed (``isaaclab_tasks``' ``PolicyCfg``
    on flat ground, without the training noise): its ``velocity_commands`` and ``actions`` terms are
    ``wp.copy`` into column views of the group buffer."""
    group = ObservationGroupCfg()
    group.base_lin_vel = ObservationTermCfg(func=obs.base_lin_vel)
    group.base_ang_vel = ObservationTermCfg(func=obs.base_ang_vel, scale=None if locomotion else 0.25)
    group.projected_gravity = ObservationTermCfg(func=obs.projected_gravity)
    if locomotion:
        group.velocity_commands = ObservationTermCfg(func=obs.generated_commands,
                                                     params={"command_name": "base_velocity"})
        group.joint_pos = ObservationTermCfg(func=obs.joint_pos_rel)
        group.joint_vel = ObservationTermCfg(func=obs.joint_vel_rel)
        group.actions = ObservationTermCfg(func=obs.last_action)
        return group
    group.hip_pos = ObservationTermCfg(func=obs.joint_pos_rel,
                                       params={"asset_cfg": SceneEntityCfg("robot", joint_names=["hip_.*"])})
    group.joint_pos_norm = ObservationTermCfg(func=obs.joint_pos_limit_normalized,
                                              params={"asset_cfg": SceneEntityCfg("robot")})
    group.joint_vel = ObservationTermCfg(func=obs.joint_vel, params={"asset_cfg": SceneEntityCfg("robot")},
                                         clip=(-4.0, 4.0))
    return group


def make_observe(locomotion: bool = False, n: int = N, device: str = "cpu", backend: str = "onnx"):
    """A fresh env and manager, and the node that runs the manager's policy group on given state (with
    ``locomotion`` also on the velocity command and the last action)."""
    env = make_env(n, JOINTS, num_actions=len(JOINTS), device=device)
    manager = ObservationManager({"policy": _policy_group(locomotion)}, env)
    data = env.scene["robot"].data

    def state_in(root_pose, root_vel, joint_pos, joint_vel):
        data.root_link_pose_w.torch.copy_(root_pose)
        data.root_com_vel_w.torch.copy_(root_vel)
        data.joint_pos.torch.copy_(joint_pos)
        data.joint_vel.torch.copy_(joint_vel)

    if locomotion:
        @leapp.node("policy_obs", export_with=backend)
        def observe(root_pose, root_vel, joint_pos, joint_vel, command, action):
            state_in(root_pose, root_vel, joint_pos, joint_vel)
            env.command_manager.get_command("base_velocity").copy_(command)
            wp.to_torch(env.action_manager.action).copy_(action)
            # generated_commands caches the first env's command on the function itself; these tests build
            # several envs in one process, so each call views this env's command again (as its first call does)
            obs.generated_commands._is_warmed_up = False
            with annotate.warp_op():
                group = manager.compute_group("policy")
            return group.clone()

        return observe, manager

    @leapp.node("policy_obs", export_with=backend)
    def observe(root_pose, root_vel, joint_pos, joint_vel):
        state_in(root_pose, root_vel, joint_pos, joint_vel)
        with annotate.warp_op():
            group = manager.compute_group("policy")
        return group.clone()

    return observe, manager


def _inputs(seed: int, locomotion: bool = False) -> list[torch.Tensor]:
    """Root pose, root velocity, joint positions and velocities for all envs; with ``locomotion`` also the
    velocity command (N, 3) and the last action (N, J)."""
    state = random_root_and_joints(N, len(JOINTS), seed)
    if not locomotion:
        return state
    g = torch.Generator().manual_seed(seed + 7919)
    return [*state, torch.randn(N, 3, generator=g), torch.randn(N, len(JOINTS), generator=g)]


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


# ---- Isaac Lab's velocity-locomotion policy group: generated_commands and last_action are strided wp.copy calls


@pytest.fixture(scope="module")
def locomotion():
    """The full locomotion policy group traced on the CPU over three passes with different states."""
    observe, manager = make_observe(locomotion=True)
    return trace_passes(observe, [_inputs(seed, True) for seed in (1, 2, 3)]), observe, manager


def test_locomotion_group_records_its_copies_as_launches(locomotion):
    """The command and last-action terms copy into column views of the persistent group buffer: Warp's CPU
    capture refuses such a copy, leapp records it as its copy kernel; the graph equals the eager manager on a
    state it was not traced with."""
    record, observe, manager = locomotion
    assert manager.group_obs_dim["policy"] == (LOCOMOTION_DIM,)
    (segment,) = record.nodes["policy_obs"].segments
    copies = [op for op in segment.captured_ops if op.startswith("launch:leapp_strided_copy_2d")]
    assert len(copies) == 2, segment.captured_ops
    assert [tuple(io.spec.shape) for io in segment.outputs] == [(N, LOCOMOTION_DIM)]
    check_recording(record, "policy_obs", observe, _inputs(7, True))


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_locomotion_graph_equals_eager_manager_on_random_states(locomotion, seed):
    record, observe, _ = locomotion
    assert_graph_matches_eager(record, "policy_obs", observe, _inputs(seed, True))


@pytest.fixture(scope="module", params=["onnx", "pt2"])
def locomotion_export(request, tmp_path_factory):
    """The locomotion group exported as traced on the CPU, validated, and loaded."""
    import shutil

    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("needs a C++ compiler: the export compiles Warp's CPU source")
    folder = tmp_path_factory.mktemp(f"locomotion_{request.param}")
    observe, _ = make_observe(locomotion=True, backend=request.param)
    with leapp.trace("locomotion_obs", save_path=str(folder)) as session:
        for seed in (1, 2, 3):
            observe(*_inputs(seed, True))
    report = session.compile(validate=True)
    return report, leapp.load(folder / "locomotion_obs"), observe


def test_locomotion_export_validates_on_the_cpu(locomotion_export):
    report, pipeline, _ = locomotion_export
    assert report["policy_obs"].status == "passed", str(report)
    assert list(pipeline.inputs) == ["root_pose", "root_vel", "joint_pos", "joint_vel", "command", "action"]


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_locomotion_export_equals_eager_manager_on_random_states(locomotion_export, seed):
    """Hypothesis over the state (root, joints, command, last action): the loaded export (PT2 or ONNX, from its
    CPU code) equals Isaac Lab's eager manager; the copied columns bit for bit."""
    _, pipeline, observe = locomotion_export
    inputs = _inputs(seed, True)
    (got,) = pipeline(**dict(zip(pipeline.inputs, inputs))).values()
    want = observe(*inputs)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert torch.equal(got[:, 9:12], inputs[4]) and torch.equal(got[:, -len(JOINTS):], inputs[5])
