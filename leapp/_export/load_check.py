"""leapp/_export/load_check.py: open every written artifact the way ``leapp.load`` will, before success.

Validation loads each artifact in a fresh process, but it does not run when
``validate=False`` or when this machine cannot replay the node (``needs-cuda``).
An artifact that cannot be opened must not be reported as written, so each of
those is opened here in-process: a PT2 through the safety check and
``torch.export.load`` (``leapp.runtime.runners.load_pt2``), an ONNX model
through ``onnx.checker`` and an ONNX Runtime session on the CPU EP with
leapp's op library (a session resolves every custom op when it is created;
nothing runs), a TorchScript file through ``torch.jit.load``.
"""

from __future__ import annotations

from pathlib import Path

from leapp.errors import ExportError

__all__ = ["check_artifact_loads"]


def check_artifact_loads(node: str, backend: str, path: Path) -> None:
    """Raises ExportError naming the node and the file when its artifact cannot be opened."""
    try:
        if backend == "pt2":
            from leapp.runtime.runners import load_pt2  # the runtime is imported only to check

            load_pt2(path)
        elif backend == "onnx":
            _open_onnx(path)
        else:
            import torch

            torch.jit.load(str(path), map_location="cpu")
    except ExportError:
        raise
    except Exception as e:  # torch's and ORT's loaders raise their own types
        raise ExportError(
            f"node '{node}': the {backend} artifact {path.name} was written but cannot be opened as leapp.load "
            f"opens it ({type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else e!r}); "
            "this is a leapp bug: please report it with the trace that produced it"
        ) from e


def _open_onnx(path: Path) -> None:
    import onnx
    import onnxruntime as ort

    from leapp.runtime import libraries
    from leapp.runtime.onnx_runner import session_options

    onnx.checker.check_model(str(path))
    library = libraries.library_path("onnx")
    if not library.is_file():
        return  # no native build here: the checker is all that can be run
    ort.InferenceSession(str(path), session_options(ort, False, str(library)), providers=["CPUExecutionProvider"])
