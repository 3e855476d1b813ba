"""leapp/runtime/pipeline.py: loading and running an exported pipeline folder (``leapp.load``).

``pipeline.yaml`` lists the nodes in execution order, their artifacts (with
sha256), I/O specs and the data-flow edges; ``leapp.pipeline_format`` reads
and checks it completely (schema, cross-references, limits). ``load`` then
checks every artifact's path (it must stay in the folder) and digest, opens
each node with its runner (``leapp.runtime.runners``; ONNX nodes
``leapp.runtime.onnx_runner``) and wires the nodes by the edges.

NOTE: all values crossing node boundaries are torch tensors. The runners,
their I/O checks and the format's names live in their own modules
(``io``, ``runners``, ``onnx_runner``, ``open_artifact``,
``leapp.pipeline_format``) and are imported from there.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Sequence
from typing import Any

import torch

from leapp.errors import LeappError, RuntimeLibraryNotFound
from leapp.runtime.cuda_graphs import (
    PlainCallGraphs,
    CudaGraphCall,
    StreamOrder,
    capture_refusal,
    in_place_graphs_limit,
)
from leapp.pipeline_format import PIPELINE_FILE, PipelineError, read_checked, read_pipeline
from leapp.runtime.io import IOSpec, check_inputs
from leapp.runtime.artifact_safety import UnsafeArtifact
from leapp.runtime.onnx_runner import OnnxRunner
from leapp.runtime.open_artifact import make_runner, onnx_ep_device
from leapp.runtime.runners import NodeRunner, Pt2Runner
from leapp.runtime.segment_check import check_onnx_segments, check_pt2_segments
from leapp.runtime.state import PipelineState, load_state

__all__ = ["PIPELINE_GRAPH_ENV", "NodeDescription", "Pipeline", "load", "plain_call_graph", "read_description",
           "whole_pipeline_graph"]


log = logging.getLogger(__name__)

PIPELINE_GRAPH_ENV = "LEAPP_PIPELINE_GRAPH"  # "0": a plain call runs node by node (see plain_call_graph)


@dataclass
class NodeDescription:
    """One node as pipeline.yaml describes it (what reports read; also leapp.testing's C++ runner route)."""

    name: str
    backend: str
    artifact: Path
    inputs: list[IOSpec]
    outputs: list[IOSpec]
    segments: list[dict]


@dataclass
class PipelineNode(NodeDescription):
    """One node of a loaded pipeline: its description and the runner that opened its artifact."""

    runner: NodeRunner
    # input -> (node, output) | pipeline input | ("state", node/input): a state input (docs/state.md)
    sources: dict[str, tuple[str, str] | str] = field(default_factory=dict)


@dataclass(frozen=True)
class _Plan:
    """A pipeline call's wiring as slot indices: inputs first, then the state inputs, then each node's outputs
    in node order; ``final`` holds the pipeline outputs, then the state outputs (in ``PipelineState.keys``
    order)."""

    input_specs: list[IOSpec]
    where: str
    steps: tuple[tuple[PipelineNode, tuple[int, ...], tuple[int, ...]], ...]  # (node, its input slots, output slots)
    padding: tuple[None, ...]  # the slots the nodes fill
    final: tuple[int, ...]  # the slots of the pipeline's outputs, in ``Pipeline.outputs`` order


@dataclass
class Pipeline:
    """A loaded export: ``pipeline(**inputs)`` returns a dict of the final outputs (torch tensors).

    ``inputs[name]`` and ``outputs[name]`` are IOSpecs: dtype, shape and the user's ``metadata``;
    ``output_sources[name]`` is the (node, output) each pipeline output comes from.

    With state (docs/state.md) a call takes only the external inputs and carries the state: ``state``,
    ``state_specs``, ``reset()``, ``reset(state)``; calls serialize on the state's lock.
    """

    name: str
    path: Path
    nodes: dict[str, PipelineNode]
    inputs: dict[str, IOSpec]
    outputs: dict[str, IOSpec]
    output_sources: dict[str, tuple[str, str]]  # key -> (node, output)
    description: dict
    # cuda_graphs=True: the whole call as one CUDA graph (see whole_pipeline_graph), else None and why not
    graph: CudaGraphCall | None = None
    graph_reason: str = "not requested (leapp.load(..., cuda_graphs=True))"
    # a plain call (no cuda_graphs): the whole call replayed with its inputs copied in (see plain_call_graph)
    plain_graphs: PlainCallGraphs | None = None
    plain_graphs_reason: str = "not made"
    _plan: _Plan | None = field(default=None, init=False, repr=False, compare=False)
    # the carried state (docs/state.md), None without state edges
    _state: PipelineState | None = field(default=None, repr=False, compare=False)
    # loaded with trust (docs/signing.md): the checked signature's folder and digests
    # (leapp.signing.readonce.SignedFolder), else None
    signature: Any = field(default=None, repr=False, compare=False)

    def run(self, **inputs: Any) -> dict[str, torch.Tensor]:
        """Runs every node in order; checks input names, dtypes and shapes first. With state, the state inputs
        come from the pipeline and, when the call succeeds, the state outputs become the next call's."""
        plan = self._plan or self._make_plan()
        values = check_inputs(plan.input_specs, inputs, plan.where)
        state = self._state
        if state is None:
            return dict(zip(self.outputs, self._call(values)))
        with state.lock:
            outs = self._call([*values, *state.values])
            n = len(self.outputs)
            state.commit(outs[n:])
            return dict(zip(self.outputs, outs[:n]))

    def _call(self, values: list[torch.Tensor]) -> list[torch.Tensor]:
        if self.graph is not None:
            return self.graph(*values)
        if self.plain_graphs is not None:
            with self.plain_graphs.order.lock:
                return self._guarded(self.plain_graphs, values)
        return self._run_all(values, direct=False)

    # ---- state (docs/state.md) ----

    @property
    def state(self) -> dict[str, torch.Tensor]:
        """``node/input`` -> a clone of the value the next call reads; empty without state."""
        return {} if self._state is None else self._state.snapshot()

    @property
    def state_specs(self) -> dict[str, IOSpec]:
        """``node/input`` -> the IOSpec of each state input; empty without state."""
        return {} if self._state is None else dict(self._state.specs)

    def reset(self, state: dict[str, torch.Tensor] | None = None) -> None:
        """Restores the initial values (initial_values.safetensors); with ``state`` (``node/input`` -> tensor),
        sets those states instead, each key checked (known, dtype, shape) and copied to the node's device."""
        if self._state is None:
            if state:
                raise PipelineError(f"Pipeline '{self.name}': reset(state): the pipeline has no state")
            return
        self._state.reset(state)

    def _guarded(self, plain_graphs: PlainCallGraphs, values: list[torch.Tensor]) -> list[torch.Tensor]:
        """The copy graph's call; an error of its replay or copies names the pipeline (node errors name their node)."""
        try:
            return plain_graphs(values)
        except LeappError:
            raise
        except Exception as e:
            raise PipelineError(f"Pipeline '{self.name}' (its CUDA graph): {type(e).__name__}: {e}") from e

    __call__ = run

    def _run_all(self, values: Sequence[torch.Tensor], direct: bool) -> list[torch.Tensor]:
        """The nodes in order on checked pipeline inputs; the final outputs in ``self.outputs`` order.
        ``direct``: without the nodes' own CUDA graphs (inside the whole-pipeline graph)."""
        plan = self._plan or self._make_plan()
        slots = [*values, *plan.padding]
        for node, arg_slots, out_slots in plan.steps:
            outs = self._run(node, [slots[i] for i in arg_slots], direct)
            for i, t in zip(out_slots, outs):
                slots[i] = t
        return [slots[i] for i in plan.final]

    def _make_plan(self) -> _Plan:
        """Where every value of a call lives (slot indices, computed once): the call then looks nothing up by name."""
        slot: dict[tuple[str, str] | str, int] = {name: i for i, name in enumerate(self.inputs)}
        state_keys = [] if self._state is None else self._state.keys
        slot.update({("state", key): len(self.inputs) + i for i, key in enumerate(state_keys)})
        state_outputs = [] if self._state is None else [(e.node, e.output) for e in self._state.edges]
        steps = []
        for node in self.nodes.values():
            arg_slots = tuple(slot[node.sources[spec.name]] for spec in node.inputs)
            out_slots = tuple(range(len(slot), len(slot) + len(node.outputs)))
            slot.update({(node.name, spec.name): i for spec, i in zip(node.outputs, out_slots)})
            steps.append((node, arg_slots, out_slots))
        final = [slot[src] for src in self.output_sources.values()] + [slot[src] for src in state_outputs]
        self._plan = _Plan(list(self.inputs.values()), f"Pipeline '{self.name}'", tuple(steps),
                           (None,) * (len(slot) - len(self.inputs) - len(state_keys)), tuple(final))
        return self._plan

    def run_node(self, name: str, **inputs: Any) -> dict[str, torch.Tensor]:
        """Runs one node alone on named inputs; returns its outputs by name."""
        node = self.nodes.get(name)
        if node is None:
            raise PipelineError(f"Pipeline '{self.name}': no node {name!r} (nodes: {list(self.nodes)})")
        args = check_inputs(node.inputs, inputs, f"Pipeline '{self.name}' node '{name}'")
        return {spec.name: t for spec, t in zip(node.outputs, self._run(node, args))}

    def _run(self, node: PipelineNode, args: list[torch.Tensor], direct: bool = False) -> list[torch.Tensor]:
        try:
            return node.runner.direct(args) if direct else node.runner(args)
        except LeappError:
            raise
        except Exception as e:
            raise PipelineError(
                f"Pipeline '{self.name}' node '{node.name}' ({node.artifact.name}): {type(e).__name__}: {e}"
            ) from e


def read_description(path: str | Path) -> tuple[Path, dict]:
    """(folder, checked pipeline.yaml) for a pipeline folder or its pipeline.yaml (``leapp.pipeline_format``)."""
    return read_pipeline(path)


def _binaries(backend: str, runner: NodeRunner, has_segments: bool) -> str:
    """What runs a node's Warp segments (and how an ONNX node meets torch's stream), for the load log."""
    parts = []
    if isinstance(runner, OnnxRunner):
        parts.append(f"ONNX Runtime {runner.stream_mode}, " + ("replayed from a node graph" if runner.graph is not None
                                                               else f"no node graph ({runner.no_graphs_reason})"))
    if not has_segments:
        parts.append("no Warp segments")
    elif backend == "pt2":
        from leapp.runtime import ops

        parts.append("Warp segments through " + ("the native op library" if ops.native_library_loaded()
                                                 else "Python kernels over leapp._native"))
    else:
        parts.append("Warp segments through the ONNX Runtime op library")
    return ", ".join(parts)


def _log_binary_choice(name: str, node_name: str, entry: dict, artifact: Path, runner: NodeRunner) -> None:
    """DEBUG: the binary each Warp module of a CUDA node will load first on its device (``binary_choice``)."""
    from leapp.runtime import binary_choice  # reads the bundles again: only when DEBUG is on

    where = f"pipeline '{name}' node '{node_name}'"
    if torch.device(entry["device"]).type != "cuda":
        from leapp.bundle.format import segment_runs_on_this_cpu

        if all(segment_runs_on_this_cpu(s) for s in entry.get("segments", [])):
            log.debug("%s: Warp segments recorded on %s; they run from their CPU code", where, entry["device"])
        else:
            log.debug("%s: Warp segments recorded on %s without CPU code for this machine; they replay on CUDA "
                      "devices only", where, entry["device"])
        return
    capability = binary_choice.device_capability(entry["device"])
    if capability is None:
        log.debug("%s: no CUDA device %s visible here; binary choice deferred to the first call", where,
                  entry["device"])
        return
    bundles = binary_choice.bundles_in_artifact(entry["backend"], artifact, runner)
    for line in binary_choice.binary_choices(bundles, capability):
        log.debug("%s: %s", where, line)


def load(path: str | Path, *, cuda_graphs: bool = False, onnx_ep: str | None = None,
         trust: str | Path | bytes | Sequence[str | Path | bytes] | None = None) -> Pipeline:
    """Loads an exported pipeline folder; checks digests and opens every node with its runtime.

    ``cuda_graphs=True`` replays each CUDA PT2 node from a CUDA graph once it has been called
    twice with the same input tensors: one graph launch instead of the dispatcher and a launch
    per kernel. Its outputs are then the graph's own tensors, overwritten by the next call of
    that node (docs/runtime.md, "CUDA graphs"). When every node can be captured (ONNX nodes on
    ONNX Runtime's CUDA EP included), ``pipeline(**inputs)`` replays the whole call as one graph
    (``pipeline.graph``; ``pipeline.graph_reason`` says why not otherwise).

    ``onnx_ep`` chooses the ONNX Runtime execution provider of every ONNX node instead of its
    recorded device: ``"cpu"`` (CPU EP; outputs on the host) or ``"cuda"`` (CUDA EP on the node's
    CUDA device, ``cuda:0`` for a CPU node; where ONNX Runtime has no CUDA EP the session gets the
    CPU EP, as a CUDA node does by default: ``node.runner.stream_mode`` tells). For tests
    (``leapp.testing`` routes); the default is what users run.

    ``trust``: the PEM public key (a path, or PEM bytes) or keys one of which must have signed the folder
    (``model.sig``, docs/signing.md); None takes the paths in ``LEAPP_TRUST``, and without it nothing is checked.
    The signature is checked before any file of the folder is parsed, and every file read then against its
    signed digest (``pipeline.signature`` holds them).

    Raises:
        FileNotFoundError: the folder has no pipeline.yaml.
        PipelineError: a pipeline.yaml that breaks its schema or limits (naming the file and
            field), a path leaving the folder, a digest mismatch (naming the file and both
            digests), or an artifact its runtime cannot open (naming the node and the file).
        RuntimeLibraryNotFound: a node with Warp segments needs a missing op library.
        ValueError: ``LEAPP_IN_PLACE_GRAPHS`` set to something other than a count of graphs.
        SignatureError (leapp.errors): with trust, a folder that is unsigned, signed by another key, or differs
            from its signature (naming the file or the signature problem), or a file changed since.
    """
    onnx_ep_device("cpu", onnx_ep)  # an unknown onnx_ep is refused before anything is opened
    in_place_graphs_limit()  # as is a LEAPP_IN_PLACE_GRAPHS that is not a count (ValueError naming it)
    if trust is not None or os.environ.get("LEAPP_TRUST"):
        from leapp.signing import check_export, reading

        signed = check_export(path, trust)  # before any file of the folder is parsed
        with reading(signed):  # every file read is compared with its signed digest (leapp.signing.readonce)
            pipeline = _load(path, cuda_graphs, onnx_ep)
        pipeline.signature = signed
        return pipeline
    return _load(path, cuda_graphs, onnx_ep)


def _load(path: str | Path, cuda_graphs: bool, onnx_ep: str | None) -> Pipeline:
    """``load`` once its arguments and the signature are checked."""
    folder, desc = read_pipeline(path)
    name = desc["name"]
    graph_stream = _graph_stream(desc["nodes"]) if cuda_graphs else None
    yaml_file = folder / PIPELINE_FILE
    nodes: dict[str, PipelineNode] = {}
    for index, entry in enumerate(desc["nodes"]):
        node_name = entry["name"]
        where = f"pipeline '{name}' node '{node_name}'"
        checked = read_checked(folder, entry["artifact"], entry["sha256"], where, f"{yaml_file}: nodes[{index}].artifact")
        files = [read_checked(folder, extra["path"], extra["sha256"], where, f"{yaml_file}: nodes[{index}].files[{i}].path")
                 for i, extra in enumerate(entry["files"])]
        artifact = checked.path
        inputs = [IOSpec.from_yaml(e, where) for e in entry["inputs"]]
        outputs = [IOSpec.from_yaml(e, where) for e in entry["outputs"]]
        segments = list(entry["segments"])
        if entry["backend"] == "onnx":  # the entries against the model's bundles, as leapp-run checks them
            check_onnx_segments(yaml_file, index, entry, artifact, checked.data, files)
        try:
            runner = make_runner(
                entry["backend"], checked, inputs, outputs, entry["device"], has_segments=bool(segments),
                cuda_graphs=cuda_graphs, onnx_ep=onnx_ep, onnx_stream=graph_stream, files=files,
            )
        except RuntimeLibraryNotFound:
            raise
        except UnsafeArtifact as e:  # names the file, the member and why: no "corrupt?" guess around it
            raise PipelineError(f"{where}: {e}") from e
        except Exception as e:  # torch, zipfile, protobuf and ORT errors have no common base
            raise PipelineError(
                f"{where}: cannot open {artifact} ({entry['backend']}; is the file corrupt or truncated?): "
                f"{type(e).__name__}: {e}"
            ) from e
        if isinstance(runner, Pt2Runner):
            check_pt2_segments(yaml_file, index, entry, artifact, runner.program.program)
        nodes[node_name] = PipelineNode(node_name, entry["backend"], artifact, inputs, outputs, segments, runner)
        if log.isEnabledFor(logging.INFO):
            log.info("pipeline '%s' node '%s': %s runner for %s on %s; %s", name, node_name, entry["backend"],
                     artifact.name, entry["device"], _binaries(entry["backend"], runner, bool(segments)))
        if segments and log.isEnabledFor(logging.DEBUG):
            _log_binary_choice(name, node_name, entry, artifact, runner)
    pipeline_inputs, sources = _wire(name, nodes, desc)
    outputs = {e["name"]: IOSpec.from_yaml(e, f"pipeline '{name}' outputs") for e in desc["outputs"]}
    pipeline = Pipeline(name, folder, nodes, pipeline_inputs, outputs, sources, desc,
                        _state=load_state(folder, desc, yaml_file, name))
    if cuda_graphs:
        pipeline.graph, pipeline.graph_reason = whole_pipeline_graph(pipeline, graph_stream)
        pipeline.plain_graphs_reason = "cuda_graphs=True (the whole-pipeline graph replaces it)"
        log.info("pipeline '%s': whole-pipeline CUDA graph %s", name,
                 "on" if pipeline.graph is not None else f"off: {pipeline.graph_reason}")
    else:
        pipeline.plain_graphs, pipeline.plain_graphs_reason = plain_call_graph(pipeline)
        log.info("pipeline '%s': plain calls %s", name, "replay one CUDA graph (inputs copied in, outputs cloned)"
                 if pipeline.plain_graphs is not None else f"run node by node: {pipeline.plain_graphs_reason}")
    return pipeline


def _one_cuda_device(entries: Sequence[dict]) -> torch.device | None:
    """The one CUDA device all nodes were recorded on, when torch sees it; else None."""
    devices = {torch.device(e["device"]) for e in entries}
    if not torch.cuda.is_available() or len(devices) != 1:
        return None
    (device,) = devices
    if device.type != "cuda" or (device.index or 0) >= torch.cuda.device_count():
        return None
    return torch.device("cuda", device.index or 0)


def _graph_stream(entries: Sequence[dict]) -> torch.cuda.Stream | None:
    """The private stream of a whole-pipeline graph: on the one CUDA device of the nodes, when torch sees it."""
    device = _one_cuda_device(entries)
    return None if device is None else torch.cuda.Stream(device)


def plain_call_graph(pipeline: Pipeline) -> tuple[PlainCallGraphs | None, str]:
    """A plain call of ``pipeline`` as one ``PlainCallGraphs``, or (None, why not).

    The plain call's contract stays (any input tensors, fresh outputs): one graph launch replays every
    node, reading input tensors whose addresses repeat in place and copying other inputs into the
    graph's own buffers, and the outputs the captured run made are cloned.
    It replaces a host dispatch per torch op, Warp segment and ONNX Runtime run. Made for pipelines of
    two or more nodes on one CUDA device with fixed shapes whose PT2 nodes can be captured and whose
    ONNX nodes have node graphs (ONNX Runtime's CUDA EP on torch's stream): those nodes then run in
    the pipeline's capture through the same hand-off, and their node graphs and the pipeline's share
    one ``StreamOrder``, since both bake in the sessions' buffers. ``LEAPP_PIPELINE_GRAPH=0`` turns it
    off (docs/runtime.md, "Plain calls").
    """
    if os.environ.get(PIPELINE_GRAPH_ENV, "1") == "0":
        return None, f"{PIPELINE_GRAPH_ENV}=0"
    if len(pipeline.nodes) < 2:
        return None, "one node (an ONNX node on the CUDA EP replays from its own node graph)"
    device = _one_cuda_device(pipeline.description["nodes"])
    if device is None:
        return None, "the nodes are not all on one CUDA device that torch sees"
    state = pipeline._state
    state_inputs = [] if state is None else [state.specs[k] for k in state.keys]
    outputs = list(pipeline.outputs.values()) + ([] if state is None else [  # the state outputs follow (_Plan.final)
        next(s for s in pipeline.nodes[e.node].outputs if s.name == e.output) for e in state.edges])
    if any(spec.batch is not None for spec in (*pipeline.inputs.values(), *outputs)):
        return None, "a dynamic batch (the graph's buffers have one shape)"
    onnx = []
    for node in pipeline.nodes.values():
        runner, where = node.runner, f"node '{node.name}'"
        if isinstance(runner, Pt2Runner):
            refusal = capture_refusal(runner.program.program.graph)
            if refusal is not None:
                return None, f"{where}: {refusal}"
        elif isinstance(runner, OnnxRunner):
            if runner.graph is None:
                return None, f"{where}: no node graph ({runner.no_graphs_reason})"
            onnx.append(runner)
        else:
            return None, f"{where}: {runner.backend} nodes are not captured"
    order = StreamOrder()
    for runner in onnx:
        runner.join_order(order)

    def run(static_in: Sequence[torch.Tensor], _unbound: None) -> list[torch.Tensor]:
        values = pipeline._run_all(static_in, direct=True)
        for spec, value in zip(outputs, values):  # the graph's static outputs: checked once, when captured
            if value.shape != spec.shape or value.dtype != spec.dtype or value.device != device:
                raise PipelineError(f"output '{spec.name}' is {value.dtype}{list(value.shape)} on {value.device}, "
                                    f"pipeline.yaml says {spec.describe()} on {device}")
        return values

    graph = PlainCallGraphs(f"pipeline '{pipeline.name}'", run, lambda values: pipeline._run_all(values, direct=False),
                      torch.cuda.Stream(device), [(s.shape, s.dtype) for s in (*pipeline.inputs.values(), *state_inputs)],
                      [(s.shape, s.dtype) for s in outputs], order, checked_inputs=True,  # Pipeline.run checks them
                      bound_outputs=False)
    return graph, ""


def whole_pipeline_graph(pipeline: Pipeline, stream: torch.cuda.Stream | None) -> tuple[CudaGraphCall | None, str]:
    """The whole call of ``pipeline`` as one CUDA graph, or (None, why not).

    Possible when every node runs on one CUDA device and can be captured: PT2 nodes without
    capture blockers, ONNX nodes on ONNX Runtime's CUDA EP running on ``stream`` (their sessions
    were opened on it; graphs are captured there). The graph bakes in the addresses of ONNX
    Runtime's intermediate buffers, which its arena hands out again to the session's next run, so
    every replay and every direct run of those sessions follows one ``StreamOrder``: one after the
    other on the device, whichever streams call (docs/runtime.md, "Whole-pipeline graph").
    """
    if stream is None:
        return None, "the nodes are not all on one CUDA device that torch sees"
    for node in pipeline.nodes.values():
        runner, where = node.runner, f"node '{node.name}'"
        if isinstance(runner, Pt2Runner) and runner.no_graphs_reason is not None:
            return None, f"{where}: {runner.no_graphs_reason}"
        if isinstance(runner, OnnxRunner) and any(spec.batch is not None for spec in node.inputs):
            # ONNX Runtime's arena hands out intermediate buffers by size: after a run at another batch, a graph
            # captured at this one could point at memory the arena gave to something else
            return None, f"{where}: an ONNX node with a dynamic batch (its intermediate buffers move with the batch)"
        if isinstance(runner, OnnxRunner) and runner.stream_mode != "torch-stream":
            return None, f"{where}: ONNX Runtime runs it in {runner.stream_mode} mode ({runner.stream_reason})"
        if not isinstance(runner, (Pt2Runner, OnnxRunner)):
            return None, f"{where}: {runner.backend} nodes are not captured"
    graph = CudaGraphCall(lambda *values: pipeline._run_all(values, direct=True), f"pipeline '{pipeline.name}'",
                          stream=stream)
    for node in pipeline.nodes.values():
        if isinstance(node.runner, OnnxRunner):  # their direct runs use the buffers the graphs bake in
            node.runner.join_order(graph.order)
    return graph, ""


def _wire(name: str, nodes: dict[str, PipelineNode], desc: dict) -> tuple[dict[str, IOSpec], dict[str, tuple[str, str]]]:
    """Fills each node's input sources from the edges; returns (pipeline inputs, final outputs).

    ``desc`` has been checked: every name it uses exists and every node input is fed once.
    """
    for edge in desc["edges"]:
        if edge.get("state", False):  # carried by the pipeline (docs/state.md)
            nodes[edge["to_node"]].sources[edge["to_input"]] = ("state", f"{edge['to_node']}/{edge['to_input']}")
        elif not edge.get("feedback", False):  # feedback: carried between runs by the caller
            nodes[edge["to_node"]].sources[edge["to_input"]] = (edge["from_node"], edge["from_output"])
    pipeline_inputs: dict[str, IOSpec] = {}
    for entry in desc["inputs"]:
        spec = IOSpec.from_yaml(entry, f"pipeline '{name}' inputs")
        pipeline_inputs[spec.name] = spec
        for consumer in entry["consumers"]:
            nodes[consumer["node"]].sources[consumer["input"]] = spec.name
    outputs = {e["name"]: (e["node"], e["output"]) for e in desc["outputs"]}
    return pipeline_inputs, outputs
