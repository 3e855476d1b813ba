"""leapp/testing/outputs.py: the eager function's result as named outputs, and one output compared.

Values are compared as export validation compares them (``leapp._export.validate.compare``:
``torch.isclose`` with rtol/atol, NaN equal to NaN only at the same position, integers and
bools exactly), after the shape and dtype. What a report needs on top (how many elements are
outside the tolerance, the first one) is added here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["OutputDiff", "compare_output", "eager_outputs", "describe_tensor"]


def eager_outputs(result: Any, names: Sequence[str], fn_name: str) -> dict[str, torch.Tensor]:
    """``fn``'s return value by pipeline output name: a dict with those keys, a tuple/list in pipeline order,
    or one tensor when the pipeline has one output."""
    names = list(names)
    if isinstance(result, Mapping):
        missing = [n for n in names if n not in result]
        if missing:
            raise ValueError(f"{fn_name} returned a dict with keys {sorted(map(str, result))}; the export's outputs are "
                             f"{names} (missing {missing})")
        values = {n: result[n] for n in names}
    elif isinstance(result, torch.Tensor):
        if len(names) != 1:
            raise ValueError(f"{fn_name} returned one tensor; the export has {len(names)} outputs {names}: return a "
                             "dict by output name or a tuple in that order")
        values = {names[0]: result}
    elif isinstance(result, (tuple, list)):
        if len(result) != len(names):
            raise ValueError(f"{fn_name} returned {len(result)} values; the export has {len(names)} outputs {names}")
        values = dict(zip(names, result))
    else:
        raise TypeError(f"{fn_name} returned a {type(result).__name__}; expected a tensor, a tuple/list or a dict "
                        f"of tensors for the export's outputs {names}")
    for name, value in values.items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{fn_name}: output '{name}' is a {type(value).__name__}, not a torch.Tensor")
    return {n: v.detach() for n, v in values.items()}


@dataclass
class OutputDiff:
    """One output of the export against the eager value."""

    name: str
    ok: bool
    max_abs: float = 0.0
    max_rel: float = 0.0
    detail: str = ""

    def describe(self) -> str:
        if self.detail.startswith("got "):
            return f"output '{self.name}': {self.detail}"
        return f"output '{self.name}': max abs error {self.max_abs:.3g}, max rel error {self.max_rel:.3g}; {self.detail}"


def _value(t: torch.Tensor, index: tuple[int, ...]) -> str:
    v = t[index].item()
    return f"{v:.7g}" if isinstance(v, float) else str(v)


def compare_output(name: str, actual: torch.Tensor, expected: torch.Tensor, rtol: float, atol: float,
                   labels: tuple[str, str] = ("export", "eager")) -> OutputDiff:
    """``actual`` (the export's) against ``expected`` (eager); ``labels`` name the two in the detail."""
    from leapp._export.validate import compare  # the exporter's own comparison

    check = compare(name, actual, expected, rtol, atol)
    diff = OutputDiff(name, check.ok, check.max_abs, check.max_rel, check.note)
    if check.ok or check.note:
        return diff
    a, e = actual.detach().cpu(), expected.detach().cpu()
    if a.is_floating_point() or a.is_complex():
        bad = ~torch.isclose(a.to(torch.complex128 if a.is_complex() else torch.float64),
                             e.to(torch.complex128 if e.is_complex() else torch.float64),
                             rtol=rtol, atol=atol, equal_nan=True)
    else:
        bad = a != e
    first = tuple(int(i) for i in bad.nonzero()[0]) if a.dim() else ()
    diff.detail = (f"{int(bad.sum())} of {bad.numel()} elements outside rtol={rtol:g}, atol={atol:g}; first at "
                   f"index {list(first)}: {labels[0]} {_value(a, first)}, {labels[1]} {_value(e, first)}")
    return diff


def describe_tensor(name: str, t: torch.Tensor, full_up_to: int = 16) -> str:
    """One line per tensor of a counterexample: spec, device, range, and the values when there are few."""
    spec = f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)} on {t.device}"
    c = t.detach().cpu()
    if c.numel() == 0:
        return f"{name}: {spec} (empty)"
    flat = c.reshape(-1)
    if c.is_floating_point():
        flat64 = flat.to(torch.float64)
        summary = f"min {flat64.min().item():.4g}, max {flat64.max().item():.4g}"
    elif c.dtype == torch.bool:
        summary = f"{int(flat.sum())} of {flat.numel()} true"
    elif c.is_complex():
        summary = f"max |x| {flat.abs().max().item():.4g}"
    else:
        summary = f"min {flat.min().item()}, max {flat.max().item()}"
    distinct = torch.unique(flat).numel() if not c.is_complex() else flat.numel()
    if distinct == 1:
        return f"{name}: {spec}, every element {flat[0].item()!r}"
    if c.numel() <= full_up_to:
        values = f"values {c.tolist()}"
    else:
        nonzero = int((flat != 0).sum())
        values = f"{distinct} distinct values, {nonzero} non-zero; first {flat[:8].tolist()}"
    return f"{name}: {spec}, {summary}; {values}"
