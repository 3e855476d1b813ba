"""leapp/runtime/io.py: the named, typed values at a node's or a pipeline's boundary.

``IOSpec`` is one entry of pipeline.yaml's ``inputs``/``outputs`` with its dtype as a
torch dtype; ``check_inputs`` turns a caller's named values into the positional tensors a
runner takes, with errors that name the input and both specs, before anything runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from leapp.pipeline_format import PipelineError, dtype_name

__all__ = ["IOSpec", "check_inputs"]


def _dtype(name: str, where: str) -> torch.dtype:
    value = getattr(torch, str(name), None)
    if not isinstance(value, torch.dtype):
        raise PipelineError(f"{where}: unknown dtype {name!r}")
    return value


@dataclass(frozen=True)
class IOSpec:
    """A named value at a node boundary: dtype, static shape, and the user's metadata (deployment fields)."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    metadata: Mapping[str, Any] = field(default_factory=dict, hash=False)

    @classmethod
    def from_yaml(cls, entry: Mapping, where: str) -> IOSpec:
        """From an entry that ``leapp.pipeline_format`` has checked (name, dtype, shape, metadata if any)."""
        return cls(str(entry["name"]), _dtype(entry["dtype"], where), tuple(int(d) for d in entry["shape"]),
                   dict(entry.get("metadata", {})))

    def describe(self) -> str:
        return f"{dtype_name(self.dtype)}{list(self.shape)}"


def _as_tensor(value: Any, where: str) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    try:
        import numpy as np

        if isinstance(value, np.ndarray):
            return torch.from_numpy(value)
    except ImportError:  # pragma: no cover - numpy is a dependency
        pass
    raise PipelineError(f"{where}: expected a torch.Tensor or numpy array, got {type(value).__name__}")


def check_inputs(specs: Sequence[IOSpec], values: Mapping[str, Any], where: str) -> list[torch.Tensor]:
    """The values of ``specs`` in order, after checking names, dtypes and shapes (clear errors)."""
    if len(values) != len(specs) or any(s.name not in values for s in specs):
        expected = [s.name for s in specs]
        unknown = sorted(set(values) - set(expected))
        missing = [n for n in expected if n not in values]
        parts = []
        if missing:
            parts.append(f"missing {missing}")
        if unknown:
            parts.append(f"unexpected {unknown}")
        raise PipelineError(f"{where}: inputs {', '.join(parts)}; expected {expected}")
    out = []
    for spec in specs:
        tensor = values[spec.name]
        if not isinstance(tensor, torch.Tensor):
            tensor = _as_tensor(tensor, f"{where}: input '{spec.name}'")
        if tensor.dtype != spec.dtype or tensor.shape != spec.shape:
            raise PipelineError(
                f"{where}: input '{spec.name}' expects {spec.describe()}, "
                f"got {dtype_name(tensor.dtype)}{list(tensor.shape)}"
            )
        out.append(tensor)
    return out
