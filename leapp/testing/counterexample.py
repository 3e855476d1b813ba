"""leapp/testing/counterexample.py: a failing input written to a file, and read back for a replay.

The file is ``torch.save`` of a plain dict (tensors, strings, numbers), so
``torch.load(weights_only=True)`` reads it and a counterexample from CI can be
replayed on a laptop. Its name is the export's plus a digest of the inputs, so
the same counterexample found twice is one file.

Version 1 holds one input dict (a stateless export, one step per example);
version 2 a sequence of input dicts, the steps run from the reset state up to
the one that failed (an export with state, or ``steps=`` > 1).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = ["COUNTEREXAMPLE_DIR", "COUNTEREXAMPLE_ENV", "Counterexample", "counterexample_dir", "save", "load"]

COUNTEREXAMPLE_DIR = ".leapp-counterexamples"  # relative to the working directory
COUNTEREXAMPLE_ENV = "LEAPP_COUNTEREXAMPLE_DIR"
FORMAT = "leapp.counterexample"
VERSION = 1  # one input dict
SEQUENCE_VERSION = 2  # a sequence of input dicts, run from the reset state


def counterexample_dir(given: str | os.PathLike | None) -> Path:
    """Where counterexamples go: ``given``, else ``$LEAPP_COUNTEREXAMPLE_DIR``, else ``./.leapp-counterexamples``."""
    if given is not None:
        return Path(given)
    return Path(os.environ.get(COUNTEREXAMPLE_ENV) or COUNTEREXAMPLE_DIR)


@dataclass
class Counterexample:
    export: str
    route: str
    routes: list[str]  # the routes selected when it was found, in order
    rtol: float
    atol: float
    steps: list[dict[str, torch.Tensor]]  # one input dict per step, on their original devices
    sequence: bool = False  # run from the reset state (version 2), not one stateless call (version 1)

    @property
    def inputs(self) -> dict[str, torch.Tensor]:
        """The last step's inputs (a stateless counterexample's only ones)."""
        return self.steps[-1]


def _hash(h, inputs: Mapping[str, torch.Tensor]) -> None:
    for name in sorted(inputs):
        t = inputs[name].detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{list(t.shape)}:".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())


def _digest(example: Counterexample) -> str:
    h = hashlib.sha256()
    if not example.sequence:
        _hash(h, example.inputs)
    for i, step in enumerate(example.steps if example.sequence else ()):
        h.update(f"step {i}:".encode())
        _hash(h, step)
    return h.hexdigest()[:16]


def _cpu(inputs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu() for k, v in inputs.items()}


def _devices(inputs: Mapping[str, torch.Tensor]) -> dict[str, str]:
    return {k: str(v.device) for k, v in inputs.items()}


def save(example: Counterexample, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{example.export}-{_digest(example)}.pt"
    data = {"format": FORMAT, "version": SEQUENCE_VERSION if example.sequence else VERSION,
            "export": example.export, "route": example.route, "routes": list(example.routes),
            "rtol": float(example.rtol), "atol": float(example.atol)}
    if example.sequence:
        data.update(steps=[_cpu(s) for s in example.steps], devices=[_devices(s) for s in example.steps])
    else:
        data.update(inputs=_cpu(example.inputs), devices=_devices(example.inputs))
    torch.save(data, path)
    return path


def load(path: str | os.PathLike, device: str | torch.device | None = None) -> Counterexample:
    """The counterexample in ``path``, its inputs on their original devices (or on ``device``)."""
    data = torch.load(path, map_location="cpu", weights_only=True)
    version = data.get("version") if isinstance(data, dict) else None
    if not isinstance(data, dict) or data.get("format") != FORMAT or version not in (VERSION, SEQUENCE_VERSION):
        raise ValueError(f"{path}: not a leapp counterexample file (format {FORMAT!r} version {VERSION} or "
                         f"{SEQUENCE_VERSION})")

    def placed(inputs: Mapping[str, torch.Tensor], devices: Mapping[str, str]) -> dict[str, torch.Tensor]:
        return {k: v.to(device if device is not None else devices[k]) for k, v in inputs.items()}

    if version == SEQUENCE_VERSION:
        steps = [placed(s, d) for s, d in zip(data["steps"], data["devices"])]
    else:
        steps = [placed(data["inputs"], data["devices"])]
    return Counterexample(data["export"], data["route"], list(data["routes"]), data["rtol"], data["atol"], steps,
                          sequence=version == SEQUENCE_VERSION)
