"""leapp/cli/inspect_bundle.py: ``leapp inspect`` of segment bundles and of the signatures that name them.

Shared by every artifact inspector: a bundle found in an ONNX initializer, a PT2 entry or
a ``.lwb`` file is described the same way, and its signature must describe it exactly.
"""

from __future__ import annotations

import json
from pathlib import Path

from leapp.bundle import Bundle, BundleError, parse_signature, read_bundle, signature_json
from leapp.bundle.describe import describe_bundle, format_bytes
from leapp.cli.report import Report

__all__ = ["check_signature", "describe_choice", "inspect_bundle_file", "read_described"]


def check_signature(report: Report, where: str, text: str | None, bundle: Bundle | None, indent: int) -> None:
    """The signature string must parse and describe ``bundle`` exactly (digest, segment, tensors)."""
    if text is None:
        report.problem(f"{where}: no signature", indent)
        return
    try:
        sig = parse_signature(text)
    except BundleError as e:
        report.problem(f"{where}: {e}", indent)
        return
    if bundle is None:
        return
    if sig["digest"] != bundle.digest:
        report.problem(f"{where}: signature digest {sig['digest']} differs from the bundle's {bundle.digest}", indent)
    elif sig != json.loads(signature_json(bundle)):
        report.problem(f"{where}: signature {text} differs from the bundle's {signature_json(bundle)}", indent)
    else:
        report.line(f"signature matches the bundle (digest {bundle.digest[:16]}...)", indent)


def describe_choice(report: Report, where: str, data: bytes, indent: int) -> None:
    """Which binary of the bundle loads on this machine's GPUs (or on named GPUs without a driver), and why:
    the native loader's own choice (``leapp.runtime.binary_choice``)."""
    from leapp.runtime.binary_choice import describe_binary_choice

    try:
        report.lines(describe_binary_choice(data), indent)
    except ValueError as e:  # the C++ reader refuses what the Python reader accepted
        report.problem(f"{where}: native reader: {e}", indent)


def read_described(report: Report, where: str, data: bytes, indent: int) -> Bundle | None:
    try:
        bundle = read_bundle(data)
    except BundleError as e:
        report.problem(f"{where}: {e}", indent)
        return None
    report.lines(describe_bundle(bundle, len(data)), indent)
    describe_choice(report, where, data, indent)
    report.digests.add(bundle.digest)
    return bundle


def inspect_bundle_file(path: Path, report: Report, indent: int) -> None:
    data = path.read_bytes()
    report.line(f"{path.name}: leapp segment bundle, {format_bytes(len(data))}", indent)
    bundle = read_described(report, str(path), data, indent + 1)
    if bundle is not None:
        report.line(f"signature: {signature_json(bundle)}", indent + 1)
