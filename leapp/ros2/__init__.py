"""leapp.ros2: an export on ROS 2 topics (``leapp ros2 EXPORT``; docs/ros2.md).

``leapp.ros2.node.PolicyNode`` subscribes to one topic per pipeline input and publishes one per output;
``leapp.ros2.messages`` chooses each topic's message type from the value's metadata and checks every
message against it (joint names and order, lengths). Needs rclpy and ROS 2's message packages
(``pip install 'leapp[ros2]'``, or a sourced ROS 2 installation); importing this package does not.
"""
