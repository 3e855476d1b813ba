"""Outside a session every annotation is a no-op returning its arguments, and it is cheap."""

from __future__ import annotations

import time

import torch
import warp as wp

import leapp
from leapp import annotate


def _stacks() -> tuple[int, int, object]:
    return torch._C._len_torch_dispatch_stack(), torch._C._len_torch_function_stack(), wp._src.context.runtime.tape


def test_annotations_return_their_arguments():
    x, y = torch.ones(2), torch.zeros(3)
    arr = wp.zeros(4, dtype=float, device="cpu")
    assert annotate.input_tensors("n", {"x": x}) is x
    assert annotate.input_tensors("n", {"x": x, "y": y, "a": arr}) == (x, y, arr)
    assert annotate.output_tensors("n", {"y": y}) is y
    with leapp.node("n", export_with="pt2") as scope:
        assert isinstance(scope, object)
        with annotate.warp_op():
            assert _stacks() == (0, 0, None)


def test_decorator_calls_the_function_directly():
    calls = []

    @leapp.node("policy")
    def policy(obs, scale=2.0):
        calls.append(_stacks())
        return obs * scale, {"k": obs}

    out = policy(torch.ones(3), scale=3.0)
    assert torch.equal(out[0], torch.full((3,), 3.0))
    assert calls == [(0, 0, None)]
    assert policy.__name__ == "policy"


def test_warp_op_decorator_outside_session():
    @annotate.warp_op()
    def body(v):
        return v + 1

    assert body(1) == 2


def test_noop_cost_is_negligible():
    x = torch.ones(2)
    n = 20000
    start = time.perf_counter()
    for _ in range(n):
        with leapp.node("n"):
            annotate.input_tensors("n", {"x": x})
            with annotate.warp_op():
                pass
            annotate.output_tensors("n", {"x": x})
    per_iteration = (time.perf_counter() - start) / n
    # Five annotations per iteration; a generous bound that still catches real work (modes, tapes, frames walks).
    assert per_iteration < 50e-6, f"{per_iteration * 1e6:.1f} us per annotated iteration"
