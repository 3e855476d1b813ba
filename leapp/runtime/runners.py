"""leapp/runtime/runners.py: one runner per node artifact (PT2, TorchScript; ONNX in ``onnx_runner``).

A runner takes positional tensors in the node's input order and returns its outputs in
order; ``make_runner`` (``open_artifact``) picks it from the backend pipeline.yaml records. ``leapp.load``
and ``leapp._export.validate`` both open nodes through it, so validation runs what users
load.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from leapp.pipeline_format import PipelineError
from leapp.runtime.io import IOSpec

__all__ = ["NodeRunner", "Pt2Runner", "TorchScriptRunner", "load_pt2"]


def load_pt2(path: str | Path, data: bytes | None = None) -> torch.export.ExportedProgram:
    """``torch.export.load`` of the canonical copy of the archive (``artifact_safety.canonical_pt2``: an archive
    loading would run code from is a PipelineError), after registering ``leapp::warp_segment`` (needed to resolve
    the op). ``data``: the archive's bytes as read and hashed (``read_checked``); without it the file is read
    once, bounded."""
    import io

    from leapp.pipeline_format import read_bounded
    from leapp.runtime import ops
    from leapp.runtime.artifact_safety import canonical_pt2

    path = Path(path)
    canonical = canonical_pt2(read_bounded(path, path.name) if data is None else data, path.name)
    ops.ensure_registered()
    return torch.export.load(io.BytesIO(canonical))


class NodeRunner:
    """Runs one artifact: positional tensors in (node input order), tensors out (node output order)."""

    backend = ""

    def __init__(self, path: Path, inputs: Sequence[IOSpec], outputs: Sequence[IOSpec], device: str):
        self.path = Path(path)
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.device = torch.device(device)
        self._device_checked = False

    def __call__(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        raise NotImplementedError

    def direct(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The call without this node's own CUDA graphs (what a whole-pipeline graph captures)."""
        return self(inputs)

    def _on_device(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """``inputs`` on the node's recorded device (checked to exist on the first call only)."""
        device = self.device
        if not self._device_checked:
            if device.type == "cuda" and not torch.cuda.is_available():
                raise PipelineError(f"{self.path}: the node was exported on {device} but torch sees no CUDA device here")
            self._device_checked = True
        return [t if t.device == device else t.to(device) for t in inputs]

    def _check_outputs(self, outs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        if len(outs) != len(self.outputs):
            raise PipelineError(
                f"{self.path.name}: produced {len(outs)} output(s), pipeline.yaml lists {len(self.outputs)}"
            )
        return list(outs)


class Pt2Runner(NodeRunner):
    """The exported program's graph called directly (``Pt2Program``) on the node's recorded device;
    with ``cuda_graphs``, a CUDA node is replayed from captured graphs (``CudaGraphCall``)."""

    backend = "pt2"

    def __init__(self, path, inputs, outputs, device, cuda_graphs: bool = False, data: bytes | None = None):
        super().__init__(path, inputs, outputs, device)
        from leapp.runtime.pt2_program import Pt2Program

        self.program = Pt2Program(load_pt2(self.path, data))
        self.call = self.program
        self.no_graphs_reason: str | None = None  # why this node is not replayed from CUDA graphs
        if cuda_graphs and self.device.type == "cuda":
            from leapp.runtime.cuda_graphs import CudaGraphCall, capture_refusal

            self.no_graphs_reason = capture_refusal(self.program.program.graph)
            if self.no_graphs_reason is None:
                self.call = CudaGraphCall(self.program, name=f"PT2 node {self.path.name}")
        elif cuda_graphs:
            self.no_graphs_reason = f"runs on {self.device}"
        else:
            self.no_graphs_reason = "not requested"

    def __call__(self, inputs):
        return self._check_outputs(self.call(*self._on_device(inputs)))

    def direct(self, inputs):
        return self._check_outputs(self.program(*self._on_device(inputs)))


class TorchScriptRunner(NodeRunner):
    """``torch.jit.load`` of a traced node (nodes without Warp segments only)."""

    backend = "torchscript"

    def __init__(self, path, inputs, outputs, device, data: bytes | None = None):
        super().__init__(path, inputs, outputs, device)
        import io

        from leapp.pipeline_format import read_bounded

        data = read_bounded(self.path, self.path.name) if data is None else data
        self.module = torch.jit.load(io.BytesIO(data), map_location=self.device)

    def __call__(self, inputs):
        outs = self.module(*self._on_device(inputs))
        if isinstance(outs, torch.Tensor):
            outs = [outs]
        return self._check_outputs(list(outs))
