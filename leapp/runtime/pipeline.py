"""leapp/runtime/pipeline.py: loading and running an exported pipeline folder (``leapp.load``).

``pipeline.yaml`` lists the nodes in execution order, their artifacts (with
sha256), I/O specs and the data-flow edges; ``leapp.pipeline_format`` reads
and checks it completely (schema, cross-references, limits). ``load`` then
checks every artifact's path (it must stay in the folder) and digest, opens
each node with its real runtime (ONNX Runtime with leapp's op library,
``torch.export.load``, or TorchScript) and wires the nodes by the edges.
The same per-node runners serve ``leapp._export.validate``, so validation
exercises exactly what users load.

NOTE: all values crossing node boundaries are torch tensors; ONNX nodes are
fed through IO binding (no numpy round trip, every dtype including bfloat16) and,
on the CUDA EP, run on torch's stream without host synchronisation
(``leapp.runtime.onnx_runner``, whose names this module re-exports).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from leapp.errors import LeappError, RuntimeLibraryNotFound
from leapp.pipeline_format import (
    PIPELINE_FILE,
    PIPELINE_FORMAT,
    PIPELINE_VERSION,
    PipelineError,
    contained_path,
    dtype_name,
    read_pipeline,
    sha256_file,
)

__all__ = [
    "PIPELINE_FILE",
    "PIPELINE_FORMAT",
    "PIPELINE_VERSION",
    "IOSpec",
    "NodeRunner",
    "OnnxRunner",
    "Pipeline",
    "PipelineError",
    "cuda_ep_options",
    "load",
    "load_pt2",
    "make_runner",
    "onnx_ep_device",
    "onnx_providers",
    "sha256_file",
    "torch_uses_tf32_matmul",
]


log = logging.getLogger(__name__)

_ONNX_RUNNER_NAMES = frozenset({"OnnxRunner", "cuda_ep_options", "onnx_providers", "torch_uses_tf32_matmul",
                                "_ONNX_TYPES", "_onnx_type"})


def __getattr__(name: str):
    """The ONNX runner's names, from leapp.runtime.onnx_runner (imported on first use: it imports this module)."""
    if name in _ONNX_RUNNER_NAMES:
        from leapp.runtime import onnx_runner

        return getattr(onnx_runner, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _dtype(name: str, where: str) -> torch.dtype:
    value = getattr(torch, str(name), None)
    if not isinstance(value, torch.dtype):
        raise PipelineError(f"{where}: unknown dtype {name!r}")
    return value


@dataclass(frozen=True)
class IOSpec:
    """A named value at a node boundary: dtype and static shape."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @classmethod
    def from_yaml(cls, entry: Mapping, where: str) -> IOSpec:
        """From an entry that ``leapp.pipeline_format`` has checked (name, dtype, shape)."""
        return cls(str(entry["name"]), _dtype(entry["dtype"], where), tuple(int(d) for d in entry["shape"]))

    def describe(self) -> str:
        return f"{dtype_name(self.dtype)}{list(self.shape)}"


def _as_tensor(value: Any, where: str) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    try:
        import numpy as np

        if isinstance(value, np.ndarray):
            return torch.from_numpy(value)
    except ImportError:  # pragma: no cover - numpy is a dependency
        pass
    raise PipelineError(f"{where}: expected a torch.Tensor or numpy array, got {type(value).__name__}")


def check_inputs(specs: Sequence[IOSpec], values: Mapping[str, Any], where: str) -> list[torch.Tensor]:
    """The values of ``specs`` in order, after checking names, dtypes and shapes (clear errors)."""
    if len(values) != len(specs) or any(s.name not in values for s in specs):
        expected = [s.name for s in specs]
        unknown = sorted(set(values) - set(expected))
        missing = [n for n in expected if n not in values]
        parts = []
        if missing:
            parts.append(f"missing {missing}")
        if unknown:
            parts.append(f"unexpected {unknown}")
        raise PipelineError(f"{where}: inputs {', '.join(parts)}; expected {expected}")
    out = []
    for spec in specs:
        tensor = values[spec.name]
        if not isinstance(tensor, torch.Tensor):
            tensor = _as_tensor(tensor, f"{where}: input '{spec.name}'")
        if tensor.dtype != spec.dtype or tensor.shape != spec.shape:
            raise PipelineError(
                f"{where}: input '{spec.name}' expects {spec.describe()}, "
                f"got {dtype_name(tensor.dtype)}{list(tensor.shape)}"
            )
        out.append(tensor)
    return out


# --- per-node runners --------------------------------------------------------------------------------


def load_pt2(path: str | Path) -> torch.export.ExportedProgram:
    """``torch.export.load`` after registering ``leapp::warp_segment`` (needed to resolve the op)."""
    from leapp.runtime import ops

    ops.ensure_registered()
    return torch.export.load(str(path))


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

    def __init__(self, path, inputs, outputs, device, cuda_graphs: bool = False):
        super().__init__(path, inputs, outputs, device)
        from leapp.runtime.pt2_program import Pt2Program

        self.program = Pt2Program(load_pt2(self.path))
        self.call = self.program
        self.no_graphs_reason: str | None = None  # why this node is not replayed from CUDA graphs
        if cuda_graphs and self.device.type == "cuda":
            from leapp.runtime.cuda_graphs import CudaGraphCall, capture_blockers

            blockers = capture_blockers(self.program.program.graph)
            if blockers:
                self.no_graphs_reason = f"not capturable: {', '.join(blockers[:3])}"
            else:
                self.call = CudaGraphCall(self.program, name=f"PT2 node {self.path.name}")
        elif cuda_graphs:
            self.no_graphs_reason = f"runs on {self.device}"
        else:
            self.no_graphs_reason = "not requested"

    def __call__(self, inputs):
        return self._check_outputs(self.call(*self._on_device(inputs)))


class TorchScriptRunner(NodeRunner):
    """``torch.jit.load`` of a traced node (nodes without Warp segments only)."""

    backend = "torchscript"

    def __init__(self, path, inputs, outputs, device):
        super().__init__(path, inputs, outputs, device)
        self.module = torch.jit.load(str(self.path), map_location=self.device)

    def __call__(self, inputs):
        outs = self.module(*self._on_device(inputs))
        if isinstance(outs, torch.Tensor):
            outs = [outs]
        return self._check_outputs(list(outs))


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
) -> NodeRunner:
    """The runner of one artifact; ``has_segments`` makes a missing native op library an error;
    ``cuda_graphs`` replays CUDA PT2 nodes from captured graphs (see leapp.runtime.cuda_graphs);
    ``onnx_ep`` opens an ONNX node for another execution provider (``onnx_ep_device``)."""
    if backend == "onnx":
        from leapp.runtime.onnx_runner import OnnxRunner

        return OnnxRunner(path, inputs, outputs, onnx_ep_device(device, onnx_ep), needs_library=has_segments)
    if backend == "pt2":
        if has_segments:
            from leapp.runtime import libraries

            libraries.require_library("pt2")
        return Pt2Runner(path, inputs, outputs, device, cuda_graphs=cuda_graphs)
    if backend == "torchscript":
        return TorchScriptRunner(path, inputs, outputs, device)
    raise PipelineError(f"unknown backend {backend!r} (leapp runs 'onnx', 'pt2' and 'torchscript')")


# --- the pipeline ------------------------------------------------------------------------------------


@dataclass
class PipelineNode:
    """One node of a loaded pipeline."""

    name: str
    backend: str
    artifact: Path
    inputs: list[IOSpec]
    outputs: list[IOSpec]
    segments: list[dict]
    runner: NodeRunner
    sources: dict[str, tuple[str, str] | str] = field(default_factory=dict)  # input -> (node, output) | pipeline input


@dataclass
class Pipeline:
    """A loaded export: ``pipeline(**inputs)`` returns a dict of the final outputs (torch tensors)."""

    name: str
    path: Path
    nodes: dict[str, PipelineNode]
    inputs: dict[str, IOSpec]
    outputs: dict[str, tuple[str, str]]  # key -> (node, output)
    description: dict

    def run(self, **inputs: Any) -> dict[str, torch.Tensor]:
        """Runs every node in order; checks input names, dtypes and shapes first."""
        where = f"Pipeline '{self.name}'"
        values = check_inputs(list(self.inputs.values()), inputs, where)
        external = dict(zip(self.inputs, values))
        produced: dict[tuple[str, str], torch.Tensor] = {}
        for node in self.nodes.values():
            args = [
                produced[src] if isinstance(src, tuple) else external[src]
                for src in (node.sources[s.name] for s in node.inputs)
            ]
            outs = self._run(node, args)
            produced.update({(node.name, spec.name): t for spec, t in zip(node.outputs, outs)})
        return {key: produced[src] for key, src in self.outputs.items()}

    __call__ = run

    def run_node(self, name: str, **inputs: Any) -> dict[str, torch.Tensor]:
        """Runs one node alone on named inputs; returns its outputs by name."""
        node = self.nodes.get(name)
        if node is None:
            raise PipelineError(f"Pipeline '{self.name}': no node {name!r} (nodes: {list(self.nodes)})")
        args = check_inputs(node.inputs, inputs, f"Pipeline '{self.name}' node '{name}'")
        return {spec.name: t for spec, t in zip(node.outputs, self._run(node, args))}

    def _run(self, node: PipelineNode, args: list[torch.Tensor]) -> list[torch.Tensor]:
        try:
            return node.runner(args)
        except LeappError:
            raise
        except Exception as e:
            raise PipelineError(
                f"Pipeline '{self.name}' node '{node.name}' ({node.artifact.name}): {type(e).__name__}: {e}"
            ) from e


def read_description(path: str | Path) -> tuple[Path, dict]:
    """(folder, checked pipeline.yaml) for a pipeline folder or its pipeline.yaml (``leapp.pipeline_format``)."""
    return read_pipeline(path)


def verify_file(folder: Path, rel: str, expected: str, where: str, field: str = "artifact") -> Path:
    """``folder/rel`` after checking it stays in the folder (before any open), exists and has sha256 ``expected``."""
    path = contained_path(folder, rel, f"{field} ({where})")
    if not path.is_file():
        raise PipelineError(f"{where}: artifact {path} is missing")
    actual = sha256_file(path)
    if actual != expected:
        raise PipelineError(
            f"{where}: artifact {path} has sha256 {actual} but pipeline.yaml records {expected}; "
            "the file changed after export"
        )
    return path


def _binaries(backend: str, runner: NodeRunner, has_segments: bool) -> str:
    """What runs a node's Warp segments (and how an ONNX node meets torch's stream), for the load log."""
    parts = [f"ONNX Runtime {runner.stream_mode}"] if backend == "onnx" and hasattr(runner, "stream_mode") else []
    if not has_segments:
        parts.append("no Warp segments")
    elif backend == "pt2":
        from leapp.runtime import ops  # noqa: PLC0415

        parts.append("Warp segments through " + ("the native op library" if ops.native_library_loaded()
                                                 else "Python kernels over leapp._native"))
    else:
        parts.append("Warp segments through the ONNX Runtime op library")
    return ", ".join(parts)


def load(path: str | Path, *, cuda_graphs: bool = False, onnx_ep: str | None = None) -> Pipeline:
    """Loads an exported pipeline folder; checks digests and opens every node with its runtime.

    ``cuda_graphs=True`` replays each CUDA PT2 node from a CUDA graph once it has been called
    twice with the same input tensors: one graph launch instead of the dispatcher and a launch
    per kernel. Its outputs are then the graph's own tensors, overwritten by the next call of
    that node (docs/runtime.md, "CUDA graphs").

    ``onnx_ep`` chooses the ONNX Runtime execution provider of every ONNX node instead of its
    recorded device: ``"cpu"`` (CPU EP; outputs on the host) or ``"cuda"`` (CUDA EP on the node's
    CUDA device, ``cuda:0`` for a CPU node; where ONNX Runtime has no CUDA EP the session gets the
    CPU EP, as a CUDA node does by default: ``node.runner.stream_mode`` tells). For tests
    (``leapp.testing`` routes); the default is what users run.

    Raises:
        FileNotFoundError: the folder has no pipeline.yaml.
        PipelineError: a pipeline.yaml that breaks its schema or limits (naming the file and
            field), a path leaving the folder, a digest mismatch (naming the file and both
            digests), or an artifact its runtime cannot open (naming the node and the file).
        RuntimeLibraryNotFound: a node with Warp segments needs a missing op library.
    """
    onnx_ep_device("cpu", onnx_ep)  # an unknown onnx_ep is refused before anything is opened
    folder, desc = read_pipeline(path)
    name = desc["name"]
    yaml_file = folder / PIPELINE_FILE
    nodes: dict[str, PipelineNode] = {}
    for index, entry in enumerate(desc["nodes"]):
        node_name = entry["name"]
        where = f"pipeline '{name}' node '{node_name}'"
        artifact = verify_file(folder, entry["artifact"], entry["sha256"], where, f"{yaml_file}: nodes[{index}].artifact")
        for i, extra in enumerate(entry["files"]):
            verify_file(folder, extra["path"], extra["sha256"], where, f"{yaml_file}: nodes[{index}].files[{i}].path")
        inputs = [IOSpec.from_yaml(e, where) for e in entry["inputs"]]
        outputs = [IOSpec.from_yaml(e, where) for e in entry["outputs"]]
        segments = list(entry["segments"])
        try:
            runner = make_runner(
                entry["backend"], artifact, inputs, outputs, entry["device"], has_segments=bool(segments),
                cuda_graphs=cuda_graphs, onnx_ep=onnx_ep,
            )
        except RuntimeLibraryNotFound:
            raise
        except Exception as e:  # torch, zipfile, protobuf and ORT errors have no common base
            raise PipelineError(
                f"{where}: cannot open {artifact} ({entry['backend']}; is the file corrupt or truncated?): "
                f"{type(e).__name__}: {e}"
            ) from e
        nodes[node_name] = PipelineNode(node_name, entry["backend"], artifact, inputs, outputs, segments, runner)
        if log.isEnabledFor(logging.INFO):
            log.info("pipeline '%s' node '%s': %s runner for %s on %s; %s", name, node_name, entry["backend"],
                     artifact.name, entry["device"], _binaries(entry["backend"], runner, bool(segments)))
    pipeline_inputs, outputs = _wire(name, nodes, desc)
    return Pipeline(name, folder, nodes, pipeline_inputs, outputs, desc)


def _wire(name: str, nodes: dict[str, PipelineNode], desc: dict) -> tuple[dict[str, IOSpec], dict[str, tuple[str, str]]]:
    """Fills each node's input sources from the edges; returns (pipeline inputs, final outputs).

    ``desc`` has been checked: every name it uses exists and every node input is fed once.
    """
    for edge in desc["edges"]:
        if not edge.get("feedback", False):  # feedback: state carried between runs by the caller
            nodes[edge["to_node"]].sources[edge["to_input"]] = (edge["from_node"], edge["from_output"])
    pipeline_inputs: dict[str, IOSpec] = {}
    for entry in desc["inputs"]:
        spec = IOSpec.from_yaml(entry, f"pipeline '{name}' inputs")
        pipeline_inputs[spec.name] = spec
        for consumer in entry["consumers"]:
            nodes[consumer["node"]].sources[consumer["input"]] = spec.name
    outputs = {e["name"]: (e["node"], e["output"]) for e in desc["outputs"]}
    return pipeline_inputs, outputs
