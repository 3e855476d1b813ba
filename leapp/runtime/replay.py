"""leapp/runtime/replay.py: the Python kernels of ``leapp::warp_segment`` (used when libleapp_warp_torch.so is absent).

NOTE: these mirror the C++ kernel in ext/torch/leapp_warp_torch.cpp: same
checks, same stream (the current CUDA stream of the inputs' device), same
replay engine (``leapp._native.run_segment``). A bundle tensor is read once
per identity (the tensor object, its data pointer, length, stride and device,
and torch's version counter, which in-place writes bump; inference tensors
have none) and parsed once per digest, so after the first call it is never
copied again (which also keeps ``torch.cuda.graph`` capture free of
device-to-host copies). Every call checks the signature against the bundle
(once per pair of signature text and digest).
"""

from __future__ import annotations

import functools
import threading
import weakref
from typing import NamedTuple

import torch

__all__ = ["warp_segment_cuda", "warp_segment_cpu", "load_bundle", "clear_cache"]


class _Read(NamedTuple):
    """A bundle tensor as it was when its bytes were read."""

    tensor: weakref.ref
    data_ptr: int
    numel: int
    stride: int
    device: torch.device
    version: int | None  # None: an inference tensor (no version counter)
    bundle: object  # leapp._native.Bundle

    def matches(self, t: torch.Tensor) -> bool:
        return (self.tensor() is t and t.dim() == 1 and self.data_ptr == t.data_ptr() and self.numel == t.numel()
                and self.stride == t.stride(0) and self.device == t.device and self.version == _version(t))


_lock = threading.Lock()
_read: dict[int, _Read] = {}  # id(bundle tensor) -> what was read from it
_checked: set[tuple[str, str]] = set()  # (signature text, bundle digest) pairs that passed check_signature


def _version(t: torch.Tensor) -> int | None:
    return None if t.is_inference() else t._version


@functools.lru_cache(maxsize=256)
def _signature(signature: str) -> dict:
    from leapp.bundle import parse_signature

    return parse_signature(signature)


def _where(sig: dict) -> str:
    from leapp._contract.names import shown

    return f"leapp::warp_segment {shown(sig.get('segment', '?'))}"  # a name from a file: quoted, cut


def load_bundle(bundle: torch.Tensor, signature: str):
    """The validated ``leapp._native.Bundle`` for an op call, checked against ``signature``.

    Raises:
        ValueError: the bundle tensor is not a 1-D uint8 tensor with data, is corrupt or does not match ``signature``.
        RuntimeError: the bundle must be read from the GPU while a CUDA graph is being captured.
    """
    sig = _signature(signature)
    seen = _read.get(id(bundle))
    if seen is None or not seen.matches(bundle):
        seen = _read_bundle(bundle, sig)
    parsed = seen.bundle
    if (signature, parsed.digest) not in _checked:
        if parsed.digest != sig["digest"]:
            raise ValueError(
                f"{_where(sig)}: the signature names bundle {sig['digest']} but the bundle tensor holds {parsed.digest} "
                "(signature and bundle belong to different segments)"
            )
        parsed.check_signature(signature)
        with _lock:
            _checked.add((signature, parsed.digest))
    return parsed


def _read_bundle(bundle: torch.Tensor, sig: dict) -> _Read:
    from leapp import _native

    if bundle.dtype != torch.uint8:
        raise ValueError(f"{_where(sig)}: the bundle must be a uint8 tensor, got {bundle.dtype}")
    if bundle.layout != torch.strided or bundle.dim() != 1 or bundle.device.type == "meta":
        raise ValueError(
            f"{_where(sig)}: the bundle must be a 1-D dense uint8 tensor with data, got a {bundle.dim()}-D "
            f"{bundle.layout} tensor on {bundle.device}"
            + (" (meta tensors hold no bytes)" if bundle.device.type == "meta" else "")
        )
    if bundle.is_cuda and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            f"{_where(sig)}: the bundle tensor lives on {bundle.device} and was never read before this CUDA graph "
            "capture; run the op once before capturing (reading it needs a device-to-host copy)"
        )
    # the identity before the copy: a write racing with it is seen by the next call
    identity = (weakref.ref(bundle), bundle.data_ptr(), bundle.numel(), bundle.stride(0), bundle.device,
                _version(bundle))
    data = bundle.detach().to("cpu").contiguous().numpy().tobytes()
    read = _Read(*identity, _native.Bundle(data))
    with _lock:
        for key in [k for k, v in _read.items() if v.tensor() is None]:
            del _read[key]
        _read[id(bundle)] = read
    return read


def clear_cache() -> None:
    """Forgets what was read from bundle tensors (host memory). Device memory and modules stay:
    ``leapp.runtime.release_segments``."""
    with _lock:
        _read.clear()
        _checked.clear()
    _signature.cache_clear()


def _describe(dtype: str, shape) -> str:
    return f"{dtype}{list(shape)}"


def _shape_matches(shape, spec: dict, dynamic: bool) -> bool:
    """The signature's shape, except dim 0 of an input that follows the batch (checked by output_shapes)."""
    want = list(spec["shape"])
    if dynamic and "batch_rule" in spec:
        return len(shape) == len(want) and list(shape[1:]) == want[1:]
    return list(shape) == want


def _prepared(inputs: list[torch.Tensor], bundle: torch.Tensor, signature: str, device_type: str):
    """(parsed bundle, dense inputs, new outputs, device) of a call, after the checks both kernels make."""
    sig = _signature(signature)
    where = _where(sig)
    device = inputs[0].device if inputs else bundle.device
    if device.type != device_type:
        raise ValueError(f"{where}: expects {'CUDA' if device_type == 'cuda' else 'CPU'} inputs, got {device}")
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
                "(all inputs must be on one device)"
            )
        if t.dtype != want_dtype or not _shape_matches(t.shape, sig["inputs"][j], "batch" in sig):
            raise ValueError(
                f"{where}: input {j} '{spec['name']}' expects {_describe(spec['dtype'], spec['shape'])}, "
                f"got {str(t.dtype).removeprefix('torch.')}{list(t.shape)}"
            )
        dense.append(t.contiguous())
    from leapp import _native
    from leapp.runtime.segment_signature import output_shapes, segment_batch

    # before the outputs, sized by the file, are allocated (docs/runtime.md, "Memory")
    _native.check_segment_memory(parsed, segment_batch(dense, sig) if "batch" in sig else 0)
    outputs = [torch.empty(tuple(shape), dtype=dtype, device=device) for shape, dtype in output_shapes(dense, signature)]
    return parsed, dense, outputs, device


def warp_segment_cuda(inputs: list[torch.Tensor], bundle: torch.Tensor, signature: str) -> list[torch.Tensor]:
    """Replays the segment on the current CUDA stream of the inputs' device; returns new output tensors."""
    from leapp import _native

    parsed, dense, outputs, device = _prepared(inputs, bundle, signature, "cuda")
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
    """Runs the segment's CPU code (docs/export-cpu.md) on CPU tensors; a clear error when the export holds
    none for this machine."""
    from leapp import _native

    parsed, dense, outputs, _ = _prepared(inputs, bundle, signature, "cpu")
    refusal = _native.cpu_code_refusal(parsed)
    if refusal:
        raise RuntimeError(f"{refusal}; the inputs are on the CPU: move them to a CUDA device")
    _native.run_segment_cpu(
        parsed,
        [t.data_ptr() for t in dense],
        [t.data_ptr() for t in outputs],
        [t.numel() * t.element_size() for t in dense],
        [t.numel() * t.element_size() for t in outputs],
    )
    return outputs
