"""leapp: export PyTorch + NVIDIA Warp pipelines to ONNX and PT2.

Public API (docs/recorder.md section 1)::

    with leapp.trace("go2", save_path="exports") as session:
        step(quat, joints)      # pass 1: discovery
        step(quat, joints)      # pass 2: capture; further passes: validation samples
    report = session.compile(validate=True)
    pipeline = leapp.load("exports/go2")

Nothing here changes torch or warp process-wide: recording is scoped to
``leapp.node`` bodies and ``annotate.warp_op()`` blocks inside a session.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

# NOTE: the recorder (torch, warp) is imported on first use, not here: loading
# and running an export (`leapp.load`, `leapp inspect`) needs neither Warp nor
# the recorder. `from leapp import annotate` imports the submodule as usual.
# What import does do, when torch is installed, is register the
# `leapp::warp_segment` op (`_register_torch_op` at the end), like torchvision.
from leapp.errors import (
    ExportError,
    LeappError,
    RuntimeLibraryNotFound,
    SegmentDivergenceError,
    SignatureError,
    TraceError,
    UnsupportedBackend,
    UnsupportedPlatform,
    ValidationError,
)

# leapp logs through the "leapp" logger (export steps and timings, the binaries chosen at load,
# cache decisions) and stays silent unless the application configures logging.
logging.getLogger("leapp").addHandler(logging.NullHandler())

if TYPE_CHECKING:
    from leapp import annotate, aoti
    from leapp._contract.records import SessionRecord
    from leapp._export.report import CompileReport
    from leapp._recorder.node import NodeScope as _NodeScope
    from leapp._recorder.session import Session
    from leapp.bundle.format import BundleError
    from leapp.pipeline_format.format import PipelineError
    from leapp.runtime.artifact_safety import UnsafeArtifact
    from leapp.runtime.pipeline import Pipeline

__all__ = [
    # recording and export
    "trace", "start", "stop", "compile_graph", "node", "annotate", "Session", "CompileReport",
    # running an export
    "load", "Pipeline", "aoti",
    # errors: one tree under LeappError (tests/foundation/test_public_api.py)
    "LeappError", "TraceError", "SegmentDivergenceError", "UnsupportedPlatform", "ExportError", "UnsupportedBackend",
    "ValidationError", "RuntimeLibraryNotFound", "BundleError", "PipelineError", "UnsafeArtifact", "SignatureError",
]

# Public names whose modules need torch (or Inductor): imported on first use, so that `import leapp` stays light.
_LAZY = {
    "annotate": ("leapp.annotate", None),
    "aoti": ("leapp.aoti", None),
    "Session": ("leapp._recorder.session", "Session"),
    "CompileReport": ("leapp._export.report", "CompileReport"),
    "Pipeline": ("leapp.runtime.pipeline", "Pipeline"),
    "BundleError": ("leapp.bundle.format", "BundleError"),
    "PipelineError": ("leapp.pipeline_format.format", "PipelineError"),
    "UnsafeArtifact": ("leapp.runtime.artifact_safety", "UnsafeArtifact"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attribute = _LAZY[name]
        found = importlib.import_module(module)
        return found if attribute is None else getattr(found, attribute)
    raise AttributeError(f"module 'leapp' has no attribute {name!r}")


def trace(name: str, save_path: str = ".") -> "Session[CompileReport]":
    """A recording session, used as a context manager; ``.compile(...)`` exports it."""
    from leapp._recorder.session import Session

    return Session(name, save_path, export=_EXPORTER)


def start(name: str, save_path: str = ".") -> "Session[CompileReport]":
    """Script-style ``trace``: begin a session (end it with ``leapp.stop()``)."""
    from leapp._recorder.session import start as _start

    return _start(name, save_path, export=_EXPORTER)


def stop() -> "Session[CompileReport]":
    """End the session begun by ``leapp.start``."""
    from leapp._recorder.session import stop as _stop

    return _stop()


class _SessionExporter:
    """The ``leapp._contract.exporter.Exporter`` sessions made here use: the exporter, imported on first use.
    The link lives here, in the API layer, so that the recorder and the exporter depend only on
    ``leapp._contract``, not on each other."""

    def prepare(self) -> None:
        """Starts the exporter's validation worker in the background
        (``leapp._export.validate_process.prestart``), so that its start overlaps with tracing."""
        from leapp._export.validate_process import prestart

        prestart()

    def __call__(self, record: "SessionRecord", **options: Any) -> "CompileReport":
        from leapp._export.compile import compile_session  # the exporter is heavy and optional

        return compile_session(record, **options)


_EXPORTER = _SessionExporter()


def compile_graph(validate: bool = True, rtol: float = 1e-3, atol: float = 1e-5) -> "CompileReport":
    """Compile the active (or last) session; same as ``session.compile(...)``."""
    from leapp._recorder.session import last_session as _last_session

    return _last_session().compile(validate=validate, rtol=rtol, atol=atol)


def node(name: str, export_with: str = "onnx", *, dynamic_batch: Any = None, **backend_params: Any) -> "_NodeScope":
    """Mark a node: ``with leapp.node("obs", export_with="pt2"):`` or ``@leapp.node("policy")``.

    ``dynamic_batch=True`` (or a ``(min, max)`` range) exports the node once for every batch size:
    dim 0 of every input and output is the batch (docs/recorder.md section 1.0).

    As a decorator, tensor arguments are the node's inputs (named after the
    parameters) and the return value (a tensor, a tuple/list or a dict of
    tensors) its outputs. Outside a session it just calls the function.
    """
    from leapp._recorder.node import NodeScope as _NodeScope

    return _NodeScope(name, export_with, dynamic_batch=dynamic_batch, **backend_params)


def load(path: str, *, cuda_graphs: bool = False, trust: Any = None) -> "Pipeline":
    """Load an exported pipeline folder (``leapp.runtime.pipeline.load``); ``cuda_graphs=True``
    replays CUDA PT2 nodes from captured CUDA graphs (outputs overwritten by the next call);
    ``trust``: the PEM public key(s) one of which must have signed it (None: ``LEAPP_TRUST``; docs/signing.md)."""
    from leapp.runtime.pipeline import load as _load  # runtime is optional at trace time

    return _load(path, cuda_graphs=cuda_graphs, trust=trust)


def _in_leapp_command() -> bool:
    """True when this process is the ``leapp`` command (its console script, or ``python -m leapp``): its
    commands register the op themselves when they load a PT2 (``leapp.runtime.runners.load_pt2``), so
    that ``leapp --help`` and ``leapp --version`` answer without importing torch."""
    import os
    import sys

    argv = list(getattr(sys, "orig_argv", []))
    if any(a == "-m" and b in ("leapp", "leapp.cli") for a, b in zip(argv, argv[1:])):
        return True
    return bool(sys.argv) and os.path.basename(sys.argv[0]) == "leapp"


def _register_torch_op() -> None:
    """Registers ``torch.ops.leapp.warp_segment`` when torch is installed, so that
    ``import leapp; torch.export.load("node.pt2")`` resolves the op. Never raises: a
    library that fails to load is reported as a warning here and raised by the
    ``leapp.load`` / export that needs it (``leapp-build-warp-runtime`` must still import).
    Not in the ``leapp`` command itself (``_in_leapp_command``)."""
    import importlib.util

    if _in_leapp_command():
        return

    try:
        if importlib.util.find_spec("torch") is None:
            return  # torch-free uses: `leapp inspect`, leapp.bundle
    except ValueError:  # sys.modules["torch"] is None: torch blocked on purpose
        return
    try:
        from leapp.runtime import ops  # imports torch, not Warp or the recorder

        ops.ensure_registered()
    except Exception as e:  # noqa: BLE001 - any failure must leave `import leapp` working
        import warnings

        warnings.warn(
            f"leapp: torch.ops.leapp.warp_segment is not registered ({type(e).__name__}: {e}); PT2 exports with "
            "Warp segments will not load. `leapp-build-warp-runtime --status` shows the op libraries.",
            RuntimeWarning,
            stacklevel=2,
        )


_register_torch_op()
