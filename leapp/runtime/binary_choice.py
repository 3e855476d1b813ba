"""leapp/runtime/binary_choice.py: the compiled binary each Warp module of a node tries first on its device.

The native loader picks a module's binary when a segment first runs: the cubin of the
device's arch, else a compatible older cubin, else the PTX (JIT-compiled by the driver)
(docs/bundle-format.md §3). ``leapp.load`` logs that choice at DEBUG from the same rule
(``leapp._native.Bundle.binary_candidates``), so a user sees at load whether a node will
JIT PTX, or finds no binary for the GPU, before its first call.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import torch

from leapp.bundle.format import MAGIC

__all__ = ["binary_choices", "bundles_in_artifact", "device_capability"]


def device_capability(device: str) -> tuple[int, int] | None:
    """(major, minor) of ``device`` as leapp's driver loader sees it (no CUDA torch needed), or None."""
    from leapp import _native

    status = _native.driver_status()
    index = torch.device(device).index or 0
    for entry in status["devices"] if status["available"] else ():
        if entry["ordinal"] == index:
            return tuple(entry["compute_capability"])
    return None


def _is_bundle(tensor: torch.Tensor) -> bool:
    return tensor.dtype == torch.uint8 and tensor.dim() == 1 and tensor.numel() > len(MAGIC)


def bundles_in_artifact(backend: str, path: Path, runner) -> list[bytes]:
    """The segment bundles a node's artifact holds: a PT2 program's constants, an ONNX model's initializers."""
    if backend == "pt2":
        program = runner.program.program
        tensors = [*program.constants.values(), *program.state_dict.values()]
        found = [bytes(t.cpu().numpy()) for t in tensors if isinstance(t, torch.Tensor) and _is_bundle(t)]
    elif backend == "onnx":
        import onnx
        from onnx import numpy_helper

        model = onnx.load(str(path))
        found = [numpy_helper.to_array(t, base_dir=str(path.parent)).tobytes() for t in model.graph.initializer
                 if t.data_type == onnx.TensorProto.UINT8 and len(t.dims) == 1]
    else:
        found = []
    return [data for data in found if data.startswith(MAGIC)]


def binary_choices(bundles: Iterable[bytes], capability: tuple[int, int]) -> list[str]:
    """One line per module of each bundle: what a device of ``capability`` loads first, and what it falls back to."""
    from leapp import _native

    major, minor = capability
    lines = []
    for data in bundles:
        bundle = _native.Bundle(data)
        for index, module in enumerate(json.loads(bundle.manifest_json)["modules"]):
            names = [f"{kind} sm_{arch}" for kind, arch in bundle.binary_candidates(index, major, minor)]
            where = f"segment {bundle.segment} module {module['name']}"
            if not names:
                offered = ", ".join(f"{b['kind']} sm_{b['arch']}" for b in module["binaries"])
                lines.append(f"{where}: no binary for sm_{10 * major + minor} (the bundle has {offered})")
            else:
                jit = " (JIT-compiled by the driver)" if names[0].startswith("ptx") else ""
                rest = f"; then {', '.join(names[1:])}" if names[1:] else ""
                lines.append(f"{where}: {names[0]}{jit} on sm_{10 * major + minor}{rest}")
    return lines
