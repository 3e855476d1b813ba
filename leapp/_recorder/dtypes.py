"""leapp/_recorder/dtypes.py: Warp dtypes at a boundary, seen as torch tensors.

A boundary value is a plain scalar array or a densely packed homogeneous
compound (vec, quat, mat, transform) in expanded scalar layout: a (2, 4)
``wp.vec3`` array is a (2, 4, 3) float32 tensor. ``@wp.struct`` arrays have
no such layout and are refused with ``Unsupported dtype``.

NOTE: an array made by Warp maps to the dtype ``wp.to_torch`` gives it, so
unsigned Warp ints are torch's unsigned dtypes (``torch.uint32``). A torch
tensor viewed by Warp keeps its own dtype (``wp.from_torch(int32_tensor,
dtype=wp.uint32)`` stays int32); ``TensorSpec.warp_dtype`` says "uint32".
"""

from __future__ import annotations

import torch
import warp as wp

from leapp._contract.records import TensorSpec
from leapp._warp_private import is_struct_type, scalar_types
from leapp.errors import UNSUPPORTED_DTYPE, TraceError

__all__ = [
    "is_warp_array",
    "check_boundary_dtype",
    "warp_dtype_name",
    "torch_dtype_of",
    "expanded_shape",
    "spec_for_array",
    "spec_for_tensor",
]


def is_warp_array(value) -> bool:
    return isinstance(value, wp.array)


def check_boundary_dtype(dtype, what: str, where: str) -> None:
    """Raise ``Unsupported dtype`` unless ``dtype`` has an expanded scalar layout."""
    if is_struct_type(dtype):
        raise TraceError(
            f"{UNSUPPORTED_DTYPE} '{dtype.key if hasattr(dtype, 'key') else dtype}' (@wp.struct) for {what} "
            f"at {where}: boundary arrays must hold Warp scalars or vec/quat/mat/transform values."
        )
    scalar = getattr(dtype, "_wp_scalar_type_", dtype)
    if scalar not in scalar_types() and scalar is not wp.bool:
        raise TraceError(f"{UNSUPPORTED_DTYPE} {dtype!r} for {what} at {where}.")


def warp_dtype_name(dtype) -> str:
    """Warp's short name: ``float32``, ``uint32``, ``vec3f``, ``quatf``, ``mat33f``, ``transformf``."""
    return getattr(dtype, "__name__", str(dtype))


_UNSIGNED = {wp.uint16: torch.uint16, wp.uint32: torch.uint32, wp.uint64: torch.uint64}


def torch_dtype_of(dtype) -> torch.dtype:
    scalar = getattr(dtype, "_wp_scalar_type_", dtype)
    return _UNSIGNED.get(scalar) or wp.dtype_to_torch(scalar)


def expanded_shape(arr) -> tuple[int, ...]:
    return tuple(arr.shape) + tuple(getattr(arr.dtype, "_shape_", ()))


def spec_for_array(name: str, arr) -> TensorSpec:
    return TensorSpec(
        name=name,
        dtype=torch_dtype_of(arr.dtype),
        shape=expanded_shape(arr),
        warp_dtype=warp_dtype_name(arr.dtype),
        logical_shape=tuple(arr.shape),
    )


def spec_for_tensor(name: str, t: torch.Tensor) -> TensorSpec:
    return TensorSpec(name=name, dtype=t.dtype, shape=tuple(t.shape))
