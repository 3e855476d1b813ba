"""leapp/testing/inputs.py: hypothesis strategies of an export's pipeline inputs.

The names, dtypes and shapes come from the export's ``pipeline.yaml``, read
through ``leapp.pipeline_format`` (the one reader). Values are finite and
bounded by default: an inference pipeline is fed observations, not
``1e308``; an input whose meaningful domain is narrower (unit quaternions,
joint limits, indices) gets an override.

Each tensor comes from one of two generators, so that both shrinking and
coverage work: a hypothesis ``arrays`` draw (element-wise: a few elements
drawn, the rest one fill value; shrinks towards zeros and small values, hits
the bounds and zero exactly) or, half of the time, a dense uniform draw from a
seeded ``torch.Generator`` (every element random; shrinks to a small seed, or
to the element-wise draw when that fails too).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from hypothesis.strategies import SearchStrategy

from leapp.pipeline_format import read_pipeline

__all__ = [
    "DEFAULT_BOUND",
    "InputSpec",
    "Within",
    "input_specs",
    "input_strategy",
    "tensors",
    "unit_norm",
    "within",
]

DEFAULT_BOUND = 10.0  # default values lie in [-DEFAULT_BOUND, DEFAULT_BOUND] (clipped to the dtype's range)


@dataclass(frozen=True)
class InputSpec:
    """One pipeline input as ``pipeline.yaml`` describes it, and the device its values are drawn on."""

    name: str
    dtype: torch.dtype
    shape: tuple[int | str, ...]  # a str is a dynamic dimension's symbol ("batch": a dynamic batch)
    device: torch.device

    def describe(self) -> str:
        return f"{str(self.dtype).removeprefix('torch.')}{list(self.shape)}"


def _torch_dtype(name: str, where: str) -> torch.dtype:
    value = getattr(torch, str(name), None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"{where}: dtype {name!r} is not a torch dtype this torch knows")
    return value


def input_specs(desc: Mapping, device: str | torch.device | None = None) -> list[InputSpec]:
    """The pipeline inputs of a checked description (``read_pipeline``), in pipeline.yaml order.
    ``device=None``: each on the recorded device of the first node that reads it (where it was traced)."""
    node_device = {n["name"]: n["device"] for n in desc["nodes"]}
    specs = []
    for entry in desc["inputs"]:
        where = f"export '{desc['name']}' input '{entry['name']}'"
        dev = device if device is not None else node_device[entry["consumers"][0]["node"]]
        shape = tuple(entry["shape"])
        if entry.get("batch") and shape:  # dynamic batch: dim 0 is the symbol every batched input shares
            shape = (BATCH_SYMBOL,) + shape[1:]
        specs.append(InputSpec(entry["name"], _torch_dtype(entry["dtype"], where), shape, torch.device(dev)))
    return specs


BATCH_SYMBOL = "batch"
MAX_DRAWN_BATCH = 64  # larger batches cost hypothesis an element-wise draw of every value: pass a fixed tensor


def dynamic_dimensions(desc: Mapping) -> dict[str, tuple[int, int]]:
    """The dimensions an export lets vary, by symbol, with their inclusive [min, max].

    A dynamic batch (pipeline inputs with ``batch: [min, max]``, docs/pipeline-format.md): dim 0 of those
    inputs is the symbol ``"batch"``, drawn once per example (so the inputs agree) in the common range, at
    most ``MAX_DRAWN_BATCH`` (or the range's min when that is larger); hypothesis shrinks it toward min.
    """
    ranges = [tuple(e["batch"]) for e in desc["inputs"] if e.get("batch") and e["shape"]]
    if not ranges:
        return {}
    lo, hi = max(r[0] for r in ranges), min(r[1] for r in ranges)
    return {BATCH_SYMBOL: (lo, max(lo, min(hi, MAX_DRAWN_BATCH)))}


# --- values ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Within:
    """Override: the default generators with other bounds (``within(-0.5, 0.5)``)."""

    low: float
    high: float


def within(low: float, high: float) -> Within:
    """Override an input's bounds, e.g. joint limits: ``input_strategy(export, joints=within(-2.7, 2.7))``."""
    if not (math.isfinite(low) and math.isfinite(high) and low <= high):
        raise ValueError(f"within({low!r}, {high!r}): expected finite bounds with low <= high")
    return Within(float(low), float(high))


def unit_norm(dim: int = -1) -> Callable[[torch.Tensor], torch.Tensor]:
    """Override transform: the default draw normalised along ``dim`` (unit quaternions, directions).

    A vector of norm zero becomes the last basis vector, (0, 0, 0, 1) for a quaternion, which is the
    identity in Warp's (x, y, z, w) order.
    """

    def normalise(x: torch.Tensor) -> torch.Tensor:
        if not x.is_floating_point():
            raise TypeError(f"unit_norm() needs a floating-point input, got {x.dtype}")
        x64 = x.to(torch.float64)
        norm = torch.linalg.vector_norm(x64, dim=dim, keepdim=True)
        basis = torch.zeros_like(x64)
        basis.select(dim, -1).fill_(1.0)
        return torch.where(norm > 0, x64 / norm.clamp_min(1e-300), basis).to(x.dtype)

    normalise.__qualname__ = f"unit_norm(dim={dim})"
    return normalise


def _float32_inside(low: float, high: float) -> tuple[float, float]:
    """The least and the greatest float32 in [low, high].

    Raises:
        ValueError: no float32 lies in the interval.
    """
    lo, hi = np.float32(low), np.float32(high)
    if float(lo) < low:
        lo = np.nextafter(lo, np.float32(np.inf))
    if float(hi) > high:
        hi = np.nextafter(hi, np.float32(-np.inf))
    if lo > hi:
        raise ValueError(f"tensors(): no float32 value lies in [{low!r}, {high!r}]")
    return float(lo), float(hi)


def _int_range(dtype: torch.dtype, low: float, high: float) -> tuple[int, int]:
    info = torch.iinfo(dtype)
    lo, hi = max(math.ceil(low), info.min), min(math.floor(high), info.max)
    if lo > hi:
        raise ValueError(f"no {dtype} value lies in [{low}, {high}]")
    return lo, hi


def tensors(shape: tuple[int, ...], dtype: torch.dtype, device: str | torch.device = "cpu",
            low: float = -DEFAULT_BOUND, high: float = DEFAULT_BOUND) -> SearchStrategy[torch.Tensor]:
    """Tensors of one shape and dtype with finite values in [low, high] (bools: both values), on ``device``.

    A building block for overrides: ``input_strategy(export, x=tensors((64, 3), torch.float32, "cuda", 0, 1))``.
    """
    shape = tuple(int(d) for d in shape)
    device = torch.device(device)
    if dtype == torch.bool:
        elements: SearchStrategy = st.booleans()
        np_dtype: Any = np.bool_
    elif dtype.is_floating_point:
        if not (math.isfinite(low) and math.isfinite(high) and low <= high):
            raise ValueError(f"tensors(): bounds [{low}, {high}] must be finite with low <= high")
        width = 64 if dtype == torch.float64 else 32  # float16/bfloat16/float8: drawn as float32, rounded
        if width == 32:  # bounds as meant: the float32 numbers inside [low, high] (0.2 has no float32 twin)
            low, high = _float32_inside(low, high)
        elements = st.floats(low, high, width=width, allow_subnormal=False)
        np_dtype = np.float64 if width == 64 else np.float32
    elif dtype.is_complex:
        raise ValueError(f"no default values for {dtype}; pass a strategy as the input's override")
    else:
        lo, hi = _int_range(dtype, low, high)
        elements, np_dtype = st.integers(lo, hi), np.int64

    def from_numpy(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.array(a, order="C")).to(dtype).to(device)  # (ascontiguousarray makes 0-d 1-d)

    def dense(seed: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(seed)
        if dtype == torch.bool:
            x = torch.randint(0, 2, shape, generator=gen).bool()
        elif dtype.is_floating_point:
            x = torch.rand(shape, generator=gen, dtype=torch.float64) * (high - low) + low
        else:
            lo, hi = _int_range(dtype, low, high)
            x = torch.randint(lo, hi + 1, shape, generator=gen, dtype=torch.int64)
        return x.to(dtype).to(device)

    # Both are drawn and a flag picks one: shrinking turns the flag off whenever the element-wise draw
    # fails too (a one_of would stop at the dense draw of seed 0, the fewest choices).
    element_wise = hnp.arrays(np_dtype, shape, elements=elements)
    return st.tuples(element_wise, st.booleans(), st.integers(0, 2**32 - 1)).map(
        lambda drawn: dense(drawn[2]) if drawn[1] else from_numpy(drawn[0]))


# --- overrides -----------------------------------------------------------------------------------------------


def _checked(spec: InputSpec, shape: tuple[int, ...], value: Any, what: str) -> torch.Tensor:
    """``value`` as the input's tensor: a tensor (or array-like) of exactly its dtype and shape."""
    if not isinstance(value, torch.Tensor):
        try:
            value = torch.as_tensor(np.asarray(value), dtype=spec.dtype)
        except (TypeError, ValueError) as e:
            raise TypeError(f"input '{spec.name}': {what} gave a {type(value).__name__}, expected a tensor "
                            f"{spec.describe()} ({e})") from e
    if value.dtype != spec.dtype or tuple(value.shape) != shape:
        raise ValueError(f"input '{spec.name}': {what} gave {str(value.dtype).removeprefix('torch.')}"
                         f"{list(value.shape)}, the export expects {str(spec.dtype).removeprefix('torch.')}{list(shape)}")
    return value.to(spec.device)


def _value_strategy(spec: InputSpec, shape: tuple[int, ...], override: Any) -> SearchStrategy[torch.Tensor]:
    if override is None:
        return tensors(shape, spec.dtype, spec.device)
    if isinstance(override, Within):
        return tensors(shape, spec.dtype, spec.device, override.low, override.high)
    if isinstance(override, SearchStrategy):
        return override.map(lambda v: _checked(spec, shape, v, "its override strategy"))
    if isinstance(override, torch.Tensor):
        fixed = _checked(spec, shape, override, "its override tensor")
        return st.just(fixed).map(torch.Tensor.clone)
    if callable(override):
        name = getattr(override, "__qualname__", repr(override))
        return tensors(shape, spec.dtype, spec.device).map(
            lambda x: _checked(spec, shape, override(x), f"its override {name}(default draw)"))
    raise TypeError(
        f"input '{spec.name}': override of type {type(override).__name__}; expected a hypothesis strategy, "
        "leapp.testing.within(low, high), a callable applied to the default draw, or a fixed tensor"
    )


def input_strategy(export_dir: str | Path, device: str | torch.device | None = None,
                   **overrides: Any) -> SearchStrategy[dict[str, torch.Tensor]]:
    """A hypothesis strategy of ``{input name: tensor}`` dicts matching the export's pipeline inputs.

    Names, dtypes and shapes come from ``pipeline.yaml``; values are finite, in [-10, 10] for floats (no
    NaN, infinity or subnormals) and integers (clipped to the dtype's range), both values for bools.
    ``device=None`` draws each input on the device its first node was traced on.

    ``overrides`` (by input name) replace the values of one input:
      - a hypothesis strategy of tensors (or array-likes) of the input's dtype and shape;
      - ``within(low, high)``: the default values with other bounds;
      - a callable, applied to the default draw: ``quat=unit_norm()``, ``x=lambda t: t.abs()``;
      - a tensor: that value in every example.

    Raises:
        ValueError: an override names no pipeline input (the message lists the export's inputs).
    """
    _, desc = read_pipeline(export_dir)
    specs = input_specs(desc, device)
    known = [s.name for s in specs]
    unknown = sorted(set(overrides) - set(known))
    if unknown:
        raise ValueError(f"input_strategy: export '{desc['name']}' has no input {', '.join(map(repr, unknown))} "
                         f"(its inputs: {known})")
    ranges = dynamic_dimensions(desc)
    strategies: dict[tuple[str, tuple[int, ...]], SearchStrategy] = {}

    def values(spec: InputSpec, shape: tuple[int, ...]) -> SearchStrategy:
        key = (spec.name, shape)
        if key not in strategies:
            strategies[key] = _value_strategy(spec, shape, overrides.get(spec.name))
        return strategies[key]

    for spec in specs:  # a bad override fails here, not at the first draw
        if all(isinstance(d, int) for d in spec.shape):
            values(spec, spec.shape)

    @st.composite
    def pipeline_inputs(draw) -> dict[str, torch.Tensor]:
        sizes = {symbol: draw(st.integers(lo, hi)) for symbol, (lo, hi) in ranges.items()}
        out = {}
        for spec in specs:
            out[spec.name] = draw(values(spec, tuple(sizes[d] if isinstance(d, str) else d for d in spec.shape)))
        return out

    return pipeline_inputs()
