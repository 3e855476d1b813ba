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

Every value, both ways, must also pass ``leapp.ros2.limits``: finite, within
its ``abs_max``, an orientation of unit norm. Refusals name at most a few
joints (a message may carry any number of names).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from leapp.errors import LeappError
from leapp.ros2.limits import QUAT_NORM_TOLERANCE, abs_max_of, shown, shown_list, value_problem
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
    """A message that does not fit the pipeline value it feeds (name, length, order or values): what, where, why."""


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
    abs_max: float | None = None  # the largest |x| (leapp.ros2.limits.abs_max_of); None: no bound (integers)
    quat_tolerance: float = QUAT_NORM_TOLERANCE  # an orientation's | ||q|| - 1 |

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
            MessageError: the message names other joints, holds another number of values, repeats a name, or
                holds a value that ``problem`` refuses (non-finite, beyond ``abs_max``, a non-unit quaternion).
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
        floats = np.asarray(values, dtype=np.float64).reshape(-1)
        problem = self.problem(floats)
        numpy_dtype = np.dtype(_numpy_dtype(self.spec.dtype))
        if problem is None and numpy_dtype.kind in "iu":
            info = np.iinfo(numpy_dtype)
            if floats.size and not (info.min <= floats.min() and floats.max() <= info.max):
                problem = f"a value lies outside {self.spec.dtype}'s range [{info.min}, {info.max}]"
        if problem is None:
            with np.errstate(over="ignore", invalid="ignore"):
                array = np.asarray(values, dtype=numpy_dtype)
            if array.dtype.kind == "f" and not np.isfinite(array).all():  # within abs_max, beyond float16/float32
                problem = f"a value overflows {self.spec.dtype} ({self.problem(array.astype(np.float64).ravel())})"
        if problem is not None:
            raise MessageError(f"{topic}: {self.message} refused for input '{self.name}': {problem}")
        return torch.from_numpy(array.reshape(self.shape)).to(self.spec.dtype)

    def problem(self, values: np.ndarray) -> str | None:
        """Why the flat ``values`` (float64, in the value's order) may not pass (leapp.ros2.limits), else None."""
        tolerance = self.quat_tolerance if self.field == "orientation" else None
        return value_problem(values, abs_max=self.abs_max, labels=self.joints, quat_tolerance=tolerance)

    def output_problem(self, tensor: torch.Tensor) -> str | None:
        """Why pipeline output ``tensor`` may not be published (the checks of ``problem``), else None."""
        flat = tensor.detach().to("cpu").reshape(-1)
        if flat.dtype == torch.bool:
            return None
        problem = self.problem(flat.to(torch.float64).numpy())
        return None if problem is None else f"output '{self.name}': {problem}"

    def _joint_values(self, msg: Any, topic: str) -> np.ndarray:
        names = list(msg.name)
        values = np.asarray(getattr(msg, self.field), dtype=np.float64)  # an array.array('d'): no copy per value
        if not names:
            raise MessageError(f"{topic}: JointState has no names; input '{self.name}' needs them to put its "
                               f"{len(self.joints)} joints in order (metadata.joints)")
        if len(values) != len(names):
            raise MessageError(f"{topic}: JointState names {len(names)} joints but holds {len(values)} "
                               f"{self.field} values")
        where = dict(zip(names, range(len(names))))  # a driver may name a whole robot: no Python loop per name
        if len(where) != len(names):
            seen: set[str] = set()
            twice = next(n for n in names if n in seen or seen.add(n))
            raise MessageError(f"{topic}: JointState names joint {shown(twice)} twice")
        missing = [j for j in self.joints if j not in where]
        if missing:  # lists cut (leapp.ros2.limits.shown_list): a refusal is kept, the message may be huge
            raise MessageError(f"{topic}: JointState lacks joint(s) {shown_list(missing)} of input '{self.name}' "
                               f"(metadata.joints: {shown_list(self.joints)}; the message names "
                               f"{shown_list(names)})")
        return values[[where[j] for j in self.joints]]

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


def codec_for(name: str, spec: IOSpec, *, quat_tolerance: float = QUAT_NORM_TOLERANCE) -> Codec:
    """The message type and conversions of pipeline value ``name`` (module docstring); an orientation's norm
    must be 1 within ``quat_tolerance``.

    Raises:
        MessageError: the metadata contradicts the value (joint count against its size, an unknown quaternion
            order, an orientation without four values) or its dtype has no message type.
    """
    meta = spec.metadata or {}
    shape = (1, *spec.shape[1:]) if spec.batch is not None else tuple(spec.shape)
    count = math.prod(shape)
    kind = str(meta.get("kind", ""))
    where = f"'{name}' ({spec.describe()}, metadata {dict(meta)})"
    abs_max = abs_max_of(meta, spec.dtype.is_floating_point)
    if "joints" in meta:
        joints = meta["joints"]
        if not isinstance(joints, list) or not all(isinstance(j, str) for j in joints) or len(set(joints)) != len(joints):
            raise MessageError(f"{where}: metadata.joints must be a list of distinct joint names")
        if len(joints) != count:
            raise MessageError(f"{where}: metadata.joints names {len(joints)} joints, the value holds {count} per robot")
        low = kind.lower()
        field = "velocity" if "velocit" in low else "effort" if ("effort" in low or "torque" in low) else "position"
        return Codec(name, spec, "sensor_msgs/JointState", field, shape, tuple(joints), abs_max=abs_max,
                     quat_tolerance=quat_tolerance)
    if kind in ORIENTATION_KINDS:
        order = str(meta.get("order", "xyzw"))
        if order not in ("xyzw", "wxyz") or count != 4:
            raise MessageError(f"{where}: an orientation is sent as sensor_msgs/Imu, which needs 4 values per robot "
                               "and metadata.order 'xyzw' or 'wxyz'")
        return Codec(name, spec, "sensor_msgs/Imu", "orientation", shape, order=order, abs_max=abs_max,
                     quat_tolerance=quat_tolerance)
    if kind in IMU_VECTORS:
        if count != 3:
            raise MessageError(f"{where}: kind '{kind}' is sent as sensor_msgs/Imu.{IMU_VECTORS[kind]}, which holds "
                               f"3 values per robot")
        return Codec(name, spec, "sensor_msgs/Imu", IMU_VECTORS[kind], shape, abs_max=abs_max)
    if spec.dtype not in _ARRAYS:
        raise MessageError(f"{where}: no std_msgs array carries dtype {spec.dtype}")
    return Codec(name, spec, f"std_msgs/{_ARRAYS[spec.dtype][0]}", "data", shape,
                 abs_max=None if spec.dtype == torch.bool else abs_max)


def _numpy_dtype(dtype: torch.dtype):
    return {torch.float16: np.float16, torch.bool: np.bool_}.get(dtype) or _ARRAYS.get(dtype, (None, np.float64))[1]
