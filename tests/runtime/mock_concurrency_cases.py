"""Threads, thread exits and released segments against the fake driver; run by test_runtime_mock_driver.py.

The fake driver executes each memset, copy and launch when it is enqueued, so
two threads enqueueing one segment on one stream interleave exactly as their
driver calls do; ``mock_set_stream_delay`` sleeps after each of them, which
turns a missing per-stream lock from a rare wrong result into one in nearly
every run. Every output is compared byte for byte with its expected value.
Its resource counters (live allocations, modules, streams, refused frees) show
what thread exits and ``release_segments`` free.
Not collected on its own (no test_ prefix); skipped unless LEAPP_MOCK_CUDA=1.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time

import numpy as np
import pytest

if os.environ.get("LEAPP_MOCK_CUDA") != "1":
    pytest.skip("runs only under the fake driver (test_runtime_mock_driver.py)", allow_module_level=True)

from cuda_bundles import chained_bundle

from leapp import _native
from leapp.bundle.testing import example_bundle
from leapp.runtime import release_segments

MOCK = ctypes.CDLL("libcuda.so.1")  # the same library the runtime dlopen'ed
MOCK.mock_stream_create.restype = ctypes.c_void_p
MOCK.mock_stream_create.argtypes = [ctypes.c_int]
MOCK.mock_set_stream_delay.argtypes = [ctypes.c_int]
RESOURCES = ("live_device", "live_device_bytes", "live_host", "live_modules", "live_streams", "bad_frees",
             "unloads", "host_frees", "use_after_free")
LIVE = ("live_device", "live_device_bytes", "live_host", "live_modules", "live_streams")
LEGACY, PER_THREAD = 1, 2  # CU_STREAM_LEGACY, CU_STREAM_PER_THREAD
THREADS = 8


def resources() -> dict[str, int]:
    out = (ctypes.c_longlong * 9)()
    MOCK.mock_resources(out)
    return dict(zip(RESOURCES, out))


@pytest.fixture
def stream_delay():
    """Sleep 20 us after every stream operation for the test's duration."""
    MOCK.mock_set_stream_delay(20)
    yield
    MOCK.mock_set_stream_delay(0)


@pytest.fixture(autouse=True)
def no_bad_frees():
    yield
    r = resources()
    assert r["bad_frees"] == 0, "the runtime freed a pointer twice or one it never allocated"
    assert r["use_after_free"] == 0, "work was enqueued on memory the runtime had freed"


def live() -> dict[str, int]:
    r = resources()
    return {k: r[k] for k in LIVE}


@pytest.fixture
def clean_slate():
    """Everything earlier tests prepared (in every runtime copy) is released first; returns the live resources then."""
    release_segments()
    return live()


def ptr(a: np.ndarray) -> int:
    return a.ctypes.data


def run(bundle, inputs, outputs, s: int, device: int = 0):
    _native.run_segment(bundle, [ptr(a) for a in inputs], [ptr(a) for a in outputs], s, device,
                        input_nbytes=[a.nbytes for a in inputs], output_nbytes=[a.nbytes for a in outputs])


def scale(n: int) -> np.ndarray:
    return np.arange(1, n + 1, dtype=np.float32)


def hammer(calls: int, one_call) -> list[str]:
    """THREADS threads, each making ``calls`` calls of ``one_call(seed)``; the mismatches they report."""
    failures: list[str] = []
    start = threading.Barrier(THREADS)

    def worker(t: int):
        start.wait()
        for i in range(calls):
            problem = one_call(t * 100_000 + i)
            if problem:
                failures.append(f"thread {t} call {i}: {problem}")

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return failures


def mismatch(got: np.ndarray, want: np.ndarray) -> str:
    if got.tobytes() == want.tobytes():
        return ""
    bad = np.flatnonzero(got.view(np.uint8) != want.view(np.uint8))
    return f"{bad.size} of {got.nbytes} bytes differ, first at byte {bad[0]}"


# --- same-stream concurrency --------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["stream0", "legacy", "shared-stream"])
@pytest.mark.parametrize("kind", ["scale", "chained"])
def test_threads_sharing_one_stream(stream_delay, where, kind):
    n = 64
    shared = {"stream0": 0, "legacy": LEGACY, "shared-stream": MOCK.mock_stream_create(0)}[where]
    make = example_bundle if kind == "scale" else chained_bundle
    bundle = _native.Bundle(make(n, segment=f"mock/same_stream_{kind}"))
    c = scale(n)

    def one_call(seed: int) -> str:
        x = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
        y = np.full(n, np.nan, np.float32)
        run(bundle, [x], [y], shared)
        return mismatch(y, x * c if kind == "scale" else (x * c) * c)

    failures = hammer(25, one_call)
    assert not failures, f"{len(failures)} of {THREADS * 25} calls wrong, e.g. {failures[:3]}"


def settled(condition, timeout: float = 5.0) -> bool:
    """Polls ``condition``: Thread.join() returns before the OS thread has run its thread_local destructors."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


# --- the per-thread default stream: scratch freed at thread exit ---------------------------------------------


def test_per_thread_stream_scratch_is_freed_when_its_thread_exits():
    n = 1024
    bundle = _native.Bundle(example_bundle(n, segment="mock/per_thread_exit"))
    x = np.ones(n, np.float32)
    run(bundle, [x], [np.empty(n, np.float32)], MOCK.mock_stream_create(0))  # module + constants, kept
    before, allocs, frees = live(), _native.allocation_count(), _native.free_count()
    failures = []

    def worker(seed: int):
        for i in range(2):
            xs = np.random.default_rng(seed * 10 + i).standard_normal(n).astype(np.float32)
            y = np.empty(n, np.float32)
            run(bundle, [xs], [y], PER_THREAD)
            if mismatch(y, xs * scale(n)):
                failures.append(seed)

    short_lived = 0
    for batch in range(10):  # 200 short-lived threads, 20 at a time
        threads = [threading.Thread(target=worker, args=(batch * 20 + t,)) for t in range(20)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        short_lived += len(threads)
        assert settled(lambda: live()["live_device"] == before["live_device"]), f"scratch kept after batch {batch}"
    assert not failures
    assert _native.allocation_count() == allocs + short_lived  # one scratch per thread ...
    assert settled(lambda: _native.free_count() == frees + short_lived)  # ... freed when the thread ended
    assert live() == before


# --- release_segments -------------------------------------------------------------------------------------------


def test_release_segments_frees_modules_constants_scratch_and_staging(clean_slate):
    n = 256
    data = example_bundle(n, segment="mock/release_all")
    bundle = _native.Bundle(data)
    streams = [MOCK.mock_stream_create(0) for _ in range(3)]
    x = np.random.default_rng(1).standard_normal(n).astype(np.float32)

    def replay_everywhere():
        for s in streams + [0, LEGACY]:
            y = np.empty(n, np.float32)
            run(bundle, [x], [y], s)
            assert mismatch(y, x * scale(n)) == ""
        run(bundle, [x], [np.empty(n, np.float32)], MOCK.mock_stream_create(1), 1)  # a second device
        y = np.zeros(n, np.float32)
        _native.run_segment_host(bundle, [x], [y])
        assert mismatch(y, x * scale(n)) == ""

    replay_everywhere()
    used = live()
    assert used["live_device"] > clean_slate["live_device"] and used["live_modules"] == clean_slate["live_modules"] + 2
    frees, unloads = _native.free_count(), resources()["unloads"]
    assert _native.release_segments() == 2  # device 0 (streams and staging share its primary context), device 1
    assert live() == clean_slate
    # scratch x5 streams on device 0 + 1 on device 1 + staging's stream, constants x2, staging device + pinned
    assert _native.free_count() - frees == 11
    assert resources()["unloads"] - unloads == 2
    replay_everywhere()  # prepared again, on demand
    assert _native.release_segments(bundle.digest) == 2
    assert live() == clean_slate


def test_release_one_segment_keeps_the_others(clean_slate):
    n = 64
    a = _native.Bundle(example_bundle(n, segment="mock/release_a"))
    b = _native.Bundle(chained_bundle(n, segment="mock/release_b"))
    s = MOCK.mock_stream_create(0)
    x = np.random.default_rng(2).standard_normal(n).astype(np.float32)
    ya, yb = np.empty(n, np.float32), np.empty(n, np.float32)
    run(a, [x], [ya], s)
    only_a = live()
    run(b, [x], [yb], s)
    assert _native.release_segments(a.digest) == 1
    assert live()["live_modules"] == clean_slate["live_modules"] + 1
    assert live()["live_device"] == clean_slate["live_device"] + (only_a["live_device"] - clean_slate["live_device"])
    for _ in range(3):  # b's warm path is untouched, a is prepared again
        run(b, [x], [yb], s)
        run(a, [x], [ya], s)
        assert mismatch(ya, x * scale(n)) == "" and mismatch(yb, x * scale(n) * scale(n)) == ""
    assert _native.release_segments("0" * 64) == 0
    _native.release_segments()
    assert live() == clean_slate


def test_release_while_threads_replay(stream_delay, clean_slate):
    """Releases race with calls on shared and own streams: no call may use freed memory or give a wrong byte."""
    n = 128
    bundles = [_native.Bundle(example_bundle(n, segment="mock/race_a")),
               _native.Bundle(chained_bundle(n, segment="mock/race_b"))]
    shared = MOCK.mock_stream_create(0)
    own = [MOCK.mock_stream_create(0) for _ in range(THREADS)]
    c = scale(n)
    stop = threading.Event()
    released = []

    def releaser():
        while not stop.is_set():
            released.append(_native.release_segments())

    def one_call(seed: int) -> str:
        k = seed % 2
        x = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
        y = np.full(n, np.nan, np.float32)
        run(bundles[k], [x], [y], shared if seed % 3 else own[seed // 100_000])
        return mismatch(y, x * c if k == 0 else (x * c) * c)

    rel = threading.Thread(target=releaser)
    rel.start()
    try:
        failures = hammer(30, one_call)
    finally:
        stop.set()
        rel.join()
    assert not failures, failures[:3]
    assert sum(released) > 0, "the releases never overlapped the calls"
    _native.release_segments()
    assert live() == clean_slate


def test_release_during_a_capture_frees_nothing_until_it_ends(clean_slate):
    n = 64
    bundle = _native.Bundle(example_bundle(n, segment="mock/release_capture"))
    s = MOCK.mock_stream_create(0)
    x = np.ones(n, np.float32)
    run(bundle, [x], [np.empty(n, np.float32)], s)
    used = live()
    captured = MOCK.mock_stream_create(0)
    MOCK.mock_set_capturing.argtypes = [ctypes.c_void_p, ctypes.c_int]
    MOCK.mock_set_capturing(captured, 1)
    try:
        with pytest.raises(RuntimeError, match=r"cuCtxSynchronize failed: .*being captured into a CUDA graph"):
            _native.release_segments()
        assert live() == used  # nothing freed while the capture runs
    finally:
        MOCK.mock_set_capturing(captured, 0)
    assert _native.release_segments() == 0  # the segment left the table already; its memory is freed now
    assert live() == clean_slate


def test_release_without_anything_prepared_is_a_no_op(clean_slate):
    frees = _native.free_count()
    assert _native.release_segments() == 0
    assert _native.free_count() == frees and live() == clean_slate


# --- leapp.runtime.release_segments: every runtime copy, captured graphs ------------------------------------------


def test_python_release_frees_every_runtime_copy(clean_slate):
    """leapp._native and libleapp_warp_ort.so each link the runtime (own caches): both are released."""
    pytest.importorskip("onnxruntime")
    from runtime_helpers import ort_session, warp_segment_model

    from leapp.runtime import libraries

    if not libraries.library_path("onnx").is_file():
        pytest.skip("libleapp_warp_ort.so is not built")
    n = 32
    data = example_bundle(n, segment="mock/release_ort")
    session = ort_session(warp_segment_model(data))
    x = np.random.default_rng(3).standard_normal(n).astype(np.float32)
    (y,) = session.run(None, {"x": x})  # prepared by the ORT library's copy (CPU EP: host staging)
    assert mismatch(y, x * scale(n)) == ""
    run(_native.Bundle(data), [x], [np.empty(n, np.float32)], MOCK.mock_stream_create(0))  # and by leapp._native's
    assert live()["live_modules"] == clean_slate["live_modules"] + 2
    assert _native.release_segments() == 1  # leapp._native's copy alone leaves the ORT library's
    assert live()["live_modules"] == clean_slate["live_modules"] + 1 and live()["live_host"] > clean_slate["live_host"]
    assert release_segments(_native.Bundle(data).digest) == 1
    assert live() == clean_slate
    (y,) = session.run(None, {"x": x})  # the session prepares again
    assert mismatch(y, x * scale(n)) == ""
    release_segments()
    assert live() == clean_slate


def test_python_release_drops_captured_graphs():
    """Graphs hold the addresses release frees: leapp.load's CUDA-graph calls forget theirs (captured again later)."""
    torch = pytest.importorskip("torch")
    from leapp.runtime.cuda_graphs import CudaGraphCall

    call = CudaGraphCall(lambda x: [x + 1], "mock/graphs")
    call._graphs["key"] = (lambda g: None, object(), [torch.zeros(1)])  # as a capture would leave it
    release_segments()
    assert not call._graphs
    x = torch.ones(2)
    assert torch.equal(call(x)[0], x + 1)  # CPU inputs run directly
