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
import warp._src.codegen as _wp_codegen
import warp._src.types as _wp_types

from leapp.errors import UNSUPPORTED_DTYPE, TraceError

from .model import TensorSpec

__all__ = [
    "is_warp_array",
    "check_boundary_dtype",
    "warp_dtype_name",
    "torch_dtype_of",
    "expanded_shape",
    "array_base",
    "spec_for_array",
    "spec_for_tensor",
]


def is_warp_array(value) -> bool:
    return isinstance(value, wp.array)


def check_boundary_dtype(dtype, what: str, where: str) -> None:
    """Raise ``Unsupported dtype`` unless ``dtype`` has an expanded scalar layout."""
    if isinstance(dtype, _wp_codegen.Struct):
        raise TraceError(
            f"{UNSUPPORTED_DTYPE} '{dtype.key if hasattr(dtype, 'key') else dtype}' (@wp.struct) for {what} "
            f"at {where}: boundary arrays must hold Warp scalars or vec/quat/mat/transform values."
        )
    scalar = getattr(dtype, "_wp_scalar_type_", dtype)
    if scalar not in _wp_types.scalar_types and scalar is not wp.bool:
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


def array_base(arr) -> tuple[object, int, int]:
    """(base array, base pointer, capacity) the way APIC keys a region.

    Mirrors ``warp._src.apic.capture.APICapture._find_base``: arrays made by
    ``wp.from_torch`` carry the torch storage's base pointer and size.
    """
    base = arr
    while getattr(base, "_ref", None) is not None and hasattr(base._ref, "ptr"):
        base = base._ref
    ptr = base._storage_base_ptr if getattr(base, "_storage_base_ptr", None) is not None else base.ptr
    capacity = base._storage_nbytes if getattr(base, "_storage_nbytes", None) is not None else base.capacity
    return base, ptr, capacity


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
