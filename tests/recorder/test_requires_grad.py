"""Tensors that require grad, and Warp memory a segment allocates, never become constants of undefined bytes.

``wp.from_torch(t)`` of a tensor that requires grad allocates and zeroes a
gradient array (``wp.zeros``) and wraps it with ``torch.as_tensor``: inside a
capture block that memory is undefined until the captured work runs. The
recorder used to snapshot it as a graph constant (a ``clone`` initializer of
garbage in the README's ``action.onnx``, a new one on every export) and to
make the gradient a segment input and output. Now: declared inputs come back
detached (no gradient at all), a gradient of any other tensor is scratch, a
``wp.to_torch`` view made in the block resolves to the segment's output when
used after it, and torch work reading that memory inside the block is refused.
"""

from __future__ import annotations

import pytest
import recorder_kernels as K
import torch
import warp as wp
from recorder_helpers import assert_graphs_replay_samples, trace

import leapp
from leapp import annotate
from leapp.errors import TraceError

wp.init()
THIS = "test_requires_grad.py:"
DEVICES = ["cpu", pytest.param("cuda:0", marks=pytest.mark.cuda)]
N = 8


def _buffers(record, node="n"):
    return dict(record.nodes[node].graph.named_buffers())


@pytest.mark.parametrize("device", DEVICES)
def test_an_input_that_requires_grad_stays_an_input_without_gradient(device):
    def step(raw):
        with leapp.node("n"):
            raw = annotate.input_tensors("n", {"raw": raw})
            assert not raw.requires_grad
            out = torch.empty_like(raw)
            with annotate.warp_op():
                wp.launch(K.scale, dim=N, inputs=[wp.from_torch(raw), 0.5], outputs=[wp.from_torch(out)],
                          device=device)
            annotate.output_tensors("n", {"action": out})
        return out

    w = torch.randn(N, device=device, requires_grad=True)
    record, results = trace(lambda: step(w * 3.0), passes=3)  # a fresh non-leaf that requires grad each pass
    (seg,) = record.nodes["n"].segments
    assert [io.spec.name for io in seg.inputs] == ["in0"] and len(seg.outputs) == 1
    assert seg.captured_ops == ["launch:scale"], "no gradient memset"
    assert seg.constants == {} and seg.scratch == {} and _buffers(record) == {}
    placeholder = [n for n in record.nodes["n"].graph.graph.nodes if n.op == "placeholder"]
    assert [p.target for p in placeholder] == ["raw"]
    for r in results:
        torch.testing.assert_close(r, (w * 1.5).detach())
    assert_graphs_replay_samples(record)


@pytest.mark.parametrize("device", DEVICES)
def test_the_gradient_of_a_tensor_made_in_the_node_is_scratch(device):
    w = torch.linspace(-1.0, 1.0, N, device=device, requires_grad=True)

    def step(x):
        with leapp.node("n"):
            x = annotate.input_tensors("n", {"x": x})
            h = x * w  # requires grad: wp.from_torch(h) allocates h.grad inside the block
            out = torch.empty_like(x)
            with annotate.warp_op():
                wp.launch(K.scale, dim=N, inputs=[wp.from_torch(h), 2.0], outputs=[wp.from_torch(out)], device=device)
            annotate.output_tensors("n", {"y": out})
        return out

    record, results = trace(step, torch.ones(N, device=device), passes=3)
    (seg,) = record.nodes["n"].segments
    assert seg.constants == {} and len(seg.inputs) == 1 and len(seg.outputs) == 1
    assert list(seg.scratch.values()) == [N * 4], "the gradient is scratch, not an input/output"
    assert [b.shape for b in _buffers(record).values()] == [(N,)]  # w only: no snapshot of the gradient
    assert torch.equal(next(iter(_buffers(record).values())), w.detach())
    assert_graphs_replay_samples(record)


@pytest.mark.parametrize("device", DEVICES)
def test_to_torch_inside_the_block_of_an_array_made_there_is_its_output(device):
    def step(x):
        with leapp.node("n", export_with="pt2"):
            x = annotate.input_tensors("n", {"x": x})
            with annotate.warp_op():
                tmp = wp.zeros(N, dtype=float, device=device)
                view = wp.to_torch(tmp)  # torch.as_tensor over memory the capture has not written yet
                wp.launch(K.scale, dim=N, inputs=[wp.from_torch(x), 3.0], outputs=[tmp], device=device)
            y = view + 1.0
            annotate.output_tensors("n", {"y": y})
        return y

    record, results = trace(step, torch.arange(N, dtype=torch.float32, device=device), passes=3)
    (seg,) = record.nodes["n"].segments
    assert seg.constants == {} and len(seg.outputs) == 1 and _buffers(record) == {}
    for r in results:
        torch.testing.assert_close(r, torch.arange(N, dtype=torch.float32, device=device) * 3.0 + 1.0)
    assert_graphs_replay_samples(record)


def test_torch_work_on_memory_the_block_allocated_is_refused():
    def step(x):
        with leapp.node("n"):
            x = annotate.input_tensors("n", {"x": x})
            with annotate.warp_op():
                tmp = wp.zeros(N, dtype=float, device="cpu")
                wp.launch(K.scale, dim=N, inputs=[wp.from_torch(x), 3.0], outputs=[tmp], device="cpu")
                total = wp.to_torch(tmp).sum()
            annotate.output_tensors("n", {"y": x + total})

    with leapp.trace("t"):
        step(torch.ones(N))  # discovery runs eagerly: the memory is defined there
        with pytest.raises(TraceError, match="allocated inside the segment") as info:
            step(torch.ones(N))
    text = str(info.value)
    line = step.__code__.co_firstlineno + 6
    assert "aten.sum" in text and "n/warp_segment_0" in text and f"{THIS}{line}" in text
    runtime = wp._src.context.runtime
    assert runtime._apic_capture is None and torch._C._len_torch_dispatch_stack() == 0


def test_views_of_untraced_tensors_in_the_block_are_snapshotted_when_used():
    gain = torch.tensor([2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0])

    def step(x):
        with leapp.node("n"):
            x = annotate.input_tensors("n", {"x": x})
            with annotate.warp_op():
                g = gain[:N]  # a view of an untraced tensor, made in the block, used after it
                wp.launch(K.add_one, dim=N, inputs=[wp.from_torch(x)], device="cpu")
            annotate.output_tensors("n", {"y": x * g})

    record, _ = trace(step, torch.ones(N), passes=3)
    (buffer,) = _buffers(record).values()
    assert torch.equal(buffer, gain[:N])
    assert_graphs_replay_samples(record)
