"""leapp/cli/ros2.py: ``leapp ros2 EXPORT``: run an export as a ROS 2 node (leapp.ros2; docs/ros2.md)."""

from __future__ import annotations

import sys

__all__ = ["ros2"]


def ros2(export_dir: str, *, trigger: str | None, rate: float | None, name: str, dry_run: bool,
         ros_args: list[str], quat_tolerance: float | None = None, trust: list[str] | None = None) -> int:
    """Loads EXPORT_DIR and spins its ``PolicyNode`` until interrupted; ``dry_run`` prints the topics and exits.

    Returns 0, or 2 (a message on stderr) when rclpy is missing or the export cannot be served: metadata that
    contradicts its value, a dynamic batch that excludes 1, a rate or tolerance out of range (docs/ros2.md), or
    an export refused at load: with ``trust`` (``--trust``) or ``LEAPP_TRUST``, one not signed by a trusted key
    (docs/signing.md).
    """
    try:
        import rclpy  # ROS 2 is an optional extra

        from leapp.ros2.messages import MessageError
        from leapp.ros2.node import PolicyNode, spin
    except ImportError as e:
        print(f"leapp ros2: ROS 2's Python packages cannot be imported ({e}): pip install 'leapp[ros2]', or source "
              "a ROS 2 installation", file=sys.stderr)
        return 2
    import leapp

    try:
        pipeline = leapp.load(export_dir, trust=trust)
    except leapp.LeappError as e:  # a refused signature (SignatureError) or export (PipelineError)
        print(f"leapp ros2: {e}", file=sys.stderr)
        return 2
    context = rclpy.Context()
    rclpy.init(args=["leapp-ros2", *ros_args], context=context)
    try:
        options = {"node_name": name, "trigger": trigger, "rate_hz": rate}
        if quat_tolerance is not None:
            options["quat_tolerance"] = quat_tolerance
        if dry_run:
            node = PolicyNode(pipeline, context=context, **options)
            print("\n".join(node.plan()))
            node.destroy_node()
            return 0
        spin(pipeline, context=context, **options)
    except (ValueError, MessageError) as e:
        print(f"leapp ros2: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    finally:
        if context.ok():
            context.shutdown()
    return 0
