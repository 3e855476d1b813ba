"""leapp/_contract/backends.py: the export backends and the ``backend_params`` each one reads.

One table for both sides: ``leapp.node(name, export_with=..., **backend_params)``
refuses an unknown backend or parameter when the node is declared, and the
exporters (``onnx_export``, ``pt2_export``, ``torchscript_export``) read only
these keys. Light on purpose (no torch): the recorder imports it on every
declaration.
"""

from __future__ import annotations

import numbers

__all__ = ["BACKEND_PARAMS", "BACKENDS", "SEGMENT_BACKENDS", "backend_problem"]

# backend -> {parameter: accepted type}; bool is not an int here (``opset_version=True`` is a mistake).
BACKEND_PARAMS: dict[str, dict[str, type]] = {
    "onnx": {"opset_version": int, "optimize": bool, "external_data": bool},
    "pt2": {"strict": bool},
    "torchscript": {},  # torch.jit.trace -> <node>.pt, nodes without Warp segments
}
BACKENDS = tuple(BACKEND_PARAMS)
SEGMENT_BACKENDS = ("onnx", "pt2")  # where a Warp segment can live (as leapp.warp::WarpSegment / leapp::warp_segment)


def _accepted() -> str:
    return "; ".join(f"{b}: {', '.join(p) if p else 'none'}" for b, p in BACKEND_PARAMS.items())


def backend_problem(export_with: object, params: dict) -> str | None:
    """What is wrong with ``export_with`` and its ``backend_params`` (None when both are accepted)."""
    accepted = BACKEND_PARAMS.get(export_with) if isinstance(export_with, str) else None
    if accepted is None:
        return f"unknown export_with={export_with!r}; the backends are {list(BACKENDS)}"
    unknown = [k for k in params if k not in accepted]
    if unknown:
        known = ", ".join(accepted) if accepted else "no parameters"
        return (
            f"export_with={export_with!r} takes {known}, not {', '.join(unknown)} "
            f"(accepted per backend: {_accepted()})"
        )
    for key, value in params.items():
        kind = accepted[key]
        integral = kind is int and isinstance(value, numbers.Integral) and not isinstance(value, bool)
        if not (integral or (kind is not int and isinstance(value, kind))):
            return f"{key}={value!r} for export_with={export_with!r} must be of type {kind.__name__}"
    return None
