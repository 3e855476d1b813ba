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


def _cpu_code_line() -> str:
    """Which CPU code an export made here carries (docs/export-cpu.md) and which this machine runs."""
    from leapp.bundle.format import CPU_MACHINES, this_machine

    machine = this_machine()
    runs = f"runs here for {machine}" if machine in CPU_MACHINES else (
        f"none runs here ({machine}; leapp makes it for {', '.join(CPU_MACHINES)} only)")
    try:
        from leapp._export.cpu_code import CPU_CODE_ENV, compilers, cpu_code_setting

        setting = cpu_code_setting()
        found = compilers()
    except Exception as e:  # noqa: BLE001 - diagnostics must not fail (a bad LEAPP_CPU_CODE says so here)
        return f"CPU code: {runs}; exports: cannot tell ({e})"
    built = ", ".join(f"{m} ({cxx})" for m, cxx in found) or "none (no C++ compiler found)"
    which = {"auto": "segments captured on the CPU", "always": "every segment", "never": "no segment"}[setting]
    return f"CPU code: {runs}; exports carry it for {which} (${CPU_CODE_ENV}={setting}), built for {built}"


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
        report.line("export and CPU tests work; Warp segments replay here only from their CPU code (below), "
                    "the CUDA code needs an NVIDIA driver", 1)
    report.line(_cpu_code_line())
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
