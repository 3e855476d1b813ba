"""`leapp ros2` never lets NaN or absurd values through, refuses exports and rates it cannot serve, and keeps
bounded error records (docs/ros2.md, "What is checked"). DDS on loopback (conftest.py).

Over DDS: NaN, infinite and 1e300 joint positions and NaN or non-unit quaternions are refused by name and never
stepped on; a step whose output is NaN (or beyond its metadata's abs_max) publishes nothing on any output.
At start: a dynamic batch from 2, and rates out of [0.1, 10000] Hz, are refused (``leapp ros2`` exits 2).
Memory: 30 refused JointStates of 300 000 names each keep a few kilobytes.
"""

from __future__ import annotations

import dataclasses
import gc
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

rclpy = pytest.importorskip("rclpy", reason="ROS 2's Python packages are not installed (pip install 'leapp[ros2]')")
import cpu_policy  # noqa: E402 - examples/, on sys.path from conftest.py
import numpy as np  # noqa: E402
import torch  # noqa: E402
from sensor_msgs.msg import Imu, JointState  # noqa: E402
from std_msgs.msg import Float32MultiArray, Int32MultiArray  # noqa: E402

import leapp  # noqa: E402
from leapp import annotate  # noqa: E402
from leapp.errors import TraceError  # noqa: E402
from leapp.pipeline_format import (PipelineError, metadata_problem, read_pipeline, sha256_file,  # noqa: E402
                                   twin_text, yaml_text)
from leapp.ros2.limits import MAX_ERROR_CHARS, MAX_ERRORS, check_rate, cut, shown_list  # noqa: E402
from leapp.ros2.messages import MessageError, codec_for  # noqa: E402
from leapp.ros2.node import PolicyNode, control_rate  # noqa: E402
from leapp.runtime.io import IOSpec  # noqa: E402
from ros2_helpers import Robot, connected  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")
LEAPP = str(Path(sys.executable).with_name("leapp"))


def send_valid(robot, node, spin_until, seed: int) -> None:
    """A valid orientation (seen by the node) first, then valid joints: the two topics' order is not DDS's."""
    quat, joints = cpu_policy.random_state(1, seed)
    robot.send(quat, joints, quat_only=True)
    spin_until(lambda: "quat" in node.latest)
    robot.send(quat, joints, names=list(cpu_policy.JOINTS))


def test_non_finite_and_absurd_inputs_are_refused_and_never_stepped_on(export, ros):
    context, executor, spin_until = ros
    node = PolicyNode(leapp.load(str(export)), trigger="joints", context=context)
    executor.add_node(node)
    robot = Robot(context, executor)
    spin_until(lambda: connected(node, robot))
    send_valid(robot, node, spin_until, 1)
    spin_until(lambda: len(robot.actions) == 1)
    quat, joints = cpu_policy.random_state(1, 2)
    bad_joints = [(math.nan, "/joints: sensor_msgs/JointState refused for input 'joints': joint 'FL_thigh' is nan, "
                             "not a finite number (1 such)"),
                  (-math.inf, "joint 'FL_thigh' is -inf, not a finite number"),
                  (1e300, "joint 'FL_thigh' is 1e+300, beyond abs_max 1e+06 (1 such;"),
                  (2e6, "joint 'FL_thigh' is 2e+06, beyond abs_max 1e+06")]
    for value, problem in bad_joints:
        j = joints.to(torch.float64)  # 1e300 as the driver sends it: float64
        j[0, 1] = value
        robot.send(quat, j)
        spin_until(lambda n=node.refused: node.refused == n + 1)
        assert problem in node.errors[-1], node.errors[-1]
        assert "joints" not in node.latest  # the refused message invalidates the input: no step on an older one
    bad_quats = [(torch.tensor([math.nan, 0.0, 0.0, 1.0]), "/quat: sensor_msgs/Imu refused for input 'quat': "
                                                          "element [0] is nan, not a finite number"),
                 (torch.tensor([0.0, 0.0, 0.0, 2.0]), "the quaternion's norm is 2, not 1 within 0.001"),
                 (torch.tensor([0.0, 0.0, 0.0, 1.0 + 2e-3]), "the quaternion's norm is 1.002, not 1 within 0.001"),
                 (torch.tensor([0.0, 0.0, 0.0, math.inf]), "element [3] is inf, not a finite number")]
    for q, problem in bad_quats:
        robot.send(q, joints, quat_only=True)
        spin_until(lambda n=node.refused: node.refused == n + 1)
        assert problem in node.errors[-1], node.errors[-1]
        assert "quat" not in node.latest
        robot.joints.publish(JointState(name=cpu_policy.JOINTS, position=joints.reshape(-1).tolist()))  # the trigger
        spin_until(lambda: "joints" in node.latest)
        assert not node.step()  # no step without a valid orientation
    end = time.monotonic() + 0.3
    spin_until(lambda: time.monotonic() > end)
    assert len(robot.actions) == 1 and node.steps == 1 and node.skipped_steps == 0
    robot.send(torch.tensor([0.0, 0.0, 0.0, 1.0 + 5e-4]), joints, quat_only=True)  # within the tolerance
    spin_until(lambda: "quat" in node.latest)
    robot.send(quat, joints, names=list(cpu_policy.JOINTS))
    spin_until(lambda: len(robot.actions) == 2)
    assert all(np.isfinite(a.position).all() for a in robot.actions)


@pytest.fixture(scope="module")
def log_export(tmp_path_factory) -> Path:
    """x -> y = log(x), z = 2x (metadata abs_max 100): a finite input that makes a NaN or an absurd output."""
    out = tmp_path_factory.mktemp("ros2_log")
    with leapp.trace("logs", save_path=str(out)) as session, torch.no_grad():
        for seed in range(2):
            x = torch.rand(1, 3, generator=torch.Generator().manual_seed(seed)) + 0.5
            with leapp.node("f", export_with="onnx"):
                x = annotate.input_tensors("f", {"x": x})
                annotate.output_tensors("f", {"y": torch.log(x), "z": x * 2.0}, metadata={"z": {"abs_max": 100}})
    session.compile(validate=False)
    return out / "logs"


def test_a_non_finite_or_absurd_output_is_never_published(log_export, ros):
    context, executor, spin_until = ros
    pipeline = leapp.load(str(log_export))
    assert pipeline.outputs["z"].metadata == {"abs_max": 100}
    node = PolicyNode(pipeline, trigger="x", context=context)
    executor.add_node(node)
    other = rclpy.create_node("other", context=context)
    x = other.create_publisher(Float32MultiArray, "x", 10)
    got = {"y": [], "z": []}
    for name in got:
        other.create_subscription(Float32MultiArray, name, got[name].append, 10)
    executor.add_node(other)
    spin_until(lambda: node.count_publishers("x") > 0 and other.count_publishers("y") > 0
               and other.count_publishers("z") > 0)

    def settle() -> None:
        end = time.monotonic() + 0.3
        spin_until(lambda: time.monotonic() > end)

    x.publish(Float32MultiArray(data=[1.0, 2.0, 3.0]))
    spin_until(lambda: len(got["y"]) == 1 and len(got["z"]) == 1)
    assert got["z"][0].data.tolist() == [2.0, 4.0, 6.0]
    for data, problem in [([-1.0, 1.0, 1.0], "output 'y': element [0] is nan, not a finite number (1 such)"),
                          ([0.0, 1.0, 1.0], "output 'y': element [0] is -inf, not a finite number"),
                          ([1.0, 60.0, 1.0], "output 'z': element [1] is 120, beyond abs_max 100")]:
        x.publish(Float32MultiArray(data=data))
        spin_until(lambda n=node.skipped_steps: node.skipped_steps == n + 1)
        assert node.errors[-1].startswith("step skipped, nothing published"), node.errors[-1]
        assert problem in node.errors[-1], node.errors[-1]
        settle()
        assert len(got["y"]) == 1 and len(got["z"]) == 1  # nothing on any output of that step
    assert node.steps == 1 and node.skipped_steps == 3 and node.refused == 0
    x.publish(Float32MultiArray(data=[1.0, 1.0, 1.0]))
    spin_until(lambda: len(got["y"]) == 2 and len(got["z"]) == 2)
    assert got["y"][1].data.tolist() == [0.0, 0.0, 0.0]


def test_values_are_checked_with_the_metadatas_abs_max_and_the_tolerance():
    spec = IOSpec("x", torch.float32, (3,), {"abs_max": 10})
    c = codec_for("x", spec)
    assert c.abs_max == 10.0 and c.to_tensor(Float32MultiArray(data=[10.0, -10.0, 0.0]), "/x").tolist() == [10, -10, 0]
    with pytest.raises(MessageError, match=r"/x: std_msgs/Float32MultiArray refused for input 'x': element \[1\] is "
                                           r"-10.5, beyond abs_max 10 \(1 such"):
        c.to_tensor(Float32MultiArray(data=[0.0, -10.5, 0.0]), "/x")
    default = codec_for("x", IOSpec("x", torch.float32, (1,)))
    assert default.to_tensor(Float32MultiArray(data=[1e6]), "/x").item() == 1e6
    with pytest.raises(MessageError, match=r"element \[0\] is 1e\+06.*beyond abs_max 1e\+06"):
        default.to_tensor(Float32MultiArray(data=[1000000.1]), "/x")
    half = codec_for("h", IOSpec("h", torch.float16, (1,)))  # within abs_max, beyond float16's range
    with pytest.raises(MessageError, match=r"a value overflows torch.float16 \(element \[0\] is inf"):
        half.to_tensor(Float32MultiArray(data=[1e5]), "/h")
    ints = codec_for("i", IOSpec("i", torch.int32, (2,)))  # integers: no default bound, the dtype's range
    assert ints.abs_max is None
    assert ints.to_tensor(Int32MultiArray(data=[2**31 - 1, 0]), "/i").tolist() == [2**31 - 1, 0]
    joints = codec_for("j", IOSpec("j", torch.int8, (1,), {"joints": ["a"]}))
    with pytest.raises(MessageError, match=r"a value lies outside torch.int8's range \[-128, 127\]"):
        joints.to_tensor(JointState(name=["a"], position=[300.0]), "/j")
    q = Imu()
    q.orientation.w = 1.05
    loose = codec_for("q", IOSpec("q", torch.float32, (4,), {"kind": "base_quat"}), quat_tolerance=0.1)
    assert loose.to_tensor(q, "/q").tolist() == [0.0, 0.0, 0.0, np.float32(1.05)]
    with pytest.raises(MessageError, match=r"the quaternion's norm is 1.05, not 1 within 0.001"):
        codec_for("q", IOSpec("q", torch.float32, (4,), {"kind": "base_quat"})).to_tensor(q, "/q")
    assert codec_for("q", IOSpec("q", torch.float32, (4,), {"kind": "base_quat"})).output_problem(
        torch.tensor([0.0, 0.0, 0.0, 0.5])) == "output 'q': the quaternion's norm is 0.5, not 1 within 0.001"


@pytest.mark.parametrize(("value", "problem"), [
    (0, "metadata.abs_max: 0 is not a positive finite number"),
    (-1.5, "metadata.abs_max: -1.5 is not a positive finite number"),
    (True, "metadata.abs_max: True is not a positive finite number"),
    ("1e6", "metadata.abs_max: '1e6' is not a positive finite number"),
    (10**400, "metadata.abs_max: 1000000000000"),
])
def test_metadata_abs_max_must_be_a_positive_finite_number(value, problem):
    assert problem in metadata_problem({"abs_max": value})
    assert metadata_problem({"abs_max": 1}) is None and metadata_problem({"abs_max": 2.5e-3}) is None


def test_a_bad_abs_max_is_refused_where_declared_and_on_load(log_export, tmp_path):
    with pytest.raises(TraceError, match=r"metadata of input 'x'.abs_max: -1 is not a positive finite number"):
        with leapp.trace("bad", save_path=str(tmp_path)), torch.no_grad():
            with leapp.node("f", export_with="onnx"):
                annotate.input_tensors("f", {"x": torch.ones(1, 3)}, metadata={"x": {"abs_max": -1}})
    folder = shutil.copytree(log_export, tmp_path / "edited")
    _, desc = read_pipeline(folder)
    desc["outputs"][1]["metadata"] = {"abs_max": 0}
    (folder / "pipeline.yaml").write_text(yaml_text(desc))
    (folder / "pipeline.json").write_text(twin_text(desc, sha256_file(folder / "pipeline.yaml")))
    with pytest.raises(PipelineError, match=r"outputs\[1\].metadata.abs_max: 0 is not a positive finite number"):
        leapp.load(folder)


@pytest.fixture(scope="module")
def batch_2_export(tmp_path_factory) -> Path:
    """A node exported for batches 2..8 only."""
    out = tmp_path_factory.mktemp("ros2_batch")

    @leapp.node("double", export_with="onnx", dynamic_batch=(2, 8))
    def double(obs):
        return obs * 2.0

    with leapp.trace("batch2", save_path=str(out)) as session, torch.no_grad():
        for _ in range(2):
            double(torch.randn(4, 3))
    session.compile(validate=False)
    return out / "batch2"


def test_an_export_whose_batch_excludes_one_is_refused_at_start(batch_2_export, ros):
    context, _, _ = ros
    pipeline = leapp.load(str(batch_2_export))
    assert pipeline.inputs["obs"].batch == (2, 8)
    with pytest.raises(ValueError, match=r"pipeline 'batch2': input 'obs' \(float32\[batch 2..8, 3\]\) takes a batch "
                                         r"of 2..8, and a ROS 2 topic carries one robot \(batch 1\)"):
        PolicyNode(pipeline, trigger="obs", context=context)
    r = subprocess.run([LEAPP, "ros2", str(batch_2_export), "--trigger", "obs", "--dry-run"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "leapp ros2: pipeline 'batch2': input 'obs'" in r.stderr, r.stderr[-2000:]
    assert "takes a batch of 2..8" in r.stderr


@pytest.mark.parametrize("rate", [1e300, 1e-300, 0, -50, math.nan, math.inf, 10_000.5, 0.09])
def test_rates_out_of_range_are_refused_at_start(export, ros, rate):
    context, _, _ = ros
    pipeline = leapp.load(str(export))
    with pytest.raises(ValueError, match=r"rate_hz \(--rate\) .* is not a rate in \[0.1, 10000\] Hz"):
        PolicyNode(pipeline, rate_hz=rate, context=context)
    with pytest.raises(ValueError, match=r"is not a rate in \[0.1, 10000\] Hz"):
        PolicyNode(pipeline, trigger="joints", rate_hz=rate, context=context)  # checked though a trigger steps
    pipeline.outputs = {n: dataclasses.replace(s, metadata={**s.metadata, "control_rate_hz": rate})
                        for n, s in pipeline.outputs.items()}
    with pytest.raises(ValueError, match=r"'action': metadata.control_rate_hz .* is not a rate in \[0.1, 10000\] Hz"):
        control_rate(pipeline)
    with pytest.raises(ValueError, match=r"'action': metadata.control_rate_hz"):
        PolicyNode(pipeline, trigger="joints", context=context)


def test_rates_at_the_bounds_are_served(export, ros):
    context, _, _ = ros
    pipeline = leapp.load(str(export))
    for rate in (0.1, 10_000, 10_000.0):
        node = PolicyNode(pipeline, rate_hz=rate, context=context)
        assert node.rate_hz == float(rate) and node._step_timer.timer_period_ns == round(1e9 / rate)
        node.destroy_node()
    assert check_rate(50, "x") == 50.0
    with pytest.raises(ValueError, match=r"quat_tolerance 0 is not a tolerance in \(0, 1\)"):
        PolicyNode(pipeline, quat_tolerance=0, context=context)


@pytest.mark.parametrize(("args", "problem"), [
    (["--rate", "1e300"], "leapp ros2: rate_hz (--rate) 1e+300 is not a rate in [0.1, 10000] Hz"),
    (["--rate", "1e-300"], "leapp ros2: rate_hz (--rate) 1e-300 is not a rate in [0.1, 10000] Hz"),
    (["--trigger", "joints", "--rate", "nan"], "leapp ros2: rate_hz (--rate) nan is not a rate in [0.1, 10000] Hz"),
    (["--quat-tolerance", "2"], "leapp ros2: quat_tolerance 2.0 is not a tolerance in (0, 1)"),
])
def test_the_command_refuses_settings_out_of_range_with_exit_2(export, args, problem):
    r = subprocess.run([LEAPP, "ros2", str(export), *args, "--dry-run"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert problem in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


def huge_joint_state(n: int) -> JointState:
    """``n`` joint names (cpu_policy's but RR_calf, then made-up ones), each a position: refused, lacking one."""
    names = cpu_policy.JOINTS[:-1] + [f"extra_joint_{i:06d}" for i in range(n - len(cpu_policy.JOINTS) + 1)]
    return JointState(name=names, position=[0.0] * len(names))


def rss_bytes() -> int:
    """This process's resident memory now (Linux /proc)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not Path("/proc/self/statm").is_file(), reason="reads resident memory from Linux's /proc")
def test_refusals_of_huge_messages_keep_bounded_memory(export, ros):
    context, _, _ = ros
    node = PolicyNode(leapp.load(str(export)), trigger="joints", context=context)
    msg = huge_joint_state(300_000)  # ~20 MB as Python strings; unbounded records kept ~22 MB per refusal
    node.receive("joints", msg)  # warm: the first refusal's one-off allocations (logging, caches)
    gc.collect()
    before = rss_bytes()
    for _ in range(30):
        node.receive("joints", msg)
    gc.collect()
    kept = rss_bytes() - before
    assert kept < 32 << 20, f"30 refusals kept {kept >> 20} MiB"
    assert sum(map(len, node.errors)) <= 31 * MAX_ERROR_CHARS
    assert node.refused == 31 and len(node.errors) == 31
    text = node.errors[-1]
    assert len(text) <= MAX_ERROR_CHARS
    assert "lacks joint(s) ['RR_calf'] of input 'joints'" in text
    assert "the message names ['FL_hip', 'FL_thigh', 'FL_calf', 'FR_hip', 'FR_thigh', 'FR_calf', 'RL_hip', " \
           "'RL_thigh', ... (299992 more)]" in text, text
    for _ in range(MAX_ERRORS + 20):
        node.receive("joints", JointState(name=["a" * 100_000], position=[0.0]))
    assert len(node.errors) == MAX_ERRORS and node.refused == 31 + MAX_ERRORS + 20
    assert all(len(e) <= MAX_ERROR_CHARS for e in node.errors)
    node.destroy_node()


def test_huge_refused_messages_over_dds_are_named_briefly(export, ros):
    context, executor, spin_until = ros
    node = PolicyNode(leapp.load(str(export)), trigger="joints", context=context)
    executor.add_node(node)
    robot = Robot(context, executor)
    spin_until(lambda: connected(node, robot))
    msg = huge_joint_state(50_000)
    for i in range(3):
        robot.joints.publish(msg)
        spin_until(lambda n=i: node.refused == n + 1)
    assert "(49992 more)" in node.errors[-1] and len(node.errors[-1]) <= MAX_ERROR_CHARS
    assert not robot.actions and node.steps == 0


def test_texts_and_lists_are_cut_and_say_how_much():
    assert shown_list(list("abc")) == "['a', 'b', 'c']"
    assert shown_list([str(i) for i in range(10)], limit=2) == "['0', '1', ... (8 more)]"
    assert shown_list(["x" * 1000])[:10] == "['xxxxxxxx" and len(shown_list(["x" * 1000])) < 70
    assert cut("abc", 5) == "abc"
    long = cut("y" * 5000)
    assert len(long) == MAX_ERROR_CHARS and long.endswith(f"... ({5000 - MAX_ERROR_CHARS} characters cut)")
