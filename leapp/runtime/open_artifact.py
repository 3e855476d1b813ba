"""leapp/runtime/open_artifact.py: one node's artifact opened with the runner of its backend.

``make_runner`` picks ``OnnxRunner`` (leapp/runtime/onnx_runner.py), ``Pt2Runner`` or ``TorchScriptRunner``
(leapp/runtime/runners.py) from the backend pipeline.yaml records, and the device an ONNX node's session is
opened for (``onnx_ep_device``). It lives apart from the runners so that none of them imports another.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from leapp.pipeline_format import CheckedFile, PipelineError
from leapp.runtime.io import IOSpec
from leapp.runtime.onnx_runner import OnnxRunner
from leapp.runtime.runners import NodeRunner, Pt2Runner, TorchScriptRunner

__all__ = ["ONNX_EPS", "make_runner", "onnx_ep_device"]

ONNX_EPS = ("cpu", "cuda")


def onnx_ep_device(device: str, onnx_ep: str | None) -> str:
    """The device an ONNX node's session is opened for (``OnnxRunner`` picks the execution provider from
    it): the node's recorded device, or the one ``onnx_ep`` asks for: ``"cpu"`` the CPU EP, ``"cuda"``
    the CUDA EP on the node's CUDA device (``cuda:0`` for a node recorded on the CPU)."""
    if onnx_ep is None:
        return device
    if onnx_ep == "cpu":
        return "cpu"
    if onnx_ep == "cuda":
        return device if torch.device(device).type == "cuda" else "cuda:0"
    raise PipelineError(f"onnx_ep={onnx_ep!r}: expected None (the node's device), or one of {list(ONNX_EPS)}")


def make_runner(
    backend: str,
    path: str | Path,
    inputs: Sequence[IOSpec],
    outputs: Sequence[IOSpec],
    device: str = "cpu",
    has_segments: bool = False,
    cuda_graphs: bool = False,
    onnx_ep: str | None = None,
    onnx_stream: torch.cuda.Stream | None = None,
    files: Sequence[Path | CheckedFile] = (),
) -> NodeRunner:
    """The runner of one artifact; ``has_segments`` makes a missing native op library an error;
    ``cuda_graphs`` replays CUDA PT2 nodes from captured graphs (see leapp.runtime.cuda_graphs);
    ``onnx_ep`` opens an ONNX node for another execution provider (``onnx_ep_device``);
    ``onnx_stream`` is the stream a CUDA EP session runs on (default: torch's current stream);
    ``files``: the node's extra files, digests checked, the only ones an ONNX model's external data may
    name (``artifact_safety.check_onnx_external_data``, before ONNX Runtime opens it; a PT2 archive is
    checked in ``load_pt2``). ``path`` and ``files`` given as ``CheckedFile`` (``read_checked``) are loaded
    from the bytes that were hashed: a PT2 through its canonical copy, an ONNX model with its external data
    copied in (``artifact_safety.self_contained_onnx``), TorchScript from memory; never from the path again."""
    path, data = (path.path, path.data) if isinstance(path, CheckedFile) else (Path(path), None)
    if backend == "onnx":
        from leapp.runtime.artifact_safety import check_onnx_external_data, self_contained_onnx

        if data is not None and all(isinstance(f, CheckedFile) for f in files):
            model = self_contained_onnx(path, data, {f.path.resolve(): f.data for f in files})
        else:
            check_onnx_external_data(path, [getattr(f, "path", f) for f in files], data)
            model = data if not files else None
        return OnnxRunner(path, inputs, outputs, onnx_ep_device(device, onnx_ep), needs_library=has_segments,
                          stream=onnx_stream, model=model)
    if backend == "pt2":
        if has_segments:
            from leapp.runtime import libraries

            libraries.require_library("pt2")
        return Pt2Runner(path, inputs, outputs, device, cuda_graphs=cuda_graphs, data=data)
    if backend == "torchscript":
        return TorchScriptRunner(path, inputs, outputs, device, data=data)
    raise PipelineError(f"unknown backend {backend!r} (leapp runs 'onnx', 'pt2' and 'torchscript')")
