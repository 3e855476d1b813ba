"""leapp/ros2/messages.py: how one pipeline value travels on a ROS 2 topic.

The value's metadata (pipeline.yaml, written by ``annotate.input_tensors(...,
metadata=...)``) chooses the message type, so that the classic deployment
bugs (joint order, quaternion order, a vector of the wrong length) are
checked where the message arrives instead of being silently fed to the
policy:

- ``joints`` (a list of names) -> ``sensor_msgs/JointState``. The field is
  ``velocity`` when ``kind`` names velocities, ``effort`` for efforts or
  torques, else ``position``. Incoming messages are reordered by name into
  ``joints``' order; names may be a superset; a missing or repeated name is
  refused. Outputs are published with ``joints`` as the names.
- ``kind`` an orientation (``base_quat``, ``orientation``, ``quat``,
  ``quaternion``), four values -> ``sensor_msgs/Imu``'s ``orientation``, in
  the ``order`` the metadata says (``xyzw``, the default, or ``wxyz``).
  ``base_ang_vel``/``angular_velocity`` and ``base_lin_acc``/
  ``linear_acceleration`` (three values) take the Imu's other vectors.
- anything else -> ``std_msgs/*MultiArray`` of the value's dtype
  (``Float32MultiArray`` for float32 and float16, ``Float64MultiArray`` for
  float64, ``Int32``/``Int64``/``Int16``/``Int8``/``UInt8MultiArray``; bool
  as ``UInt8``), row-major, with one layout dimension per tensor dimension.

A topic carries one robot: a value with a dynamic batch is sent with batch 1.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from leapp.errors import LeappError
from leapp.runtime.io import IOSpec

__all__ = ["Codec", "MessageError", "codec_for"]

ORIENTATION_KINDS = {"base_quat", "orientation", "quat", "quaternion"}
IMU_VECTORS = {"base_ang_vel": "angular_velocity", "angular_velocity": "angular_velocity",
               "base_lin_acc": "linear_acceleration", "linear_acceleration": "linear_acceleration"}
_ARRAYS = {torch.float32: ("Float32MultiArray", np.float32), torch.float16: ("Float32MultiArray", np.float32),
           torch.float64: ("Float64MultiArray", np.float64), torch.int64: ("Int64MultiArray", np.int64),
           torch.int32: ("Int32MultiArray", np.int32), torch.int16: ("Int16MultiArray", np.int16),
           torch.int8: ("Int8MultiArray", np.int8), torch.uint8: ("UInt8MultiArray", np.uint8),
           torch.bool: ("UInt8MultiArray", np.uint8)}


class MessageError(LeappError, ValueError):
    """A message that does not fit the pipeline value it feeds (name, length or order): what, where, and why."""


@dataclass(frozen=True)
class Codec:
    """The conversions of one pipeline value: message <-> tensor of ``shape`` (batch 1), checked both ways."""

    name: str  # the pipeline input or output
    spec: IOSpec
    message: str  # "sensor_msgs/JointState", "sensor_msgs/Imu", "std_msgs/Float32MultiArray", ...
    field: str  # JointState: position/velocity/effort; Imu: orientation/angular_velocity/...; arrays: data
    shape: tuple[int, ...]
    joints: tuple[str, ...] = ()
    order: str = "xyzw"

    @functools.cached_property
    def message_type(self) -> type:
        package, _, name = self.message.partition("/")
        module = __import__(f"{package}.msg", fromlist=[name])
        return getattr(module, name)

    @property
    def count(self) -> int:
        return math.prod(self.shape)

    def to_tensor(self, msg: Any, topic: str) -> torch.Tensor:
        """The tensor ``msg`` carries, in the value's dtype and ``shape``.

        Raises:
            MessageError: the message names other joints, holds another number of values, or repeats a name.
        """
        if self.message == "sensor_msgs/JointState":
            values = self._joint_values(msg, topic)
        elif self.message == "sensor_msgs/Imu":
            v = getattr(msg, self.field)
            values = [v.x, v.y, v.z, v.w] if self.field == "orientation" else [v.x, v.y, v.z]
            if self.field == "orientation" and self.order == "wxyz":
                values = values[3:] + values[:3]
        else:
            values = np.asarray(msg.data)
            if values.size != self.count:
                raise MessageError(f"{topic}: {self.message} holds {values.size} values; input '{self.name}' takes "
                                   f"{self.count} (shape {list(self.shape)}, row-major)")
        array = np.asarray(values, dtype=_numpy_dtype(self.spec.dtype))
        return torch.from_numpy(array.reshape(self.shape)).to(self.spec.dtype)

    def _joint_values(self, msg: Any, topic: str) -> list[float]:
        names = list(msg.name)
        values = list(getattr(msg, self.field))
        if not names:
            raise MessageError(f"{topic}: JointState has no names; input '{self.name}' needs them to put its "
                               f"{len(self.joints)} joints in order (metadata.joints)")
        if len(values) != len(names):
            raise MessageError(f"{topic}: JointState names {len(names)} joints but holds {len(values)} "
                               f"{self.field} values")
        where = {}
        for i, n in enumerate(names):
            if n in where:
                raise MessageError(f"{topic}: JointState names joint '{n}' twice")
            where[n] = i
        missing = [j for j in self.joints if j not in where]
        if missing:
            raise MessageError(f"{topic}: JointState lacks joint(s) {missing} of input '{self.name}' "
                               f"(metadata.joints: {list(self.joints)}; the message names {names})")
        return [values[where[j]] for j in self.joints]

    def to_message(self, tensor: torch.Tensor, stamp: Any = None) -> Any:
        """The message carrying ``tensor`` (one robot: batch 1), stamped with ``stamp`` where the type has a header.

        Raises:
            MessageError: the tensor holds another number of values than the value's shape.
        """
        flat = tensor.detach().to("cpu").reshape(-1)
        if flat.numel() != self.count:
            raise MessageError(f"output '{self.name}' has {flat.numel()} values; its topic carries one robot, "
                               f"{self.count} (shape {list(self.shape)})")
        msg = self.message_type()
        if self.message == "sensor_msgs/JointState":
            if stamp is not None:
                msg.header.stamp = stamp
            msg.name = list(self.joints)
            setattr(msg, self.field, flat.to(torch.float64).tolist())
        elif self.message == "sensor_msgs/Imu":
            if stamp is not None:
                msg.header.stamp = stamp
            v = flat.to(torch.float64).tolist()
            target = getattr(msg, self.field)
            if self.field == "orientation":
                x, y, z, w = v if self.order == "xyzw" else v[1:] + v[:1]
                target.x, target.y, target.z, target.w = x, y, z, w
            else:
                target.x, target.y, target.z = v
        else:
            from std_msgs.msg import MultiArrayDimension  # rclpy's packages are an extra

            stride = self.count
            for i, size in enumerate(self.shape):
                msg.layout.dim.append(MultiArrayDimension(label=f"dim{i}", size=size, stride=stride))
                stride //= max(size, 1)
            msg.data = flat.numpy().astype(_ARRAYS[self.spec.dtype][1]).tolist()  # float16 and bool widen exactly
        return msg


def codec_for(name: str, spec: IOSpec) -> Codec:
    """The message type and conversions of pipeline value ``name`` (module docstring).

    Raises:
        MessageError: the metadata contradicts the value (joint count against its size, an unknown quaternion
            order, an orientation without four values) or its dtype has no message type.
    """
    meta = spec.metadata or {}
    shape = (1, *spec.shape[1:]) if spec.batch is not None else tuple(spec.shape)
    count = math.prod(shape)
    kind = str(meta.get("kind", ""))
    where = f"'{name}' ({spec.describe()}, metadata {dict(meta)})"
    if "joints" in meta:
        joints = meta["joints"]
        if not isinstance(joints, list) or not all(isinstance(j, str) for j in joints) or len(set(joints)) != len(joints):
            raise MessageError(f"{where}: metadata.joints must be a list of distinct joint names")
        if len(joints) != count:
            raise MessageError(f"{where}: metadata.joints names {len(joints)} joints, the value holds {count} per robot")
        low = kind.lower()
        field = "velocity" if "velocit" in low else "effort" if ("effort" in low or "torque" in low) else "position"
        return Codec(name, spec, "sensor_msgs/JointState", field, shape, tuple(joints))
    if kind in ORIENTATION_KINDS:
        order = str(meta.get("order", "xyzw"))
        if order not in ("xyzw", "wxyz") or count != 4:
            raise MessageError(f"{where}: an orientation is sent as sensor_msgs/Imu, which needs 4 values per robot "
                               "and metadata.order 'xyzw' or 'wxyz'")
        return Codec(name, spec, "sensor_msgs/Imu", "orientation", shape, order=order)
    if kind in IMU_VECTORS:
        if count != 3:
            raise MessageError(f"{where}: kind '{kind}' is sent as sensor_msgs/Imu.{IMU_VECTORS[kind]}, which holds "
                               f"3 values per robot")
        return Codec(name, spec, "sensor_msgs/Imu", IMU_VECTORS[kind], shape)
    if spec.dtype not in _ARRAYS:
        raise MessageError(f"{where}: no std_msgs array carries dtype {spec.dtype}")
    return Codec(name, spec, f"std_msgs/{_ARRAYS[spec.dtype][0]}", "data", shape)


def _numpy_dtype(dtype: torch.dtype):
    return {torch.float16: np.float16, torch.bool: np.bool_}.get(dtype) or _ARRAYS.get(dtype, (None, np.float64))[1]
