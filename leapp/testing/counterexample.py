"""leapp/testing/counterexample.py: a failing input written to a file, and read back for a replay.

The file is ``torch.save`` of a plain dict (tensors, strings, numbers), so
``torch.load(weights_only=True)`` reads it and a counterexample from CI can be
replayed on a laptop. Its name is the export's plus a digest of the inputs, so
the same counterexample found twice is one file.
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
VERSION = 1


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
    inputs: dict[str, torch.Tensor]  # on their original devices


def _digest(inputs: Mapping[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(inputs):
        t = inputs[name].detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{list(t.shape)}:".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def save(example: Counterexample, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{example.export}-{_digest(example.inputs)}.pt"
    torch.save(
        {
            "format": FORMAT,
            "version": VERSION,
            "export": example.export,
            "route": example.route,
            "routes": list(example.routes),
            "rtol": float(example.rtol),
            "atol": float(example.atol),
            "inputs": {k: v.detach().cpu() for k, v in example.inputs.items()},
            "devices": {k: str(v.device) for k, v in example.inputs.items()},
        },
        path,
    )
    return path


def load(path: str | os.PathLike, device: str | torch.device | None = None) -> Counterexample:
    """The counterexample in ``path``, its inputs on their original devices (or on ``device``)."""
    data = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("version") != VERSION:
        raise ValueError(f"{path}: not a leapp counterexample file (format {FORMAT!r} version {VERSION})")
    inputs = {k: v.to(device if device is not None else data["devices"][k]) for k, v in data["inputs"].items()}
    return Counterexample(data["export"], data["route"], list(data["routes"]), data["rtol"], data["atol"], inputs)
