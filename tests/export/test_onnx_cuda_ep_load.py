"""GPU: leapp.load's ONNX node with Warp segments on ONNX Runtime's CUDA EP.

The node (two example segments between torch ops, compile_records' ``segment_node``) is exported on
the GPU and validated in a fresh process (which runs it through the same runner), then loaded:
it runs on the CUDA EP on torch's stream, equals eager on new inputs with its outputs left on the
GPU, and a call never waits on the host: a ~50 ms ``torch.cuda._sleep`` is enqueued before the input
is written, the call must return while the GPU still sleeps, and the result (read after
``torch.cuda.synchronize()``) must be computed from the value written after the sleep, so the run
was ordered after it. The same holds when the call is made on another stream than the session's
(the event hand-off), both ways round, and from two threads at once.

Needs onnxruntime-gpu (CUDAExecutionProvider) and onnxscript (torch's ONNX exporter); skipped with
the reason otherwise.
"""

from __future__ import annotations

import contextlib
import threading
import time

import pytest
import torch

import compile_records as cr
import leapp
from leapp._export.compile import compile_session
from leapp.runtime import libraries
from leapp.runtime.onnx_runner import cuda_ep_options, ort_stream_handle

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


def test_onnx_node_runs_on_the_cuda_ep_and_equals_eager(onnx_export):
    pipeline = leapp.load(onnx_export)
    runner = pipeline.nodes["obs"].runner
    assert runner.stream_mode == "torch-stream", runner.stream_reason
    assert runner.session.get_providers()[0] == "CUDAExecutionProvider"
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
def test_a_call_does_not_wait_on_the_host_and_follows_stream_order(onnx_export, case):
    side = torch.cuda.Stream()
    with torch.cuda.stream(side) if case == "load-on-side-stream" else contextlib.nullcontext():
        pipeline = leapp.load(onnx_export)
    runner = pipeline.nodes["obs"].runner
    assert runner.stream_mode == "torch-stream", runner.stream_reason
    call_stream = side if case == "call-on-side-stream" else torch.cuda.default_stream()
    x = torch.zeros(N, device="cuda")
    with torch.cuda.stream(call_stream):
        pipeline(x=x)  # warm-up: the first call reads the bundle back and loads the modules
    torch.cuda.synchronize()
    new = torch.randn(N, device="cuda")
    cycles = sleep_cycles(SLEEP_MS)
    torch.cuda.synchronize()
    with torch.cuda.stream(call_stream):
        torch.cuda._sleep(cycles)
        x.copy_(new)  # lands after the sleep: a run not ordered after it reads zeros
        start = time.perf_counter()
        out = pipeline(x=x)
        host_s = time.perf_counter() - start
        still_sleeping = not call_stream.query()
    assert host_s < HOST_LIMIT_S, f"the call took {host_s * 1e3:.1f} ms on the host behind a {SLEEP_MS} ms GPU sleep"
    assert still_sleeping, "the GPU had finished the sleep when the call returned"
    torch.cuda.synchronize()
    want = expected(new)
    torch.testing.assert_close(out["out"], want[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out["h"], want[1], rtol=1e-5, atol=1e-5)


def test_threads_on_their_own_streams_share_one_pipeline(onnx_export):
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
