"""leapp/cli: the ``leapp`` command: ``inspect``, ``doctor``, ``aoti``, ``write-json``, ``write-leapp-bundle``, ``ros2``,
``sign``, ``verify``, ``--version``.

This module holds the argument parser and ``main``; each command lives in its own module.
None of them imports torch unless the command needs it (``aoti``).
"""

from __future__ import annotations

import argparse
import sys

from leapp.cli.diagnostics import doctor, package_version
from leapp.cli.folder_commands import aoti, write_json
from leapp.cli.graph import graph_command
from leapp.cli.inspect import inspect_path
from leapp.cli.leapp_bundle import write_leapp_bundle_command
from leapp.cli.ros2 import ros2
from leapp.cli.signing import add_commands as add_signing_commands, sign_command, verify_command

__all__ = ["main", "inspect_path", "doctor", "aoti"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="leapp",
        description="leapp: exported PyTorch + Warp pipelines.",
        epilog="The native op libraries are built and checked by a second command:\n"
        "  leapp-build-warp-runtime [--status]   (--status: which libraries exist, where, and the driver state)",
        formatter_class=argparse.RawDescriptionHelpFormatter,  # keeps the command's name on one line
    )
    parser.add_argument("--version", action="version", version=f"leapp {package_version('leapp')}")
    parser.add_argument("--cmake-dir", action=_PrintCmakeDir,
                        help="print the folder holding leappConfig.cmake (find_package(leapp): docs/deploy.md) and exit")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    inspect = commands.add_parser(
        "inspect",
        help="describe a bundle, ONNX model, PT2 archive or export folder",
        description="Describe the Warp segments an artifact holds: kernels, buffers, ops, binaries, versions. "
        "Exit status 1 when a bundle is corrupt or disagrees with its signature or pipeline.yaml.",
    )
    inspect.add_argument("path", help="a .lwb bundle, .onnx, .pt2 or .pt file, or an export folder with pipeline.yaml")
    inspect.add_argument("--graph", metavar="OUT", default=None,
                         help="also draw the export folder's pipeline into OUT (.svg, .png or .pdf): nodes, backends, "
                         "Warp segments and kernels, edges with tensor names, dtypes and shapes (needs leapp[graph])")
    commands.add_parser("doctor", help="report the CUDA driver, devices and op libraries",
                        description="Report the CUDA driver, devices, op libraries and package versions.")
    aoti_parser = commands.add_parser(
        "aoti",
        help="compile a PT2 node of an export folder into an AOTInductor package",
        description="Compile PT2 node NODE of EXPORT_DIR with AOTInductor (torch._inductor.aoti_compile_and_package) "
        "into a .pt2 package that torch._inductor.aoti_load_package and C++'s AOTIModelPackageLoader load "
        "(after registering leapp::warp_segment: import leapp, or dlopen libleapp_warp_torch.so). "
        "Prints the package's path.",
    )
    aoti_parser.add_argument("export_dir", metavar="EXPORT_DIR", help="an export folder with pipeline.yaml")
    aoti_parser.add_argument("node", metavar="NODE", help="the name of a PT2 node in it")
    aoti_parser.add_argument("-o", "--output", metavar="OUT", default=None,
                             help="the package file (ending in .pt2) or a folder; default EXPORT_DIR/NODE.aoti.pt2")
    write_json = commands.add_parser(
        "write-json",
        help="write pipeline.json, the JSON twin of pipeline.yaml that the C++ runner reads",
        description="Read EXPORT_DIR/pipeline.yaml (checked as leapp.load checks it) and write EXPORT_DIR/pipeline.json: "
        "the same description plus the sha256 of pipeline.yaml (docs/pipeline-format.md, 'pipeline.json'). "
        "Exports made by this leapp have it already; run this after editing pipeline.yaml or for older exports.",
    )
    write_json.add_argument("export_dir", metavar="EXPORT_DIR", help="an export folder with pipeline.yaml")
    commands.add_parser(
        "write-leapp-bundle",
        help="write <name>.yaml, the LEAPP bundle that the existing LEAPP tool and Isaac ROS Deploy read",
        description="Read EXPORT_DIR/pipeline.yaml (checked as leapp.load checks it; every artifact's sha256 "
        "recomputed) and write EXPORT_DIR/<name>.yaml in the existing LEAPP tool's layout (docs/leapp-bundle.md). "
        "Warns, by node, about nodes other tools cannot run (Warp segments not lowered, PT2 nodes for Triton).",
    ).add_argument("export_dir", metavar="EXPORT_DIR", help="an export folder with pipeline.yaml")
    ros2 = commands.add_parser(
        "ros2",
        help="run an export as a ROS 2 node: a topic per input and per output (needs leapp[ros2])",
        description="Load EXPORT_DIR and run it as a ROS 2 node: one subscription per pipeline input, one publisher "
        "per output, named after them; message types from their metadata (sensor_msgs/JointState for joints, "
        "sensor_msgs/Imu for an orientation, std_msgs/*MultiArray otherwise; docs/ros2.md). Arguments after "
        "--ros-args go to ROS (remapping: --ros-args -r joints:=/robot/joint_states).",
    )
    ros2.add_argument("export_dir", metavar="EXPORT_DIR", help="an export folder with pipeline.yaml")
    ros2.add_argument("--trigger", metavar="INPUT", default=None,
                      help="step on every message of this input (default: a timer)")
    ros2.add_argument("--rate", metavar="HZ", type=float, default=None,
                      help="the timer's rate, 0.1 to 10000 (default: metadata control_rate_hz)")
    ros2.add_argument("--quat-tolerance", metavar="TOL", type=float, default=None,
                      help="how far an orientation's norm may be from 1 (default: 1e-3)")
    ros2.add_argument("--name", default="leapp", help="the node's name (default: leapp)")
    ros2.add_argument("--dry-run", action="store_true", help="print the topics, types and step mode, then exit")
    ros2.add_argument("--trust", metavar="PUB.pem", action="append", default=None,
                      help="load only if signed by this PEM public key (repeatable; default: LEAPP_TRUST's keys)")
    add_signing_commands(commands)
    return parser


class _PrintCmakeDir(argparse.Action):
    """``leapp --cmake-dir``: like ``--version``, it prints and exits without a command."""

    def __init__(self, option_strings, dest, help=None):  # argparse's name
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        from leapp.runtime.libraries import native_dir

        folder = native_dir() / "cmake"
        if not (folder / "leappConfig.cmake").is_file():
            parser.exit(1, f"leapp: {folder}/leappConfig.cmake is missing: this build has no C++ pipeline library "
                           "(it needs ONNX Runtime's headers: bash scripts/fetch-ort-headers.sh, then reinstall)\n")
        print(folder)  # stdout: cmake -Dleapp_DIR="$(leapp --cmake-dir)"
        parser.exit(0)


def main(argv: list[str] | None = None) -> int:
    """The ``leapp`` console script; returns the exit status (0 ok, 1 problems found, 2 usage)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    ros_args = argv[argv.index("--ros-args") + 1:] if "--ros-args" in argv else []
    argv = argv[:argv.index("--ros-args")] if "--ros-args" in argv else argv
    args = _parser().parse_args(argv)
    try:
        if args.command == "inspect":
            problems = inspect_path(args.path)
            drawn = args.graph is None or graph_command(args.path, args.graph) == 0
            return 1 if problems or not drawn else 0
        if args.command == "aoti":
            return aoti(args.export_dir, args.node, args.output)
        if args.command == "write-json":
            return write_json(args.export_dir)
        if args.command == "write-leapp-bundle":
            return write_leapp_bundle_command(args.export_dir)
        if args.command == "ros2":
            return ros2(args.export_dir, trigger=args.trigger, rate=args.rate, name=args.name, dry_run=args.dry_run,
                        ros_args=["--ros-args", *ros_args] if ros_args else [], quat_tolerance=args.quat_tolerance,
                        trust=args.trust)
        if args.command == "sign":
            return sign_command(args)
        if args.command == "verify":
            return verify_command(args)
        return 1 if doctor() else 0
    except BrokenPipeError:  # `leapp inspect x | head`: stop quietly, as other command-line tools do
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1

