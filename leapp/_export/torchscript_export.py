"""leapp/_export/torchscript_export.py: ``export_with="torchscript"`` for nodes without Warp segments.

``torch.jit.trace`` of the recorded graph on its example inputs, saved as
``<node>.pt`` (loadable by ``torch.jit.load`` in Python and by libtorch in C++).
Warp segments cannot go there: the ``leapp::warp_segment`` op carries its
bundle as a module buffer only in the ONNX and PT2 exporters.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from leapp._export.exportable import ExportableNode
from leapp._export.paths import artifact_path
from leapp.errors import ExportError

__all__ = ["export_torchscript"]


def export_torchscript(node: ExportableNode, out_dir: Path) -> Path:
    """Writes ``<out_dir>/<node>.pt`` and returns its path."""
    record = node.record
    path = artifact_path(out_dir, record.name, ".pt", f"node '{record.name}' ({record.source})")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", category=DeprecationWarning)  # torch.jit is deprecated but still works
            traced = torch.jit.trace(node.module, node.example_inputs, check_trace=False, strict=False)
            torch.jit.save(traced, str(path))
    except Exception as e:
        raise ExportError(f"node '{record.name}' ({record.source}): torch.jit.trace failed: {type(e).__name__}: {e}") from e
    return path
