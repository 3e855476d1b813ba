"""leapp/runtime/release.py: freeing what replay keeps per segment, for long-running processes.

Replay prepares a segment once per CUDA context (its modules and constants) and
once per stream (its scratch) and keeps that, so a control loop pays nothing per
call. A process that loads export after export frees what it no longer replays
with ``release_segments()``. Every copy of the native runtime in the process is
released: ``leapp._native``'s, and those of the torch and ONNX Runtime op
libraries when they are loaded (each links the runtime statically and keeps its
own caches). Captured CUDA graphs of ``leapp.load(..., cuda_graphs=True)`` are
dropped first, since they hold the addresses being freed; they are captured
again on later calls. docs/runtime.md ("Resources") lists what stays and why.
"""

from __future__ import annotations

import ctypes
import os
import sys

__all__ = ["release_segments"]


def release_segments(digest: str | None = None) -> int:
    """Frees the device memory and modules replay keeps for segment ``digest`` (every segment when None).

    Waits for calls enqueueing those segments, synchronises their CUDA contexts,
    then frees modules, constants, scratch and idle host staging; a later call
    prepares a segment again. Call it when no other thread replays a CUDA graph
    that captured these segments and no stream is being captured. Returns how
    many (CUDA context, segment) preparations were released, over all runtime copies.

    Raises:
        RuntimeError: something could not be freed (e.g. a stream is being captured);
            it is kept and the next call tries again.
    """
    graphs = sys.modules.get("leapp.runtime.cuda_graphs")
    if graphs is not None:
        graphs.drop_all_graphs()
    from leapp import _native

    released = _native.release_segments(digest)
    released += _release_in_torch_library(digest)
    released += _release_in_ort_library(digest)
    return released


def _release_in_torch_library(digest: str | None) -> int:
    if "torch" not in sys.modules:  # the library cannot be loaded without torch
        return 0
    import torch

    try:
        op = torch.ops.leapp.release_segments
    except (AttributeError, RuntimeError):  # libleapp_warp_torch.so not loaded (or an older build)
        return 0
    return int(op(digest))


def _release_in_ort_library(digest: str | None) -> int:
    from leapp.runtime import libraries

    path = libraries.library_path("onnx")
    try:  # only when ONNX Runtime loaded it already: RTLD_NOLOAD never loads
        lib = ctypes.CDLL(str(path), mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        fn = lib.LeappReleaseSegments
    except (OSError, AttributeError):
        return 0
    fn.restype = ctypes.c_longlong
    fn.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]
    error = ctypes.create_string_buffer(2048)
    n = fn(digest.encode() if digest is not None else None, error, len(error))
    if n < 0:
        raise RuntimeError(f"{path.name}: {error.value.decode(errors='replace')}")
    return int(n)
