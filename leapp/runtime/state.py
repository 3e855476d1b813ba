"""leapp/runtime/state.py: the state a loaded pipeline carries from one call to the next (docs/state.md).

One buffer per state edge (``node/input``), on its node's device, starting
from ``initial_values.safetensors`` (checked by
``leapp.pipeline_format.check_initial_values`` after its sha256). A call
passes the buffers as extra inputs and, once the whole call succeeded,
copies the state outputs into them: outputs may be a CUDA graph's own
tensors, overwritten by the next call, and a call that raises leaves the
state as it was. Calls on one pipeline serialize on ``lock``: each step
depends on the one before.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from leapp.pipeline_format import PipelineError, StateEdge, check_initial_values, read_checked, state_edges
from leapp.runtime.io import IOSpec

__all__ = ["PipelineState", "load_state"]


class PipelineState:
    """The carried values of one pipeline: ``keys`` in state-edge order, ``values`` the buffers a call reads."""

    def __init__(self, where: str, edges: Sequence[StateEdge], specs: Mapping[str, IOSpec],
                 initial: Mapping[str, torch.Tensor], devices: Mapping[str, torch.device]) -> None:
        self.where = where
        self.edges = list(edges)
        self.keys = [e.key for e in edges]
        self.specs = dict(specs)
        self.initial = {k: initial[k] for k in self.keys}  # on the CPU, never handed out
        self.values = [torch.empty(specs[k].shape, dtype=specs[k].dtype, device=devices[k]) for k in self.keys]
        self.lock = threading.Lock()
        self.reset()

    def reset(self, state: Mapping[str, Any] | None = None) -> None:
        """The initial values (``state`` None), else those of ``state`` (``node/input`` -> tensor), every key
        checked (known, dtype, shape) before any is copied."""
        if state is None:
            with self.lock:
                for key, buffer in zip(self.keys, self.values):
                    buffer.copy_(self.initial[key])
            return
        if not isinstance(state, Mapping):
            raise PipelineError(f"{self.where}: reset(state) takes a dict 'node/input' -> tensor, got "
                                f"{type(state).__name__}")
        checked = []
        for key, value in state.items():
            if key not in self.specs:
                raise PipelineError(f"{self.where}: reset(state): {key!r} is no state of the pipeline (states: "
                                    f"{self.keys})")
            spec = self.specs[key]
            if not isinstance(value, torch.Tensor):
                raise PipelineError(f"{self.where}: reset(state): {key!r} is a {type(value).__name__}, expected a "
                                    f"torch.Tensor {spec.describe()}")
            if value.dtype != spec.dtype or tuple(value.shape) != tuple(spec.shape):
                shown = f"{str(value.dtype).removeprefix('torch.')}{list(value.shape)}"
                raise PipelineError(f"{self.where}: reset(state): {key!r} is {shown}, the state is {spec.describe()}")
            checked.append((self.keys.index(key), value))
        with self.lock:
            for index, value in checked:
                self.values[index].copy_(value)

    def snapshot(self) -> dict[str, torch.Tensor]:
        """``node/input`` -> a clone of the current value."""
        with self.lock:
            return {key: buffer.clone() for key, buffer in zip(self.keys, self.values)}

    def commit(self, outputs: Sequence[torch.Tensor]) -> None:
        """The state outputs of a successful call become the next call's state (caller holds ``lock``)."""
        for buffer, value in zip(self.values, outputs):
            buffer.copy_(value)


def _device(entry: Mapping) -> torch.device:
    """The node's recorded device, or the CPU where torch sees no such CUDA device (its runner then refuses the
    call, naming the device)."""
    device = torch.device(entry["device"])
    if device.type == "cuda" and (not torch.cuda.is_available() or (device.index or 0) >= torch.cuda.device_count()):
        return torch.device("cpu")
    return device


def _tensor(raw: memoryview, spec: IOSpec) -> torch.Tensor:
    if len(raw) == 0:
        return torch.empty(spec.shape, dtype=spec.dtype)
    return torch.frombuffer(bytearray(raw), dtype=spec.dtype).reshape(spec.shape)


def load_state(folder: Path, desc: dict, yaml_file: Path, name: str) -> PipelineState | None:
    """The state of a checked description, initial values read and checked; None without state edges."""
    edges = state_edges(desc)
    if not edges:
        return None
    entry = desc["initial_values"]
    where = f"pipeline '{name}' initial values"
    checked = read_checked(folder, entry["path"], entry["sha256"], where, f"{yaml_file}: initial_values.path")
    raw = check_initial_values(checked.data, str(checked.path), edges)
    entries = {n["name"]: n for n in desc["nodes"]}
    specs, devices, initial = {}, {}, {}
    for edge in edges:
        node = entries[edge.node]
        spec_entry = next(e for e in node["inputs"] if e["name"] == edge.input)
        specs[edge.key] = IOSpec.from_yaml(spec_entry, f"{where}: {edge.key}")
        devices[edge.key] = _device(node)
        initial[edge.key] = _tensor(raw[edge.key], specs[edge.key])
    return PipelineState(f"Pipeline '{name}'", edges, specs, initial, devices)
