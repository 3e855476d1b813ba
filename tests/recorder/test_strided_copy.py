"""``wp.copy`` between non-contiguous arrays inside a segment: Warp's capture refuses it, leapp records it as its own
copy kernel (leapp/_recorder/strided_copy.py), bit for bit.

The recorded graph replays the segment from its ``.wrp`` through Warp (tests/recorder/warp_replay.py) on inputs the
trace never saw, and must give exactly the bytes eager Warp's copy gives.
"""

from __future__ import annotations

import pytest
import torch
import warp as wp
from hypothesis import given, settings
from hypothesis import strategies as st
from recorder_helpers import trace
from warp_replay import run_node_graph

import leapp
from leapp import annotate
from leapp.errors import TraceError

wp.init()
DEVICES = ["cpu", pytest.param("cuda:0", marks=pytest.mark.cuda)]


def _column_node(device: str, rows: int, width: int, start: int, cols: int, dtype=wp.float32, name: str = "obs"):
    """Isaac Lab's pattern: a persistent group buffer, a column view at an offset, ``wp.copy(column, action)``."""
    group = wp.zeros((rows, width), dtype=dtype, device=device)
    size = wp.types.type_size_in_bytes(dtype)
    column = wp.array(ptr=group.ptr + start * size, dtype=dtype, shape=(rows, cols), strides=group.strides,
                      device=device)
    action = wp.zeros((rows, cols), dtype=dtype, device=device)

    @leapp.node(name)
    def node(a):
        wp.to_torch(action).copy_(a)
        with annotate.warp_op():
            wp.copy(column, action)
        return wp.to_torch(group).clone()

    return node


def _bits(t: torch.Tensor) -> bytes:
    return t.detach().cpu().contiguous().numpy().tobytes()


@pytest.mark.parametrize("device", DEVICES)
def test_copy_into_a_column_view_is_recorded_as_a_launch(device):
    """The copy is one launch of leapp's kernel; the graph equals eager on new inputs, NaN payloads included."""
    node = _column_node(device, 5, 7, 2, 3)
    record, _ = trace(node, torch.randn(5, 3, device=device), passes=3)
    (segment,) = record.nodes["obs"].segments
    assert segment.captured_ops == ["launch:leapp_strided_copy_2d_1x32"], segment.captured_ops
    fresh = torch.randn(5, 3, device=device)
    fresh.view(torch.int32)[0, 0] = 0x7FA00001  # a NaN with a payload: copied as bits, not as a float
    (got,) = run_node_graph(record.nodes["obs"], [fresh])
    assert _bits(got) == _bits(node(fresh))
    assert _bits(got[:, 2:5]) == _bits(fresh)


_DTYPES = {"float16": (wp.float16, torch.float16), "float32": (wp.float32, torch.float32),
           "int64": (wp.int64, torch.int64), "vec3f": (wp.vec3f, torch.float32), "uint8": (wp.uint8, torch.uint8)}


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 6), width=st.integers(2, 7), data=st.data(), dtype=st.sampled_from(sorted(_DTYPES)),
       seed=st.integers(0, 2**31 - 1))
def test_column_copies_equal_eager_bit_for_bit(rows, width, data, dtype, seed):
    """Hypothesis over buffer shapes, column ranges and dtypes (element sizes 1 to 12 bytes, so every word width),
    with random bytes as inputs: the recorded graph equals eager Warp byte for byte."""
    start = data.draw(st.integers(0, width - 1))
    cols = data.draw(st.integers(1, width - start))
    wp_dtype, torch_dtype = _DTYPES[dtype]
    node = _column_node("cpu", rows, width, start, cols, wp_dtype)
    lanes = 3 if dtype == "vec3f" else 1
    shape = (rows, cols, lanes) if lanes > 1 else (rows, cols)
    g = torch.Generator().manual_seed(seed)

    def sample():
        raw = torch.randint(0, 256, (rows * cols * lanes * torch.tensor([], dtype=torch_dtype).element_size(),),
                            dtype=torch.uint8, generator=g)
        return raw.view(torch_dtype).reshape(shape)

    record, _ = trace(node, sample(), passes=2)
    fresh = sample()
    (got,) = run_node_graph(record.nodes["obs"], [fresh])
    assert _bits(got) == _bits(node(fresh))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", ["transposed source", "strided source", "1-d with offsets", "3-d slices"])
def test_other_strided_copies(device, case):
    """A transposed view, a source with a step, Warp's 1-d offsets and count, and 3-d slices: each recorded as
    leapp's kernel and equal to eager on new inputs."""
    out = wp.zeros(24, dtype=wp.float32, device=device)

    def copy(x):
        src = wp.from_torch(x)
        if case == "transposed source":
            wp.copy(out.reshape((4, 6)), src.reshape((6, 4)).transpose())
        elif case == "strided source":
            wp.copy(out[:12], src[::2])
        elif case == "1-d with offsets":
            wp.copy(out, src[::3], dest_offset=5, src_offset=1, count=6)
        else:
            wp.copy(out.reshape((2, 3, 4))[:, 1:, ::2], src.reshape((2, 3, 4))[:, :2, 1::2])

    @leapp.node("n")
    def node(x):
        out.zero_()
        with annotate.warp_op():
            copy(x)
        return wp.to_torch(out).clone()

    record, _ = trace(node, torch.randn(24, device=device), passes=2)
    (segment,) = record.nodes["n"].segments
    assert any(op.startswith("launch:leapp_strided_copy_") for op in segment.captured_ops), segment.captured_ops
    fresh = torch.randn(24, device=device)
    (got,) = run_node_graph(record.nodes["n"], [fresh])
    torch.testing.assert_close(got, node(fresh), rtol=0, atol=0)


def test_overlapping_copy_is_refused_by_name():
    """Copying a buffer's columns onto its own shifted columns: the elements overlap, so a parallel copy's result
    would depend on its order; leapp refuses it naming the line, and leaves eager Warp alone outside a trace."""
    buf = wp.zeros((3, 4), dtype=wp.float32, device="cpu")

    @leapp.node("o")
    def node(x):
        wp.to_torch(buf).copy_(x)
        with annotate.warp_op():
            wp.copy(buf[:, 1:], buf[:, :3])  # <overlap>
        return wp.to_torch(buf).clone()

    node(torch.ones(3, 4))  # outside a session: Warp's own copy
    with pytest.raises(TraceError, match=r"wp.copy at \S*test_strided_copy.py:\d+ .*overlap in memory"):
        trace(node, torch.ones(3, 4), passes=2)


def test_copy_kernels_are_one_module_each():
    """Each (ndim, word) kernel has a module of its own, so making a new one never changes the hash (and entry
    names) of one a capture already recorded."""
    from leapp._recorder.strided_copy import copy_kernel

    a, _ = copy_kernel(2, 4, 1)
    b, _ = copy_kernel(2, 4, 3)
    assert a.module is not b.module and copy_kernel(2, 4, 1)[0] is a
