"""`leapp ros2` on an export with state: the pipeline carries it between steps, a skipped step is undone, and
reset() (or a std_msgs/Empty on ~/reset) starts over. DDS on loopback (conftest.py).

The export: x -> y = log(x) + h, state h updated to 0.5 h + y. A negative x makes y NaN: that step publishes
nothing, and its NaN must not enter the carried state (every later step would be NaN too).
"""

from __future__ import annotations

from pathlib import Path

import pytest

rclpy = pytest.importorskip("rclpy", reason="ROS 2's Python packages are not installed (pip install 'leapp[ros2]')")
import torch  # noqa: E402
from std_msgs.msg import Empty, Float32MultiArray  # noqa: E402

import leapp  # noqa: E402
from leapp import annotate  # noqa: E402
from leapp.ros2.node import PolicyNode  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")


def log_step(x: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    with leapp.node("f", export_with="onnx"):
        x = annotate.input_tensors("f", {"x": x})
        h = annotate.state_tensors("f", {"h": h})
        y = torch.log(x) + h
        h = annotate.update_state("f", {"h": 0.5 * h + y})
        annotate.output_tensors("f", {"y": y})
    return y, h


@pytest.fixture(scope="module")
def state_export(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ros2_state")
    h = torch.zeros(1, 3)  # the initial value: the state at the first traced call
    with leapp.trace("carry", save_path=str(out)) as session, torch.no_grad():
        for seed in range(2):
            _, h = log_step(torch.rand(1, 3, generator=torch.Generator().manual_seed(seed)) + 0.5, h)
    session.compile(validate=False)
    return out / "carry"


def test_state_is_carried_a_skipped_step_undone_and_reset_starts_over(state_export, ros):
    context, executor, spin_until = ros
    reference = leapp.load(str(state_export))  # the sequence leapp.load computes, without the skipped step
    node = PolicyNode(leapp.load(str(state_export)), trigger="x", context=context)
    assert node.stateful and any(line.startswith("  state: f/h float32[1, 3]") and "/leapp/reset" in line
                                 for line in node.plan()), node.plan()
    executor.add_node(node)
    other = rclpy.create_node("other", context=context)
    x_pub = other.create_publisher(Float32MultiArray, "x", 10)
    reset_pub = other.create_publisher(Empty, "/leapp/reset", 10)
    got: list[Float32MultiArray] = []
    other.create_subscription(Float32MultiArray, "y", got.append, 10)
    executor.add_node(other)
    spin_until(lambda: node.count_publishers("x") > 0 and other.count_publishers("y") > 0
               and node.count_publishers("/leapp/reset") > 0)

    def step(values: list[float]) -> None:
        """One valid step: its y equals leapp.load's next step, byte for byte."""
        x_pub.publish(Float32MultiArray(data=values))
        spin_until(lambda n=len(got): len(got) == n + 1)
        want = reference(x=torch.tensor([values]))["y"]
        assert torch.tensor(got[-1].data.tolist(), dtype=torch.float32).numpy().tobytes() == \
            want.reshape(-1).numpy().tobytes()

    for values in ([1.0, 2.0, 3.0], [0.5, 0.7, 2.5], [3.0, 1.0, 1.5]):
        step(values)
    assert not torch.equal(node.pipeline.state["f/h"], torch.zeros(1, 3)), "the state moved"
    before = node.pipeline.state
    x_pub.publish(Float32MultiArray(data=[-1.0, 1.0, 1.0]))  # log(-1): y is NaN, and so would be the new state
    spin_until(lambda: node.skipped_steps == 1)
    assert "output 'y': element [0] is nan" in node.errors[-1], node.errors[-1]
    assert torch.equal(node.pipeline.state["f/h"], before["f/h"]), "the skipped step's state was undone"
    assert len(got) == 3
    step([2.0, 2.0, 2.0])  # continues from the last good state: finite, as leapp.load's sequence without the NaN

    node.reset()  # a new episode
    reference.reset()
    step([1.0, 2.0, 3.0])
    assert node.resets == 1
    reset_pub.publish(Empty())  # what a deployment sends at an episode start: ros2 topic pub --once /leapp/reset ...
    spin_until(lambda: node.resets == 2)
    reference.reset()
    assert torch.equal(node.pipeline.state["f/h"], torch.zeros(1, 3))
    step([1.5, 0.5, 2.5])
    assert node.steps == 6 and node.skipped_steps == 1
