"""The robot side of the ROS 2 tests (a node that publishes what a robot driver would), imported by them."""

from __future__ import annotations


class Robot:
    """The other side: publishes quat / joints the way a robot driver would, collects the actions."""

    def __init__(self, context, executor):
        import rclpy
        from sensor_msgs.msg import Imu, JointState

        self.node = rclpy.create_node("robot", context=context)
        self.quat = self.node.create_publisher(Imu, "quat", 10)
        self.joints = self.node.create_publisher(JointState, "joints", 10)
        self.actions: list[JointState] = []
        self.node.create_subscription(JointState, "action", self.actions.append, 10)
        executor.add_node(self.node)

    def send(self, quat, joints, names=None, quat_only: bool = False) -> None:
        """``quat`` (xyzw) on /quat, ``joints`` (cpu_policy.JOINTS' order) on /joints under ``names``: by default
        another order and one more joint, as a driver of the whole robot sends them."""
        import cpu_policy
        from sensor_msgs.msg import Imu, JointState

        q = Imu()
        q.orientation.x, q.orientation.y, q.orientation.z, q.orientation.w = map(float, quat.reshape(-1))
        self.quat.publish(q)
        if quat_only:
            return
        names = list(cpu_policy.JOINTS)[::-1] + ["gripper"] if names is None else names  # another order, one more
        by_name = dict(zip(cpu_policy.JOINTS, joints.reshape(-1).tolist()))
        self.joints.publish(JointState(name=names, position=[by_name.get(n, 7.0) for n in names]))


def connected(node, robot) -> bool:
    """Both sides discovered each other (the robot's publishers, its subscription to the actions)."""
    return (node.count_publishers("joints") > 0 and node.count_publishers("quat") > 0
            and robot.node.count_publishers("action") > 0)
