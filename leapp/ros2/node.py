"""leapp/ros2/node.py: an export as a ROS 2 node (rclpy): a subscription per pipeline input, a publisher per output.

Topics are the pipeline's input and output names, relative to the node's
namespace (``--ros-args -r joints:=/robot/joint_states`` remaps one); message
types and checks are ``leapp.ros2.messages``. The node steps the pipeline
either on every message of one trigger input, or on a timer at a rate (the
``control_rate_hz`` an input or output's metadata records, unless one is
given). A step uses the latest valid message of every input; it waits until
each input has one. A message that does not fit its input is refused: it is
logged (throttled) and kept in ``errors``, and that input counts as missing
until a valid one arrives, so the policy never runs on a value it could not
check. A step whose outputs fail the same checks (a NaN joint target) is
skipped: nothing is published on any output, ``skipped_steps`` counts it.
An export with state carries it from step to step in the pipeline; a skipped
step is undone (the state is restored to its value before the step), so a NaN
never enters the carried state. ``reset()``, or a ``std_msgs/Empty`` message
on the node's ``~/reset`` topic, restores the initial state (a new episode).
``errors`` keeps the latest refusals, each cut (``leapp.ros2.limits``). An
export the node cannot serve (a dynamic batch that excludes 1, a rate out of
range) is refused at start, as is, while ``LEAPP_TRUST`` is set, a pipeline whose signature was not checked
at load (docs/signing.md). A failing step raises out of the executor.
"""

from __future__ import annotations

import collections
from typing import Any

import torch
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.qos import QoSProfile
from rclpy.validate_topic_name import validate_topic_name
from std_msgs.msg import Empty

from leapp.ros2.limits import MAX_ERRORS, QUAT_NORM_TOLERANCE, check_rate, check_tolerance, cut
from leapp.ros2.messages import Codec, MessageError, codec_for

__all__ = ["PolicyNode", "RESET_TOPIC", "control_rate", "spin"]

RESET_TOPIC = "~/reset"  # std_msgs/Empty: restore the pipeline's initial state (an export with state only)


def control_rate(pipeline) -> float | None:
    """The ``control_rate_hz`` the metadata of the pipeline's inputs and outputs records (one value), or None.

    Raises:
        ValueError: two values disagree, or one is not a rate in [MIN_RATE_HZ, MAX_RATE_HZ] (leapp.ros2.limits).
    """
    found = {}
    for name, spec in [*pipeline.inputs.items(), *pipeline.outputs.items()]:
        rate = (spec.metadata or {}).get("control_rate_hz")
        if rate is not None:
            found[name] = check_rate(rate, f"'{name}': metadata.control_rate_hz")
    if len(set(found.values())) > 1:
        raise ValueError(f"metadata.control_rate_hz differs between values: {found}")
    return next(iter(found.values()), None)


class PolicyNode(Node):
    """``pipeline`` (``leapp.load``) on ROS 2 topics (module docstring).

    Args:
        pipeline: a loaded export.
        node_name: the ROS node's name.
        trigger: the input whose every (valid) message starts a step; None steps on a timer.
        rate_hz: the timer's rate; default the metadata's ``control_rate_hz``.
        quat_tolerance: how far an orientation's norm may be from 1 (inputs and outputs).
        qos_depth: the history depth of every subscription and publisher (1: the latest value only).
        context: the rclpy context (default: the global one).

    Raises:
        ValueError: a name that is not a valid topic, an unknown trigger, no trigger and no rate, a rate or
            tolerance out of range (``rate_hz`` is checked even with a trigger, the metadata's rate always), a
            value whose dynamic batch excludes 1 (a topic carries one robot).
        MessageError: metadata that contradicts its value (leapp.ros2.messages.codec_for).
        SignatureError: ``LEAPP_TRUST`` is set and ``pipeline`` was loaded without a signature check.
    """

    def __init__(self, pipeline, *, node_name: str = "leapp", trigger: str | None = None,
                 rate_hz: float | None = None, quat_tolerance: float = QUAT_NORM_TOLERANCE, qos_depth: int = 1,
                 context: Any = None):
        self.pipeline = pipeline
        _check_signed(pipeline)
        _check_one_robot(pipeline)
        tolerance = check_tolerance(quat_tolerance, "quat_tolerance")
        self.inputs: dict[str, Codec] = {n: codec_for(n, spec, quat_tolerance=tolerance)
                                         for n, spec in pipeline.inputs.items()}
        self.outputs: dict[str, Codec] = {n: codec_for(n, spec, quat_tolerance=tolerance)
                                          for n, spec in pipeline.outputs.items()}
        for name in [*self.inputs, *self.outputs]:
            try:
                validate_topic_name(name)
            except Exception as e:  # noqa: BLE001 - rclpy's InvalidTopicNameException and its kin
                raise ValueError(f"pipeline value '{name}' is not a valid ROS 2 topic name ({e}); rename it where "
                                 "it is declared (annotate.input_tensors / output_tensors)") from None
        if trigger is not None and trigger not in self.inputs:
            raise ValueError(f"trigger '{trigger}' is not an input of pipeline '{pipeline.name}' "
                             f"(inputs: {list(self.inputs)})")
        recorded = control_rate(pipeline)  # checked even when a trigger or rate_hz makes it unused
        if rate_hz is not None:
            rate_hz = check_rate(rate_hz, "rate_hz (--rate)")
        if trigger is None:
            rate_hz = recorded if rate_hz is None else rate_hz
            if rate_hz is None:
                raise ValueError(f"pipeline '{pipeline.name}': no trigger input and no rate: step on an input's "
                                 "messages (--trigger NAME), at a rate (--rate HZ), or record metadata "
                                 "control_rate_hz at trace time")
        super().__init__(node_name, context=context)
        self.trigger, self.rate_hz = trigger, (None if trigger else float(rate_hz))
        self.devices = _input_devices(pipeline)
        self.latest: dict[str, torch.Tensor] = {}
        self.errors: collections.deque[str] = collections.deque(maxlen=MAX_ERRORS)  # the latest, each cut
        self.refused = 0  # messages refused, all of them
        self.steps = 0  # steps published
        self.skipped_steps = 0  # steps whose outputs were refused: nothing published
        self.resets = 0  # reset() calls (and ~/reset messages)
        self.stateful = bool(getattr(pipeline, "state_specs", None))  # the pipeline carries state between steps
        self._waiting_for: tuple[str, ...] = ()
        qos = QoSProfile(depth=qos_depth)
        self._input_subscriptions = [
            self.create_subscription(codec.message_type, name, lambda msg, n=name: self.receive(n, msg), qos)
            for name, codec in self.inputs.items()]
        self._output_publishers = {name: self.create_publisher(codec.message_type, name, qos)
                            for name, codec in self.outputs.items()}
        self._step_timer = self.create_timer(1.0 / self.rate_hz, self.step) if self.rate_hz else None
        self._input_topics = {name: self.resolve_topic_name(name) for name in self.inputs}  # for refusals
        self._reset_subscription = None
        if self.stateful:
            reset_topic = self.resolve_topic_name(RESET_TOPIC)
            clash = [n for n in [*self.inputs, *self.outputs] if self.resolve_topic_name(n) == reset_topic]
            if clash:
                self.destroy_node()
                raise ValueError(f"pipeline '{pipeline.name}': value '{clash[0]}' is on topic {reset_topic}, the "
                                 "node's reset topic: rename the value or the node (--ros-args -r __node:=NAME)")
            self._reset_subscription = self.create_subscription(Empty, RESET_TOPIC, lambda _msg: self.reset(), qos)

    def topic(self, name: str) -> str:
        """The resolved topic of pipeline value ``name`` (namespace and remapping applied)."""
        return self.resolve_topic_name(name)

    def plan(self) -> list[str]:
        """Lines saying which topic and message type carry each value, and when the node steps."""
        lines = [f"leapp ros2: pipeline '{self.pipeline.name}' as node {self.get_fully_qualified_name()}"]
        for role, codecs in (("in ", self.inputs), ("out", self.outputs)):
            for name, c in codecs.items():
                extra = f" joints {list(c.joints)}" if c.joints else f" order {c.order}" if c.field == "orientation" \
                    else f" shape {list(c.shape)}"
                lines.append(f"  {role} {self.topic(name)}: {c.message}.{c.field}{extra}")
        lines.append(f"  step: on every message of {self.topic(self.trigger)}" if self.trigger
                     else f"  step: at {self.rate_hz:g} Hz")
        if self.stateful:
            specs = self.pipeline.state_specs
            named = [f"{key} {spec.describe()}" for key, spec in specs.items()] if isinstance(specs, dict) \
                else [spec.describe() for spec in specs]
            lines.append(f"  state: {', '.join(named)}; carried between steps, reset by std_msgs/Empty on "
                         f"{self.topic(RESET_TOPIC)}")
        return lines

    def reset(self, state: dict[str, torch.Tensor] | None = None) -> None:
        """The pipeline's initial state (``Pipeline.reset()``), or ``state`` (``"node/input"`` -> tensor): call it
        when an episode starts. A pipeline without state has nothing to reset."""
        if self.stateful and state is None:
            self.pipeline.reset()
        elif self.stateful:
            self.pipeline.reset(state)
        elif state:
            raise ValueError(f"pipeline '{self.pipeline.name}' has no state; got state {sorted(state)}")
        self.resets += 1
        self.get_logger().info(f"state reset ({self.resets} so far)")

    def receive(self, name: str, msg: Any) -> None:
        """A message of input ``name``: checked, kept as its latest value, and a step when it is the trigger."""
        try:
            self.latest[name] = self.inputs[name].to_tensor(msg, self._input_topics[name])
        except MessageError as e:
            self.latest.pop(name, None)  # never step on a value older than a refused one
            self.refused += 1
            self.errors.append(cut(str(e)))
            self.get_logger().error(self.errors[-1], throttle_duration_sec=1.0)
            return
        if name == self.trigger:
            self.step()

    def step(self) -> bool:
        """One pipeline call on the latest inputs, its outputs published; False while an input has none, or when
        an output is refused (non-finite, beyond abs_max: the step is skipped, nothing is published)."""
        missing = tuple(n for n in self.inputs if n not in self.latest)
        if missing:
            if missing != self._waiting_for:
                self.get_logger().info(f"waiting for {[self.topic(n) for n in missing]}")
                self._waiting_for = missing
            return False
        self._waiting_for = ()
        values = {n: t.to(self.devices[n]) for n, t in self.latest.items()}
        before = self.pipeline.state if self.stateful else None  # a skipped step is undone
        outputs = self.pipeline(**values)
        problems = [p for name, codec in self.outputs.items() if (p := codec.output_problem(outputs[name]))]
        if problems:  # a robot never sees NaN: no message on any output this step, its own timeout applies
            if before is not None:
                self.pipeline.reset(before)  # nor does the carried state: the next step starts from the last good one
            self.skipped_steps += 1
            self.errors.append(cut(f"step skipped, nothing published ({self.skipped_steps} skipped so far): "
                                   + "; ".join(problems)))
            self.get_logger().error(self.errors[-1], throttle_duration_sec=1.0)
            return False
        stamp = self.get_clock().now().to_msg()
        for name, codec in self.outputs.items():
            self._output_publishers[name].publish(codec.to_message(outputs[name], stamp))
        self.steps += 1
        return True


def _check_signed(pipeline) -> None:
    """The robot's policy (``LEAPP_TRUST``): a pipeline served here had its signature checked at load
    (``leapp.load`` honours ``LEAPP_TRUST``; one loaded before it was set, or made by hand, did not)."""
    from leapp.signing.trust import TRUST_ENV, trusted_keys

    if trusted_keys() is not None and getattr(pipeline, "signature", None) is None:
        from leapp.errors import SignatureError

        raise SignatureError(f"pipeline '{pipeline.name}': {TRUST_ENV} is set, but the pipeline was loaded without "
                             "its signature checked: load it with leapp.load (which honours it) or trust=")


def _check_one_robot(pipeline) -> None:
    """Refuses a pipeline value whose dynamic batch excludes 1: its topic carries one robot, batch 1.

    Raises:
        ValueError: naming the value and its range.
    """
    for role, specs in (("input", pipeline.inputs), ("output", pipeline.outputs)):
        for name, spec in specs.items():
            if spec.batch is not None and spec.batch[0] > 1:
                low, high = spec.batch
                raise ValueError(f"pipeline '{pipeline.name}': {role} '{name}' ({spec.describe()}) takes a batch of "
                                 f"{low}..{high}, and a ROS 2 topic carries one robot (batch 1): export it with a "
                                 f"dynamic batch from 1 (dynamic_batch=(1, {high}))")


def _input_devices(pipeline) -> dict[str, torch.device]:
    """Each pipeline input's device: that of the first node that reads it (pipeline.yaml's ``device``)."""
    devices = {}
    for entry in pipeline.description["nodes"]:
        node = pipeline.nodes[entry["name"]]
        for source in node.sources.values():
            if isinstance(source, str):
                devices.setdefault(source, torch.device(entry["device"]))
    return {name: devices.get(name, torch.device("cpu")) for name in pipeline.inputs}


def spin(pipeline, *, context: Any = None, **options: Any) -> None:
    """Runs a ``PolicyNode`` of ``pipeline`` until the context shuts down (``leapp ros2``)."""
    node = PolicyNode(pipeline, context=context, **options)
    for line in node.plan():
        node.get_logger().info(line)
    executor = SingleThreadedExecutor(context=context)
    executor.add_node(node)
    try:
        executor.spin()
    finally:
        executor.shutdown()
        node.destroy_node()
