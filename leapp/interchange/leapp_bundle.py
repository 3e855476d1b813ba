"""leapp/interchange/leapp_bundle.py: an export folder's ``pipeline.yaml`` -> the existing LEAPP tool's ``<name>.yaml``.

Other tools speak that tool's format (its ``InferenceManager``; Isaac ROS Deploy, which serves the models through
Triton; Isaac Lab's deploy commands), so leapp writes it beside its own description. The source is ``pipeline.yaml``
read through ``leapp.pipeline_format`` (schema, references, limits); the artifacts' bytes are hashed again and must
match it. What the old format cannot say is refused by name, what other tools cannot run is warned about by node
(docs/leapp-bundle.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import warnings
from pathlib import Path
from typing import Any

import yaml

from leapp.errors import LeappError
from leapp.pipeline_format import PIPELINE_FILE, contained_path, read_pipeline, short_repr

__all__ = ["OLD_DTYPES", "LeappBundleError", "LeappBundleWarning", "bundle_description", "write_leapp_bundle"]

# The dtype names LEAPP 0.7.2 maps back to torch (its utils/dtype.py vocabulary); the others it cannot load.
OLD_DTYPES = frozenset({"bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64",
                        "float16", "bfloat16", "float32", "float64"})
# leapp backend -> the old format's backend name (its NodeManager: onnx, pt2, jit)
BACKENDS = {"onnx": "onnx", "pt2": "pt2", "torchscript": "jit"}
CONFIG_VERSION = "1.3"  # the old tool's ``__config_version__`` of 0.7.2, whose layout this file follows
OUT_SLOT = "==out=="  # the old InferenceManager's name for its output slot: no node may take it
ONNX_CUSTOM_DOMAIN = "leapp.warp"  # leapp._export.onnx_export.DOMAIN (the exporter is not imported here)
_CHUNK = 1 << 20
_HEADER_MAX = 16 << 20  # a safetensors header larger than this is not one leapp wrote


class LeappBundleError(LeappError):
    """The export cannot be written as a LEAPP bundle (the text names the file, node or tensor and why)."""


class LeappBundleWarning(UserWarning):
    """The bundle is written, but a node cannot run in every tool that reads it (the text names the node)."""


def write_leapp_bundle(export_dir: str | Path) -> Path:
    """Writes ``<export_dir>/<name>.yaml`` (the existing LEAPP tool's layout) and returns its path.

    Raises:
        FileNotFoundError: no pipeline.yaml in ``export_dir``.
        PipelineError: pipeline.yaml is refused by leapp's reader.
        LeappBundleError: an artifact's bytes differ from pipeline.yaml's sha256, or the export holds what the old
            format cannot express (a name with '/', a dtype it lacks, malformed ``element_names``, ...).
    """
    folder, document = _described(export_dir)
    target = contained_path(folder, f"{document['_name']}.yaml", "LEAPP bundle")
    del document["_name"]
    text = yaml.safe_dump(document, sort_keys=False, default_flow_style=None, allow_unicode=True, width=120)
    partial = target.with_name(f".{target.name}.partial")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, target)
    return target


def bundle_description(export_dir: str | Path) -> dict:
    """The content of the bundle's yaml (``models``, ``pipeline``, ``system information``); warns as the writer."""
    _, document = _described(export_dir)
    del document["_name"]
    return document


def _described(export_dir: str | Path) -> tuple[Path, dict]:
    folder, desc = read_pipeline(export_dir)
    name = desc["name"]
    if not name or any(c in name for c in "/\\\0") or name in (".", ".."):
        raise LeappBundleError(f"{folder / PIPELINE_FILE}: session name {short_repr(name)} cannot name the "
                               "bundle file <name>.yaml (one file name, no '/')")
    if f"{name}.yaml" == PIPELINE_FILE:
        raise LeappBundleError(f"{folder / PIPELINE_FILE}: a session named 'pipeline' would write its LEAPP bundle "
                               f"over {PIPELINE_FILE}; export it under another name")
    for node in desc["nodes"]:
        _check_names(folder, node)
    edges = desc["edges"]
    state = [e for e in edges if e.get("state") is True]
    for e in state:
        if e["from_node"] != e["to_node"] or e.get("feedback") is not True:
            raise LeappBundleError(f"{folder / PIPELINE_FILE}: state edge {_port(e, 'from')} -> {_port(e, 'to')} "
                                   "must be a feedback edge from a node to itself")
    models = {node["name"]: _model(folder, node) for node in desc["nodes"]}
    pipeline = _pipeline(folder, desc, state)
    _check_routes(folder, desc, pipeline)
    return folder, {"_name": name, "models": models, "pipeline": pipeline,
                    "system information": _system_information(desc["producer"])}


def _check_names(folder: Path, node: dict) -> None:
    """The old format keys every port as ``node/port`` (split at '/') and keeps its outputs under '==out=='."""
    where = f"{folder / PIPELINE_FILE}: node {short_repr(node['name'])}"
    if "/" in node["name"] or node["name"] == OUT_SLOT:
        raise LeappBundleError(f"{where}: the LEAPP bundle names ports 'node/port', so a node name may not hold '/' "
                               f"nor be {OUT_SLOT!r} (its output slot)")
    for kind in ("inputs", "outputs"):
        for entry in node[kind]:
            if "/" in entry["name"]:
                raise LeappBundleError(f"{where} {kind[:-1]} {short_repr(entry['name'])}: the LEAPP bundle names "
                                       "ports 'node/port', so a tensor name may not hold '/'")


def _model(folder: Path, node: dict) -> dict:
    name = node["name"]
    if node["backend"] not in BACKENDS:
        raise LeappBundleError(f"node '{name}': backend {short_repr(node['backend'])} has no LEAPP bundle name")
    artifact = contained_path(folder, node["artifact"], f"nodes '{name}' artifact")
    md5, sha256 = _digests(artifact)
    if sha256 != node["sha256"]:
        raise LeappBundleError(f"{artifact}: sha256 is {sha256}, but {PIPELINE_FILE} records {node['sha256']} for "
                               f"node '{name}': the file changed after export; refusing to describe it")
    for extra in node["files"]:
        path = contained_path(folder, extra["path"], f"nodes '{name}' files")
        if _digests(path)[1] != extra["sha256"]:
            raise LeappBundleError(f"{path}: sha256 differs from the {extra['sha256']} {PIPELINE_FILE} records for "
                                   f"node '{name}': the file changed after export; refusing to describe it")
        if not Path(extra["path"]).name.startswith(Path(node["artifact"]).name + "."):
            warnings.warn(f"node '{name}': external data file {extra['path']} is not named "
                          f"{Path(node['artifact']).name}.*; Isaac ROS Deploy copies only such files next to the model "
                          "it serves", LeappBundleWarning, stacklevel=4)
    segments = [s["id"] for s in node.get("segments", [])]
    custom = _onnx_checked(artifact, node) if node["backend"] == "onnx" else []
    segments = segments or custom
    if segments:
        warnings.warn(f"node '{name}' holds leapp custom ops (Warp segments not lowered: {', '.join(segments)}): "
                      "only leapp's op libraries run them, so the LEAPP InferenceManager, Isaac ROS Deploy and Triton "
                      "cannot; export with session.compile(warp=\"lower\") (docs/lowering.md)",
                      LeappBundleWarning, stacklevel=4)
    if node["backend"] != "onnx":
        warnings.warn(f"node '{name}' is a {node['backend']} node: Isaac ROS Deploy serves every model as ONNX through "
                      "Triton and cannot run it (the LEAPP InferenceManager can); export it with export_with='onnx'",
                      LeappBundleWarning, stacklevel=4)
    return {
        "inputs": [_tensor(name, "input", e) for e in node["inputs"]],
        "outputs": [_tensor(name, "output", e) for e in node["outputs"]],
        "parameters": {"model_path": Path(node["artifact"]).as_posix(), "backend": BACKENDS[node["backend"]],
                       "md5sum": md5, "sha256sum": sha256},
    }


def _digests(path: Path) -> tuple[str, str]:
    if not path.is_file():
        raise LeappBundleError(f"{path}: missing or not a regular file")
    md5, sha256 = hashlib.md5(usedforsecurity=False), hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            md5.update(chunk)
            sha256.update(chunk)
    return md5.hexdigest(), sha256.hexdigest()


def _onnx_checked(path: Path, node: dict) -> list[str]:
    """The old runtime feeds an ONNX model positionally in the yaml's order: the graph's inputs and outputs must be
    the node's, in order. Returns the names of ``leapp.warp`` nodes the graph holds (leapp custom ops)."""
    import onnx
    from google.protobuf.message import DecodeError

    try:
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, OSError, ValueError, RuntimeError) as e:  # a file the sha256 names but nothing can parse
        raise LeappBundleError(f"{path}: node '{node['name']}': not a readable ONNX model "
                               f"({type(e).__name__}: {e})") from e
    initializers = {t.name for t in model.graph.initializer}
    found = ([i.name for i in model.graph.input if i.name not in initializers], [o.name for o in model.graph.output])
    wanted = ([e["name"] for e in node["inputs"]], [e["name"] for e in node["outputs"]])
    for kind, have, want in zip(("inputs", "outputs"), found, wanted):
        if have != want:
            raise LeappBundleError(f"{path}: node '{node['name']}': the ONNX graph's {kind} are {have}, but "
                                   f"{PIPELINE_FILE} lists {want}; the LEAPP runtime passes them by position")
    return [n.name or n.op_type for n in model.graph.node if n.domain == ONNX_CUSTOM_DOMAIN]


def _tensor(node: str, kind: str, entry: dict) -> dict:
    where = f"node '{node}' {kind} '{entry['name']}'"
    if entry["dtype"] not in OLD_DTYPES:
        raise LeappBundleError(f"{where}: dtype {entry['dtype']} has no name in the LEAPP bundle "
                               f"(it knows {sorted(OLD_DTYPES)})")
    out = {"name": entry["name"], "dtype": entry["dtype"], "shape": [int(d) for d in entry["shape"]], "type": "tensor"}
    metadata = entry.get("metadata") or {}
    if "kind" in metadata:
        if not isinstance(metadata["kind"], str) or not metadata["kind"]:
            raise LeappBundleError(f"{where}: metadata kind {short_repr(metadata['kind'])} is not a non-empty string "
                                   "(a term kind such as 'state/joint/position')")
        out["kind"] = metadata["kind"]
    if "element_names" in metadata:
        out["element_names"] = _element_names(where, metadata["element_names"], out["shape"])
    return out


def _element_names(where: str, value: Any, shape: list[int]) -> list[list[str]]:
    """One list of names per axis, right-aligned with the shape (Isaac ROS Deploy pads missing leading axes)."""
    if isinstance(value, str):
        axes = [[value]]
    elif isinstance(value, list) and all(isinstance(v, str) for v in value):
        axes = [list(value)]
    elif isinstance(value, list) and all(v is None or (isinstance(v, list) and all(isinstance(s, str) for s in v))
                                         for v in value):
        axes = [[] if v is None else list(v) for v in value]
    else:
        raise LeappBundleError(f"{where}: metadata element_names {short_repr(value)} is not a name, a list of names, "
                               "or a list of lists of names (one list per axis)")
    if len(axes) > len(shape):
        raise LeappBundleError(f"{where}: metadata element_names has {len(axes)} axes, but the tensor has shape "
                               f"{shape}")
    for i, names in enumerate(axes):
        dim = shape[len(shape) - len(axes) + i]
        if names and len(names) != dim:
            raise LeappBundleError(f"{where}: metadata element_names axis {len(shape) - len(axes) + i} has "
                                   f"{len(names)} names for a dimension of {dim} (shape {shape})")
    return axes


def _port(edge: dict, end: str) -> str:
    return f"{edge[end + '_node']}/{edge[end + '_output' if end == 'from' else end + '_input']}"


def _flow(edges: list[dict]) -> dict[str, list[str]]:
    flow: dict[str, list[str]] = {}
    for e in edges:
        flow.setdefault(_port(e, "from"), []).append(_port(e, "to"))
    return flow


def _pipeline(folder: Path, desc: dict, state: list[dict]) -> dict:
    """Forward edges are data_flow; state edges (the runtime carries them) feedback_flow and feedback_connections.
    A feedback edge without ``state`` is carried by the caller in leapp: its input stays a pipeline input."""
    order = [n["name"] for n in desc["nodes"]]
    fed = {(c["node"], c["input"]) for i in desc["inputs"] for c in i["consumers"]}
    returned = {(o["node"], o["output"]) for o in desc["outputs"]}
    inputs = {n["name"]: [e["name"] for e in n["inputs"] if (n["name"], e["name"]) in fed] for n in desc["nodes"]}
    outputs = {n["name"]: [e["name"] for e in n["outputs"] if (n["name"], e["name"]) in returned]
               for n in desc["nodes"]}
    pipeline = {
        "data_flow": _flow([e for e in desc["edges"] if not e.get("feedback")]),
        "feedback_flow": _flow(state),
        "feedback_connections": _flow(state),
        "inputs": {n: inputs[n] for n in order if inputs[n]},
        "outputs": {n: outputs[n] for n in order if outputs[n]},
    }
    initial = desc.get("initial_values")
    if state and not isinstance(initial, dict):
        raise LeappBundleError(f"{folder / PIPELINE_FILE}: the pipeline has state edges but no initial_values; "
                               "the LEAPP runtime would start them from zeros")
    if isinstance(initial, dict):
        pipeline["initial_values"] = _initial_values(folder, initial, state)
    return pipeline


def _initial_values(folder: Path, initial: dict, state: list[dict]) -> str:
    """The file's sha256 must be pipeline.yaml's, and its keys exactly the state inputs: the LEAPP runtime leaves an
    input without a key at zero without a word."""
    path = contained_path(folder, initial["path"], "initial_values.path")
    if _digests(path)[1] != initial["sha256"]:
        raise LeappBundleError(f"{path}: sha256 differs from the {initial['sha256']} {PIPELINE_FILE} records for "
                               "initial_values: the file changed after export; refusing to describe it")
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        if size > _HEADER_MAX:
            raise LeappBundleError(f"{path}: safetensors header of {size} bytes, more than {_HEADER_MAX}")
        try:
            header = json.loads(f.read(size))
        except ValueError as e:
            raise LeappBundleError(f"{path}: not a safetensors file (its header is not JSON: {e})") from None
    keys = set(header) - {"__metadata__"} if isinstance(header, dict) else set()
    wanted = {_port(e, "to") for e in state}
    if keys != wanted:
        raise LeappBundleError(f"{path}: holds initial values for {sorted(keys)}, but the state inputs are "
                               f"{sorted(wanted)}")
    return Path(initial["path"]).as_posix()


def _check_routes(folder: Path, desc: dict, pipeline: dict) -> None:
    """The old InferenceManager refuses a model output that no flow or pipeline output takes."""
    routed = {p for flow in ("data_flow", "feedback_flow") for p in pipeline[flow]}
    routed |= {f"{n}/{o}" for n, outs in pipeline["outputs"].items() for o in outs}
    for node in desc["nodes"]:
        for entry in node["outputs"]:
            if f"{node['name']}/{entry['name']}" not in routed:
                raise LeappBundleError(f"{folder / PIPELINE_FILE}: node '{node['name']}' output '{entry['name']}' "
                                       "goes to no node and is no pipeline output; the LEAPP runtime refuses that")


def _system_information(producer: dict) -> dict:
    """The versions that made the export (pipeline.yaml's ``producer``), under the old format's key names."""
    names = {"leapp": "leapp version", "torch": "torch version", "python": "python version",
             "cuda_toolkit": "cuda version", "warp": "warp version"}
    info = {"leapp version": producer.get("leapp", "unknown"), "leapp config version": CONFIG_VERSION}
    for key, value in producer.items():
        info[names.get(key, f"{key} version")] = str(value)
    info["os"] = f"{platform.system()} {platform.release()} (where the bundle was written)"
    return info
