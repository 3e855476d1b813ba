"""An export folder rewritten as an attacker who can write it would: a segment bundle of an ONNX node replaced, and
every digest that covers it recomputed (the op's signature, the artifact's sha256 and the segment's digest in
pipeline.yaml, pipeline.json), so that only leapp's own content checks stand between the bytes and the runtime."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import yaml

__all__ = ["copy_export", "resealed", "swap_onnx_bundle"]


def copy_export(src: Path, dst: Path) -> Path:
    """A copy of export folder ``src`` at ``dst`` (to be rewritten without touching a shared fixture)."""
    shutil.copytree(src, dst)
    return dst


def swap_onnx_bundle(folder: Path, node: str, edit: Callable[[dict, list], None]) -> bytes:
    """Rewrites the bundle of ``node``'s (one) WarpSegment with ``edit(manifest dict, list of blob bytes)`` (in
    place, unchecked) and reseals the folder; returns the new bundle. The node must be an ONNX one (its bundle is
    an initializer). The op's signature is made anew from the edited manifest where leapp's signature rules allow
    it, else the old one with the new digest."""
    import onnx
    from onnx import numpy_helper

    from leapp.bundle.format import MAGIC
    from leapp.pipeline_format import sha256_file, write_twin

    desc = yaml.safe_load((folder / "pipeline.yaml").read_text())
    entry = next(n for n in desc["nodes"] if n["name"] == node)
    path = folder / entry["artifact"]
    model = onnx.load(str(path))
    (op,) = [n for n in model.graph.node if n.domain == "leapp.warp" and n.op_type == "WarpSegment"]
    init = next(t for t in model.graph.initializer if t.name == op.input[-1])
    old = numpy_helper.to_array(init).tobytes()
    assert old.startswith(MAGIC)
    new = resealed(old, edit)
    digest = _digest(new)
    init.CopyFrom(numpy_helper.from_array(_uint8(new), init.name))
    attr = next(a for a in op.attribute if a.name == "signature")
    attr.s = _signature(new, attr.s, digest).encode()
    onnx.save(model, str(path))
    entry["sha256"] = sha256_file(path)
    for seg in entry["segments"]:
        seg["digest"] = digest
    (folder / "pipeline.yaml").write_text(yaml.safe_dump(desc, sort_keys=False))
    write_twin(folder)
    return new


def resealed(data: bytes, edit: Callable[[dict, list], None]) -> bytes:
    """The bundle with its manifest (a dict) and stored blobs (a list of bytes) edited by ``edit``, packed with a
    new whole-file hash and not checked, as a hostile writer would."""
    from leapp.bundle import read_bundle
    from leapp.bundle.writer import pack

    bundle = read_bundle(data)
    manifest = json.loads(json.dumps(bundle.manifest))
    blobs = [bytes(b) for b in bundle.blobs]
    edit(manifest, blobs)
    return pack(json.dumps(manifest).encode(), blobs, min_reader_version=bundle.min_reader_version)


def _signature(bundle: bytes, old: bytes, digest: str) -> str:
    from leapp.bundle import BundleError
    from leapp.bundle.reader import decode_manifest
    from leapp.bundle.signature import signature_json

    try:
        return signature_json(decode_manifest(_manifest_bytes(bundle)), digest)
    except (BundleError, KeyError, TypeError, ValueError):
        signature = json.loads(old)
        signature["digest"] = digest
        return json.dumps(signature, sort_keys=True, separators=(",", ":"))


def _manifest_bytes(bundle: bytes) -> bytes:
    from leapp.bundle.format import HEADER

    fields = HEADER.unpack_from(bundle)
    offset, size = fields[7], fields[8]  # manifest_offset, manifest_size
    return bundle[offset:offset + size]


def _digest(bundle: bytes) -> str:
    return bundle[-32:].hex()  # the trailing sha256 (docs/bundle-format.md section 1)


def _uint8(data: bytes):
    import numpy as np

    return np.frombuffer(data, dtype=np.uint8).copy()
