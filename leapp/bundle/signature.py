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

from leapp.bundle.format import DTYPE_ITEMSIZE, MAX_BATCH, MAX_INT, MAX_RULE_COEFFICIENT, BundleError
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
            "inputs": [_entry(t) for t in manifest["signature"]["inputs"]],
            "outputs": [_entry(t) for t in manifest["signature"]["outputs"]],
        }
        if "batch" in manifest:  # dynamic batch: what a fake kernel needs to size outputs from the inputs
            sig["batch"] = {k: manifest["batch"][k] for k in ("min", "max", "traced")}
    except (KeyError, TypeError) as e:
        raise BundleError(f"signature: the manifest lacks segment/signature fields: {e!r}") from e
    text = json.dumps(sig, sort_keys=True, separators=(",", ":"))
    parse_signature(text)  # a signature we write is one we accept
    return text


def _entry(t: dict) -> dict:
    entry = {k: t[k] for k in _TENSOR_KEYS}
    if "batch_rule" in t:
        entry["batch_rule"] = t["batch_rule"]
    return entry


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
        if "batch_rule" in t:
            rule = t["batch_rule"]
            if not (isinstance(rule, list) and len(rule) == 2 and all(
                    isinstance(v, int) and not isinstance(v, bool) and abs(v) <= MAX_RULE_COEFFICIENT for v in rule)):
                raise _fail(f"{path}.batch_rule must be [a, b], two integers in [-2^40, 2^40], got {rule!r}")
            if not shape:
                raise _fail(f"{path}.batch_rule is given for a 0-d tensor")
    return entries


def parse_signature(text: str) -> dict[str, Any]:
    """The signature as a dict, after checking every field; BundleError names the bad one."""
    if not isinstance(text, str):
        raise _fail(f"expected a JSON string, got {type(text).__name__}")
    sig = decode_strict_json(text, "signature", refuse_nul=True)  # the JSON rules of the manifest, as the C++ reader applies them
    if not isinstance(sig, dict):
        raise _fail(f"must be a JSON object, got {type(sig).__name__}")
    digest = sig.get("digest")
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
        raise _fail(f"digest must be 64 lowercase hex digits (a sha256), got {digest!r:.80}")
    if not isinstance(sig.get("segment"), str):
        raise _fail(f"segment must be a string, got {sig.get('segment')!r:.80}")
    inputs = _tensors(sig, "inputs")
    _tensors(sig, "outputs")
    if "batch" in sig:
        batch = sig["batch"]
        ok = isinstance(batch, dict) and all(
            isinstance(batch.get(k), int) and not isinstance(batch.get(k), bool) for k in ("min", "max", "traced"))
        if not ok or not 1 <= batch["min"] <= batch["traced"] <= batch["max"] <= MAX_BATCH:
            raise _fail(f"batch must be {{min, traced, max}} integers with 1 <= min <= traced <= max <= 2^31-1, "
                        f"got {batch!r}")
        if not any(t.get("batch_rule", [0])[0] for t in inputs):
            raise _fail("batch is given but no input has a batch_rule [a, b] with a != 0")
    return sig
