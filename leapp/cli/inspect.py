"""leapp/cli/inspect.py: ``leapp inspect PATH``: what an artifact or an export folder holds, and its problems.

NOTE: ``inspect`` reads artifacts without running them, so it works where
there is no GPU, no Warp and no torch: bundles through ``leapp.bundle``, ONNX
through the ``onnx`` package, PT2 archives by reading their entries, export
folders through ``leapp.pipeline_format`` (the reader ``leapp.load`` uses; no
path it names is opened before it passes the containment rule). Each problem
is printed as an ``error:`` line and makes the exit status 1.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import TextIO

from leapp.bundle.format import MAGIC
from leapp.cli.inspect_archive import inspect_pt2, inspect_torchscript
from leapp.cli.inspect_bundle import inspect_bundle_file
from leapp.cli.inspect_onnx import inspect_onnx
from leapp.cli.report import Report
from leapp.pipeline_format import (PIPELINE_FILE, PipelineError, check_initial_values, contained_path, is_regular_file,
                                   read_bounded, read_checked, read_pipeline, state_edges)

__all__ = ["inspect_path"]


def _tensor_list(entries: list[dict]) -> str:
    return "; ".join(f"{e['name']}: {e['dtype']}{_shape(e)}{_metadata(e)}" for e in entries) or "none"


def _shape(e: dict) -> str:
    """``[16, 8]``, or ``[batch 1..64 (traced 16), 8]`` for a dynamic batch."""
    if "batch" not in e or not e["shape"]:
        return str(e["shape"])
    lo, hi = e["batch"]
    return "[" + ", ".join([f"batch {lo}..{hi} (traced {e['shape'][0]})"] + [str(d) for d in e["shape"][1:]]) + "]"


def _metadata(entry: dict) -> str:
    """' {"kind": "base_quat"}' for an entry with the user's metadata, else ''."""
    return " " + json.dumps(entry["metadata"], ensure_ascii=False) if entry.get("metadata") else ""


def _inspect_dir(path: Path, report: Report, indent: int) -> None:
    pipeline_file = path / PIPELINE_FILE
    if not pipeline_file.is_file():
        artifacts = sorted(p for p in path.iterdir() if p.suffix in _INSPECTORS)
        report.line(f"{path}: no {PIPELINE_FILE}; inspecting {len(artifacts)} artifact files", indent)
        for artifact in artifacts:
            try:
                contained_path(path, artifact.name, str(artifact))  # a symlink out of the folder is not followed
            except PipelineError as e:
                report.problem(str(e), indent + 1)
                continue
            _inspect_file(artifact, report, indent + 1)
        return
    try:
        _, pipeline = read_pipeline(path)
    except PipelineError as e:
        report.problem(str(e), indent)
        return
    except OSError as e:  # unreadable (permissions), or gone since the check above
        report.problem(f"{pipeline_file}: cannot read: {e}", indent)
        return
    report.line(f"pipeline {pipeline['name']} ({pipeline['format']} v{pipeline['version']}) in {path}", indent)
    if pipeline["producer"]:
        report.line("producer: " + ", ".join(f"{k} {v}" for k, v in pipeline["producer"].items()), indent + 1)
    report.line(f"inputs: {_tensor_list(pipeline['inputs'])}", indent + 1)
    report.line(f"outputs: {_tensor_list(pipeline['outputs'])}", indent + 1)
    for edge in pipeline["edges"]:
        feedback = " (state, carried by the runtime)" if edge.get("state") else (
            " (feedback)" if edge.get("feedback") else "")
        report.line(
            f"edge {edge['from_node']}.{edge['from_output']} -> {edge['to_node']}.{edge['to_input']}{feedback}", indent + 1
        )
    if "initial_values" in pipeline:
        _inspect_initial_values(path, pipeline, report, indent + 1)
    report.line(f"nodes: {len(pipeline['nodes'])}", indent + 1)
    for index, node in enumerate(pipeline["nodes"]):
        _inspect_pipeline_node(path, index, node, report, indent + 2)


def _inspect_initial_values(folder: Path, pipeline: dict, report: Report, indent: int) -> None:
    """The state's initial values file (docs/state.md): contained, its sha256, then the strict check; one line
    per state (``node/input <- node/output``, dtype and shape)."""
    entry = pipeline["initial_values"]
    try:
        checked = read_checked(folder, entry["path"], entry["sha256"], "initial values",
                               f"{PIPELINE_FILE} initial_values.path")
        check_initial_values(checked.data, entry["path"], state_edges(pipeline))
    except PipelineError as e:
        report.problem(str(e), indent)
        return
    report.line(f"initial values: {entry['path']} (sha256 {entry['sha256']}, checked)", indent)
    for edge in state_edges(pipeline):
        report.line(f"state {edge.key} <- {edge.node}/{edge.output}: {edge.dtype}{list(edge.shape)}", indent + 1)


def _inspect_pipeline_node(folder: Path, index: int, node: dict, report: Report, indent: int) -> None:
    """One checked node entry: its files (contained, present, sha256) and its artifact's contents."""
    name = node["name"]
    report.line(f"node {name}: backend {node['backend']}, artifact {node['artifact']}", indent)
    report.line(f"inputs: {_tensor_list(node['inputs'])}", indent + 1)
    report.line(f"outputs: {_tensor_list(node['outputs'])}", indent + 1)
    for seg in node["segments"]:
        route = (seg.get("producer") or {}).get("route")
        report.line(f"segment {seg['id']}: digest {seg['digest']}, kernels {seg['kernels']}"
                    + (f", route {route}" if route else ""), indent + 1)
    for seg in node.get("lowered_segments") or []:  # compile(warp="lower"|"auto"): standard ops, no bundle
        ops = "ATen" if node["backend"] == "pt2" else "ONNX"
        report.line(f"segment {seg.get('id')}: kernels {seg.get('kernels')}, route lowered to standard {ops} ops",
                    indent + 1)
    entries = [(node["artifact"], node["sha256"], f"nodes[{index}].artifact")] + [
        (entry["path"], entry["sha256"], f"nodes[{index}].files[{i}].path") for i, entry in enumerate(node["files"])
    ]
    artifact, files = None, []
    for number, (rel, expected, field) in enumerate(entries):
        try:  # before anything touches the file: an outside path is refused, never reported missing or different
            file = contained_path(folder, rel, f"node {name}: {PIPELINE_FILE} {field}")
        except PipelineError as e:
            report.problem(str(e), indent + 1)
            continue
        if not is_regular_file(file):
            report.problem(f"node {name}: {rel} is missing", indent + 1)
            continue
        try:  # read once, bounded: the digest and the safety checks look at the same bytes, as leapp.load's do
            data = read_bounded(file, f"node {name}")
        except PipelineError as e:
            report.problem(str(e), indent + 1)
            continue
        if hashlib.sha256(data).hexdigest() != expected:
            report.problem(f"node {name}: {rel} sha256 differs from pipeline.yaml's {expected}", indent + 1)
        if number == 0:
            artifact, artifact_data = file, data
        else:
            files.append(file)
    if artifact is not None:
        _check_safety(name, node["backend"], artifact, artifact_data, files, report, indent + 1)
        before = report.problems
        digests = _inspect_file(artifact, report, indent + 1)
        for seg in node["segments"]:
            if seg["digest"] not in digests and report.problems == before:
                report.problem(
                    f"node {name}: segment {seg['id']} (digest {seg['digest']}) is not in {artifact.name}", indent + 1
                )


def _check_safety(name: str, backend: str, artifact: Path, data: bytes, files: list[Path], report: Report,
                  indent: int) -> None:
    """What leapp.load would refuse before its loader opens the artifact (leapp.runtime.artifact_safety)."""
    from leapp.runtime.artifact_safety import UnsafeArtifact, canonical_pt2, check_onnx_external_data

    try:
        if backend == "pt2":
            canonical_pt2(data, artifact.name)
        elif backend == "onnx":
            check_onnx_external_data(artifact, files, data)
    except UnsafeArtifact as e:
        report.problem(f"node {name}: unsafe to load: {e}", indent)
    except PipelineError:
        pass  # not a readable archive or model: the artifact's own inspection below says what it is


_INSPECTORS = {".lwb": inspect_bundle_file, ".onnx": inspect_onnx, ".pt2": inspect_pt2, ".pt": inspect_torchscript}


def _inspect_file(path: Path, report: Report, indent: int = 0) -> set[str]:
    """Inspects one artifact; returns the digests of the bundles it holds."""
    digests_before = set(report.digests)
    suffix = path.suffix.lower()
    inspector = _INSPECTORS.get(suffix)
    if inspector is None:
        with path.open("rb") as f:
            head = f.read(8)
        if head == MAGIC:
            inspector = inspect_bundle_file
        elif head.startswith(b"PK\x03\x04"):
            inspector = inspect_pt2
        else:
            report.problem(f"{path}: not a bundle (.lwb), ONNX (.onnx), PT2 (.pt2) or TorchScript (.pt) file", indent)
            return set()
    inspector(path, report, indent)
    return report.digests - digests_before


def inspect_path(path: str | Path, out: TextIO | None = None) -> int:
    """Prints what ``path`` (bundle, ONNX, PT2, TorchScript or export folder) holds; returns the problem count."""
    report = Report(out if out is not None else sys.stdout)
    path = Path(path)
    if path.is_dir():
        _inspect_dir(path, report, 0)
    elif path.is_file():
        _inspect_file(path, report, 0)
    else:
        report.problem(f"{path}: no such file or directory")
    return report.problems
