"""leapp/cli/diagnostics.py: ``leapp doctor``: the driver, devices, op libraries and package versions here.

A machine without a driver is reported, not a problem: export works there, GPU replay does not.
"""

from __future__ import annotations

import sys
from typing import TextIO

from leapp.cli.report import Report

__all__ = ["doctor", "package_version"]


def package_version(dist: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def doctor(out: TextIO | None = None) -> int:
    """Prints the CUDA driver, devices, op libraries and package versions; returns the problem count.

    A machine without a driver is reported, not a problem: export works there, GPU replay does not.
    """
    report = Report(out if out is not None else sys.stdout)
    report.line(f"leapp {package_version('leapp')} (Python {sys.version.split()[0]})")
    try:
        from leapp import _native
    except ImportError as e:
        report.problem(f"native module leapp._native cannot be imported: {e} (rebuild: pip install -e .)")
        return report.problems
    report.line(f"native module: {_native.__file__}")
    status = _native.driver_status()
    if status["available"]:
        version = int(status["version"])
        report.line(f"CUDA driver: available, CUDA {version // 1000}.{version % 1000 // 10} ({version})")
        if status.get("assumed_version"):
            assumed = int(status["assumed_version"])
            report.line(f"LEAPP_ASSUME_DRIVER: binaries are chosen as a CUDA {assumed // 1000}."
                        f"{assumed % 1000 // 10} driver would (cubins it could not load are not tried)", 1)
        if status.get("assumed_error"):
            report.problem(status["assumed_error"])
        devices = status["devices"]
        if not devices:
            report.line("devices: none (the driver sees no GPU)", 1)
        for device in devices:
            major, minor = device["compute_capability"]
            report.line(f"device {device['ordinal']}: {device['name']}, compute capability {major}.{minor} "
                        f"(bundle arch {10 * major + minor})", 1)
    else:
        report.line(f"CUDA driver: not available ({status['error']})")
        report.line("export and CPU tests work; replaying Warp segments needs an NVIDIA driver", 1)
    from leapp.runtime.binary_choice import describe_machine_binaries

    report.lines(describe_machine_binaries())  # which binary a default export loads here, and why
    try:
        from leapp.runtime import libraries

        for backend in ("pt2", "onnx"):
            path = libraries.library_path(backend)
            state = "found" if path.is_file() else "MISSING"
            report.line(f"{backend} op library: {path} ({state})")
    except Exception as e:  # noqa: BLE001 - diagnostics must not fail
        report.line(f"op libraries: cannot locate ({e})")
    versions = ", ".join(f"{d} {package_version(d)}" for d in ("torch", "warp-lang", "onnx", "onnxruntime"))
    report.line(f"packages: {versions}")
    return report.problems
