"""The device a test that runs on either traces Warp on: the GPU where there is one, else the CPU.

On the CPU the segments run from their CPU code (docs/export-cpu.md); tracing there runs the kernels eagerly
with Warp's own CPU build, which needs its warp-clang library (the GPU test machine's Warp has none).
"""

from __future__ import annotations

from pathlib import Path

import pytest


def warp_builds_cpu_kernels() -> bool:
    import warp as wp

    return (Path(wp.__file__).parent / "bin" / "warp-clang.so").is_file()


def warp_device() -> str:
    """"cuda:0" where Warp and torch see a GPU, else "cpu"; skips when neither can run Warp kernels."""
    import torch
    import warp as wp

    wp.init()
    if wp.is_cuda_available() and torch.cuda.is_available():
        return "cuda:0"
    if not warp_builds_cpu_kernels():
        pytest.skip("no CUDA device, and this Warp cannot build CPU kernels (no warp-clang.so)")
    return "cpu"
