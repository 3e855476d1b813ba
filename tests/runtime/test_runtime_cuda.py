"""GPU replay of hand-assembled bundles (marked `cuda`: runs where a driver and a device exist, e.g. an H200).

Every expected value is computed with torch (or numpy) from the inputs; no
test needs the network. Warp is only needed by the tests that compile real
Warp kernels (with Warp's NVRTC, which needs no GPU); they skip without it.
The first test of this module (not marked) checks on any machine that the
hand-packed parameter bytes equal Warp's own ctypes structures.
"""

from __future__ import annotations

import ctypes
import json
import struct
import threading
import time

import numpy as np
import pytest
import torch
from cuda_bundles import (
    WARP_K,
    WARP_OFFSET,
    WARP_SCALE,
    array_t,
    chained_bundle,
    compile_warp_module,
    copy_memset_bundle,
    launch_bounds,
    smem_bundle,
    warp_bundle,
    with_binaries,
)
from runtime_helpers import ort_session, signature_of, warp_segment_model

from leapp import _native
from leapp.bundle.testing import EXAMPLE_PTX, example_bundle
from leapp.runtime import libraries, ops, replay

cuda = pytest.mark.cuda
EXAMPLE_PTX_BLOB = EXAMPLE_PTX.encode("ascii") + b"\0"


# --- on every machine: the hand-packed ABI equals Warp's ctypes ------------------------------------------------


def test_hand_packed_params_match_warp_ctypes():
    wp = pytest.importorskip("warp")
    import warp._src.types as wt

    assert launch_bounds(1000) == bytes(wt.launch_bounds_t((1000,)))
    assert launch_bounds(5, 7) == bytes(wt.launch_bounds_t((5, 7)))
    for shape, dtype, strides in (((6,), wp.vec3, (12,)), ((5, 7), wp.float32, (28, 4)), ((1,), wp.int32, (4,))):
        arr = wp.zeros(shape, dtype=dtype, device="cpu")
        ct = arr.__ctype__()
        raw = ctypes.string_at(ctypes.addressof(ct), ctypes.sizeof(ct))
        assert len(raw) == 56
        assert array_t(shape, strides)[8:] == raw[8:]  # everything but the data pointer (a relocation)


# --- helpers -------------------------------------------------------------------------------------------------


def scale_of(n: int, device) -> torch.Tensor:
    return torch.arange(1, n + 1, dtype=torch.float32, device=device)


def bundle_tensor(data: bytes, device="cpu") -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)


def run_native(bundle: bytes, inputs, outputs, stream=None, device=None):
    """leapp._native.run_segment on torch tensors, on torch's current stream."""
    b = _native.Bundle(bundle)
    dev = (inputs or outputs)[0].device
    stream = torch.cuda.current_stream(dev).cuda_stream if stream is None else stream
    _native.run_segment(b, [t.data_ptr() for t in inputs], [t.data_ptr() for t in outputs], stream,
                        dev.index if device is None else device,
                        input_nbytes=[t.numel() * t.element_size() for t in inputs],
                        output_nbytes=[t.numel() * t.element_size() for t in outputs])


@pytest.fixture(scope="module")
def op():
    ops.ensure_registered()
    return torch.ops.leapp.warp_segment


# --- the example segment: memset, launch, copy, constant, scratch, init zero -------------------------------------


@cuda
@pytest.mark.parametrize("n", [1, 4, 257, 100_000])
def test_example_bundle_replays(dev, n):
    x = torch.randn(n, device=dev)
    y = torch.full((n,), float("nan"), device=dev)
    run_native(example_bundle(n), [x], [y])
    torch.cuda.synchronize(dev)
    torch.testing.assert_close(y, x * scale_of(n, dev))


@cuda
@pytest.mark.parametrize("bundle_device", ["cpu", "cuda"])
def test_torch_op(dev, op, bundle_device):
    n = 1000
    data = example_bundle(n)
    x = torch.randn(n, device=dev)
    (y,) = op([x], bundle_tensor(data, bundle_device if bundle_device == "cpu" else dev), signature_of(data))
    torch.testing.assert_close(y, x * scale_of(n, dev))
    assert y.device == dev and y.dtype == torch.float32


@cuda
def test_python_kernel(dev):
    """replay.warp_segment_cuda, the kernel used when libleapp_warp_torch.so is absent."""
    n = 333
    data = example_bundle(n)
    x = torch.randn(n, device=dev)
    (y,) = replay.warp_segment_cuda([x], bundle_tensor(data), signature_of(data))
    torch.testing.assert_close(y, x * scale_of(n, dev))


@cuda
@pytest.mark.parametrize("kernel", ["native", "python"])
def test_non_contiguous_input(dev, op, kernel):
    n = 500
    data = example_bundle(n)
    base = torch.randn(2 * n, device=dev)
    x = base[::2]
    assert not x.is_contiguous()
    call = op if kernel == "native" else replay.warp_segment_cuda
    (y,) = call([x], bundle_tensor(data), signature_of(data))
    torch.testing.assert_close(y, x * scale_of(n, dev))


@cuda
@pytest.mark.parametrize("kernel", ["native", "python"])
def test_input_errors_name_segment_and_input(dev, op, kernel):
    data = example_bundle(8)
    sig = signature_of(data)
    call = op if kernel == "native" else replay.warp_segment_cuda
    with pytest.raises(ValueError, match=r"'example/warp_segment_0'.*input 0 'x' expects float32\[8\]"):
        call([torch.ones(8, device=dev, dtype=torch.float64)], bundle_tensor(data), sig)
    with pytest.raises(ValueError, match=r"'example/warp_segment_0'.*input 0 'x' expects float32\[8\]"):
        call([torch.ones(9, device=dev)], bundle_tensor(data), sig)
    with pytest.raises(ValueError, match=r"expected 1 inputs"):
        call([torch.ones(8, device=dev), torch.ones(8, device=dev)], bundle_tensor(data), sig)
    with pytest.raises(ValueError, match=r"inputs\[0\] 'x' has 12 bytes, expected 32"):
        x, y = torch.ones(8, device=dev), torch.empty(8, device=dev)
        _native.run_segment(_native.Bundle(data), [x.data_ptr()], [y.data_ptr()], 0, dev.index, input_nbytes=[12])


# --- ops without kernels -----------------------------------------------------------------------------------


@cuda
def test_memset_copy_and_init_from_input(dev):
    n = 16
    data, constant = copy_memset_bundle(n)
    a = torch.randn(n, device=dev)
    a_before = a.clone()
    o1 = torch.empty(n, device=dev)
    o2 = torch.full((4 * n,), 7, dtype=torch.uint8, device=dev)
    run_native(data, [a], [o1, o2])
    torch.cuda.synchronize(dev)
    assert torch.equal(a, a_before), "the input must never be written"
    assert o1.view(torch.int32)[0].item() == -1  # bytes FF FF FF FF
    torch.testing.assert_close(o1[1:], a[1:])
    expected = bytes([1] * 8) + constant[:8] + bytes(4 * n - 16)
    assert bytes(o2.cpu().numpy()) == expected


# --- dynamic shared memory (> 48 KiB needs cuFuncSetAttribute) ------------------------------------------------


@cuda
@pytest.mark.parametrize("n", [128, 1000])
def test_dynamic_shared_memory_above_48k(dev, n):
    block = 128
    x = torch.randn(n, device=dev)
    y = torch.empty(n, device=dev)
    run_native(smem_bundle(n, block=block, smem=64 * 1024), [x], [y])
    torch.cuda.synchronize(dev)
    idx = torch.arange(n, device=dev)
    src = idx // block * block + (block - 1 - idx % block)
    padded = torch.cat([x, torch.zeros(block, device=dev)])
    torch.testing.assert_close(y, padded[src] + 1)


# --- caches: scratch reuse, streams, contexts ---------------------------------------------------------------


@cuda
def test_scratch_and_constants_are_allocated_once_per_stream(dev):
    n = 4096
    data = example_bundle(n, segment="test/alloc_segment")  # a digest no other test uses
    x = torch.randn(n, device=dev)
    y = torch.empty(n, device=dev)
    stream = torch.cuda.Stream(dev)
    before = _native.allocation_count()
    with torch.cuda.stream(stream):
        run_native(data, [x], [y])
    after_first = _native.allocation_count()
    assert after_first - before == 2  # one constant block (per context) + one scratch block (per stream)
    with torch.cuda.stream(stream):
        for _ in range(50):
            run_native(data, [x], [y])
    assert _native.allocation_count() == after_first
    other = torch.cuda.Stream(dev)
    with torch.cuda.stream(other):
        run_native(data, [x], [y])
        run_native(data, [x], [y])
    assert _native.allocation_count() == after_first + 1  # scratch for the new stream only
    torch.cuda.synchronize(dev)
    torch.testing.assert_close(y, x * scale_of(n, dev))


@cuda
def test_runs_on_torchs_current_stream(dev, op):
    """A delayed fill on a side stream must be seen: the replay is ordered after it on that same stream."""
    n = 1 << 16
    data = example_bundle(n)
    bt = bundle_tensor(data)
    sig = signature_of(data)
    x = torch.zeros(n, device=dev)
    op([x], bt, sig)  # warm-up: load the module before timing matters
    torch.cuda.synchronize(dev)
    stream = torch.cuda.Stream(dev)
    with torch.cuda.stream(stream):
        torch.cuda._sleep(20_000_000)  # ~10 ms of GPU time on this stream
        x.fill_(3.0)
        (y,) = op([x], bt, sig)
    stream.synchronize()
    torch.testing.assert_close(y, 3.0 * scale_of(n, dev))


@cuda
def test_cuda_graph_capture_after_warm_up(dev, op):
    n = 2048
    data = example_bundle(n)
    bt = bundle_tensor(data)
    sig = signature_of(data)
    x = torch.randn(n, device=dev)
    stream = torch.cuda.Stream(dev)
    stream.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(stream):
        for _ in range(2):  # warm-up on the capture stream (module, constants, scratch)
            op([x], bt, sig)
    torch.cuda.current_stream(dev).wait_stream(stream)
    torch.cuda.synchronize(dev)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):  # (the capture gets scratch of its own: see the next test)
        (y,) = op([x], bt, sig)
    before = _native.allocation_count()
    for value in (1.0, -2.5, 4.0):
        x.fill_(value)
        graph.replay()
        torch.cuda.synchronize(dev)
        torch.testing.assert_close(y, value * scale_of(n, dev))
    assert _native.allocation_count() == before


@cuda
def test_graphs_captured_on_one_stream_get_scratch_of_their_own(dev):
    """torch.cuda.graph captures on one default stream, and torch's pool streams repeat: two graphs of one segment
    replayed at once on two streams must not share its scratch. Each capture gets its own, freed after its graph."""
    n = 1 << 20
    data = chained_bundle(n, segment="test/capture_scratch")  # x -> scratch -> y: a shared scratch mixes x1 and x2
    c = scale_of(n, dev)
    xs = [torch.randn(n, device=dev) for _ in range(2)]
    ys = [torch.empty(n, device=dev) for _ in range(2)]
    capture = torch.cuda.Stream(dev)
    capture.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(capture):
        run_native(data, [xs[0]], [ys[0]])  # warm-up: module, constants and the stream's own scratch
    torch.cuda.synchronize(dev)
    graphs = [torch.cuda.CUDAGraph() for _ in range(2)]
    before = _native.allocation_count()
    for graph, x, y in zip(graphs, xs, ys):
        with torch.cuda.graph(graph, stream=capture):
            run_native(data, [x], [y])
    assert _native.allocation_count() == before + 2  # one scratch block per capture
    expected = [x * c * c for x in xs]
    streams = [torch.cuda.Stream(dev) for _ in range(2)]
    for _ in range(30):
        for y in ys:
            y.zero_()
        torch.cuda.synchronize(dev)
        for graph, s in zip(graphs, streams):
            with torch.cuda.stream(s):
                graph.replay()
        torch.cuda.synchronize(dev)
        for y, e in zip(ys, expected):
            assert torch.equal(y, e)
    frees = _native.free_count()
    del graphs, graph
    torch.cuda.synchronize(dev)
    # The driver runs the graphs' user object destructors asynchronously; the next new scratch entry, or any
    # release_segments() (here of a digest no segment has), frees what they released.
    deadline = time.monotonic() + 10
    while _native.free_count() < frees + 2 and time.monotonic() < deadline:
        _native.release_segments("0" * 64)
        time.sleep(0.05)
    assert _native.free_count() >= frees + 2, "the captures' scratch was not freed after their graphs were destroyed"


@cuda
def test_first_use_inside_capture(dev, op):
    """Without warm-up on the capture stream: one-time setup runs in relaxed capture mode and the graph still works."""
    n = 512
    data = example_bundle(n, segment="test/capture_first")
    bt = bundle_tensor(data)
    sig = signature_of(data)
    replay.load_bundle(bt, sig)  # the bundle bytes must be read before capture (host data)
    x = torch.randn(n, device=dev)
    torch.cuda.synchronize(dev)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        (y,) = op([x], bt, sig)
    x.fill_(2.0)
    graph.replay()
    torch.cuda.synchronize(dev)
    torch.testing.assert_close(y, 2.0 * scale_of(n, dev))


@cuda
def test_threads_with_their_own_streams(dev, op):
    n = 10_000
    data = example_bundle(n)
    bt = bundle_tensor(data)
    sig = signature_of(data)
    scale = scale_of(n, dev)
    op([torch.zeros(n, device=dev)], bt, sig)
    failures: list[str] = []

    def worker(seed: int):
        try:
            torch.cuda.set_device(dev)
            stream = torch.cuda.Stream(dev)
            gen = torch.Generator(device=dev).manual_seed(seed)
            with torch.cuda.stream(stream):
                for _ in range(20):
                    x = torch.randn(n, device=dev, generator=gen)
                    (y,) = op([x], bt, sig)
                    if not torch.allclose(y, x * scale):
                        failures.append(f"thread {seed}: wrong result")
            stream.synchronize()
        except Exception as e:  # noqa: BLE001 - reported below
            failures.append(f"thread {seed}: {e!r}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures


@cuda
@pytest.mark.parametrize("kernel", ["native", "op"])
def test_threads_sharing_torchs_default_stream(dev, op, kernel):
    """8 threads replay a 2-launch segment on torch's default stream (one legacy stream, one scratch): every
    output is exact. Interleaved enqueues used to let one call's second launch read another call's scratch."""
    n = 1 << 16
    data = chained_bundle(n, segment=f"test/same_stream_{kernel}")
    b = _native.Bundle(data)
    bt, sig = bundle_tensor(data), signature_of(data)
    scale = scale_of(n, dev)
    failures: list[str] = []

    def worker(seed: int):
        try:
            torch.cuda.set_device(dev)
            gen = torch.Generator(device=dev).manual_seed(seed)
            default = torch.cuda.default_stream(dev)
            with torch.cuda.stream(default):
                for i in range(150):
                    x = torch.randn(n, device=dev, generator=gen)
                    if kernel == "op":
                        (y,) = op([x], bt, sig)
                    else:
                        y = torch.empty(n, device=dev)
                        _native.run_segment(b, [x.data_ptr()], [y.data_ptr()], default.cuda_stream, dev.index)
                    if not torch.equal(y, x * scale * scale):
                        failures.append(f"thread {seed} call {i}: wrong result")
        except Exception as e:  # noqa: BLE001 - reported below
            failures.append(f"thread {seed}: {e!r}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, f"{len(failures)} failures, e.g. {failures[:3]}"


@cuda
def test_per_thread_stream_scratch_is_freed_at_thread_exit(dev):
    n = 4096
    data = example_bundle(n, segment="test/per_thread_exit")
    b = _native.Bundle(data)
    x = torch.randn(n, device=dev)
    run_native(data, [x], [torch.empty(n, device=dev)])  # module and constants, kept
    outs = [torch.full((n,), float("nan"), device=dev) for _ in range(40)]
    torch.cuda.synchronize(dev)
    allocs, frees = _native.allocation_count(), _native.free_count()

    def worker(i: int):
        _native.run_segment(b, [x.data_ptr()], [outs[i].data_ptr()], 2, dev.index)  # 2: CU_STREAM_PER_THREAD

    for batch in range(4):
        threads = [threading.Thread(target=worker, args=(batch * 10 + t,)) for t in range(10)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    deadline = time.monotonic() + 10  # join() returns before the OS thread runs its thread_local destructors
    while _native.free_count() < frees + 40 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _native.allocation_count() == allocs + 40  # one scratch per thread ...
    assert _native.free_count() == frees + 40  # ... freed (after synchronising) when its thread ended
    torch.cuda.synchronize(dev)
    for y in outs:
        assert torch.equal(y, x * scale_of(n, dev))


@cuda
def test_release_segments_frees_and_prepares_again(dev, op):
    from leapp.runtime import release_segments

    n = 4096
    data = example_bundle(n, segment="test/release")  # a digest no other test uses: nothing else is released
    digest = _native.Bundle(data).digest
    bt, sig = bundle_tensor(data), signature_of(data)
    x = torch.randn(n, device=dev)
    streams = [torch.cuda.Stream(dev) for _ in range(3)]

    def everywhere():
        outs = []
        for s in streams:
            with torch.cuda.stream(s):
                y = torch.empty(n, device=dev)
                run_native(data, [x], [y])
                outs.append(y)
                outs.extend(op([x], bt, sig))
        torch.cuda.synchronize(dev)
        for y in outs:
            assert torch.equal(y, x * scale_of(n, dev))

    everywhere()
    allocs, frees = _native.allocation_count(), _native.free_count()
    assert _native.release_segments(digest) == 1
    assert _native.free_count() - frees == 4  # constants + the scratch of 3 streams
    if ops.native_library_loaded():  # the torch library keeps its own runtime copy
        assert torch.ops.leapp.release_segments(digest) == 1
    everywhere()
    assert _native.allocation_count() - allocs == 4
    assert release_segments(digest) == (2 if ops.native_library_loaded() else 1)  # every copy at once


@cuda
def test_release_drops_captured_graphs(dev, op):
    from leapp.runtime import release_segments
    from leapp.runtime.cuda_graphs import CudaGraphCall

    n = 2048
    data = example_bundle(n, segment="test/release_graphs")
    bt, sig = bundle_tensor(data), signature_of(data)
    call = CudaGraphCall(lambda t: op([t], bt, sig), "test/release_graphs")
    x = torch.randn(n, device=dev)
    for _ in range(3):
        (y,) = call(x)
    assert call.captures == 1
    torch.cuda.synchronize(dev)
    assert release_segments(_native.Bundle(data).digest) >= 1
    assert not call._graphs  # the graph baked in the freed scratch: dropped
    x.fill_(2.0)
    for _ in range(3):
        (y,) = call(x)
    torch.cuda.synchronize(dev)
    assert call.captures == 2
    assert torch.equal(y, 2.0 * scale_of(n, dev))


@cuda
def test_callers_context_is_restored(dev):
    """Replaying from a thread with no current CUDA context leaves it without one."""
    libcuda = ctypes.CDLL("libcuda.so.1")
    n = 64
    data = example_bundle(n)
    x = torch.randn(n, device=dev)
    y = torch.empty(n, device=dev)
    stream = torch.cuda.Stream(dev)
    seen: dict[str, int] = {}

    def worker():
        ctx = ctypes.c_void_p()
        libcuda.cuCtxGetCurrent(ctypes.byref(ctx))
        seen["before"] = ctx.value or 0
        _native.run_segment(_native.Bundle(data), [x.data_ptr()], [y.data_ptr()], stream.cuda_stream, -1)
        libcuda.cuCtxGetCurrent(ctypes.byref(ctx))
        seen["after"] = ctx.value or 0

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen["before"] == seen["after"] == 0
    stream.synchronize()
    torch.testing.assert_close(y, x * scale_of(n, dev))


# --- binary choice -------------------------------------------------------------------------------------------


@cuda
def test_broken_cubin_falls_back_to_ptx(dev):
    major, minor = torch.cuda.get_device_capability(dev)
    arch = 10 * major + minor
    data = with_binaries([("cubin", arch, b"not an ELF image"), ("ptx", 75, EXAMPLE_PTX_BLOB)])
    x = torch.randn(64, device=dev)
    y = torch.empty(64, device=dev)
    run_native(data, [x], [y])
    torch.cuda.synchronize(dev)
    torch.testing.assert_close(y, x * scale_of(64, dev))


@cuda
def test_no_binary_for_the_device(dev):
    major, minor = torch.cuda.get_device_capability(dev)
    other_family = 10 * (major - 1) if major > 7 else 10 * (major + 1)  # a cubin of another SM family never loads
    data = with_binaries([("cubin", other_family, b"sass"), ("ptx", 10 * major + minor + 1, b"ptx\0")])
    x = torch.randn(64, device=dev)
    y = torch.empty(64, device=dev)
    status = _native.driver_status()
    driver = f"{status['version'] // 1000}.{(status['version'] % 1000) // 10}"
    with pytest.raises(RuntimeError) as info:
        run_native(data, [x], [y])
    text = str(info.value)
    for part in ("example/warp_segment_0", f"compute capability {major}.{minor}", f"CUDA driver {driver}",
                 f"cubin sm_{other_family}", f"ptx sm_{10 * major + minor + 1} (PTX ISA unknown)"):  # no .version line
        assert part in text, (part, text)


# --- real Warp kernels -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def warp_compiled(tmp_path_factory):
    pytest.importorskip("warp", reason="compiling Warp kernels needs warp-lang")
    return compile_warp_module(tmp_path_factory.mktemp("warp_aot"))


def warp_reference(x, a, bias):
    offset = torch.tensor(WARP_OFFSET, device=x.device)
    return WARP_SCALE * x + offset, a + bias * WARP_K


@cuda
@pytest.mark.parametrize(("n", "rows", "cols"), [(1, 1, 1), (1000, 5, 7), (70_000, 300, 129)])
def test_warp_kernels_cubin(dev, op, warp_compiled, n, rows, cols):
    data = warp_bundle(warp_compiled, n, rows, cols)
    assert _native.Bundle(data).binary_candidates(0, *torch.cuda.get_device_capability(dev))[0] == ("cubin", 90) or \
        torch.cuda.get_device_capability(dev)[0] != 9
    x = torch.randn(n, 3, device=dev)
    a = torch.randn(rows, cols, device=dev)
    bias = torch.randn(cols, device=dev)
    y, hits, out = op([x, a, bias], bundle_tensor(data), signature_of(data))
    y_ref, out_ref = warp_reference(x, a, bias)
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(out, out_ref)
    assert hits.item() == n  # output init "zero" happens every call
    y2, hits2, _ = op([x, a, bias], bundle_tensor(data), signature_of(data))
    assert hits2.item() == n


@cuda
def test_warp_ptx_only(dev, warp_compiled):
    """Warp 1.19 writes PTX ISA 9.4: a driver older than that must explain error 222; a newer one runs it."""
    data = warp_bundle(warp_compiled, 256, 4, 4, binaries=("ptx75",))
    x = torch.randn(256, 3, device=dev)
    a = torch.randn(4, 4, device=dev)
    bias = torch.randn(4, device=dev)
    outs = [torch.empty(256, 3, device=dev), torch.empty(1, dtype=torch.int32, device=dev), torch.empty(4, 4, device=dev)]
    try:
        run_native(data, [x, a, bias], outs)
        torch.cuda.synchronize(dev)
    except RuntimeError as e:
        text = str(e)
        assert "CUDA_ERROR_UNSUPPORTED_PTX_VERSION (222)" in text, text
        assert f"PTX ISA {warp_compiled['ptx_isa']}" in text, text
        assert "cubin for sm_" in text, text
        return
    y_ref, out_ref = warp_reference(x, a, bias)
    torch.testing.assert_close(outs[0], y_ref)
    torch.testing.assert_close(outs[2], out_ref)


# --- ONNX Runtime, CPU execution provider: host staging ------------------------------------------------------------


needs_ort = pytest.mark.skipif(not libraries.library_path("onnx").is_file(), reason="libleapp_warp_ort.so not built")


@cuda
@needs_ort
def test_ort_cpu_ep_stages_through_the_gpu():
    pytest.importorskip("onnxruntime")
    n = 1000
    data = example_bundle(n)
    session = ort_session(warp_segment_model(data))
    scale = np.arange(1, n + 1, dtype=np.float32)
    for _ in range(3):
        x = np.random.default_rng().standard_normal(n).astype(np.float32)
        (y,) = session.run(None, {"x": x})
        np.testing.assert_allclose(y, x * scale, rtol=1e-6)


@cuda
@needs_ort
def test_ort_sessions_and_threads(dev, warp_compiled):
    pytest.importorskip("onnxruntime")
    n, rows, cols = 999, 6, 33
    data = warp_bundle(warp_compiled, n, rows, cols)
    sessions = [ort_session(warp_segment_model(data)) for _ in range(2)]
    failures: list[str] = []

    def worker(seed):
        rng = np.random.default_rng(seed)
        for _ in range(10):
            x = rng.standard_normal((n, 3)).astype(np.float32)
            a = rng.standard_normal((rows, cols)).astype(np.float32)
            bias = rng.standard_normal(cols).astype(np.float32)
            try:
                y, hits, out = sessions[seed % 2].run(None, {"x": x, "a": a, "bias": bias})
                np.testing.assert_allclose(y, WARP_SCALE * x + np.array(WARP_OFFSET, np.float32), rtol=1e-5, atol=1e-6)
                np.testing.assert_allclose(out, a + bias * WARP_K, rtol=1e-5, atol=1e-6)
                assert hits[0] == n
            except Exception as e:  # noqa: BLE001 - reported below
                failures.append(f"thread {seed}: {e!r}")

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures[:3]


@cuda
def test_run_segment_host(dev):
    n = 300
    data = example_bundle(n)
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    y = np.zeros(n, np.float32)
    _native.run_segment_host(_native.Bundle(data), [x], [y], dev.index)
    np.testing.assert_allclose(y, x * np.arange(1, n + 1, dtype=np.float32), rtol=1e-6)


def test_signature_json_is_what_the_ops_read():
    """The string the op kernels parse is leapp.bundle's signature (kept here so the GPU tests share it)."""
    sig = json.loads(signature_of(example_bundle(4)))
    assert set(sig) == {"digest", "segment", "inputs", "outputs"}
    assert struct.calcsize("<I4xQQ") == 24
