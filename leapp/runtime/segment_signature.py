"""leapp/runtime/segment_signature.py: what a ``leapp::warp_segment`` call returns, read from its signature.

The fake (meta) kernel and the Python replay kernels both size their outputs from the signature string a
PT2 program carries (docs/bundle-format.md, "Dynamic batch"): every check of
``leapp.bundle.parse_signature`` first, then dim 0 from the batch the inputs imply.
"""

from __future__ import annotations

import functools

import torch

__all__ = ["OP_NAME", "output_shapes", "output_specs", "segment_batch"]

OP_NAME = "leapp::warp_segment"


@functools.lru_cache(maxsize=256)
def _parsed(signature: str) -> dict:
    """The signature after every check of ``leapp.bundle.parse_signature`` (a graph passes the same string on
    every call: cached). A hostile or broken string fails here naming its field, never deeper in a fake kernel."""
    from leapp.bundle import BundleError, parse_signature

    try:
        return parse_signature(signature)
    except BundleError as e:
        raise ValueError(f"{OP_NAME}: malformed signature {signature[:200]!r}: {e}") from e


def output_specs(signature: str) -> list[tuple[str, torch.dtype, list[int]]]:
    """(name, dtype, shape) of each output named in a segment signature string."""
    if not isinstance(signature, str):
        raise ValueError(f"{OP_NAME}: the signature must be a string, got {type(signature).__name__}")
    return [(o["name"], getattr(torch, o["dtype"]), list(o["shape"])) for o in _parsed(signature)["outputs"]]


def output_shapes(inputs: list[torch.Tensor], signature: str) -> list[tuple[list, torch.dtype]]:
    """Each output's (shape, dtype) for these inputs: the signature's, with dim 0 from the batch when the
    segment has a dynamic batch (docs/bundle-format.md, "Dynamic batch"). Works on symbolic shapes."""
    specs = output_specs(signature)
    sig = _parsed(signature)
    if "batch" not in sig:
        return [(shape, dtype) for _, dtype, shape in specs]
    batch = segment_batch(inputs, sig)
    out = []
    for (_, dtype, shape), entry in zip(specs, sig["outputs"]):
        if "batch_rule" in entry:
            a, b = entry["batch_rule"]
            shape = [a * batch + b] + list(shape[1:])
        out.append((shape, dtype))
    return out


def segment_batch(inputs: list[torch.Tensor], sig: dict):
    """The batch of a dynamic segment call, from the first input whose dim 0 follows it (may be symbolic)."""
    segment = sig.get("segment", "?")
    if len(inputs) != len(sig["inputs"]):
        raise ValueError(f"{OP_NAME} '{segment}': expected {len(sig['inputs'])} inputs, got {len(inputs)}")
    j, entry = next((j, e) for j, e in enumerate(sig["inputs"]) if e.get("batch_rule", [0])[0])
    a, b = entry["batch_rule"]
    t = inputs[j]
    if t.dim() != len(entry["shape"]):
        raise ValueError(f"{OP_NAME} '{segment}': input {j} '{entry['name']}' has {t.dim()} dims, expected "
                         f"{len(entry['shape'])} (shape {entry['shape']} with a dynamic dim 0)")
    batch = (t.shape[0] - b) // a
    if isinstance(batch, int):
        lo, hi = sig["batch"]["min"], sig["batch"]["max"]
        if a * batch + b != t.shape[0] or not lo <= batch <= hi:
            raise ValueError(f"{OP_NAME} '{segment}': input {j} '{entry['name']}' has {t.shape[0]} rows, which is "
                             f"batch {(t.shape[0] - b) / a:g}; the segment runs batches {lo}..{hi} "
                             f"(dim 0 = {a} * batch + {b})")
    else:
        torch._check(a * batch + b == t.shape[0])
    return batch
