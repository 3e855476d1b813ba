"""The smallest Isaac Lab environment the Warp-first MDP terms and managers accept, without Isaac Sim or Newton.

Isaac Lab's own code does the work: the managers, terms and kernels, ``SceneEntityCfg.resolve``, the
``ActuatorCollection`` command buffers and ``ActuatorTargetCommand`` write path, ``BaseArticulation``'s
``set_joint_position_target_index`` and ``AssetBase``'s shape checks. Only what Newton or Isaac Sim would
provide is stood in for: an articulation whose ``data`` holds ``ProxyArray``-wrapped ``wp.array`` buffers in
``isaaclab_newton``'s ``ArticulationData`` layouts (one ``transformf`` root pose and ``spatial_vectorf`` root
velocity per env, per-env gravity in m/s^2 like Newton's ``model.gravity``, ``(num_envs, num_joints)``
float32 joint state), and the env/scene/sim attributes the managers read.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch
import warp as wp
from isaaclab.actuators.actuator_collection import ActuatorCollection, ActuatorTargetCommand
from isaaclab.actuators.actuator_control import ArticulationActuatorControl
from isaaclab.assets import ArticulationCfg
from isaaclab.assets.articulation.base_articulation import BaseArticulation
from isaaclab.assets.asset_base import AssetBase
from isaaclab.utils import string as string_utils
from isaaclab.utils.warp.proxy_array import ProxyArray

__all__ = ["StandInArticulationData", "StandInArticulation", "StandInCommandManager", "make_env",
           "random_root_and_joints"]


def _proxy(values: np.ndarray, dtype, device: str) -> ProxyArray:
    return ProxyArray(wp.array(values.astype(np.float32), dtype=dtype, device=device))


class StandInArticulationData:
    """The buffers ``ArticulationData`` exposes that the terms read, as ``ProxyArray``s in its layouts."""

    def __init__(self, num_envs: int, num_joints: int, device: str) -> None:
        n, j = num_envs, num_joints
        pose = np.zeros((n, 7), np.float32)
        pose[:, 6] = 1.0  # identity quaternion, (x, y, z, w) as in Isaac Lab 3
        self.root_link_pose_w = _proxy(pose, wp.transformf, device)
        self.root_com_vel_w = _proxy(np.zeros((n, 6)), wp.spatial_vectorf, device)
        self.GRAVITY_VEC_W = _proxy(np.tile([0.0, 0.0, -9.81], (n, 1)), wp.vec3f, device)
        self.joint_pos = _proxy(np.zeros((n, j)), wp.float32, device)
        self.joint_vel = _proxy(np.zeros((n, j)), wp.float32, device)
        self.default_joint_pos = _proxy(np.tile(np.linspace(-0.4, 0.4, j), (n, 1)), wp.float32, device)
        self.default_joint_vel = _proxy(np.zeros((n, j)), wp.float32, device)
        limits = np.tile(np.array([[-1.5, 1.5]], np.float32), (n, j, 1))
        self.soft_joint_pos_limits = _proxy(limits, wp.vec2f, device)


class _Control(ArticulationActuatorControl):
    """Isaac Lab's articulation actuator control; submitting to a backend is out of scope here."""

    def submit_commands(self, collection) -> None:
        raise NotImplementedError("no simulation backend in these tests")


class StandInArticulation:
    """An articulation as the terms and the actuator write path see it (Newton's index resolution)."""

    _DTYPE_TO_TORCH_TRAILING_DIMS = AssetBase._DTYPE_TO_TORCH_TRAILING_DIMS
    _SHAPE_AXIS_LIMITS = AssetBase._SHAPE_AXIS_LIMITS
    assert_shape_and_dtype = AssetBase.assert_shape_and_dtype
    set_joint_position_target_index = BaseArticulation.set_joint_position_target_index

    def __init__(self, num_envs: int, joint_names: list[str], device: str) -> None:
        self.cfg = ArticulationCfg()
        self.device = device
        self.num_instances = num_envs
        self.joint_names = list(joint_names)
        self.num_joints = len(joint_names)
        self.body_names = ["base"]
        self.num_bodies = 1
        self._check_shapes = True
        self._ALL_INDICES = wp.array(np.arange(num_envs, dtype=np.int32), device=device)
        self._ALL_JOINT_INDICES = wp.array(np.arange(self.num_joints, dtype=np.int32), device=device)
        self.data = StandInArticulationData(num_envs, self.num_joints, device)
        # The collection's command buffers and write path, without actuator groups (those need a solver).
        actuators = object.__new__(ActuatorCollection)
        actuators._control = _Control(self)
        actuators._allocate_buffers()
        actuators._target_command = ActuatorTargetCommand(actuators)
        self.actuators = actuators

    def find_joints(self, name_keys, joint_subset=None, preserve_order: bool = False):
        return string_utils.resolve_matching_names(name_keys, self.joint_names, preserve_order)

    def find_bodies(self, name_keys, preserve_order: bool = False):
        return string_utils.resolve_matching_names(name_keys, self.body_names, preserve_order)

    def _resolve_env_ids(self, env_ids):
        if env_ids is None or env_ids == slice(None):
            return self._ALL_INDICES
        return wp.array(env_ids, dtype=wp.int32, device=self.device) if isinstance(env_ids, list) else env_ids

    def _resolve_joint_ids(self, joint_ids):
        if isinstance(joint_ids, list):
            return wp.array(joint_ids, dtype=wp.int32, device=self.device)
        return self._ALL_JOINT_INDICES if joint_ids is None or joint_ids == slice(None) else joint_ids


class _Scene(dict):
    """``env.scene``: entities by name, plus the device ``SceneEntityCfg.resolve`` allocates on."""

    def __init__(self, device: str, **entities) -> None:
        super().__init__(**entities)
        self.device = device


class StandInCommandManager:
    """``env.command_manager``: one persistent ``(num_envs, 3)`` torch tensor per command name, as Isaac Lab's
    velocity command term keeps ``vel_command_b`` (the ``generated_commands`` term views it with ``wp.from_torch``)."""

    def __init__(self, num_envs: int, device: str, names=("base_velocity",)) -> None:
        self._commands = {name: torch.zeros(num_envs, 3, device=device) for name in names}

    def get_command(self, name: str) -> torch.Tensor:
        return self._commands[name]


def make_env(num_envs: int, joint_names: list[str], num_actions: int, device: str = "cpu") -> SimpleNamespace:
    """An env with one articulation ``robot``, a playing sim, an action manager holding ``action`` and a command
    manager holding the ``base_velocity`` command."""
    robot = StandInArticulation(num_envs, joint_names, device)
    action = wp.zeros((num_envs, num_actions), dtype=wp.float32, device=device)
    return SimpleNamespace(
        num_envs=num_envs,
        device=device,
        scene=_Scene(device, robot=robot),
        sim=SimpleNamespace(is_playing=lambda: True),
        action_manager=SimpleNamespace(action=action),
        command_manager=StandInCommandManager(num_envs, device),
    )


def random_root_and_joints(num_envs: int, num_joints: int, seed: int) -> list[torch.Tensor]:
    """Root pose (N, 7) with a unit (x, y, z, w) quaternion, root velocity (N, 6), joint pos and vel (N, J)."""
    g = torch.Generator().manual_seed(seed)
    quat = torch.nn.functional.normalize(torch.randn(num_envs, 4, generator=g), dim=-1)
    pose = torch.cat([torch.randn(num_envs, 3, generator=g), quat], dim=1)
    vel = torch.randn(num_envs, 6, generator=g)
    q = 1.2 * torch.randn(num_envs, num_joints, generator=g)
    qd = 3.0 * torch.randn(num_envs, num_joints, generator=g)
    return [pose, vel, q, qd]
