"""A session leaves nothing changed process-wide: also after one that raised.

Checked: no attribute of the warp / torch modules (and Tensor) replaced or
added, ``wp.config`` equal, Warp's tape and APIC capture slots empty, no
torch dispatch/function mode left, grad mode kept, torch's CUDA caching
allocator untouched (its settings, and CUDA not even initialised on CPU).
"""

from __future__ import annotations

import os

import pytest
import recorder_kernels as K
import torch
import warp as wp

import leapp
from leapp import annotate
from leapp.errors import LeappError, SegmentDivergenceError, TraceError

wp.init()


def _module_attrs(module) -> dict[str, int]:
    return {name: id(value) for name, value in vars(module).items()}


def _snapshot() -> dict:
    import warp._src.context as wp_context
    import warp._src.types as wp_types
    import warp._src.utils as wp_utils

    runtime = wp_context.runtime
    modules = [wp, wp_context, wp_types, wp_utils, wp.config, torch, torch.Tensor, torch._C._TensorBase,
               torch.cuda, torch.cuda.memory, torch.fx, torch.overrides]
    return {
        "attrs": [_module_attrs(m) for m in modules],
        "wp.config": {k: repr(getattr(wp.config, k)) for k in dir(wp.config) if not k.startswith("_")},
        "runtime": (runtime.tape, runtime._apic_capture, runtime._apic_graph, wp.get_device().alias),
        "modes": (torch._C._len_torch_dispatch_stack(), torch._C._len_torch_function_stack()),
        "grad": torch.is_grad_enabled(),
        # torch's CUDA caching allocator: its configuration and whether CUDA was even initialised.
        "alloc_conf": (os.environ.get("PYTORCH_CUDA_ALLOC_CONF"), os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING")),
        "cuda_initialized": torch.cuda.is_initialized(),
        "allocator": torch.cuda.memory._get_current_allocator if hasattr(torch.cuda.memory, "_get_current_allocator")
        else None,
        "session": leapp._recorder.session.current_session(),
    }


def step(x, fail=None):
    device = str(x.device)
    with leapp.node("n", export_with="pt2"):
        x = annotate.input_tensors("n", {"x": x})
        y = torch.zeros_like(x)
        with annotate.warp_op():
            wp.launch(K.scale, dim=x.shape[0], inputs=[wp.from_torch(x), 2.0], outputs=[wp.from_torch(y)],
                      device=device)
            if fail == "in_block":
                raise RuntimeError("user error inside the segment")
            if fail == "torch_in_block":
                x.sum()
        if fail == "diverge":
            with annotate.warp_op():  # a segment discovery never met
                pass
        if fail == "in_node":
            raise RuntimeError("user error inside the node")
        annotate.output_tensors("n", {"y": y + x})
    return y


@pytest.fixture(scope="module", autouse=True)
def _warm_up():
    """Let one-time lazy work happen first (torch imports its submodules lazily, Warp caches its CPU
    toolchain on the first module load); the snapshots then compare steady states."""
    wp.init()
    if wp._src.context.runtime.llvm is None:  # Warp without its CPU compiler (warp-clang), as on the GPU machine
        device = "cuda:0"
    else:
        device = "cpu"
    with leapp.trace("warm-up"):
        for _ in range(3):
            step(torch.ones(4, device=device))


@pytest.mark.parametrize("fail", [None, "in_block", "torch_in_block", "in_node", "diverge"])
@pytest.mark.parametrize("failing_pass", [0, 1])
def test_nothing_process_wide_changes(fail, failing_pass):
    before = _snapshot()
    expected = {"diverge": SegmentDivergenceError, "torch_in_block": TraceError}.get(fail, RuntimeError)
    with pytest.raises(expected) if fail else _nullcontext():
        with leapp.trace("t"):
            for i in range(3):
                if fail == "diverge":
                    step(torch.ones(4), fail if i == failing_pass + 1 else None)
                else:
                    step(torch.ones(4), fail if i == failing_pass else None)
    assert _snapshot() == before


def test_script_session_and_stop_with_a_node_left_open():
    before = _snapshot()
    leapp.start("s")
    scope = leapp.node("n")
    scope.__enter__()
    with annotate.warp_op():
        pass
    leapp.stop()  # the node was never exited: stop() unwinds its scoped mode
    assert _snapshot() == before


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_the_snapshot_sees_a_patch(monkeypatch):
    before = _snapshot()
    monkeypatch.setattr(wp, "launch", lambda *a, **k: None)
    assert _snapshot() != before
    monkeypatch.undo()
    monkeypatch.setattr(wp.config, "verify_cuda", not wp.config.verify_cuda)
    assert _snapshot() != before
    monkeypatch.undo()
    with torch.overrides.TorchFunctionMode():
        assert _snapshot() != before
    assert _snapshot() == before


@pytest.mark.cuda
@pytest.mark.parametrize("fail", [None, "in_block", "torch_in_block"])
def test_cuda_session_leaves_the_caching_allocator_alone(fail):
    x = torch.ones(4, device="cuda:0")
    with leapp.trace("warm-up-cuda"):
        for _ in range(3):
            step(x)
    before = _snapshot()
    backend = torch.cuda.memory.get_allocator_backend()
    with pytest.raises((RuntimeError, LeappError)) if fail else _nullcontext():
        with leapp.trace("t"):
            for i in range(3):
                step(x, fail if i == 1 else None)
    assert _snapshot() == before
    assert torch.cuda.memory.get_allocator_backend() == backend
    # Still a caching allocator: freed blocks stay reserved.
    block = torch.empty(1 << 20, device="cuda:0")
    reserved = torch.cuda.memory_reserved()
    del block
    assert torch.cuda.memory_reserved() == reserved > 0
