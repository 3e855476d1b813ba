"""GPU: leapp.load's ONNX node with Warp segments on ONNX Runtime's CUDA EP.

The node (two example segments between torch ops, compile_records' ``segment_node``) is exported on
the GPU and validated in a fresh process (which runs it through the same runner), then loaded:
it runs on the CUDA EP on torch's stream, equals eager on new inputs with its outputs left on the
GPU, and a call never waits on the host: a ~50 ms ``torch.cuda._sleep`` is enqueued before the input
is written, the call must return while the GPU still sleeps, and the result (read after
``torch.cuda.synchronize()``) must be computed from the value written after the sleep, so the run
was ordered after it. The same holds when the call is made on another stream than the session's
(the event hand-off), both ways round, and from two threads at once, with the node replayed from its
own CUDA graph (the default: ``PlainCallGraphs``) and without it (``LEAPP_ONNX_GRAPHS=0``). The graph's
contract is the plain call's: any input tensors, fresh outputs, 0 device allocations per call, correct
inside an outer capture and after ``release_segments``.

Needs onnxruntime-gpu (CUDAExecutionProvider) and onnxscript (torch's ONNX exporter); skipped with
the reason otherwise.
"""

from __future__ import annotations

import contextlib
import gc
import threading
import time

import pytest
import torch

import compile_records as cr
import leapp
from leapp._export.compile import compile_session
from leapp.runtime import libraries, release_segments
from leapp.runtime.onnx_runner import ONNX_GRAPHS_ENV, cuda_ep_options, ort_stream_handle

ort = pytest.importorskip("onnxruntime")

pytestmark = [pytest.mark.cuda, pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")]

N = 4096
SEGMENTS = 2
SLEEP_MS = 50.0
HOST_LIMIT_S = 0.025  # half the sleep: a call that waited for the stream takes at least the whole sleep


@pytest.fixture(scope="module")
def onnx_export(tmp_path_factory):
    """The export folder of one ONNX node with two Warp segments, recorded on cuda:0 and validated."""
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip(f"onnxruntime {ort.__version__} has no CUDAExecutionProvider (onnxruntime-gpu is not installed)")
    if not libraries.library_path("onnx").is_file():
        pytest.skip("libleapp_warp_ort.so is not built")
    pytest.importorskip("onnxscript", reason="onnxscript is not installed (torch.onnx.export(dynamo=True) needs it)")
    folder = tmp_path_factory.mktemp("onnx_cuda_ep")
    node = cr.segment_node("obs", "onnx", n=N, segments=SEGMENTS, device="cuda", samples=2)
    report = compile_session(cr.session(folder, node), bundles=cr.example_bundles)
    assert report["obs"].status == "passed", str(report)
    return folder / "demo"


def expected(x: torch.Tensor) -> list[torch.Tensor]:
    return cr.expected_segment_outputs(x, SEGMENTS)


def sleep_cycles(ms: float) -> int:
    """``torch.cuda._sleep`` cycles that keep a stream busy for about ``ms``, measured with CUDA events."""
    probe = 20_000_000
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(probe)
    end.record()
    end.synchronize()
    return int(probe * ms / start.elapsed_time(end))


def call_behind_a_sleep(stream: torch.cuda.Stream, x: torch.Tensor, new: torch.Tensor, call, host_wait: bool = False):
    """``call()`` on ``stream`` behind a ~50 ms GPU sleep and ``x.copy_(new)``: asserts it returned while the GPU
    still slept (no host wait), or with ``host_wait`` once the stream was done (an ONNX Runtime run outside a
    graph ends with a synchronisation, docs/runtime.md); returns its result once the device is done (computed
    from ``new`` if ordered)."""
    cycles = sleep_cycles(SLEEP_MS)
    # Earlier tests' pipelines, if only the cycle collector frees them, must not go during the call: freeing an
    # ORT arena or a graph's pool (cudaFree) waits for the device (a 50.4 ms "call" on the H200, once, in a run
    # where another file's GPU test came first)
    gc.collect()
    torch.cuda.synchronize()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(cycles)
        x.copy_(new)  # lands after the sleep: a run not ordered after it reads the old values
        start = time.perf_counter()
        out = call()
        host_s = time.perf_counter() - start
        still_sleeping = not stream.query()
    if host_wait:
        assert not still_sleeping, "the call returned before ONNX Runtime's end-of-run synchronisation"
    else:
        assert host_s < HOST_LIMIT_S, f"the call took {host_s * 1e3:.1f} ms on the host behind a {SLEEP_MS} ms GPU sleep"
        assert still_sleeping, "the GPU had finished the sleep when the call returned"
    torch.cuda.synchronize()
    return out


@pytest.fixture(params=["node-graph", "no-graph"])
def graphs(request, monkeypatch):
    """Both ways a plain call runs a CUDA EP node: replayed from its own graph (the default) or not."""
    if request.param == "no-graph":
        monkeypatch.setenv(ONNX_GRAPHS_ENV, "0")
    return request.param


def test_onnx_node_runs_on_the_cuda_ep_and_equals_eager(onnx_export, graphs):
    pipeline = leapp.load(onnx_export)
    runner = pipeline.nodes["obs"].runner
    assert runner.stream_mode == "torch-stream", runner.stream_reason
    assert runner.session.get_providers()[0] == "CUDAExecutionProvider"
    if graphs == "node-graph":  # the session runs on a private stream, where the graph is captured
        assert runner.graph is not None and runner.no_graphs_reason is None, runner.no_graphs_reason
        assert runner.ort_stream == runner.session_stream.cuda_stream != torch.cuda.current_stream().cuda_stream
    else:
        assert runner.graph is None and runner.no_graphs_reason == f"{ONNX_GRAPHS_ENV}=0"
        assert runner.ort_stream == ort_stream_handle(torch.cuda.current_stream().cuda_stream)
    reported = runner.session.get_provider_options()["CUDAExecutionProvider"]
    assert reported["user_compute_stream"] == str(runner.ort_stream), reported
    assert reported["use_tf32"] == cuda_ep_options(torch.device("cuda:0"))["use_tf32"], reported
    gen = torch.Generator(device="cuda").manual_seed(11)
    for scale in (1.0, 1e-3, 1e3):  # inputs never seen while tracing
        x = torch.randn(N, device="cuda", generator=gen) * scale
        out = pipeline(x=x)
        assert out["out"].device == x.device and out["h"].device == x.device  # no host copies
        want = expected(x)
        torch.testing.assert_close(out["out"], want[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(out["h"], want[1], rtol=1e-5, atol=1e-5)


def test_every_node_of_the_export_can_be_placed_on_the_cuda_ep(onnx_export):
    """With CPU fallback off, a session is refused if any node (the WarpSegment ones included) needs the CPU EP.

    The CPU EP is not listed: ORT refuses it next to ``disable_cpu_ep_fallback`` (measured, ORT 1.30)."""
    options = ort.SessionOptions()
    options.register_custom_ops_library(str(libraries.require_library("onnx")))
    options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    session = ort.InferenceSession(str(onnx_export / "obs.onnx"), options,
                                   providers=[("CUDAExecutionProvider", cuda_ep_options(torch.device("cuda:0")))])
    assert session.get_providers()[0] == "CUDAExecutionProvider"


@pytest.mark.parametrize("case", ["default-stream", "call-on-side-stream", "load-on-side-stream"])
def test_a_call_does_not_wait_on_the_host_and_follows_stream_order(onnx_export, case, graphs):
    """Replayed from its graph a call only enqueues; run directly (no graph) ONNX Runtime ends the run with a
    synchronisation (without it, some models abort in a host callback: docs/runtime.md). Either way the result
    follows stream order."""
    side = torch.cuda.Stream()
    with torch.cuda.stream(side) if case == "load-on-side-stream" else contextlib.nullcontext():
        pipeline = leapp.load(onnx_export)
    runner = pipeline.nodes["obs"].runner
    assert runner.stream_mode == "torch-stream", runner.stream_reason
    call_stream = side if case == "call-on-side-stream" else torch.cuda.default_stream()
    x = torch.zeros(N, device="cuda")
    with torch.cuda.stream(call_stream):
        for _ in range(3):  # warm-up: the first call reads the bundle back and loads the modules; the second captures
            pipeline(x=x)
    torch.cuda.synchronize()
    assert (runner.graph is not None and runner.graph.captures == 1) == (graphs == "node-graph")
    new = torch.randn(N, device="cuda")
    out = call_behind_a_sleep(call_stream, x, new, lambda: pipeline(x=x), host_wait=graphs == "no-graph")
    want = expected(new)
    torch.testing.assert_close(out["out"], want[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out["h"], want[1], rtol=1e-5, atol=1e-5)


def test_threads_on_their_own_streams_share_one_pipeline(onnx_export, graphs):
    pipeline = leapp.load(onnx_export)
    results: dict[int, list] = {}
    errors: list[str] = []

    def worker(seed: int) -> None:
        try:
            stream = torch.cuda.Stream()
            gen = torch.Generator(device="cuda").manual_seed(seed)
            calls = []
            with torch.cuda.stream(stream):
                for _ in range(20):
                    x = torch.randn(N, device="cuda", generator=gen)
                    calls.append((x, pipeline(x=x)))
            stream.synchronize()
            results[seed] = calls
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(f"thread {seed}: {e!r}")

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    torch.cuda.synchronize()
    for seed, calls in results.items():
        for i, (x, out) in enumerate(calls):
            want = expected(x)
            torch.testing.assert_close(out["out"], want[0], rtol=1e-5, atol=1e-5,
                                       msg=lambda m, seed=seed, i=i: f"thread {seed} call {i}: {m}")


def test_node_graph_takes_any_inputs_and_returns_fresh_outputs(onnx_export):
    """The plain call's contract with the graph: new input tensors every call, outputs that later calls
    leave alone, one capture, and no device allocation per call after it but the outputs' own."""
    pipeline = leapp.load(onnx_export)
    graph = pipeline.nodes["obs"].runner.graph
    gen = torch.Generator(device="cuda").manual_seed(5)
    kept = []
    for i in range(6):
        x = torch.randn(N, device="cuda", generator=gen) * 10.0 ** (i - 3)  # a new tensor each call
        kept.append((x, pipeline(x=x)))
    assert graph.captures == 1
    static = {t.data_ptr() for t in graph._entry[3]}
    torch.cuda.synchronize()
    for i, (x, out) in enumerate(kept):  # each call's outputs still hold its own results
        assert out["out"].data_ptr() not in static and out["h"].data_ptr() not in static
        want = expected(x)
        torch.testing.assert_close(out["out"], want[0], rtol=1e-5, atol=1e-5, msg=lambda m, i=i: f"call {i}: {m}")
        torch.testing.assert_close(out["h"], want[1], rtol=1e-5, atol=1e-5, msg=lambda m, i=i: f"call {i}: {m}")
    assert graph._in_place == {}  # no address came twice
    x = torch.randn(N, device="cuda", generator=gen)
    assert_no_device_allocation(lambda: pipeline(x=x))
    assert graph.captures == 2 and list(graph._in_place) == [(x.data_ptr(),)]  # x's graph reads it in place


def assert_no_device_allocation(call, calls: int = 50) -> None:
    """After two warm-up ``call()``s (the second captures the in-place graph of inputs met twice), ``calls`` more
    make no cudaMalloc and leave free device memory as it was."""
    call()
    call()
    torch.cuda.synchronize()
    mallocs, free = torch.cuda.memory_stats()["num_device_alloc"], torch.cuda.mem_get_info()[0]
    for _ in range(calls):
        call()
    torch.cuda.synchronize()
    assert torch.cuda.memory_stats()["num_device_alloc"] == mallocs
    assert torch.cuda.mem_get_info()[0] == free


def loaded_with_its_node_graph(onnx_export, x: torch.Tensor):
    """A fresh load whose node graph is captured: call 1 runs directly, call 2 captures (reading ``x`` in place),
    call 3 replays."""
    pipeline = leapp.load(onnx_export)
    graph = pipeline.nodes["obs"].runner.graph
    for _ in range(3):
        pipeline(x=x)
    assert graph.captures == 1
    return pipeline, graph


def replay_outer_capture(call, static_x: torch.Tensor, check) -> None:
    """Captures ``call()`` in the caller's own ``torch.cuda.graph`` (on a side stream), then replays it on new
    values written into ``static_x``; ``check(outputs)`` after each replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    outer = torch.cuda.CUDAGraph()
    with torch.cuda.graph(outer, stream=side):
        captured = call()
    for scale in (1.0, 1e-2):
        static_x.copy_(torch.randn(static_x.shape, device=static_x.device) * scale)
        outer.replay()
        torch.cuda.synchronize()
        check(captured)


def test_node_graph_call_inside_an_outer_capture_runs_directly(onnx_export):
    """Inside the caller's torch.cuda.graph the node runs directly (recorded into that graph), which then
    replays on new values; the node's own graph is still replayed by plain calls afterwards."""
    static_x = torch.randn(N, device="cuda")
    pipeline, graph = loaded_with_its_node_graph(onnx_export, static_x)

    def check(captured: dict) -> None:
        want = expected(static_x)
        torch.testing.assert_close(captured["out"], want[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(captured["h"], want[1], rtol=1e-5, atol=1e-5)

    replay_outer_capture(lambda: pipeline(x=static_x), static_x, check)
    x = torch.randn(N, device="cuda")
    out = pipeline(x=x)
    torch.cuda.synchronize()
    torch.testing.assert_close(out["out"], expected(x)[0], rtol=1e-5, atol=1e-5)
    assert graph.captures == 2  # x's address is new: the copy graph (the first call of the load warmed it up)


def test_node_graph_is_dropped_by_release_segments_and_captured_again(onnx_export):
    pipeline, graph = loaded_with_its_node_graph(onnx_export, torch.randn(N, device="cuda"))
    torch.cuda.synchronize()
    assert graph._in_place  # loaded with one tensor: its graph reads it in place
    assert release_segments() >= 1
    assert graph._entry is None and graph._in_place == {}
    kept = []  # new addresses every call
    for i in range(3):  # direct, capture, replay: each prepares what release freed and stays right
        kept.append(torch.randn(N, device="cuda") * (i + 1))
        out = pipeline(x=kept[-1])
        torch.cuda.synchronize()
        torch.testing.assert_close(out["out"], expected(kept[-1])[0], rtol=1e-5, atol=1e-5)
    assert graph.captures == 2


def test_node_graph_refuses_other_shapes_and_runs_them_directly(onnx_export):
    """run_node checks shapes, the runner itself is also called by validation: a wrong shape reaches ONNX
    Runtime's own check instead of being broadcast into the static buffer."""
    pipeline = leapp.load(onnx_export)
    runner = pipeline.nodes["obs"].runner
    x = torch.randn(N, device="cuda")
    for _ in range(3):
        runner([x])
    with pytest.raises(Exception, match="(?i)dimension|shape|size"):
        runner([torch.randn(1, device="cuda")])
    out = runner([x.double().float() * 2])
    torch.cuda.synchronize()
    torch.testing.assert_close(out[0], expected(x * 2)[0], rtol=1e-5, atol=1e-5)
