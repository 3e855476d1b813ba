"""The child process of test_aoti.py: one export node through ``leapp.load`` and through its AOTInductor package.

    python aoti_replay.py EXPORT_DIR NODE PACKAGE SETS_DIR

Runs under the fake driver with the CPU-as-CUDA op library (``LEAPP_WARP_PT2_CUSTOM_OP_LIBRARY``).
Each ``SETS_DIR/<set>/inputs.txt`` lists the node's inputs (the format of ``aoti_cpp/main.cpp``);
the outputs go to ``<set>/load/`` and ``<set>/python_aoti/`` in the same format, and
``SETS_DIR/info.json`` says which library served the op. The parent compares.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch

__all__ = ["read_tensors", "write_tensors"]


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def write_tensors(folder: Path, tensors: list[torch.Tensor], stem: str = "output") -> None:
    """``<stem>_<i>.bin`` (raw C-order bytes) per tensor and ``<stem>s.txt``: "file dtype rank dims..." per line."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    lines = []
    for i, t in enumerate(tensors):
        t = t.detach().cpu().contiguous()
        file = f"{stem}_{i}.bin"
        (folder / file).write_bytes(t.view(torch.uint8).numpy().tobytes())
        lines.append(" ".join([file, _name(t.dtype), str(t.dim()), *map(str, t.shape)]))
    (folder / f"{stem}s.txt").write_text("\n".join(lines) + "\n")


def read_tensors(folder: Path, stem: str = "output") -> list[torch.Tensor]:
    """The tensors ``write_tensors`` (or aoti_run) wrote."""
    folder = Path(folder)
    out = []
    for line in (folder / f"{stem}s.txt").read_text().split("\n"):
        if not line:
            continue
        file, dtype, rank, *dims = line.split()
        assert int(rank) == len(dims), line
        raw = np.fromfile(folder / file, dtype=np.uint8)
        out.append(torch.from_numpy(raw).view(getattr(torch, dtype)).reshape([int(d) for d in dims]))
    return out


def main(export_dir: str, node: str, package: str, sets_dir: str) -> None:
    import leapp
    from leapp.runtime import libraries, ops

    native = ops.ensure_registered()
    pipeline = leapp.load(export_dir)
    entry = pipeline.nodes[node]
    model = torch._inductor.aoti_load_package(package)
    for folder in sorted(p for p in Path(sets_dir).iterdir() if p.is_dir()):
        inputs = read_tensors(folder, "input")
        want = pipeline.run_node(node, **{spec.name: t for spec, t in zip(entry.inputs, inputs)})
        write_tensors(folder / "load", [want[spec.name] for spec in entry.outputs])
        write_tensors(folder / "python_aoti", list(model(*inputs)))
    info = {"native": native, "library": str(libraries.library_path("pt2")), "torch": torch.__version__}
    (Path(sets_dir) / "info.json").write_text(json.dumps(info))


if __name__ == "__main__":
    main(*sys.argv[1:])
