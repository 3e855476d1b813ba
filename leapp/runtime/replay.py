"""leapp/runtime/replay.py: the Python kernels of ``leapp::warp_segment`` (used when libleapp_warp_torch.so is absent).

NOTE: these mirror the C++ kernel in ext/torch/leapp_warp_torch.cpp: same
checks, same stream (the current CUDA stream of the inputs' device), same
replay engine (``leapp._native.run_segment``). Bundles are parsed once per
digest: the signature names the digest, so after the first call a bundle is
never copied or parsed again (which also keeps ``torch.cuda.graph`` capture
free of device-to-host copies).
"""

from __future__ import annotations

import functools
import threading

import torch

__all__ = ["warp_segment_cuda", "warp_segment_cpu", "load_bundle", "clear_cache"]

_lock = threading.Lock()
_bundles: dict[str, object] = {}  # digest -> leapp._native.Bundle (checked against its signature)


@functools.lru_cache(maxsize=256)
def _signature(signature: str) -> dict:
    from leapp.bundle import parse_signature

    return parse_signature(signature)


def _where(sig: dict) -> str:
    return f"leapp::warp_segment '{sig.get('segment', '?')}'"


def load_bundle(bundle: torch.Tensor, signature: str):
    """The validated ``leapp._native.Bundle`` for an op call, parsed once per digest.

    Raises:
        ValueError: the bundle is corrupt or does not match ``signature``.
        RuntimeError: the bundle must be read from the GPU while a CUDA graph is being captured.
    """
    from leapp import _native

    sig = _signature(signature)
    digest = sig["digest"]
    cached = _bundles.get(digest)
    if cached is not None:
        return cached
    if bundle.dtype != torch.uint8:
        raise ValueError(f"{_where(sig)}: the bundle must be a uint8 tensor, got {bundle.dtype}")
    if bundle.is_cuda and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            f"{_where(sig)}: the bundle tensor lives on {bundle.device} and was never read before this CUDA graph "
            "capture; run the op once before capturing (reading it needs a device-to-host copy)"
        )
    data = bundle.detach().to("cpu").contiguous().numpy().tobytes()
    parsed = _native.Bundle(data)
    if parsed.digest != digest:
        raise ValueError(
            f"{_where(sig)}: the signature names bundle {digest} but the bundle tensor holds {parsed.digest} "
            "(signature and bundle belong to different segments)"
        )
    parsed.check_signature(signature)
    with _lock:
        return _bundles.setdefault(digest, parsed)


def clear_cache() -> None:
    """Forgets parsed bundles (host memory). Device memory and modules stay: ``leapp.runtime.release_segments``."""
    with _lock:
        _bundles.clear()
    _signature.cache_clear()


def _describe(dtype: str, shape) -> str:
    return f"{dtype}{list(shape)}"


def warp_segment_cuda(inputs: list[torch.Tensor], bundle: torch.Tensor, signature: str) -> list[torch.Tensor]:
    """Replays the segment on the current CUDA stream of the inputs' device; returns new output tensors."""
    from leapp import _native

    sig = _signature(signature)
    where = _where(sig)
    device = inputs[0].device if inputs else bundle.device
    if device.type != "cuda":
        raise ValueError(f"{where}: expects CUDA inputs, got {device}")
    parsed = load_bundle(bundle, signature)
    specs = parsed.inputs
    if len(inputs) != len(specs):
        raise ValueError(f"{where}: expected {len(specs)} inputs {[s['name'] for s in specs]}, got {len(inputs)}")
    dense = []
    for j, (t, spec) in enumerate(zip(inputs, specs)):
        want_dtype = getattr(torch, spec["dtype"])
        if t.device != device:
            raise ValueError(
                f"{where}: input {j} '{spec['name']}' is on {t.device}, input 0 on {device} "
                "(all inputs must be on one CUDA device)"
            )
        if t.dtype != want_dtype or tuple(t.shape) != tuple(spec["shape"]):
            raise ValueError(
                f"{where}: input {j} '{spec['name']}' expects {_describe(spec['dtype'], spec['shape'])}, "
                f"got {str(t.dtype).removeprefix('torch.')}{list(t.shape)}"
            )
        dense.append(t.contiguous())
    outputs = [
        torch.empty(tuple(spec["shape"]), dtype=getattr(torch, spec["dtype"]), device=device)
        for spec in parsed.outputs
    ]
    stream = torch.cuda.current_stream(device).cuda_stream
    _native.run_segment(
        parsed,
        [t.data_ptr() for t in dense],
        [t.data_ptr() for t in outputs],
        stream,
        device.index if device.index is not None else torch.cuda.current_device(),
        input_nbytes=[t.numel() * t.element_size() for t in dense],
        output_nbytes=[t.numel() * t.element_size() for t in outputs],
    )
    return outputs


def warp_segment_cpu(inputs: list[torch.Tensor], bundle: torch.Tensor, signature: str) -> list[torch.Tensor]:
    """CPU inputs: a clear error, because exported Warp segments replay only on CUDA devices."""
    try:
        where = _where(_signature(signature))
    except ValueError:
        where = "leapp::warp_segment"
    raise RuntimeError(
        f"{where}: exported Warp segments replay on CUDA devices only; the inputs are on the CPU. "
        "Move the inputs to a CUDA device."
    )
