"""Fixtures of the ROS 2 tests: DDS on loopback, an export of examples/cpu_policy.py, an rclpy context.

DDS stays on this machine: discovery is limited to localhost, and every test process takes its own random
domain id, both set here, before any test module imports rclpy.
"""

from __future__ import annotations

import os
import random
import sys
import time
from pathlib import Path

import pytest

os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"  # before rclpy starts DDS: no multicast to the LAN
os.environ["ROS_DOMAIN_ID"] = str(random.SystemRandom().randrange(1, 100))

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))


@pytest.fixture(scope="session")
def export(tmp_path_factory) -> Path:
    """examples/cpu_policy.py's export: an Imu orientation and a JointState in, joint targets out, 50 Hz."""
    import cpu_policy
    import torch

    import leapp

    out = tmp_path_factory.mktemp("ros2")
    with leapp.trace("go2_cpu", save_path=str(out)) as session, torch.no_grad():
        for seed in range(3):
            cpu_policy.step(*cpu_policy.random_state(1, seed))
    session.compile(validate=False)
    return out / "go2_cpu"


@pytest.fixture
def ros():
    """An rclpy context, an executor on it, and `spin_until(predicate)`."""
    rclpy = pytest.importorskip("rclpy", reason="ROS 2's Python packages are not installed (pip install 'leapp[ros2]')")
    from rclpy.executors import SingleThreadedExecutor

    context = rclpy.Context()
    rclpy.init(context=context)
    executor = SingleThreadedExecutor(context=context)

    def spin_until(predicate, timeout: float = 20.0) -> None:
        end = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < end, "timed out waiting on ROS 2 messages"
            executor.spin_once(timeout_sec=0.02)

    yield context, executor, spin_until
    executor.shutdown()
    context.shutdown()
