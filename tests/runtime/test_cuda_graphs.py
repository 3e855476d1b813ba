"""CudaGraphCall: when a call is replayed from a graph, and that replays give what direct calls give.

The mechanism is checked here with plain torch functions; tests/e2e/test_gpu_equivalence.py
checks it with an exported Warp segment through leapp.load(..., cuda_graphs=True).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import pytest
import torch

from leapp.runtime.cuda_graphs import CudaGraphCall, capture_blockers, capture_refusal

cuda = pytest.mark.cuda


def affine(x: torch.Tensor, y: torch.Tensor) -> list[torch.Tensor]:
    return [x * 2 + y, (x - y).abs()]


def test_cpu_inputs_always_run_directly():
    calls = []

    def fn(x):
        calls.append(x)
        return [x + 1]

    graphed = CudaGraphCall(fn, "cpu node")
    x = torch.arange(4.0)
    for _ in range(3):
        assert torch.equal(graphed(x)[0], x + 1)
    assert len(calls) == 3 and graphed.captures == 0


def test_max_graphs_must_be_positive():
    with pytest.raises(ValueError, match="node: max_graphs must be at least 1, got 0"):
        CudaGraphCall(affine, "node", max_graphs=0)


def _device() -> torch.device:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: CUDA graphs need one")
    return torch.device("cuda", torch.cuda.current_device())


@cuda
def test_second_call_with_the_same_tensors_captures_and_later_calls_replay():
    dev = _device()
    graphed = CudaGraphCall(affine, "affine")
    x, y = torch.randn(1000, device=dev), torch.randn(1000, device=dev)
    first = graphed(x, y)
    assert graphed.captures == 0  # first sight: direct
    for step in range(4):
        x.copy_(torch.randn(1000, device=dev))  # new values, same addresses: the graph reads them
        got = graphed(x, y)
        for g, w in zip(got, affine(x, y)):
            torch.testing.assert_close(g, w, rtol=0, atol=0)
    assert graphed.captures == 1
    assert first[0].data_ptr() != got[0].data_ptr()  # direct outputs are fresh tensors, graph outputs static


@cuda
def test_replays_overwrite_the_previous_outputs():
    """The documented contract: a graph's outputs are overwritten by its next replay."""
    dev = _device()
    graphed = CudaGraphCall(affine, "affine")
    x, y = torch.ones(8, device=dev), torch.zeros(8, device=dev)
    graphed(x, y)
    kept = graphed(x, y)[0]  # captured and replayed: 2 * 1 + 0
    torch.cuda.synchronize()
    assert kept.tolist() == [2.0] * 8
    x.fill_(5)
    again = graphed(x, y)[0]
    torch.cuda.synchronize()
    assert again.data_ptr() == kept.data_ptr() and kept.tolist() == [10.0] * 8


@cuda
def test_new_addresses_run_directly_and_lru_keeps_max_graphs():
    dev = _device()
    graphed = CudaGraphCall(affine, "affine", max_graphs=2)
    pairs = [(torch.randn(64, device=dev), torch.randn(64, device=dev)) for _ in range(3)]
    for _ in range(3):
        for x, y in pairs:
            for g, w in zip(graphed(x, y), affine(x, y)):
                torch.testing.assert_close(g, w, rtol=0, atol=0)
    # rounds 1: direct (seen), 2: three captures (one evicted each time beyond 2), 3: recaptures
    assert len(graphed._graphs) == 2 and graphed.captures >= 3


@cuda
def test_non_contiguous_inputs_run_directly():
    dev = _device()
    graphed = CudaGraphCall(affine, "affine")
    base = torch.randn(16, 16, device=dev)
    x, y = base.t(), torch.randn(16, 16, device=dev)
    for _ in range(3):
        for g, w in zip(graphed(x, y), affine(x, y)):
            torch.testing.assert_close(g, w, rtol=0, atol=0)
    assert graphed.captures == 0


@cuda
def test_each_stream_gets_its_own_graph():
    dev = _device()
    graphed = CudaGraphCall(affine, "affine")
    x, y = torch.randn(256, device=dev), torch.randn(256, device=dev)
    results = {}
    for name, stream in (("default", torch.cuda.current_stream(dev)), ("side", torch.cuda.Stream(dev))):
        stream.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(stream):
            outs = [graphed(x, y) for _ in range(3)][-1]
        torch.cuda.current_stream(dev).wait_stream(stream)
        results[name] = outs
    torch.cuda.synchronize()
    assert graphed.captures == 2
    assert results["default"][0].data_ptr() != results["side"][0].data_ptr()
    for outs in results.values():
        for g, w in zip(outs, affine(x, y)):
            torch.testing.assert_close(g, w, rtol=0, atol=0)


@cuda
def test_threads_each_on_their_own_stream():
    dev = _device()
    graphed = CudaGraphCall(affine, "affine")
    errors = []

    # drawn here: while any thread captures, torch's CUDA RNG refuses other threads (a torch limitation)
    data = [(torch.randn(512, device=dev), torch.randn(512, device=dev)) for _ in range(4)]

    def worker(x, y):
        try:
            stream = torch.cuda.Stream(dev)
            stream.wait_stream(torch.cuda.default_stream(dev))
            with torch.cuda.stream(stream):  # the current stream is per thread
                for _ in range(20):
                    x.add_(1)
                    got, want = graphed(x, y), affine(x, y)
                    stream.synchronize()
                    for g, w in zip(got, want):
                        torch.testing.assert_close(g, w, rtol=0, atol=0)
        except Exception as e:  # noqa: BLE001 - reported below, from the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=xy) for xy in data]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert graphed.captures == 4  # one graph per thread's stream


@cuda
def test_calls_inside_an_outer_capture_run_directly():
    dev = _device()
    graphed = CudaGraphCall(affine, "affine")
    x, y = torch.randn(32, device=dev), torch.randn(32, device=dev)
    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        graphed(x, y)
    torch.cuda.current_stream(dev).wait_stream(side)
    outer = torch.cuda.CUDAGraph()
    with torch.cuda.graph(outer):
        outs = graphed(x, y)
    outer.replay()
    torch.cuda.synchronize()
    assert graphed.captures == 0
    for g, w in zip(outs, affine(x, y)):
        torch.testing.assert_close(g, w, rtol=0, atol=0)


_FAILING_CAPTURE = textwrap.dedent(
    """
    import warnings, torch
    from leapp.runtime.cuda_graphs import CudaGraphCall

    def syncs(x):
        return [x + float(x.sum().item())]  # .item() synchronises: illegal while capturing

    graphed = CudaGraphCall(syncs, "node 'sync'")
    x = torch.ones(4, device="cuda")
    graphed(x)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = graphed(x)
    print([str(w.message)[:60] for w in caught])
    print(got[0].tolist(), graphed.enabled, graphed(x)[0].tolist())
    """
)


@cuda
def test_a_call_that_cannot_be_captured_falls_back_with_a_warning():
    """In a process of its own: a failed capture leaves torch's CUDA RNG unusable (a torch limitation)."""
    _device()
    out = subprocess.run([sys.executable, "-c", _FAILING_CAPTURE], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    warned, result = out.stdout.strip().splitlines()[-2:]
    assert "node 'sync': CUDA graph capture failed, calling directly" in warned
    assert result == "[5.0, 5.0, 5.0, 5.0] False [5.0, 5.0, 5.0, 5.0]"


def test_graphs_of_programs_that_synchronise_are_refused():
    class Syncs(torch.nn.Module):
        def forward(self, x):
            return x[x > 0]  # a data-dependent shape: nonzero synchronises

    class Plain(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x) * 2

    x = torch.randn(6)
    syncs = torch.export.export(Syncs(), (x,), strict=False).graph
    blockers = capture_blockers(syncs)
    assert blockers[0] == "aten.index.Tensor (index)", blockers  # the boolean-mask index: a data-dependent size
    assert capture_refusal(syncs) == f"not capturable: {', '.join(blockers[:3])}"
    plain = torch.export.export(Plain(), (x,)).graph
    assert capture_blockers(plain) == [] and capture_refusal(plain) is None


def _host_function_fn():
    """(fn, ran): ``fn(x)`` enqueues a host function (cuLaunchHostFunc, as ONNX Runtime's CUDA EP does to free
    pinned buffers) on the current stream and returns [x + 1]; ``ran`` counts the host function's runs."""
    import ctypes

    libcuda = ctypes.CDLL("libcuda.so.1")
    ran = []
    callback = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lambda _: ran.append(1))
    libcuda.cuLaunchHostFunc.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]

    def fn(x):
        stream = torch.cuda.current_stream(x.device).cuda_stream
        assert libcuda.cuLaunchHostFunc(stream, ctypes.cast(callback, ctypes.c_void_p), None) == 0
        return [x + 1]

    fn.callback = callback  # kept alive with fn
    return fn, ran


@cuda
def test_a_capture_that_records_a_host_function_is_never_replayed():
    """A host function in a graph runs again at every replay on what its pointers hold by then (ONNX Runtime's
    pinned-buffer release aborted a process that way): the graph is refused, the calls stay direct."""
    device = _device()
    fn, ran = _host_function_fn()
    graphed = CudaGraphCall(fn, "node 'host'")
    x = torch.arange(4.0, device=device)
    with pytest.warns(RuntimeWarning, match=r"node 'host': CUDA graph capture failed, calling directly from now on: "
                                            r"RuntimeError: the capture recorded 1 host function\(s\)"):
        for _ in range(3):
            assert torch.equal(graphed(x)[0], x + 1)
    for _ in range(3):
        assert torch.equal(graphed(x)[0], x + 1)
    torch.cuda.synchronize()
    assert graphed.captures == 0
    assert len(ran) == 6 + 1  # every call once, and the warm-up before the refused capture; no replay
