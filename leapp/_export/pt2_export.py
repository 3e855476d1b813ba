"""leapp/_export/pt2_export.py: a node as a ``torch.export`` program (``<node>.pt2``).

Segments stay ``torch.ops.leapp.warp_segment`` calls whose bundle is a uint8
buffer of the program, so the same file runs in Python (after
``leapp.runtime.ops.ensure_registered()``) and in C++ (AOTInductor or the
torch op library).
"""

from __future__ import annotations

from pathlib import Path

import torch

from leapp._export.exportable import ExportableNode
from leapp._export.paths import artifact_path
from leapp.errors import ExportError

__all__ = ["export_pt2", "to_exported_program"]


def to_exported_program(node: ExportableNode) -> torch.export.ExportedProgram:
    """``torch.export.export`` of the node's module on its example inputs (static shapes)."""
    from leapp.runtime import ops

    ops.ensure_registered()
    record = node.record
    strict = bool(record.backend_params.get("strict", False))
    try:
        return torch.export.export(node.module, node.example_inputs, strict=strict)
    except Exception as e:  # torch raises many types here; the node and its source matter most
        raise ExportError(
            f"node '{record.name}' ({record.source}): torch.export.export failed: {type(e).__name__}: {e}"
        ) from e


def export_pt2(node: ExportableNode, out_dir: Path) -> Path:
    """Writes ``<out_dir>/<node>.pt2`` and returns its path."""
    path = artifact_path(out_dir, node.record.name, ".pt2", f"node '{node.record.name}' ({node.record.source})")
    program = to_exported_program(node)
    torch.export.save(program, path)
    return path
