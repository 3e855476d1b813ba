"""StreamOrder and PlainCallGraphs's input check, on any machine: torch's stream and event calls are replaced by
recording fakes, so the decisions (when an event is recorded and waited for, which inputs fit the graph's
buffers) are checked without a GPU. tests/export/test_pipeline_copy_graph_gpu.py checks them on one."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from leapp.runtime import cuda_graphs
from leapp.runtime.cuda_graphs import PlainCallGraphs, StreamOrder

DEVICE = torch.device("cuda", 0)


class FakeStream:
    def __init__(self, handle: int, log: list):
        self.handle, self.log = handle, log

    def wait_event(self, event) -> None:
        self.log.append(("wait", self.handle, event.recorded_on))


class FakeEvent:
    def __init__(self):
        self.recorded_on = None

    def record(self, stream) -> None:
        self.recorded_on = stream.handle


@pytest.fixture
def streams(monkeypatch):
    """``use(handle)`` makes that fake stream the current one; ``log`` lists the waits it was told to make."""
    log: list = []
    current = {"stream": FakeStream(1, log)}
    monkeypatch.setattr(cuda_graphs, "_raw_stream", lambda index: current["stream"].handle)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: current["stream"])
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)

    def use(handle: int) -> None:
        current["stream"] = FakeStream(handle, log)

    return SimpleNamespace(use=use, log=log)


def test_a_call_waits_only_when_the_stream_changed(streams):
    order = StreamOrder()
    order.follow(DEVICE)  # the first call: nothing before it
    order.follow(DEVICE)  # the same stream: its own order suffices
    assert streams.log == []
    streams.use(2)
    order.follow(DEVICE)  # another stream: waits for what stream 1 enqueued
    order.follow(DEVICE)
    streams.use(1)
    order.follow(DEVICE)  # and back
    assert streams.log == [("wait", 2, 1), ("wait", 1, 2)]


def fake_tensor(shape, dtype=torch.float32, cuda=True, index=0):
    return SimpleNamespace(shape=torch.Size(shape), dtype=dtype, is_cuda=cuda, get_device=lambda: index)


@pytest.mark.parametrize("checked", [False, True])
def test_copy_graph_inputs_fit_by_shape_dtype_and_device(checked):
    graph = PlainCallGraphs("node", run=None, direct=None, stream=SimpleNamespace(device=DEVICE),
                      inputs=[((4,), torch.float32)], outputs=[((4,), torch.float32)], checked_inputs=checked)
    assert graph._fits([fake_tensor((4,))])
    assert not graph._fits([fake_tensor((4,), cuda=False)])  # a CPU input runs directly
    assert not graph._fits([fake_tensor((4,), index=1)])  # as does one on another device
    assert not graph._fits([fake_tensor((4,)), fake_tensor((4,))])  # and another number of inputs
    # shapes and dtypes: checked here unless the caller did (the pipeline's check_inputs)
    assert graph._fits([fake_tensor((5,))]) is checked
    assert graph._fits([fake_tensor((4,), torch.float64)]) is checked
