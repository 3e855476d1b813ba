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

_ACCEPTED_SHAPES = 256  # per dynamic-batch IOSpec: the distinct batches whose shape check is remembered


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
    # Dynamic batch (docs/recorder.md section 1.0): dim 0 may be any size in [min, max]; shape holds the traced one.
    batch: tuple[int, int] | None = None
    # Dynamic batch: shapes ``accepts`` said yes to (a steady batch then costs one set lookup per call, as a
    # fixed shape costs one compare); bounded, since a caller may sweep the whole range.
    _accepted: set = field(default_factory=set, compare=False, hash=False, repr=False)

    @classmethod
    def from_yaml(cls, entry: Mapping, where: str) -> IOSpec:
        """From an entry that ``leapp.pipeline_format`` has checked (name, dtype, shape, metadata, batch if any)."""
        batch = tuple(int(v) for v in entry["batch"]) if entry.get("batch") else None
        return cls(str(entry["name"]), _dtype(entry["dtype"], where), tuple(int(d) for d in entry["shape"]),
                   dict(entry.get("metadata", {})), batch)

    def describe(self) -> str:
        if self.batch is not None:
            dims = [f"batch {self.batch[0]}..{self.batch[1]}"] + [str(d) for d in self.shape[1:]]
            return f"{dtype_name(self.dtype)}[{', '.join(dims)}]"
        return f"{dtype_name(self.dtype)}{list(self.shape)}"

    def accepts(self, shape) -> bool:
        """Whether a tensor of ``shape`` fits (any batch of the range in dim 0 when the batch is dynamic)."""
        if self.batch is None:
            return tuple(shape) == tuple(self.shape)
        shape = tuple(shape)
        if shape in self._accepted:
            return True
        ok = (len(shape) == len(self.shape) and shape[1:] == tuple(self.shape[1:])
              and self.batch[0] <= shape[0] <= self.batch[1])
        if ok and len(self._accepted) < _ACCEPTED_SHAPES:
            self._accepted.add(shape)
        return ok


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


def _batches_differ(specs: Sequence[IOSpec], values: Mapping[str, Any], where: str) -> None:
    batches = sorted((s.name, int(values[s.name].shape[0])) for s in specs if s.batch is not None)
    raise PipelineError(f"{where}: the inputs' batches differ ({', '.join(f'{n}: {b}' for n, b in batches)}); "
                        "dim 0 of every input of a dynamic-batch node is the one batch")


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
    batch = None  # dim 0 of the first dynamic-batch input: every other one must have it too
    for spec in specs:
        tensor = values[spec.name]
        if not isinstance(tensor, torch.Tensor):
            tensor = _as_tensor(tensor, f"{where}: input '{spec.name}'")
        shape = tensor.shape  # a torch.Size: a tuple, compared element by element in C
        if spec.batch is None:
            ok = tensor.dtype == spec.dtype and shape == spec.shape
        else:
            ok = tensor.dtype == spec.dtype and (shape in spec._accepted or spec.accepts(shape))
            if ok and batch is None:
                batch = shape[0]
            elif ok and shape[0] != batch:
                _batches_differ(specs, values, where)
        if not ok:
            why = ""
            if spec.batch is not None and tensor.dim() == len(spec.shape) and tuple(tensor.shape[1:]) == spec.shape[1:]:
                why = f" (batch {tensor.shape[0]} is outside the exported range {spec.batch[0]}..{spec.batch[1]})"
            raise PipelineError(
                f"{where}: input '{spec.name}' expects {spec.describe()}, "
                f"got {dtype_name(tensor.dtype)}{list(tensor.shape)}{why}"
            )
        out.append(tensor)
    return out
