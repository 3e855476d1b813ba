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

import json
import logging
import threading

import torch

from leapp.runtime import libraries
from leapp.runtime.segment_signature import OP_NAME, output_shapes

__all__ = ["SCHEMA", "ensure_registered", "native_library_loaded"]

SCHEMA = "warp_segment(Tensor[] inputs, Tensor bundle, str signature) -> Tensor[]"

_lock = threading.Lock()
log = logging.getLogger(__name__)

_state: dict[str, object] = {"registered": False, "native": False, "library": None}


def _fake(inputs: list[torch.Tensor], bundle: torch.Tensor, signature: str) -> list[torch.Tensor]:
    device = inputs[0].device if inputs else bundle.device
    if bundle.device.type == "meta" or any(t.device.type == "meta" for t in inputs):
        _refuse_meta_with_data(inputs, bundle, signature)
    return [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in output_shapes(inputs, signature)]


def _refuse_meta_with_data(inputs: list[torch.Tensor], bundle: torch.Tensor, signature: str) -> None:
    """Raises when meta tensors come with real ones on a device.

    This kernel also serves torch's Meta dispatch key, which wins over CPU and
    CUDA whenever any argument is on ``meta``: a meta bundle next to real CUDA
    inputs would otherwise "run" here and return uninitialised outputs. All
    arguments on meta (shape propagation) and fake tensors (tracing) pass.
    """
    from torch._subclasses.fake_tensor import is_fake  # only on meta calls

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
    from leapp.runtime import replay  # CUDA/CPU kernels through leapp._native

    lib.impl("warp_segment", replay.warp_segment_cpu, "CPU")
    lib.impl("warp_segment", replay.warp_segment_cuda, "CUDA")


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
