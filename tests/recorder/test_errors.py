"""Every recording error of docs/recorder.md section 2, with its exact text, raised where the table says."""

from __future__ import annotations

import sys

import pytest
import recorder_kernels as K
import torch
import warp as wp

import leapp
from leapp import annotate
from leapp.errors import (
    LINUX_ONLY,
    MIXED_TRACE_CONTEXTS,
    MORE_REGIONS_THAN_DISCOVERY,
    NOT_EXECUTED_TWICE,
    SEGMENT_DIVERGED,
    WARP_OP_OWNER_TOKEN,
    SegmentDivergenceError,
    TraceError,
)

wp.init()
THIS = "test_errors.py:"
DEVICES = ["cpu", pytest.param("cuda:0", marks=pytest.mark.cuda)]


def scaled(x, kernels=("scale",), segments=1):
    """A node with ``segments`` Warp segments, each launching ``kernels`` in order."""
    with leapp.node("n", export_with="pt2"):
        x = annotate.input_tensors("n", {"x": x})
        y = torch.zeros_like(x)
        for _ in range(segments):
            with annotate.warp_op():
                for k in kernels:
                    if k == "scale":
                        wp.launch(K.scale, dim=x.shape[0], inputs=[wp.from_torch(x), 2.0],
                                  outputs=[wp.from_torch(y)], device=str(x.device))
                    else:
                        wp.launch(K.add_one, dim=x.shape[0], inputs=[wp.from_torch(y)], device=str(x.device))
        annotate.output_tensors("n", {"y": y})
    return y


def _clean_state():
    runtime = wp._src.context.runtime
    assert runtime.tape is None and runtime._apic_capture is None and runtime._apic_graph is None
    assert torch._C._len_torch_dispatch_stack() == 0 and torch._C._len_torch_function_stack() == 0
    assert leapp._recorder.session.current_session() is None


@pytest.mark.parametrize("device", DEVICES)
def test_node_executed_only_once(device):
    with leapp.trace("t") as session:
        scaled(torch.ones(3, device=device))
    with pytest.raises(TraceError, match=NOT_EXECUTED_TWICE) as info:
        session.compile()
    text = str(info.value)
    assert "leapp.node('n')" in text and "n/warp_segment_0" in text and THIS in text
    _clean_state()


@pytest.mark.parametrize("device", DEVICES)
def test_capture_pass_skips_a_discovered_region(device):
    with leapp.trace("t") as session:
        scaled(torch.ones(3, device=device), segments=2)
        scaled(torch.ones(3, device=device), segments=1)  # no error here: DESIGN raises at compile_graph()
    with pytest.raises(TraceError, match=NOT_EXECUTED_TWICE) as info:
        session.compile()
    assert "n/warp_segment_1" in str(info.value) and THIS in str(info.value)
    # The script spelling raises the same, before the exporter is imported.
    leapp.start("s")
    scaled(torch.ones(3, device=device), segments=2)
    scaled(torch.ones(3, device=device), segments=1)
    with pytest.raises(TraceError, match=NOT_EXECUTED_TWICE):
        leapp.compile_graph()
    _clean_state()


@pytest.mark.parametrize("device", DEVICES)
def test_capture_pass_adds_a_region(device):
    with leapp.trace("t"):
        scaled(torch.ones(3, device=device), segments=1)
        with pytest.raises(SegmentDivergenceError, match=MORE_REGIONS_THAN_DISCOVERY) as info:
            scaled(torch.ones(3, device=device), segments=2)
        _clean_state_in_session()
    assert "n/warp_segment_1" in str(info.value) and THIS in str(info.value)
    _clean_state()


def _clean_state_in_session():
    runtime = wp._src.context.runtime
    assert runtime.tape is None and runtime._apic_capture is None
    assert torch._C._len_torch_dispatch_stack() == 0 and torch._C._len_torch_function_stack() == 0


@pytest.mark.parametrize(
    "first,second",
    [(("scale",), ("add_one",)), (("scale",), ("scale", "add_one")), (("scale", "add_one"), ("scale",))],
)
@pytest.mark.parametrize("device", DEVICES)
def test_capture_pass_calls_different_operations(first, second, device):
    with leapp.trace("t"):
        scaled(torch.ones(3, device=device), kernels=first)
        with pytest.raises(SegmentDivergenceError, match=SEGMENT_DIVERGED) as info:
            scaled(torch.ones(3, device=device), kernels=second)
        _clean_state_in_session()
    text = str(info.value)
    assert "n/warp_segment_0" in text and THIS in text and str([f"launch:{k}" for k in first]) in text
    _clean_state()


@pytest.mark.parametrize("device", DEVICES)
def test_sample_pass_must_match_too(device):
    with leapp.trace("t"):
        scaled(torch.ones(3, device=device))
        scaled(torch.ones(3, device=device))
        with pytest.raises(SegmentDivergenceError, match=SEGMENT_DIVERGED):
            scaled(torch.ones(3, device=device), kernels=("add_one",))
        with pytest.raises(SegmentDivergenceError, match=MORE_REGIONS_THAN_DISCOVERY):
            scaled(torch.ones(3, device=device), segments=2)
    _clean_state()


@pytest.mark.parametrize("device", DEVICES)
def test_one_call_with_arrays_of_two_nodes(device):
    def step(x):
        with leapp.node("a"):
            x = annotate.input_tensors("a", {"x": x})
            a_out = annotate.output_tensors("a", {"y": x + 1})
        with leapp.node("b"):
            x = annotate.input_tensors("b", {"x": x})
            b_tmp = x * 2
            out = torch.empty_like(x)
            with annotate.warp_op():
                wp.launch(K.add_arrays, dim=x.shape[0], inputs=[wp.from_torch(a_out), wp.from_torch(b_tmp)],
                          outputs=[wp.from_torch(out)], device=device)
            annotate.output_tensors("b", {"z": out})

    for passes in (1, 2):  # raised at the call, in discovery as in capture
        with leapp.trace("t"):
            if passes == 2:
                with pytest.raises(TraceError):
                    step(torch.ones(3, device=device))
            with pytest.raises(TraceError, match=MIXED_TRACE_CONTEXTS) as info:
                step(torch.ones(3, device=device))
            _clean_state_in_session()
        text = str(info.value)
        assert text.startswith("wp.launch('add_arrays') at ") and THIS in text
        assert f"{text.split(' at ')[1].split(' ')[0]} in segment b/warp_segment_0 {MIXED_TRACE_CONTEXTS}" in text
        assert "node 'a': a" in text and "node 'b': b, out" in text
    _clean_state()


def test_nested_warp_op_is_refused_by_the_owner_token():
    with leapp.trace("t"), leapp.node("n"):
        with annotate.warp_op():
            with pytest.raises(TraceError, match=WARP_OP_OWNER_TOKEN) as info:
                with annotate.warp_op():
                    pass
            _ = info
        text = str(info.value)
        assert "n/warp_segment_0" in text and THIS in text
        # Only the owner's exit closes the segment: the failed inner entry left it open until then.
        with annotate.warp_op():
            pass
    _clean_state()


def test_non_linux_platform(monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    with leapp.trace("t"), leapp.node("n"):
        with pytest.raises(ImportError, match=LINUX_ONLY) as info:
            with annotate.warp_op():
                pass
    assert "n/warp_segment_0" in str(info.value)
    with annotate.warp_op():  # outside a session: still a no-op
        pass
    _clean_state()


@pytest.mark.parametrize(
    "body,name",
    [
        (lambda x: x + 1, "aten.add.Tensor"),
        (lambda x: torch.cat([x, x]), "torch.cat"),
        (lambda x: x.numpy(), "host readback Tensor.numpy"),
        (lambda x: x.sum().item(), "aten.sum"),
        (lambda x: x[0].item(), "host readback Tensor.item"),
        (lambda x: x.tolist(), "host readback Tensor.tolist"),
    ],
)
@pytest.mark.parametrize("device", DEVICES)
def test_torch_work_inside_a_segment(body, name, device):
    def step(x):
        with leapp.node("n"):
            x = annotate.input_tensors("n", {"x": x})
            with annotate.warp_op():
                wp.from_torch(x[:2])  # views are fine: they touch no data
                body(x)
            annotate.output_tensors("n", {"y": x})

    with leapp.trace("t"):
        with pytest.raises(TraceError, match="inside Warp segment n/warp_segment_0") as info:
            step(torch.ones(3, device=device))
    text = str(info.value)
    assert name in text and THIS in text
    _clean_state()


def test_warp_op_outside_or_for_another_node():
    with leapp.trace("t"):
        with pytest.raises(TraceError, match="outside any leapp.node"):
            with annotate.warp_op():
                pass
        with leapp.node("a"):
            with pytest.raises(TraceError, match=r"inside leapp.node\('a'\), not 'b'"):
                with annotate.warp_op(node="b"):
                    pass
            with annotate.warp_op(node="a"):
                pass
    _clean_state()


def test_a_users_tape_is_reported():
    with leapp.trace("t"), leapp.node("n"), wp.Tape():
        with pytest.raises(TraceError, match="another wp.Tape is active"):
            with annotate.warp_op():
                pass
    _clean_state()


@pytest.mark.parametrize("device", DEVICES)
def test_error_in_the_capture_block_releases_the_capture(device):
    def step(x, fail):
        with leapp.node("n"):
            x = annotate.input_tensors("n", {"x": x})
            y = torch.zeros_like(x)
            with annotate.warp_op():
                wp.launch(K.scale, dim=3, inputs=[wp.from_torch(x), 2.0], outputs=[wp.from_torch(y)], device=device)
                if fail:
                    raise KeyError("user bug")
            annotate.output_tensors("n", {"y": y})

    with leapp.trace("t") as session:
        step(torch.ones(3, device=device), False)
        with pytest.raises(KeyError):
            step(torch.ones(3, device=device), True)
        _clean_state_in_session()
        step(torch.ones(3, device=device), False)  # the failed execution was not counted: this is the capture pass
    assert session.record.problems == [] and len(session.record.nodes["n"].segments) == 1
    _clean_state()
