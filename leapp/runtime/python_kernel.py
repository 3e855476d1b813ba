"""Kernels for ``leapp::warp_segment`` when it is defined from Python.

Used only when libleapp_warp_torch.so is absent; replays through ``leapp._native``.
"""

from __future__ import annotations


def register(lib) -> None:
    """Registers the CPU and CUDA kernels on ``lib`` (a torch.library.Library for 'leapp')."""
    from leapp.runtime import replay

    lib.impl("warp_segment", replay.warp_segment_cpu, "CPU")
    lib.impl("warp_segment", replay.warp_segment_cuda, "CUDA")
