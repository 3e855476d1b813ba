"""leapp/runtime/segment_check.py: a node's ``segments`` entries checked against the bundles its artifact holds.

pipeline.yaml's segment entries are claims that an edited folder can change with every digest recomputed;
the bundles inside the (sha256-checked) artifact are what runs. ``leapp.load`` checks them here and leapp-run
in ext/pipeline/src/segment_check.cpp, with the same texts, so both readers give one verdict
(docs/pipeline-format.md, "Segments"): the count, each digest (the op's ``signature``) and each
``producer.cpu_code`` claim against the machines the bundle holds CPU code for.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from leapp.bundle.format import claims_any_machine
from leapp.bundle.strict_json import decode_strict_json
from leapp.pipeline_format import CheckedFile, PipelineError

__all__ = ["check_onnx_segments", "check_pt2_segments", "claimed_machines"]

_DOMAIN, _OP = "leapp.warp", "WarpSegment"


def claimed_machines(note: str) -> set[str]:
    """The machines a producer.cpu_code note claims: none for "none..." (or no note), else its comma-separated names
    (an "any..." note, copies only, is checked on its own: ``claims_any_machine``)."""
    return set() if note.startswith("none") else {m.strip() for m in note.split(",")}


def _signature_digest(signature: str) -> str:
    """The ``digest`` of a signature ("" when it is not a JSON object with a string digest)."""
    try:
        sig = decode_strict_json(signature, "signature")
    except Exception:  # noqa: BLE001 - any refusal of the text: no digest
        return ""
    digest = sig.get("digest") if isinstance(sig, dict) else None
    return digest if isinstance(digest, str) else ""


def _bundle_machines(at: str, which: str, name: str, data: bytes) -> tuple[list[str], int]:
    """The machines bundle ``data`` holds CPU code for, in its order, and how many kernels it has; parsed by the
    native reader leapp-run uses."""
    import json

    from leapp import _native

    try:
        bundle = _native.Bundle(bytes(data))
    except ValueError as e:
        raise PipelineError(f"{at}: {which}: its bundle in {name} cannot be read: {e}") from e
    manifest = json.loads(bundle.manifest_json)
    return [code["machine"] for code in manifest.get("cpu_code", [])], len(manifest.get("kernels", []))


def _check(field: str, entry: dict, name: str, found: list[tuple[str, bytes | None]], no_bundle: str) -> None:
    """``found``: (signature digest, bundle bytes or None) per segment of the artifact, in its order."""
    segments = entry["segments"]
    if len(found) != len(segments):
        raise PipelineError(f"{field}: {len(segments)} Warp segment(s) listed, but {name} holds {len(found)} "
                            f"({_DOMAIN} {_OP} nodes): the description and the artifact disagree")
    for i, (segment, (digest, data)) in enumerate(zip(segments, found)):
        at, which = f"{field}[{i}]", f"segment {segment['id']!r} of node {entry['name']!r}"
        if digest != segment["digest"]:
            raise PipelineError(f"{at}.digest: {which} records digest {segment['digest']}, but {name} holds {digest!r} "
                                "there: the description and the artifact disagree")
        if data is None:
            raise PipelineError(f"{at}: {which}: {name} holds no bundle for it{no_bundle}")
        machines, kernels = _bundle_machines(at, which, name, data)
        note = segment["producer"].get("cpu_code", "none")
        if claims_any_machine(note):
            if kernels or machines:
                raise PipelineError(f"{at}.producer.cpu_code: {which} claims it runs on any machine without CPU code "
                                    f"({note!r}), but its bundle launches {kernels} kernel(s) and holds CPU code for "
                                    f"{', '.join(machines) or 'no machine'}")
            continue
        if claimed_machines(note) != set(machines):
            raise PipelineError(f"{at}.producer.cpu_code: {which} claims CPU code for {note!r}, but its bundle holds "
                                f"CPU code for {', '.join(machines) or 'no machine'}")


def _external(tensor: Any, model: Path, files: list[CheckedFile]) -> bytes | None:
    """An external initializer's bytes from the node's checked files (as leapp-run finds them), or None."""
    entries = {e.key: e.value for e in tensor.external_data}
    location = entries.get("location", "")
    if not location:
        return None
    target = (model.parent / location).resolve()
    for file in files:
        if Path(file.path).resolve() != target:
            continue
        try:
            offset = int(entries.get("offset", "0"))
            length = int(entries["length"]) if "length" in entries else len(file.data) - offset
        except ValueError:
            return None
        if offset > len(file.data) or length < 0 or length > len(file.data) - offset:
            return None
        return bytes(file.data[offset:offset + length])
    return None


def check_onnx_segments(yaml_file: Path, index: int, entry: dict, artifact: Path, data: bytes,
                        files: list[CheckedFile]) -> None:
    """An ONNX node's segments against the WarpSegment nodes of its model's graph (``data``, the bytes hashed)."""
    import onnx

    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except Exception:  # noqa: BLE001 - not a model: opening it says so (``make_runner``)
        return
    initializers = {t.name: t for t in model.graph.initializer}  # the last of a name, as leapp-run keeps
    found = []
    for node in model.graph.node:
        if node.domain != _DOMAIN or node.op_type != _OP:
            continue
        signature = next((a.s.decode("utf-8", "replace") for a in node.attribute if a.name == "signature"), "")
        tensor = initializers.get(node.input[-1]) if node.input and node.input[-1] else None
        bundle = None
        if tensor is not None and tensor.data_type == onnx.TensorProto.UINT8:
            external = tensor.data_location == onnx.TensorProto.EXTERNAL
            bundle = _external(tensor, artifact, files) if external else tensor.raw_data
        found.append((_signature_digest(signature), bundle))
    _check(f"{yaml_file}: nodes[{index}].segments", entry, artifact.name, found,
           " (its WarpSegment's last input is not a uint8 initializer, or its external data is not one of the "
           "node's files)")


def check_pt2_segments(yaml_file: Path, index: int, entry: dict, artifact: Path, program: Any) -> None:
    """A PT2 node's segments against the ``leapp::warp_segment`` calls of its program's graph and the bundles among
    its constants. leapp-run runs a PT2 node from its AOTInductor package and reads only the claims (docs)."""
    import torch

    from leapp.bundle.format import MAGIC

    tensors = [*program.constants.values(), *program.state_dict.values()]
    by_digest = {}
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.dtype == torch.uint8 and t.dim() == 1 and t.numel() > len(MAGIC) + 32:
            data = bytes(t.detach().cpu().contiguous().numpy())
            if data.startswith(MAGIC):
                by_digest[data[-32:].hex()] = data  # a bundle's digest: its trailing sha256
    found = []
    for node in program.graph.nodes:
        if node.op == "call_function" and str(node.target).startswith("leapp.warp_segment"):
            signature = node.args[2] if len(node.args) > 2 and isinstance(node.args[2], str) else ""
            digest = _signature_digest(signature)
            found.append((digest, by_digest.get(digest)))
    _check(f"{yaml_file}: nodes[{index}].segments", entry, artifact.name, found, "")
