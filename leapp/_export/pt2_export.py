"""leapp/_export/pt2_export.py: a node as a ``torch.export`` program (``<node>.pt2``).

Segments stay ``torch.ops.leapp.warp_segment`` calls whose bundle is a uint8
buffer of the program, so the same file runs in Python (after
``leapp.runtime.ops.ensure_registered()``) and in C++ (AOTInductor or the
torch op library).

NOTE: the saved program carries no example inputs. ``torch.export.save``
would store ``program.example_inputs`` (the node's first recorded sample, N
elements per input) in the archive; nothing that loads it needs them (the
graph's placeholders keep every shape, dtype and stride, validation uses the
samples it is handed), and what needs some (AOTInductor) gets zeros of the
program's own input placeholders (``zero_example_inputs``). So an artifact's
size does not grow with N.
"""

from __future__ import annotations

from pathlib import Path

import torch

from leapp._export.exportable import ExportableNode
from leapp._export.paths import artifact_path
from leapp.errors import ExportError

__all__ = ["export_pt2", "to_exported_program", "zero_example_inputs"]


def to_exported_program(node: ExportableNode) -> torch.export.ExportedProgram:
    """``torch.export.export`` of the node's module on its example inputs (static shapes)."""
    from leapp.runtime import ops

    ops.ensure_registered()
    record = node.record
    strict = bool(record.backend_params.get("strict", False))
    args, dynamic_shapes = node.example_inputs, None
    if record.dynamic_batch is not None:
        from leapp._export.exportable import example_batch_inputs

        args = example_batch_inputs(record)
        dynamic_shapes = batch_dynamic_shapes(record, args)
    try:
        return torch.export.export(node.module, args, strict=strict, dynamic_shapes=dynamic_shapes)
    except Exception as e:  # torch raises many types here; the node and its source matter most
        hint = ""
        if dynamic_shapes is not None:
            hint = (f" (dynamic_batch={record.dynamic_batch}: dim 0 of every input is torch.export.Dim('batch'); "
                    "the recorded graph must not bake the batch into a size)")
        raise ExportError(
            f"node '{record.name}' ({record.source}): torch.export.export failed{hint}: {type(e).__name__}: {e}"
        ) from e


def batch_dynamic_shapes(record, args) -> tuple:
    """``dynamic_shapes`` for torch.export: dim 0 of every input is one Dim with the node's range."""
    lo, hi = record.dynamic_batch
    # torch.export treats 0 and 1 as special sizes; a Dim's min is at least 2, and batch 1 still runs (checked
    # by validation at the range's smallest batch).
    batch = torch.export.Dim("batch", min=max(lo, 2), max=hi)
    return tuple({0: batch} for _ in args)


def export_pt2(node: ExportableNode, out_dir: Path) -> Path:
    """Writes ``<out_dir>/<node>.pt2`` and returns its path."""
    path = artifact_path(out_dir, node.record.name, ".pt2", f"node '{node.record.name}' ({node.record.source})")
    program = to_exported_program(node)  # a fresh program of ours: clearing its inputs touches nothing of the user's
    program.example_inputs = None  # torch's setter accepts None; the archive then holds an empty sample-inputs file
    _drop_provenance(program)
    torch.export.save(program, path)
    return path


def zero_example_inputs(program: torch.export.ExportedProgram) -> tuple[tuple[torch.Tensor, ...], dict]:
    """``(args, kwargs)`` of zeros shaped like the program's user inputs (shape, stride, dtype, device of each
    placeholder), for APIs that want ``program.example_inputs`` (``aoti_compile_and_package``) on a leapp
    ``.pt2``, which stores none."""
    user_inputs = set(program.graph_signature.user_inputs)
    args = []
    for node in program.graph.nodes:
        if node.op != "placeholder" or node.name not in user_inputs:
            continue
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            raise ExportError(f"program input '{node.name}' is not a tensor ({type(val).__name__}): leapp nodes "
                              "take tensors only")
        args.append(torch.empty_strided(_concrete(val.shape), _concrete(val.stride()), dtype=val.dtype,
                                        device=val.device).zero_())
    return tuple(args), {}


def _concrete(sizes) -> list[int]:
    """Sizes with a dynamic batch's symbols replaced by their example value (the traced sample's)."""
    out = []
    for d in sizes:
        if isinstance(d, torch.SymInt):
            hint = getattr(d.node, "hint", None)
            d = hint if hint is not None else 2  # a symbol without a hint: the smallest size torch.export keeps dynamic
        out.append(int(d))
    return out


def _drop_provenance(program: torch.export.ExportedProgram) -> None:
    """Removes torch's ``from_node`` provenance from the program's nodes before it is saved.

    It names the graphs a node passed through by ``id()`` of the graph object, an address of the exporting
    process, so the same node exported twice gave two archives; it is debug information that loading never
    reads. Without it an export is reproducible, and the validation cache (keyed by the artifact's sha256)
    answers a node exported again.
    """
    for module in program.graph_module.modules():
        graph = getattr(module, "graph", None)
        for fx_node in graph.nodes if isinstance(graph, torch.fx.Graph) else ():
            fx_node.meta.pop("from_node", None)
