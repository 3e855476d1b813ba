"""Exceptions and the exact error texts of the recorder's checks (docs/recorder.md section 2) and of export.

NOTE: users search for these texts and tests assert them, so each lives here
once; callers format them with the node, segment and file:line they know.
"""

from __future__ import annotations

__all__ = [
    "LeappError",
    "TraceError",
    "SegmentDivergenceError",
    "ExportError",
    "ValidationError",
    "RuntimeLibraryNotFound",
    "UnsupportedBackend",
    "UnsupportedPlatform",
    "SignatureError",
    "NOT_EXECUTED_TWICE",
    "MORE_REGIONS_THAN_DISCOVERY",
    "SEGMENT_DIVERGED",
    "MIXED_TRACE_CONTEXTS",
    "WARP_OP_OWNER_TOKEN",
    "LINUX_ONLY",
    "UNSUPPORTED_DTYPE",
    "VALIDATION_FAILED",
    "runtime_not_found_message",
]

NOT_EXECUTED_TWICE = "not executed a second time for APIC capture"
MORE_REGIONS_THAN_DISCOVERY = "Warp capture encountered more regions than discovery"
SEGMENT_DIVERGED = "Warp segment diverged between discovery and capture"
MIXED_TRACE_CONTEXTS = "received traced Warp arrays from different LEAPP trace contexts."
WARP_OP_OWNER_TOKEN = "Cannot begin WarpOp because the active WarpOp is protected by an owner token."
LINUX_ONLY = "LEAPP: Warp tracing is only available on Linux."
UNSUPPORTED_DTYPE = "Unsupported dtype"
VALIDATION_FAILED = "Model validation failed for {count} node(s): {names}"


class LeappError(RuntimeError):
    """Base class of leapp's own errors."""


class TraceError(LeappError):
    """The traced code broke a rule of the two passes (docs/recorder.md section 2)."""


class SegmentDivergenceError(TraceError):
    """The capture pass met different Warp regions or operations than discovery."""


class ExportError(LeappError):
    """A recorded node cannot be written as the requested artifact."""


class ValidationError(LeappError):
    """Exported artifacts could not be run or disagree with eager outputs."""


class SignatureError(LeappError):
    """An export's signature (model.sig) is missing, not from a trusted key, or does not cover the files read
    (docs/signing.md); the text names the file or the signature problem, as the C++ reader's does."""


class RuntimeLibraryNotFound(LeappError, FileNotFoundError):
    """A native op library (PT2 or ONNX) is missing."""


class UnsupportedBackend(ExportError, NotImplementedError):
    """A node holds what its ``export_with`` backend cannot export (Warp segments on TorchScript)."""


class UnsupportedPlatform(TraceError, ImportError):
    """Warp tracing on an operating system leapp does not support (Linux only)."""


def runtime_not_found_message(backend: str, path: str) -> str:
    """The text for a missing op library, naming both ways out; backend is 'pt2' or 'onnx'."""
    env = "LEAPP_WARP_PT2_CUSTOM_OP_LIBRARY" if backend == "pt2" else "LEAPP_WARP_ONNX_CUSTOM_OP_LIBRARY"
    return (
        f"LEAPP Warp {backend} runtime was not found at {path}. "
        f"Run leapp-build-warp-runtime or set {env}."
    )
