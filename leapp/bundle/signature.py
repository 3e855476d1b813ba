"""leapp/bundle/signature.py: the segment signature string of ONNX ``WarpSegment`` nodes and PT2 ops.

NOTE: the signature is what a fake (meta) kernel or a graph checker sees of a
segment without its bytes: the bundle digest, the segment name and each
input/output tensor's name, dtype and storage shape. It is compact JSON with
sorted keys, so one bundle always has one signature string.
"""

from __future__ import annotations

import json
import re
from typing import Any

from leapp.bundle.format import DTYPE_ITEMSIZE, MAX_INT, BundleError
from leapp.bundle.reader import Bundle
from leapp.bundle.strict_json import decode_strict_json

__all__ = ["signature_json", "parse_signature"]

_DIGEST = re.compile(r"[0-9a-f]{64}")
_TENSOR_KEYS = ("name", "dtype", "shape")


def signature_json(bundle_or_manifest: Bundle | dict, digest: str | None = None) -> str:
    """The compact JSON signature of a bundle (or of a manifest and its bundle's digest).

    ``{"digest": ..., "inputs": [{"dtype", "name", "shape"}...], "outputs": [...], "segment": ...}``
    with ``separators=(",", ":")`` and sorted keys. ``digest`` defaults to the bundle's own.
    """
    if isinstance(bundle_or_manifest, Bundle):
        manifest = bundle_or_manifest.manifest
        digest = bundle_or_manifest.digest if digest is None else digest
    else:
        manifest = bundle_or_manifest
    if digest is None:
        raise BundleError("signature: a digest is required with a manifest (the hex sha256 of its bundle)")
    try:
        sig = {
            "digest": digest,
            "segment": manifest["segment"],
            "inputs": [{k: t[k] for k in _TENSOR_KEYS} for t in manifest["signature"]["inputs"]],
            "outputs": [{k: t[k] for k in _TENSOR_KEYS} for t in manifest["signature"]["outputs"]],
        }
    except (KeyError, TypeError) as e:
        raise BundleError(f"signature: the manifest lacks segment/signature fields: {e!r}") from e
    text = json.dumps(sig, sort_keys=True, separators=(",", ":"))
    parse_signature(text)  # a signature we write is one we accept
    return text


def _fail(message: str) -> BundleError:
    return BundleError(f"signature: {message}")


def _tensors(sig: dict, side: str) -> list[dict]:
    entries = sig.get(side)
    if not isinstance(entries, list):
        raise _fail(f"{side} must be an array, got {type(entries).__name__}")
    names: set[str] = set()
    for j, t in enumerate(entries):
        path = f"{side}[{j}]"
        if not isinstance(t, dict):
            raise _fail(f"{path} must be an object")
        name = t.get("name")
        if not isinstance(name, str) or not name:
            raise _fail(f"{path}.name must be a non-empty string, got {name!r}")
        if name in names:
            raise _fail(f'{path}.name "{name}" is used twice')
        names.add(name)
        if not isinstance(t.get("dtype"), str) or t["dtype"] not in DTYPE_ITEMSIZE:
            raise _fail(f"{path}.dtype must be one of {', '.join(DTYPE_ITEMSIZE)}, got {t.get('dtype')!r}")
        shape = t.get("shape")
        if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= MAX_INT for d in shape
        ):
            raise _fail(f"{path}.shape must be an array of non-negative integers, got {shape!r}")
    return entries


def parse_signature(text: str) -> dict[str, Any]:
    """The signature as a dict, after checking every field; BundleError names the bad one."""
    if not isinstance(text, str):
        raise _fail(f"expected a JSON string, got {type(text).__name__}")
    sig = decode_strict_json(text, "signature")  # the JSON rules of the manifest, as the C++ reader applies them
    if not isinstance(sig, dict):
        raise _fail(f"must be a JSON object, got {type(sig).__name__}")
    digest = sig.get("digest")
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
        raise _fail(f"digest must be 64 lowercase hex digits (a sha256), got {digest!r}")
    if not isinstance(sig.get("segment"), str):
        raise _fail(f"segment must be a string, got {sig.get('segment')!r}")
    _tensors(sig, "inputs")
    _tensors(sig, "outputs")
    return sig
