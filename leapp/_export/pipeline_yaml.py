"""leapp/_export/pipeline_yaml.py: the ``pipeline.yaml`` that describes an export folder.

Layout (schema, limits and reader: ``leapp.pipeline_format``, docs/pipeline-format.md;
keys are stable, new keys may be added and readers ignore keys they do not know):

    format: leapp.pipeline
    version: 1
    name: <session>
    producer: {leapp, torch, warp, onnx, onnxruntime, onnxscript, python, cuda_toolkit, ptx_isa, ptx_toolkit}
    nodes:                       # in execution order
    - name, backend, artifact (relative path), sha256, files ([{path, sha256}]: ONNX external data),
      source, device, inputs/outputs ([{name, dtype, shape, warp_dtype?, logical_shape?, metadata?}]),
      segments ([{id, source, device, digest, kernels, producer}])
    edges: [{from_node, from_output, to_node, to_input}]
    inputs:  [{name, dtype, shape, metadata?, consumers: [{node, input}]}]   # values the caller passes
    outputs: [{name, node, output, dtype, shape, metadata?}]                 # values the pipeline returns
    constants: [...]             # untraced arrays snapshotted as constants (recorder's report)
    initial_values: {path, sha256}   # iff some edge has state: true (initial_values.safetensors, docs/state.md)

Pipeline inputs are node inputs that no edge feeds; nodes that read the same
name share one pipeline input. Pipeline outputs are node outputs that no edge
consumes, keyed by their name (``node.output`` where names collide). An edge
into a node that ran earlier (state carried to the next step, e.g. the last
action) is written with ``feedback: true``: within one run its input is a
pipeline input and its source a pipeline output, and the caller carries it.
A node's state (``NodeRecord.state``, docs/state.md) is an edge from the node
to itself with ``feedback: true, state: true``: the runtime carries it, so its
input is no pipeline input and its output no pipeline output.
"""

from __future__ import annotations

import platform
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import torch

from leapp._contract.records import NodeRecord, SessionRecord, TensorSpec
from leapp._export.initial_values import record_state_edges, write_initial_values
from leapp._export.source_paths import recorded_source
from leapp.errors import ExportError
from leapp.pipeline_format import (
    PIPELINE_FILE,
    PIPELINE_FORMAT,
    PIPELINE_VERSION,
    PipelineError,
    dtype_name,
    parse_description,
    sha256_file,
    write_twin,
    yaml_text,
)

__all__ = ["NodeArtifact", "describe_pipeline", "dump_pipeline_yaml", "write_pipeline_yaml", "producer_versions"]


@dataclass
class NodeArtifact:
    """What compile wrote for one node."""

    record: NodeRecord
    backend: str
    path: Path
    extra_files: list[Path] = field(default_factory=list)
    segments: list = field(default_factory=list)  # leapp._export.exportable.SegmentExport
    routes: dict = field(default_factory=dict)  # segment id -> "lowered" / "replayed: <why>"; empty: warp="replay"
    lowered: list = field(default_factory=list)  # leapp._export.exportable.LoweredExport


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def producer_versions(segment_producers: list[Mapping[str, str]]) -> dict[str, str]:
    """Versions of everything that shaped the export; CUDA toolkit / PTX ISA come from the bundles."""
    versions = {
        "leapp": _version("leapp"),
        "torch": str(torch.__version__),
        "warp": _version("warp-lang"),
        "onnx": _version("onnx"),
        "onnxruntime": _version("onnxruntime") or _version("onnxruntime-gpu"),
        "onnxscript": _version("onnxscript"),
        "python": platform.python_version(),
    }
    for key in ("cuda_toolkit", "ptx_isa", "ptx_toolkit", "param_abi"):
        seen = sorted({str(p[key]) for p in segment_producers if p.get(key)})
        if seen:
            versions[key] = ", ".join(seen)
    return {k: v for k, v in versions.items() if v is not None}


def _spec(spec: TensorSpec, batch: tuple[int, int] | None = None) -> dict:
    entry = {"name": spec.name, "dtype": dtype_name(spec.dtype), "shape": [int(d) for d in spec.shape]}
    if batch is not None:  # dynamic batch: dim 0 may be any of [min, max] (shape holds the traced batch)
        entry["batch"] = [int(batch[0]), int(batch[1])]
    if spec.warp_dtype is not None:
        entry["warp_dtype"] = spec.warp_dtype
    if spec.logical_shape is not None:
        entry["logical_shape"] = [int(d) for d in spec.logical_shape]
    if spec.metadata:
        entry["metadata"] = spec.metadata
    return entry


def _shared_metadata(record: SessionRecord, name: str, users: list[tuple[str, TensorSpec]]) -> dict:
    """The metadata of a pipeline input read by several nodes: one mapping, whichever of them declared it."""
    declared = [(node, spec.metadata) for node, spec in users if spec.metadata]
    for node, fields in declared[1:]:
        if fields != declared[0][1]:
            raise ExportError(
                f"session '{record.name}': pipeline input '{name}' has metadata {declared[0][1]} in node "
                f"'{declared[0][0]}' but {fields} in node '{node}'; declare the same fields (or declare them once)"
            )
    return declared[0][1] if declared else {}


def _device(record: NodeRecord) -> str:
    for sample in record.samples:
        for t in list(sample.inputs) + list(sample.outputs):
            return str(t.device)
    for seg in record.segments:
        return str(seg.device)
    return "cpu"


def _segment_producer(art: NodeArtifact, seg) -> dict:
    producer = dict(seg.manifest.get("producer", {}))
    if seg.id in art.routes:
        producer["route"] = art.routes[seg.id]
    return producer


def _node_entry(art: NodeArtifact, folder: Path) -> dict:
    """A lowered segment holds no bundle: it is listed under ``lowered_segments``, which the readers ignore."""
    record = art.record
    entry = {
        "name": record.name,
        "backend": art.backend,
        "artifact": art.path.relative_to(folder).as_posix(),
        "sha256": sha256_file(art.path),
        "files": [{"path": p.relative_to(folder).as_posix(), "sha256": sha256_file(p)} for p in art.extra_files],
        "source": recorded_source(record.source),
        "device": _device(record),
        "inputs": [_spec(s, record.dynamic_batch) for s in record.inputs],
        "outputs": [_spec(s, record.dynamic_batch) for s in record.outputs],
        "segments": [
            {
                "id": seg.id,
                "source": recorded_source(seg.source),
                "device": seg.device,
                "digest": seg.digest,
                "kernels": [k.get("key") or k.get("entry") for k in seg.manifest.get("kernels", [])],
                "producer": _segment_producer(art, seg),
            }
            for seg in art.segments
        ],
    }
    if art.lowered:
        ops = "aten" if art.backend == "pt2" else "onnx"
        entry["lowered_segments"] = [
            {
                "id": seg.id,
                "source": recorded_source(seg.source),
                "device": seg.device,
                "kernels": list(seg.kernels),
                "producer": {"route": "lowered", "ops": ops},
            }
            for seg in art.lowered
        ]
    return entry


def _check_edges(record: SessionRecord) -> None:
    for edge in record.edges:
        src, out, dst, inp = edge
        for node, name, side in ((src, out, "outputs"), (dst, inp, "inputs")):
            if node not in record.nodes:
                raise ExportError(f"session '{record.name}': edge {edge} names unknown node '{node}'")
            specs = {s.name: s for s in getattr(record.nodes[node], side)}
            if name not in specs:
                raise ExportError(
                    f"session '{record.name}': edge {edge}: node '{node}' has no {side[:-1]} '{name}' "
                    f"({side}: {list(specs)})"
                )
        a = next(s for s in record.nodes[src].outputs if s.name == out)
        b = next(s for s in record.nodes[dst].inputs if s.name == inp)
        if a.dtype != b.dtype or tuple(a.shape) != tuple(b.shape):
            raise ExportError(
                f"session '{record.name}': edge {edge} joins {dtype_name(a.dtype)}{list(a.shape)} "
                f"to {dtype_name(b.dtype)}{list(b.shape)}"
            )


def _forward_edges(record: SessionRecord) -> list[tuple[str, str, str, str]]:
    """Edges from a node to a later one (execution order); the others carry state between runs."""
    order = list(record.nodes)
    return [e for e in record.edges if order.index(e[0]) < order.index(e[2])]


def _state_edges(record: SessionRecord) -> list[tuple[str, str, str, str]]:
    """(node, output, node, input) of every state (docs/state.md): feedback from a node to itself."""
    return [(n.name, s.output, n.name, s.input) for n in record.nodes.values() for s in n.state]


def _pipeline_inputs(record: SessionRecord) -> list[dict]:
    fed = {(dst, inp) for _, _, dst, inp in _forward_edges(record) + _state_edges(record)}
    groups: dict[str, list[tuple[str, TensorSpec]]] = {}
    for node in record.nodes.values():
        for spec in node.inputs:
            if (node.name, spec.name) not in fed:
                groups.setdefault(spec.name, []).append((node.name, spec))
    entries = []
    for name, users in groups.items():
        first = users[0][1]
        same = all(s.dtype == first.dtype and tuple(s.shape) == tuple(first.shape) for _, s in users)
        ranges = [record.nodes[n].dynamic_batch for n, _ in users]
        batch = None
        if all(r is not None for r in ranges):  # every consumer takes any batch of the common range
            lo, hi = max(r[0] for r in ranges), min(r[1] for r in ranges)
            batch = (lo, hi) if lo < hi else None
        if same:
            entry = _spec(first, batch) | {"name": name, "consumers": [{"node": n, "input": name} for n, _ in users]}
            entry.pop("metadata", None)
            metadata = _shared_metadata(record, name, users)
            entries.append(entry | ({"metadata": metadata} if metadata else {}))
        else:  # different values under one name: one pipeline input per node
            for node_name, spec in users:
                entries.append(_spec(spec) | {"name": f"{node_name}.{name}", "consumers": [{"node": node_name, "input": name}]})
    return entries


def _pipeline_outputs(record: SessionRecord) -> list[dict]:
    consumed = {(src, out) for src, out, _, _ in _forward_edges(record) + _state_edges(record)}
    finals = [(n.name, s) for n in record.nodes.values() for s in n.outputs if (n.name, s.name) not in consumed]
    counts: dict[str, int] = {}
    for _, spec in finals:
        counts[spec.name] = counts.get(spec.name, 0) + 1
    return [
        {
            "name": spec.name if counts[spec.name] == 1 else f"{node}.{spec.name}",
            "node": node,
            "output": spec.name,
            "dtype": dtype_name(spec.dtype),
            "shape": [int(d) for d in spec.shape],
        } | ({"batch": list(record.nodes[node].dynamic_batch)} if record.nodes[node].dynamic_batch else {})
          | ({"metadata": spec.metadata} if spec.metadata else {})
        for node, spec in finals
    ]


def describe_pipeline(record: SessionRecord, artifacts: list[NodeArtifact], folder: Path) -> dict:
    """The pipeline.yaml content (a plain dict of YAML-safe values); writes ``initial_values.safetensors`` into
    ``folder`` when a node has state (``leapp._export.initial_values``)."""
    _check_edges(record)
    record_state_edges(record)  # a hand-made record's states checked before anything is written
    producers = [seg.manifest.get("producer", {}) for art in artifacts for seg in art.segments]
    forward = set(_forward_edges(record))
    return {
        "format": PIPELINE_FORMAT,
        "version": PIPELINE_VERSION,
        "name": record.name,
        "producer": producer_versions(producers),
        "nodes": [_node_entry(art, folder) for art in artifacts],
        "edges": [
            {"from_node": e[0], "from_output": e[1], "to_node": e[2], "to_input": e[3]}
            | ({} if tuple(e) in forward else {"feedback": True})
            for e in record.edges
        ] + [
            {"from_node": e[0], "from_output": e[1], "to_node": e[2], "to_input": e[3], "feedback": True, "state": True}
            for e in _state_edges(record)
        ],
        "inputs": _pipeline_inputs(record),
        "outputs": _pipeline_outputs(record),
        "constants": [_recorded_line(str(line), artifacts) for line in record.constants_report],
    } | _initial_values(record, folder)


def _initial_values(record: SessionRecord, folder: Path) -> dict:
    entry = write_initial_values(record, folder)
    return {} if entry is None else {"initial_values": entry}


def _recorded_line(line: str, artifacts) -> str:
    """A constants report line (``obs/warp_segment_0 (/abs/f.py:45): ...``) with its segment's source as recorded."""
    for art in artifacts:
        for seg in [*art.segments, *art.lowered]:
            line = line.replace(f"{seg.id} ({seg.source})", f"{seg.id} ({recorded_source(seg.source)})")
    return line


def dump_pipeline_yaml(description: dict) -> str:
    """The text of pipeline.yaml (the canonical rendering, ``leapp.pipeline_format.yaml_text``), after reading
    it back through ``leapp.pipeline_format`` (schema, cross-references, limits) and comparing: leapp never
    writes a file that ``leapp.load`` would refuse or read differently."""
    try:
        text = yaml_text(description)
    except (TypeError, ValueError) as e:
        raise ExportError(f"session '{description.get('name')}': {PIPELINE_FILE} cannot hold a value: {e}") from e
    try:
        read_back = parse_description(text.encode("utf-8"), PIPELINE_FILE)
    except PipelineError as e:
        raise ExportError(f"session '{description.get('name')}': leapp would write an invalid {e}") from e
    if read_back != description:
        raise ExportError(f"session '{description.get('name')}': {PIPELINE_FILE} does not read back as written")
    return text


def write_pipeline_yaml(description: dict, folder: Path) -> Path:
    """Writes ``folder/pipeline.yaml`` (``dump_pipeline_yaml``) and its JSON twin ``pipeline.json``
    (``leapp.pipeline_format.twin``: the same description for the C++ runner, bound to this file's sha256)."""
    dump_pipeline_yaml(description)  # checks what write_twin writes
    write_twin(folder, description)
    return Path(folder) / PIPELINE_FILE
