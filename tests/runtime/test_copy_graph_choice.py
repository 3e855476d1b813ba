"""Which graph a PlainCallGraphs call takes, on any machine: captures and replays are replaced by recording fakes, so the
choice between running directly, an in-place graph (input addresses that repeat) and the copy graph is checked
without a GPU. tests/export/test_pipeline_copy_graph_gpu.py runs the real graphs."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from leapp.runtime import cuda_graphs
from leapp.runtime.cuda_graphs import IN_PLACE_GRAPHS_ENV, PlainCallGraphs, in_place_graphs_limit

DEVICE = torch.device("cuda", 0)


class FakeInput:
    """What PlainCallGraphs reads of an input: its address, layout and device."""

    def __init__(self, ptr: int, contiguous: bool = True):
        self.ptr, self.contiguous = ptr, contiguous
        self.shape, self.dtype, self.is_cuda, self.requires_grad = torch.Size((4,)), torch.float32, True, False

    def data_ptr(self) -> int:
        return self.ptr

    def is_contiguous(self) -> bool:
        return self.contiguous

    def get_device(self) -> int:
        return 0


class Recorder:
    """A PlainCallGraphs whose captures, replays and copies append to ``log``: ("direct",), ("capture", key),
    ("in-place", key), ("copies", input addresses)."""

    def __init__(self, max_in_place: int = 2):
        self.log: list[tuple] = []
        self.graph = PlainCallGraphs("node", run=None, direct=lambda inputs: self._log("direct"),
                               stream=SimpleNamespace(device=DEVICE), inputs=[((4,), torch.float32)],
                               outputs=[((4,), torch.float32)], order=SimpleNamespace(follow=lambda device: None),
                               checked_inputs=True, max_in_place=max_in_place)
        self.graph._capture = self._capture

    def _log(self, *entry) -> list:
        self.log.append(entry)
        return []

    def _capture(self, inputs, key):
        self.log.append(("capture", key))
        replay = (lambda graph: self._log("in-place", graph)) if key is not None else (lambda graph: None)
        if key is None:
            static_in = [SimpleNamespace(copy_=lambda t: self._log("copies", t.data_ptr()))]
            self.graph._entry = (replay, None, static_in, [])
        else:
            self.graph._in_place[key] = [replay, key, [], self.graph._tick]
        self.graph.captures += 1
        return []

    def __call__(self, ptr: int, contiguous: bool = True) -> tuple:
        self.log.clear()
        self.graph([FakeInput(ptr, contiguous)])
        return tuple(self.log)


@pytest.fixture(autouse=True)
def not_capturing(monkeypatch):
    monkeypatch.setattr(cuda_graphs, "_capturing", lambda: False)


def test_repeated_addresses_get_an_in_place_graph_and_no_copy_graph():
    call = Recorder()
    assert call(0x1000) == (("direct",),)  # first sight: direct, the one-time setup
    assert call(0x1000) == (("capture", (0x1000,)),)  # met again: captured reading them in place
    for _ in range(3):
        assert call(0x1000) == (("in-place", (0x1000,)),)
    assert call.graph._entry is None and call.graph.captures == 1


def test_new_addresses_every_call_take_the_copy_graph():
    call = Recorder()
    assert call(0x1000) == (("direct",),)
    assert call(0x2000) == (("capture", None),)  # the copy graph, on buffers of its own
    assert call(0x3000) == (("copies", 0x3000),)
    assert call(0x4000) == (("copies", 0x4000),)
    assert call.graph._in_place == {} and call.graph.captures == 1


def test_a_non_contiguous_input_is_never_read_in_place():
    call = Recorder()
    for _ in range(3):
        call(0x1000, contiguous=False)
    assert call.graph._in_place == {}
    assert call(0x1000, contiguous=False) == (("copies", 0x1000),)


def test_in_place_graphs_are_bounded_and_an_idle_one_makes_room():
    call = Recorder(max_in_place=2)
    for ptr in (0xA, 0xB, 0xC):
        for _ in range(3):
            call(ptr)
    assert set(call.graph._in_place) == {(0xA,), (0xB,)}  # full: C takes the copy graph
    assert call(0xC) == (("copies", 0xC),)
    for _ in range(cuda_graphs._IDLE_CALLS):  # A idles while B is called
        assert call(0xB) == (("in-place", (0xB,)),)
    call(0xC)  # met before, and A has been idle long enough: A makes room for C
    assert set(call.graph._in_place) == {(0xB,), (0xC,)}
    assert call(0xC) == (("in-place", (0xC,)),)


def test_no_in_place_graphs_when_the_limit_is_zero():
    call = Recorder(max_in_place=0)
    assert [call(0x1000) for _ in range(3)] == [(("direct",),), (("capture", None),), (("copies", 0x1000),)]
    assert call.graph._in_place == {}


def test_drop_graphs_forgets_both_kinds():
    call = Recorder()
    for ptr in (0x1000, 0x1000, 0x2000, 0x3000):
        call(ptr)
    assert call.graph._in_place and call.graph._entry is not None
    call.graph.drop_graphs()
    assert call.graph._in_place == {} and call.graph._entry is None
    assert call(0x1000) == (("direct",),)  # met before the drop, but forgotten with it


def test_the_limit_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(IN_PLACE_GRAPHS_ENV, raising=False)
    assert in_place_graphs_limit() == 2
    monkeypatch.setenv(IN_PLACE_GRAPHS_ENV, "0")
    assert in_place_graphs_limit() == 0
    for bad in ("-1", "two", "", "1.5", "\u00b2"):
        monkeypatch.setenv(IN_PLACE_GRAPHS_ENV, bad)
        with pytest.raises(ValueError, match=IN_PLACE_GRAPHS_ENV):
            in_place_graphs_limit()
