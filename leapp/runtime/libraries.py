"""Where the native op libraries are, and the error when one is missing.

NOTE: editable installs keep the compiled files in site-packages while the
Python sources stay in the checkout, so paths are taken from the location of
``leapp._native`` (never from ``leapp.__file__``).
"""

from __future__ import annotations

import os
from pathlib import Path

from leapp.errors import RuntimeLibraryNotFound, runtime_not_found_message

__all__ = ["native_dir", "library_path", "require_library", "onnxruntime_library", "ENV_OVERRIDES", "LIBRARY_NAMES"]

ENV_OVERRIDES = {
    "pt2": "LEAPP_WARP_PT2_CUSTOM_OP_LIBRARY",
    "onnx": "LEAPP_WARP_ONNX_CUSTOM_OP_LIBRARY",
}
LIBRARY_NAMES = {
    "pt2": "libleapp_warp_torch.so",
    "onnx": "libleapp_warp_ort.so",
}


def native_dir() -> Path:
    """The folder that holds ``leapp._native`` and the op libraries pip built."""
    from leapp import _native

    return Path(_native.__file__).resolve().parent


def library_path(backend: str) -> Path:
    """The op library for ``backend`` ('pt2' or 'onnx'): the env override, else the installed one."""
    if backend not in LIBRARY_NAMES:
        raise ValueError(f"library_path(): backend must be 'pt2' or 'onnx', got {backend!r}")
    override = os.environ.get(ENV_OVERRIDES[backend])
    if override:
        return Path(override)
    return native_dir() / LIBRARY_NAMES[backend]


def require_library(backend: str) -> Path:
    """library_path(backend), raising ``RuntimeLibraryNotFound`` (how to build or point to it) when the file is not there."""
    path = library_path(backend)
    if not path.is_file():
        raise RuntimeLibraryNotFound(runtime_not_found_message(backend, str(path)))
    return path


def onnxruntime_library() -> Path:
    """The ``libonnxruntime.so`` of the onnxruntime this Python imports (the one ``leapp.load`` runs).

    The C++ runner looks for the onnxruntime wheel next to leapp's installed package; a program
    started from Python where another onnxruntime comes first on ``sys.path`` (a ``PYTHONPATH``
    overlay of onnxruntime-gpu, say) is given this path in ``LEAPP_ONNXRUNTIME_LIBRARY`` so that
    both sides run the same ONNX Runtime.
    """
    import onnxruntime

    capi = Path(onnxruntime.__file__).resolve().parent / "capi"
    found = sorted(capi.glob("libonnxruntime.so*"))
    if not found:
        raise FileNotFoundError(f"no libonnxruntime.so* in {capi} (onnxruntime {onnxruntime.__version__})")
    return found[0]
