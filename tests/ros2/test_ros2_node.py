"""`leapp ros2`: an export on ROS 2 topics, tested with two ROS 2 nodes in one process, on the CPU.

The export is examples/cpu_policy.py's (an Imu orientation and a JointState in, a JointState of joint
targets out, 50 Hz in its metadata). A "robot" node publishes recorded inputs (joints in another order, with
an extra joint, as a robot driver sends them) and receives the actions; each action must equal, byte for
byte, what ``leapp.load`` computes on the same inputs. DDS stays on this machine (conftest.py): discovery is
limited to localhost and every test process takes its own random domain id.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

rclpy = pytest.importorskip("rclpy", reason="ROS 2's Python packages are not installed (pip install 'leapp[ros2]')")
import cpu_policy  # noqa: E402 - examples/, on sys.path from conftest.py
import numpy as np  # noqa: E402
import torch  # noqa: E402
from sensor_msgs.msg import Imu, JointState  # noqa: E402
from std_msgs.msg import Float32MultiArray  # noqa: E402

import leapp  # noqa: E402
from leapp.ros2.messages import MessageError, codec_for  # noqa: E402
from leapp.ros2.node import PolicyNode, control_rate  # noqa: E402
from leapp.runtime.io import IOSpec  # noqa: E402
from ros2_helpers import Robot, connected  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")


def test_actions_equal_leapp_load_byte_for_byte(export, ros):
    context, executor, spin_until = ros
    pipeline = leapp.load(str(export))
    node = PolicyNode(leapp.load(str(export)), trigger="joints", context=context)
    executor.add_node(node)
    robot = Robot(context, executor)
    spin_until(lambda: connected(node, robot))
    for seed in range(5):
        quat, joints = cpu_policy.random_state(1, 100 + seed)
        robot.send(quat, joints)
        spin_until(lambda n=seed: len(robot.actions) == n + 1)
        action = robot.actions[-1]
        assert list(action.name) == cpu_policy.JOINTS
        expected = pipeline(quat=quat, joints=joints)["action"]
        got = np.asarray(action.position, dtype=np.float64).astype(np.float32)
        assert got.tobytes() == expected.numpy().reshape(-1).tobytes()  # float32 -> float64 -> float32: exact
    assert node.steps == 5 and not node.errors


def test_a_wrong_joint_set_is_refused_by_name_and_never_stepped_on(export, ros):
    context, executor, spin_until = ros
    node = PolicyNode(leapp.load(str(export)), trigger="joints", context=context)
    executor.add_node(node)
    robot = Robot(context, executor)
    spin_until(lambda: connected(node, robot))
    quat, joints = cpu_policy.random_state(1, 7)
    robot.send(quat, joints)
    spin_until(lambda: len(robot.actions) == 1)
    robot.send(quat, joints, names=cpu_policy.JOINTS[:-1])  # RR_calf missing
    spin_until(lambda: len(node.errors) == 1)
    assert "lacks joint(s) ['RR_calf'] of input 'joints'" in node.errors[0], node.errors[0]
    assert "joints" not in node.latest  # the refused message invalidates the input: no step on the older value
    assert not node.step() and len(robot.actions) == 1
    robot.send(quat, joints)
    spin_until(lambda: len(robot.actions) == 2)


def test_a_timer_steps_at_the_metadatas_control_rate(export, ros):
    context, executor, spin_until = ros
    pipeline = leapp.load(str(export))
    assert control_rate(pipeline) == 50.0  # cpu_policy's action metadata
    node = PolicyNode(pipeline, context=context)
    assert node.rate_hz == 50.0 and "  step: at 50 Hz" in node.plan()
    executor.add_node(node)
    robot = Robot(context, executor)
    spin_until(lambda: connected(node, robot))
    quat, joints = cpu_policy.random_state(1, 3)
    robot.send(quat, joints)
    spin_until(lambda: len(robot.actions) >= 3)
    expected = pipeline(quat=quat, joints=joints)["action"].numpy().reshape(-1)
    assert all(np.asarray(a.position).astype(np.float32).tobytes() == expected.tobytes() for a in robot.actions)


def test_settings_that_cannot_work_are_refused_by_name(export, ros):
    context, _, _ = ros
    pipeline = leapp.load(str(export))
    with pytest.raises(ValueError, match=r"trigger 'action' is not an input of pipeline 'go2_cpu' \(inputs: "
                                         r"\['quat', 'joints'\]\)"):
        PolicyNode(pipeline, trigger="action", context=context)
    pipeline.outputs = {name: dataclasses.replace(spec, metadata={k: v for k, v in spec.metadata.items()
                                                                        if k != "control_rate_hz"})
                             for name, spec in pipeline.outputs.items()}
    with pytest.raises(ValueError, match=r"no trigger input and no rate: step on an input's messages"):
        PolicyNode(pipeline, context=context)


# --- the messages alone --------------------------------------------------------------------------------------


def spec(shape, dtype=torch.float32, batch=None, **metadata) -> IOSpec:
    return IOSpec("x", dtype, tuple(shape), metadata, batch)


def test_arrays_carry_any_other_value_row_major_with_their_dtype():
    c = codec_for("x", spec((2, 3)))
    assert c.message == "std_msgs/Float32MultiArray"
    t = torch.arange(6, dtype=torch.float32).reshape(2, 3) / 3
    msg = c.to_message(t)
    assert [(d.size, d.stride) for d in msg.layout.dim] == [(2, 6), (3, 3)]
    assert torch.equal(c.to_tensor(msg, "/x"), t)
    with pytest.raises(MessageError, match=r"/x: std_msgs/Float32MultiArray holds 5 values; input 'x' takes 6 "
                                           r"\(shape \[2, 3\], row-major\)"):
        c.to_tensor(Float32MultiArray(data=[0.0] * 5), "/x")
    assert codec_for("x", spec((4,), torch.int64)).message == "std_msgs/Int64MultiArray"
    assert codec_for("x", spec((4,), torch.float64)).message == "std_msgs/Float64MultiArray"
    dynamic = codec_for("x", spec((8, 3), batch=(1, 64)))
    assert dynamic.shape == (1, 3)  # one robot per topic


def test_quaternion_order_and_imu_vectors():
    wxyz = codec_for("q", spec((1, 4), kind="base_quat", order="wxyz"))
    msg = Imu()
    msg.orientation.x, msg.orientation.y, msg.orientation.z, msg.orientation.w = 0.1, 0.3, 0.3, 0.9  # unit norm
    assert wxyz.to_tensor(msg, "/q").tolist() == [[np.float32(0.9), np.float32(0.1), np.float32(0.3),
                                                   np.float32(0.3)]]
    back = wxyz.to_message(wxyz.to_tensor(msg, "/q")).orientation
    assert (back.x, back.y, back.z, back.w) == tuple(float(np.float32(v)) for v in (0.1, 0.3, 0.3, 0.9))
    assert codec_for("w", spec((3,), kind="base_ang_vel")).field == "angular_velocity"
    with pytest.raises(MessageError, match=r"metadata.order 'xyzw' or 'wxyz'"):
        codec_for("q", spec((4,), kind="base_quat", order="zyxw"))


def test_joint_metadata_is_checked_against_the_value():
    with pytest.raises(MessageError, match=r"metadata.joints names 2 joints, the value holds 3 per robot"):
        codec_for("j", spec((1, 3), joints=["a", "b"]))
    with pytest.raises(MessageError, match=r"metadata.joints must be a list of distinct joint names"):
        codec_for("j", spec((2,), joints=["a", "a"]))
    c = codec_for("j", spec((2,), kind="joint_velocities", joints=["a", "b"]))
    assert c.field == "velocity"
    with pytest.raises(MessageError, match=r"/j: JointState names joint 'a' twice"):
        c.to_tensor(JointState(name=["a", "a"], velocity=[1.0, 2.0]), "/j")
    with pytest.raises(MessageError, match=r"/j: JointState has no names"):
        c.to_tensor(JointState(velocity=[1.0, 2.0]), "/j")
    with pytest.raises(MessageError, match=r"/j: JointState names 2 joints but holds 1 velocity values"):
        c.to_tensor(JointState(name=["b", "a"], velocity=[1.0]), "/j")
    assert c.to_tensor(JointState(name=["b", "a"], velocity=[1.0, 2.0]), "/j").tolist() == [2.0, 1.0]


def test_the_command_prints_its_plan_and_remaps(export):
    env = dict(os.environ)
    proc = subprocess.run([str(Path(sys.executable).with_name("leapp")), "ros2", str(export), "--dry-run",
                           "--ros-args", "-r", "joints:=/robot/joint_states"],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0] == "leapp ros2: pipeline 'go2_cpu' as node /leapp"
    assert lines[1] == "  in  /quat: sensor_msgs/Imu.orientation order xyzw"
    assert lines[2].startswith("  in  /robot/joint_states: sensor_msgs/JointState.position joints ['FL_hip'")
    assert lines[3].startswith("  out /action: sensor_msgs/JointState.position joints ['FL_hip'")
    assert lines[4] == "  step: at 50 Hz"
    bad = subprocess.run([str(Path(sys.executable).with_name("leapp")), "ros2", str(export), "--trigger", "obs",
                          "--dry-run"], capture_output=True, text=True, timeout=300, env=env)
    assert bad.returncode == 2 and "leapp ros2: trigger 'obs' is not an input of pipeline 'go2_cpu'" in bad.stderr
