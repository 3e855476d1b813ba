"""The ``leapp::warp_segment`` torch operator.

Schema: ``leapp::warp_segment(Tensor[] inputs, Tensor bundle, str signature) -> Tensor[]``.

``import leapp`` registers the op when torch is installed (as torchvision and
torchaudio register theirs), so ``torch.export.load`` resolves it in a program
that never calls ``leapp.load``.

NOTE: the schema is defined in exactly one place per process. When the native
library ``libleapp_warp_torch.so`` is present it defines the op (TORCH_LIBRARY)
and its CUDA kernel, so a PT2 program also runs in C++ without Python. Only
when the library is missing (e.g. torch was installed after leapp) is the
schema defined from Python. Either way the fake (meta) kernel is registered
here: it reads output dtypes and shapes from ``signature``, because fake
tensors carry no bundle bytes.
"""

from __future__ import annotations

import functools
import json
import logging
import threading

import torch

from leapp.runtime import libraries

__all__ = ["OP_NAME", "SCHEMA", "ensure_registered", "output_specs", "native_library_loaded"]

OP_NAME = "leapp::warp_segment"
SCHEMA = "warp_segment(Tensor[] inputs, Tensor bundle, str signature) -> Tensor[]"

_lock = threading.Lock()
log = logging.getLogger(__name__)

_state: dict[str, object] = {"registered": False, "native": False, "library": None}


@functools.lru_cache(maxsize=256)
def _parsed(signature: str) -> dict:
    """The signature after every check of ``leapp.bundle.parse_signature`` (a graph passes the same string on
    every call: cached). A hostile or broken string fails here naming its field, never deeper in a fake kernel."""
    from leapp.bundle import BundleError, parse_signature  # noqa: PLC0415

    try:
        return parse_signature(signature)
    except BundleError as e:
        raise ValueError(f"{OP_NAME}: malformed signature {signature[:200]!r}: {e}") from e


def output_specs(signature: str) -> list[tuple[str, torch.dtype, list[int]]]:
    """(name, dtype, shape) of each output named in a segment signature string."""
    if not isinstance(signature, str):
        raise ValueError(f"{OP_NAME}: the signature must be a string, got {type(signature).__name__}")
    return [(o["name"], getattr(torch, o["dtype"]), list(o["shape"])) for o in _parsed(signature)["outputs"]]


def _fake(inputs: list[torch.Tensor], bundle: torch.Tensor, signature: str) -> list[torch.Tensor]:
    device = inputs[0].device if inputs else bundle.device
    if bundle.device.type == "meta" or any(t.device.type == "meta" for t in inputs):
        _refuse_meta_with_data(inputs, bundle, signature)
    return [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in output_shapes(inputs, signature)]


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


def _refuse_meta_with_data(inputs: list[torch.Tensor], bundle: torch.Tensor, signature: str) -> None:
    """Raises when meta tensors come with real ones on a device.

    This kernel also serves torch's Meta dispatch key, which wins over CPU and
    CUDA whenever any argument is on ``meta``: a meta bundle next to real CUDA
    inputs would otherwise "run" here and return uninitialised outputs. All
    arguments on meta (shape propagation) and fake tensors (tracing) pass.
    """
    from torch._subclasses.fake_tensor import is_fake  # noqa: PLC0415 - only on meta calls

    real = [(f"input {j}", t) for j, t in enumerate(inputs)] + [("the bundle tensor", bundle)]
    on_device = [(what, t.device) for what, t in real if t.device.type != "meta" and not is_fake(t)]
    if not on_device:
        return
    meta = [what for what, t in real if t.device.type == "meta"]
    try:
        segment = json.loads(signature).get("segment", "?")
    except (ValueError, AttributeError):
        segment = "?"
    what, device = on_device[0]
    raise ValueError(
        f"{OP_NAME} '{segment}': {meta[0]} is on the meta device (it holds no bytes) while {what} is on {device}: "
        "the segment cannot run on meta tensors. Pass the bundle and the inputs on one CUDA device "
        "(all arguments on meta only computes output shapes)"
    )


def _define_from_python() -> None:
    lib = torch.library.Library("leapp", "DEF")  # noqa: TOR901 - owned for the process lifetime
    lib.define(SCHEMA)
    _state["library"] = lib
    from leapp.runtime import python_kernel  # CUDA/CPU kernels through leapp._native

    python_kernel.register(lib)


def ensure_registered() -> bool:
    """Makes ``torch.ops.leapp.warp_segment`` available; returns True when the native library serves it.

    ``import leapp`` calls it when torch is installed. Idempotent and thread-safe; the
    fake kernel is registered once per process (a Meta kernel already there, e.g. from
    this module before an ``importlib.reload``, is kept). Loading never changes anything
    but the ``leapp`` op namespace.
    """
    with _lock:
        if _state["registered"]:
            return bool(_state["native"])
        path = libraries.library_path("pt2")
        if path.is_file():
            torch.ops.load_library(str(path))
            _state["native"] = True
            log.info("leapp::warp_segment: native op library %s", path)
        elif not hasattr(torch.ops.leapp, "warp_segment"):
            _define_from_python()
            log.info("leapp::warp_segment: Python kernels over leapp._native (no op library at %s)", path)
        else:
            log.info("leapp::warp_segment: already defined in this process (no op library at %s)", path)
        if not torch._C._dispatch_has_kernel_for_dispatch_key(OP_NAME, "Meta"):
            torch.library.register_fake(OP_NAME)(_fake)
        _state["registered"] = True
        return bool(_state["native"])


def native_library_loaded() -> bool:
    """Whether the op is served by libleapp_warp_torch.so (required for Python-free PT2)."""
    return bool(_state["native"])
