"""Lowering Warp kernels to standard ONNX ops, read from Warp's own code generation (docs/lowering.md).

A lowered kernel needs nothing of leapp or Warp to run: any ONNX runtime that
implements the default opset ``OPSET`` executes it.
"""

from __future__ import annotations

from leapp.lowering.frontend import to_ir
from leapp.lowering.onnx_backend import OPSET, to_onnx

__all__ = ["OPSET", "lower_kernel"]


def lower_kernel(kernel):
    """The ONNX model of a 1-D Warp kernel (arrays in, ``<array>_out`` per written array), or ExportError naming
    each construct that does not lower (kernel, file:line, construct)."""
    return to_onnx(to_ir(kernel))
