"""Lowering Warp kernels to standard ops, read from Warp's own code generation (docs/lowering.md).

``frontend`` turns each launch of a segment into the IR (``ir``) from the
kernel's SSA as Warp builds it, ``table`` holds the builtins as data, and
``torch_backend`` runs the IR as torch ops, which torch.export records as
ATen ops and torch.onnx writes as standard ONNX: a lowered export needs
nothing of leapp or Warp to run.
"""

from __future__ import annotations

from leapp.lowering.frontend import MAX_TRIPS, ArrayBinding, LaunchBinding, lower_launch
from leapp.lowering.ir import Graph

__all__ = ["MAX_TRIPS", "ArrayBinding", "Graph", "LaunchBinding", "lower_launch"]


def lower_wp_launch(kernel, dim, inputs: list):
    """A ``wp.launch(kernel, dim, inputs)`` on CPU arrays, lowered: a torch function of the arrays' tensors.

    Each array becomes one input region (its tensor, in argument order) and
    scalars are baked in; the returned ``LoweredLaunch`` maps the arrays' torch
    tensors to their values after the launch. For tests and for reading what a
    kernel lowers to; exports lower whole recorded segments instead.
    """
    from leapp.lowering.launch import lower_wp_launch as _lower

    return _lower(kernel, dim, inputs)


__all__ += ["lower_wp_launch"]
