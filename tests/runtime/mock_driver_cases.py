"""Replay against tests/runtime/mock_cuda (a fake libcuda.so.1); run by test_runtime_mock_driver.py in a subprocess.

The fake driver executes memsets/copies at once on host memory and emulates
the test kernels from their kernelParams, so these cases check on a CPU-only
machine what the GPU tests check on a GPU: relocations, parameter packing,
op order, inits, caches, contexts, capture mode, binary choice and errors.
Not collected on its own (no test_ prefix); skipped unless LEAPP_MOCK_CUDA=1.
"""

from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path

import numpy as np
import pytest
from cuda_bundles import (
    SMEM_ENTRY,
    WARP_K,
    WARP_OFFSET,
    WARP_SCALE,
    copy_memset_bundle,
    fake_cubin,
    smem_bundle,
    with_binaries,
)

if os.environ.get("LEAPP_MOCK_CUDA") != "1":
    pytest.skip("runs only under the fake driver (test_runtime_mock_driver.py)", allow_module_level=True)

from leapp import _native
from leapp.bundle import write_bundle
from leapp.bundle.testing import EXAMPLE_ENTRY, EXAMPLE_PTX, example_bundle, example_manifest_and_blobs

MOCK = ctypes.CDLL("libcuda.so.1")  # the same library the runtime dlopen'ed
MOCK.mock_current_ctx.restype = ctypes.c_void_p
MOCK.mock_primary_ctx.restype = ctypes.c_void_p
MOCK.mock_primary_ctx.argtypes = [ctypes.c_int]
MOCK.mock_stream_create.restype = ctypes.c_void_p
MOCK.mock_stream_create.argtypes = [ctypes.c_int]
MOCK.mock_set_capturing.argtypes = [ctypes.c_void_p, ctypes.c_int]
MOCK.mock_set_current_ctx.argtypes = [ctypes.c_void_p]
STATS = ("allocs", "frees", "launches", "memsets", "copies", "loads", "exchanges", "set_current", "load_failures",
         "prohibited")
PTX_75 = EXAMPLE_PTX.encode() + b"\0"
PTX_94 = EXAMPLE_PTX.replace(".version 7.5", ".version 9.4").encode() + b"\0"


def stats() -> dict[str, int]:
    out = (ctypes.c_longlong * 10)()
    MOCK.mock_stats(out)
    return dict(zip(STATS, out))


def last_loaded() -> str:
    buf = ctypes.create_string_buffer(64)
    MOCK.mock_last_loaded(buf, 64)
    return buf.value.decode()


def stream(device: int = 0) -> int:
    return MOCK.mock_stream_create(device)


def ptr(a: np.ndarray) -> int:
    return a.ctypes.data


def run(data: bytes, inputs, outputs, s: int = 0, device: int = 0):
    _native.run_segment(_native.Bundle(data), [ptr(a) for a in inputs], [ptr(a) for a in outputs], s, device,
                        input_nbytes=[a.nbytes for a in inputs], output_nbytes=[a.nbytes for a in outputs])


def scale(n: int) -> np.ndarray:
    return np.arange(1, n + 1, dtype=np.float32)


# --- results ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 4, 1000])
@pytest.mark.parametrize("where", ["legacy", "stream", "stream-any-device"])
def test_example_replay(n, where):
    x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    y = np.full(n, np.nan, np.float32)
    if where == "legacy":
        run(example_bundle(n), [x], [y], 0, 0)
    else:
        run(example_bundle(n), [x], [y], stream(0), 0 if where == "stream" else -1)
    np.testing.assert_array_equal(y, x * scale(n))


def test_memset_copy_and_init_from_input():
    n = 16
    data, constant = copy_memset_bundle(n)
    a = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    before = a.copy()
    o1 = np.empty(n, np.float32)
    o2 = np.full(4 * n, 7, np.uint8)
    run(data, [a], [o1, o2], stream(0))
    np.testing.assert_array_equal(a, before)
    assert o1.view(np.int32)[0] == -1
    np.testing.assert_array_equal(o1[1:], a[1:])
    assert o2.tobytes() == bytes([1] * 8) + constant[:8] + bytes(4 * n - 16)


@pytest.mark.parametrize("n", [128, 1000])
def test_dynamic_shared_memory(n):
    block = 128
    x = np.random.default_rng(2).standard_normal(n).astype(np.float32)
    y = np.empty(n, np.float32)
    run(smem_bundle(n, block=block, smem=64 * 1024), [x], [y], stream(0))
    idx = np.arange(n)
    src = idx // block * block + (block - 1 - idx % block)
    padded = np.concatenate([x, np.zeros(block, np.float32)])
    np.testing.assert_array_equal(y, padded[src] + 1)


def test_warp_kernels(tmp_path):
    pytest.importorskip("warp")
    from cuda_bundles import compile_warp_module, warp_bundle

    compiled = compile_warp_module(tmp_path)
    n, rows, cols = 1000, 5, 7
    data = warp_bundle(compiled, n, rows, cols)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((n, 3)).astype(np.float32)
    a = rng.standard_normal((rows, cols)).astype(np.float32)
    bias = rng.standard_normal(cols).astype(np.float32)
    y = np.empty((n, 3), np.float32)
    hits = np.full(1, 12345, np.int32)
    out = np.empty((rows, cols), np.float32)
    run(data, [x, a, bias], [y, hits, out], stream(0))
    assert last_loaded() == "cubin sm_90"
    np.testing.assert_allclose(y, WARP_SCALE * x + np.array(WARP_OFFSET, np.float32), rtol=1e-6)
    np.testing.assert_allclose(out, a + bias * WARP_K, rtol=1e-6)
    assert hits[0] == n  # init "zero" ran before the launch


# --- caches, contexts, capture ------------------------------------------------------------------------------


def test_allocations_once_per_context_digest_and_stream():
    n = 64
    data = example_bundle(n, segment="mock/alloc")
    x = np.ones(n, np.float32)
    y = np.empty(n, np.float32)
    s1 = stream(0)
    base = _native.allocation_count()
    assert stats()["allocs"] == base
    run(data, [x], [y], s1)
    assert _native.allocation_count() == base + 2  # constants (per context) + scratch (per stream)
    for _ in range(20):
        run(data, [x], [y], s1)
    assert _native.allocation_count() == base + 2
    run(data, [x], [y], stream(0))
    assert _native.allocation_count() == base + 3
    run(data, [x], [y], 0)  # the legacy stream is one more stream
    run(data, [x], [y], 0)
    assert _native.allocation_count() == base + 4
    per_thread = 2  # CU_STREAM_PER_THREAD: one stream per thread

    def worker():
        run(data, [x], [y], per_thread)
        run(data, [x], [y], per_thread)

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert _native.allocation_count() == base + 6
    assert stats()["allocs"] == _native.allocation_count()


def test_module_loaded_once_per_context():
    data = example_bundle(32, segment="mock/loads")
    x = np.ones(32, np.float32)
    y = np.empty(32, np.float32)
    before = stats()["loads"]
    for _ in range(5):
        run(data, [x], [y], stream(0))
    assert stats()["loads"] == before + 1
    run(data, [x], [y], stream(1), 1)  # another device, another context
    assert stats()["loads"] == before + 2


def test_callers_context_is_restored():
    data = example_bundle(8)
    x = np.ones(8, np.float32)
    y = np.empty(8, np.float32)
    seen = {}

    def worker():
        seen["none_before"] = MOCK.mock_current_ctx()
        run(data, [x], [y], stream(1), -1)
        seen["none_after"] = MOCK.mock_current_ctx()
        MOCK.mock_set_current_ctx(MOCK.mock_primary_ctx(0))
        run(data, [x], [y], stream(1), 1)
        seen["ctx0_after"] = MOCK.mock_current_ctx()

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen["none_before"] is None and seen["none_after"] is None
    assert seen["ctx0_after"] == MOCK.mock_primary_ctx(0)


def test_device_checks():
    data = example_bundle(8)
    x = np.ones(8, np.float32)
    y = np.empty(8, np.float32)
    with pytest.raises(ValueError, match="the stream belongs to CUDA device 1, but device 0 was requested"):
        run(data, [x], [y], stream(1), 0)
    with pytest.raises(ValueError, match=r"CUDA device 5 does not exist \(2 devices\)"):
        run(data, [x], [y], 0, 5)


def test_setup_during_capture_uses_relaxed_mode():
    n = 128
    data = example_bundle(n, segment="mock/capture")
    x = np.random.default_rng(4).standard_normal(n).astype(np.float32)
    y = np.empty(n, np.float32)
    captured = stream(0)
    MOCK.mock_set_capturing(captured, 1)
    try:
        assert _native.stream_is_capturing(captured) is True
        before = stats()
        run(data, [x], [y], captured)  # first use: module load, constants, scratch, all while capturing
        after = stats()
        assert after["exchanges"] == before["exchanges"] + 2  # to relaxed and back
        assert after["prohibited"] == before["prohibited"]
        np.testing.assert_array_equal(y, x * scale(n))
        run(data, [x], [y], captured)  # warm: no setup, no mode switch, no allocation
        again = stats()
        assert again["exchanges"] == after["exchanges"] and again["allocs"] == after["allocs"]
        other = stream(0)  # a new stream of the same segment while another is captured
        run(data, [x], [y], other)
        assert stats()["prohibited"] == before["prohibited"]
    finally:
        MOCK.mock_set_capturing(captured, 0)
    assert _native.stream_is_capturing(captured) is False


def test_threads_with_their_own_streams():
    n = 500
    data = example_bundle(n, segment="mock/threads")
    failures = []
    base = _native.allocation_count()

    def worker(seed):
        s = stream(0)
        rng = np.random.default_rng(seed)
        for _ in range(50):
            x = rng.standard_normal(n).astype(np.float32)
            y = np.empty(n, np.float32)
            run(data, [x], [y], s)
            if not np.array_equal(y, x * scale(n)):
                failures.append(seed)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures
    assert _native.allocation_count() == base + 1 + 8  # one constant block, one scratch per stream


# --- binary choice ---------------------------------------------------------------------------------------------


def test_cubin_preferred_over_ptx():
    data = with_binaries([("ptx", 75, PTX_94), ("cubin", 90, fake_cubin(90, EXAMPLE_ENTRY))], n=64)
    x = np.ones(64, np.float32)
    y = np.empty(64, np.float32)
    run(data, [x], [y], stream(0))
    assert last_loaded() == "cubin sm_90"
    np.testing.assert_array_equal(y, scale(64))


def test_broken_cubin_falls_back_to_ptx():
    broken = bytearray(fake_cubin(90, EXAMPLE_ENTRY))
    broken[40:48] = (2**40).to_bytes(8, "little")  # nonsense header: the driver refuses the image
    data = with_binaries([("cubin", 90, bytes(broken)), ("ptx", 75, PTX_75)], n=16)
    y = np.empty(16, np.float32)
    run(data, [np.ones(16, np.float32)], [y], stream(0))
    assert last_loaded() == "ptx 7.5"
    np.testing.assert_array_equal(y, scale(16))


def test_cubin_with_out_of_bounds_tables_never_reaches_the_driver():
    truncated = bytearray(fake_cubin(90, EXAMPLE_ENTRY))
    truncated[60:62] = (3).to_bytes(2, "little")  # e_shnum = 3 section headers that are not there
    loads, failures = stats()["loads"], stats()["load_failures"]
    data = with_binaries([("cubin", 90, bytes(truncated)), ("ptx", 75, PTX_75)], n=16)
    y = np.empty(16, np.float32)
    run(data, [np.ones(16, np.float32)], [y], stream(0))
    assert last_loaded() == "ptx 7.5"
    assert stats()["loads"] == loads + 1 and stats()["load_failures"] == failures  # only the PTX went to the driver
    only = with_binaries([("cubin", 90, bytes(truncated))], n=16)
    with pytest.raises(RuntimeError, match=r"cubin sm_90: not loaded: its section header table lies outside the image"):
        run(only, [np.ones(16, np.float32)], [y], stream(0))


def test_ptx_too_new_explains_error_222():
    data = with_binaries([("ptx", 75, PTX_94), ("cubin", 86, fake_cubin(86, EXAMPLE_ENTRY))], n=16)
    with pytest.raises(RuntimeError) as info:
        run(data, [np.ones(16, np.float32)], [np.empty(16, np.float32)], stream(0))
    text = str(info.value)
    for part in ("leapp segment 'example/warp_segment_0': module 0 'leapp_example_module' could not be loaded",
                 "compute capability 9.0", "CUDA driver 13.0", "ptx sm_75 (PTX ISA 9.4), cubin sm_86",
                 "ptx sm_75: CUDA_ERROR_UNSUPPORTED_PTX_VERSION", "Unsupported .version 9.4",
                 "CUDA_ERROR_UNSUPPORTED_PTX_VERSION (222): the CUDA 13.0 driver cannot JIT-compile PTX ISA 9.4 "
                 "(it reads PTX up to ISA 9.0;", "Update the driver to CUDA 13.4 or later",
                 "re-export the bundle with a cubin for sm_90 or with PTX of an older ISA"):
        assert part in text, (part, text)


def test_no_binary_for_the_device():
    data = with_binaries([("cubin", 86, fake_cubin(86, EXAMPLE_ENTRY)), ("ptx", 100, PTX_75)], n=16)
    with pytest.raises(RuntimeError, match=r"has no binary for device 0 \(Mock GPU 0, compute capability 9.0\), "
                                           r"CUDA driver 13.0; the bundle holds cubin sm_86, ptx sm_100 \(PTX ISA 7.5\)"):
        run(data, [np.ones(16, np.float32)], [np.empty(16, np.float32)], stream(0))


def test_missing_entry_and_launch_errors_name_the_op():
    data = with_binaries([("cubin", 90, fake_cubin(90, "some_other_kernel"))], n=16)
    with pytest.raises(RuntimeError, match=r"kernels\[0\] entry 'leapp_example_scale_cuda_kernel_forward' not found "
                                           r"in module 0 \(cubin sm_90\)"):
        run(data, [np.ones(16, np.float32)], [np.empty(16, np.float32)], stream(0))
    bad = smem_bundle(1000, block=512, smem=1024)  # the kernel's window needs 4 * 512 bytes > 1024
    with pytest.raises(RuntimeError, match=rf"leapp segment 'test/smem_segment': ops\[0\] launch of '{SMEM_ENTRY}' "
                                           r"\(grid 2x1x1, block 512x1x1, smem 1024\): CUDA_ERROR_ILLEGAL_ADDRESS"):
        run(bad, [np.ones(1000, np.float32)], [np.empty(1000, np.float32)], stream(0))


# --- host staging and ONNX Runtime's CPU execution provider ------------------------------------------------------


def test_allocation_beyond_the_limit_is_a_clear_error_before_cuda_is_asked():
    """A bundle within the format's size caps (docs/bundle-format.md) asking for more than a call may take is refused
    by name before any cuMemAlloc (docs/runtime.md, "Memory")."""
    manifest, blobs = example_manifest_and_blobs(4)
    manifest["buffers"][2]["bytes"] = 2**40 - 16  # scratch + the 16-byte constant: exactly the format's cap
    data = write_bundle(manifest, blobs)
    x, y = np.ones(4, np.float32), np.zeros(4, np.float32)
    before = _native.allocation_count()
    with pytest.raises(RuntimeError, match=r"^leapp segment 'example/warp_segment_0' needs 1099511628048 bytes "
                                           r"\(1024.0 GiB\): outputs 16, scratch 1099511627776, constants 256; more "
                                           r"than the 4294967296 bytes"):
        run(data, [x], [y], stream(0))
    assert _native.allocation_count() == before
    run(example_bundle(4), [x], [y], stream(0))  # the runtime is still usable
    np.testing.assert_array_equal(y, x * scale(4))


def test_run_segment_host():
    n = 300
    data = example_bundle(n, segment="mock/host")
    base = _native.allocation_count()
    for seed in range(3):
        x = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
        y = np.zeros(n, np.float32)
        _native.run_segment_host(_native.Bundle(data), [x], [y])
        np.testing.assert_array_equal(y, x * scale(n))
    # one staging set (device + pinned block) + constants + scratch on the staging stream
    assert _native.allocation_count() == base + 4


def test_leapp_cuda_device_env(monkeypatch):
    data = example_bundle(8)
    x, y = np.ones(8, np.float32), np.zeros(8, np.float32)
    monkeypatch.setenv("LEAPP_CUDA_DEVICE", "1")
    before = stats()["loads"]
    _native.run_segment_host(_native.Bundle(data), [x], [y])
    np.testing.assert_array_equal(y, scale(8))
    monkeypatch.setenv("LEAPP_CUDA_DEVICE", "gpu0")
    with pytest.raises(ValueError, match="LEAPP_CUDA_DEVICE='gpu0' is not a device ordinal"):
        _native.run_segment_host(_native.Bundle(data), [x], [y])
    assert stats()["loads"] >= before


def test_ort_cpu_ep():
    ort = pytest.importorskip("onnxruntime")
    from runtime_helpers import ort_session, warp_segment_model

    from leapp.runtime import libraries

    if not libraries.library_path("onnx").is_file():
        pytest.skip("libleapp_warp_ort.so is not built")
    n = 1000
    data = example_bundle(n, segment="mock/ort")
    sessions = [ort_session(warp_segment_model(data)) for _ in range(2)]
    failures = []

    def worker(seed):
        rng = np.random.default_rng(seed)
        for _ in range(20):
            x = rng.standard_normal(n).astype(np.float32)
            (y,) = sessions[seed % 2].run(None, {"x": x})
            if not np.array_equal(y, x * scale(n)):
                failures.append(seed)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures
    assert ort.__version__


# --- segment graphs -----------------------------------------------------------------------------------------------

GRAPH_STATS = ("live_graphs", "live_execs", "graph_launches", "instantiations", "updates")


def graph_stats() -> dict[str, int]:
    out = (ctypes.c_longlong * 5)()
    MOCK.mock_graph_stats(out)
    return dict(zip(GRAPH_STATS, out))


def delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in before}


def check_copy_outputs(a, o1, o2, constant):
    assert o1.view(np.int32)[0] == -1
    np.testing.assert_array_equal(o1[1:], a[1:])
    assert o2.tobytes() == bytes([1] * 8) + constant[:8] + bytes(o2.nbytes - 16)


def fresh_outputs(n: int):
    return np.full(n, np.nan, np.float32), np.full(4 * n, 7, np.uint8)


def test_segment_replays_as_one_graph_per_address_set():
    n = 20
    data, constant = copy_memset_bundle(n)
    a = np.random.default_rng(5).standard_normal(n).astype(np.float32)
    s = stream(0)
    g0, ops0 = graph_stats(), stats()
    first = fresh_outputs(n)
    for _ in range(5):
        first[0].fill(np.nan), first[1].fill(7)
        run(data, [a], list(first), s)
        check_copy_outputs(a, *first, constant)
    g = delta(g0, graph_stats())
    assert (g["instantiations"], g["graph_launches"], g["live_graphs"]) == (1, 5, 0)
    ops = delta(ops0, stats())
    # the same work as op by op: 3 memsets (one is the zero init) and 3 copies per call, plus the constants' upload
    assert (ops["memsets"], ops["copies"], ops["launches"]) == (5 * 3, 5 * 3 + 1, 0)

    second = fresh_outputs(n)  # new addresses: a second graph; the first one still serves its own
    run(data, [a], list(second), s)
    check_copy_outputs(a, *second, constant)
    first[0].fill(np.nan), first[1].fill(7)
    run(data, [a], list(first), s)
    check_copy_outputs(a, *first, constant)
    g = delta(g0, graph_stats())
    assert (g["instantiations"], g["graph_launches"]) == (2, 7)


def test_least_recently_used_graph_is_updated_in_place():
    n = 24
    data, constant = copy_memset_bundle(n)
    a = np.random.default_rng(6).standard_normal(n).astype(np.float32)
    s = stream(0)
    sets = [fresh_outputs(n) for _ in range(9)]  # one more than the 8 graphs kept per stream

    def call(i):
        o1, o2 = sets[i]
        o1.fill(np.nan), o2.fill(7)
        run(data, [a], [o1, o2], s)
        check_copy_outputs(a, o1, o2, constant)

    g0 = graph_stats()
    for i in range(9):  # the ninth set takes over the graph of the first
        call(i)
    g = delta(g0, graph_stats())
    assert (g["instantiations"], g["updates"], g["live_execs"]) == (8, 1, 8)
    for i in range(1, 9):  # all kept: hits only
        call(i)
    assert delta(g0, graph_stats()) == dict(g, graph_launches=17)
    call(0)  # back again: takes over the least recently used (set 1's)
    g = delta(g0, graph_stats())
    assert (g["instantiations"], g["updates"], g["graph_launches"]) == (8, 2, 18)
    call(8)
    assert delta(g0, graph_stats())["updates"] == 2  # still kept


def test_ever_changing_addresses_replay_op_by_op():
    n = 28
    data, constant = copy_memset_bundle(n)
    a = np.random.default_rng(7).standard_normal(n).astype(np.float32)
    s = stream(0)
    g0, ops0 = graph_stats(), stats()
    keep = []  # every call gets outputs at new addresses
    for _ in range(40):
        o1, o2 = fresh_outputs(n)
        keep.append((o1, o2))
        run(data, [a], [o1, o2], s)
        check_copy_outputs(a, o1, o2, constant)
    g = delta(g0, graph_stats())
    assert g["graph_launches"] < 40 and g["instantiations"] + g["updates"] <= 8 + 16
    assert delta(ops0, stats())["memsets"] == 40 * 3  # every call did its work, by graph or op by op


def test_a_capturing_stream_gets_the_ops_themselves():
    n = 32
    data, constant = copy_memset_bundle(n)
    a = np.random.default_rng(8).standard_normal(n).astype(np.float32)
    s = stream(0)
    o1, o2 = fresh_outputs(n)
    run(data, [a], [o1, o2], s)  # warm: a graph exists for these addresses
    g0 = graph_stats()
    MOCK.mock_set_capturing(s, 1)
    try:
        o1.fill(np.nan), o2.fill(7)
        run(data, [a], [o1, o2], s)
    finally:
        MOCK.mock_set_capturing(s, 0)
    check_copy_outputs(a, o1, o2, constant)
    assert delta(g0, graph_stats())["graph_launches"] == 0  # an outer capture records the ops, not our graph


def test_single_op_segments_launch_directly():
    n = 36
    manifest, blobs = example_manifest_and_blobs(n, segment="mock/single-op")
    manifest["buffers"][1]["init"] = "none"
    launch = manifest["ops"][1]
    launch["relocs"][2]["buffer"] = 1  # the kernel writes the output itself: one enqueue per call
    manifest["ops"] = [launch]
    manifest["buffers"] = manifest["buffers"][:2] + [dict(manifest["buffers"][3], id=2)]
    launch["relocs"][1]["buffer"] = 2
    x = np.ones(n, np.float32)
    y = np.empty(n, np.float32)
    g0 = graph_stats()
    for _ in range(3):
        run(write_bundle(manifest, blobs), [x], [y], stream(0))
    np.testing.assert_array_equal(y, scale(n))
    assert delta(g0, graph_stats())["graph_launches"] == 0


def test_release_destroys_graphs_and_their_streams():
    from leapp.runtime import release_segments

    n = 40
    data, constant = copy_memset_bundle(n)
    a = np.ones(n, np.float32)
    s = stream(0)
    release_segments()
    # what no runtime copy holds any more (an op library ONNX Runtime unloaded with its sessions)
    orphaned = graph_stats()["live_execs"]
    kept = [fresh_outputs(n) for _ in range(3)]  # three address sets, alive together
    for o1, o2 in kept:
        run(data, [a], [o1, o2], s)
    assert graph_stats()["live_execs"] == orphaned + 3
    release_segments()
    assert graph_stats()["live_execs"] == orphaned and graph_stats()["live_graphs"] == 0
    o1, o2 = fresh_outputs(n)
    run(data, [a], [o1, o2], s)  # prepared again, graphs again
    check_copy_outputs(a, o1, o2, constant)
    assert graph_stats()["live_execs"] == orphaned + 1


def test_graphs_off_by_environment(tmp_path):
    import subprocess
    import sys

    script = tmp_path / "off.py"
    script.write_text(
        "import ctypes, numpy as np\n"
        "from cuda_bundles import copy_memset_bundle\n"
        "from leapp import _native\n"
        "data, _ = copy_memset_bundle(16)\n"
        "a = np.ones(16, np.float32); o1 = np.empty(16, np.float32); o2 = np.empty(64, np.uint8)\n"
        "for _ in range(3):\n"
        "    _native.run_segment(_native.Bundle(data), [a.ctypes.data], [o1.ctypes.data, o2.ctypes.data], 0, 0,\n"
        "                        input_nbytes=[a.nbytes], output_nbytes=[o1.nbytes, o2.nbytes])\n"
        "out = (ctypes.c_longlong * 5)(); ctypes.CDLL('libcuda.so.1').mock_graph_stats(out)\n"
        "print('graph launches', out[2])\n"
    )
    env = dict(os.environ, LEAPP_SEGMENT_GRAPHS="0", PYTHONPATH=os.pathsep.join(
        [str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "graph launches 0" in proc.stdout
# --- caller captures: scratch of its own per capture (ext/core/src/segment_cache.cpp, "Captures") -----------------------

MOCK.mock_user_object_stats.argtypes = [ctypes.POINTER(ctypes.c_longlong)]


def user_objects() -> dict[str, int]:
    out = (ctypes.c_longlong * 2)()
    MOCK.mock_user_object_stats(out)
    return {"live": out[0], "destroyed": out[1]}


def capture_example(data: bytes, n: int, s: int, calls: int = 1) -> None:
    """``calls`` runs of the example inside one caller capture of ``s``; the capture's graph is destroyed at its end."""
    MOCK.mock_set_capturing(s, 1)
    try:
        for i in range(calls):
            x = np.random.default_rng(i).standard_normal(n).astype(np.float32)
            y = np.full(n, np.nan, np.float32)
            run(data, [x], [y], s)
            np.testing.assert_array_equal(y, x * scale(n))
    finally:
        MOCK.mock_set_capturing(s, 0)


def test_each_capture_of_one_stream_gets_scratch_of_its_own_freed_after_its_graph():
    # Two graphs captured on one stream (torch's default capture stream, or a repeated pool stream) replay
    # later on any streams, perhaps at once: they must not bake in the same scratch.
    n = 64
    data = example_bundle(n, segment="mock/capture-scratch")
    s = stream(0)
    run(data, [np.ones(n, np.float32)], [np.empty(n, np.float32)], s)  # the stream's own entry, not captured
    base, objects, frees = stats()["allocs"], user_objects(), stats()["frees"]
    capture_example(data, n, s, calls=3)  # one capture, three calls: one entry
    assert stats()["allocs"] == base + 1
    assert user_objects() == {"live": objects["live"], "destroyed": objects["destroyed"] + 1}  # its graph is gone
    assert stats()["frees"] == frees  # queued, freed by the next new entry
    capture_example(data, n, s)  # a second capture of the same stream: scratch of its own; the first one's freed
    assert stats()["allocs"] == base + 2 and stats()["frees"] == frees + 1
    run(data, [np.ones(n, np.float32)], [np.empty(n, np.float32)], s)  # the stream's entry is still there
    assert stats()["allocs"] == base + 2
    assert _native.release_segments(_native.Bundle(data).digest) == 1
    assert stats()["frees"] == frees + 1 + 3  # capture 1's; then the stream's scratch, capture 2's, the constants
    assert user_objects()["live"] == objects["live"]


def test_a_capture_holds_its_scratch_while_its_graph_lives():
    n = 16
    data = example_bundle(n, segment="mock/capture-held")
    s, other = stream(0), stream(0)
    MOCK.mock_set_capturing(s, 1)
    try:
        x = np.arange(n, dtype=np.float32)
        y = np.empty(n, np.float32)
        run(data, [x], [y], s)
        capture_example(data, n, other)  # another capture, whose graph is gone at its end
        frees, allocs = stats()["frees"], stats()["allocs"]
        run(data, [x], [y], stream(0))  # a new entry frees what is gone: the other capture's scratch only
        assert stats()["frees"] == frees + 1
        run(data, [x], [y], s)  # this capture's entry is still there: no new scratch
        assert stats()["allocs"] == allocs + 1  # (the new stream's)
        np.testing.assert_array_equal(y, x * scale(n))
    finally:
        MOCK.mock_set_capturing(s, 0)
    run(data, [x], [y], stream(0))
    assert stats()["frees"] == frees + 2  # now this capture's


MOCK.mock_capture_id.argtypes = [ctypes.c_void_p]
MOCK.mock_capture_id.restype = ctypes.c_ulonglong


def test_an_adopted_capture_keeps_its_scratch_without_a_user_object_until_released():
    # leapp's C++ Pipeline owns its step graphs: a graph holding a user object makes the driver track each of
    # its launches on a thread of its own (a host allocation per launch), so the pipeline adopts its captures
    # and says when their graphs are gone.
    n = 32
    data = example_bundle(n, segment="mock/capture-adopted")
    s = stream(0)
    run(data, [np.ones(n, np.float32)], [np.empty(n, np.float32)], s)  # prepared, the stream's own entry
    objects, allocs, frees = user_objects(), stats()["allocs"], stats()["frees"]
    MOCK.mock_set_capturing(s, 1)
    capture = MOCK.mock_capture_id(s)
    _native.adopt_capture(capture)
    try:
        x = np.arange(n, dtype=np.float32)
        y = np.full(n, np.nan, np.float32)
        run(data, [x], [y], s)
        np.testing.assert_array_equal(y, x * scale(n))
    finally:
        MOCK.mock_set_capturing(s, 0)  # its graph is destroyed; the owner has not said so yet
    assert stats()["allocs"] == allocs + 1  # scratch of its own, as an unadopted capture's
    assert user_objects() == objects  # but no user object was made for it
    run(data, [x], [y], stream(0))  # a new entry frees only what was released: nothing yet
    assert stats()["frees"] == frees
    _native.release_capture(capture)
    _native.release_capture(capture)  # twice, or an id never adopted: nothing
    _native.release_capture(capture + 1000)
    run(data, [x], [y], stream(0))
    assert stats()["frees"] == frees + 1
    assert _native.release_segments(_native.Bundle(data).digest) == 1


def _driver_variant(tmp_path, env_name: str) -> str:
    """Runs two captures of one stream in a process whose fake driver has ``env_name``=1; prints counts."""
    import subprocess
    import sys

    script = tmp_path / "variant.py"
    script.write_text(
        "import ctypes, numpy as np\n"
        "from leapp import _native\n"
        "from leapp.bundle.testing import example_bundle\n"
        "mock = ctypes.CDLL('libcuda.so.1'); mock.mock_stream_create.restype = ctypes.c_void_p\n"
        "mock.mock_set_capturing.argtypes = [ctypes.c_void_p, ctypes.c_int]\n"
        "data = _native.Bundle(example_bundle(8)); s = mock.mock_stream_create(0)\n"
        "x = np.arange(8, dtype=np.float32); y = np.empty(8, np.float32)\n"
        "def go():\n"
        "    _native.run_segment(data, [x.ctypes.data], [y.ctypes.data], s, 0, input_nbytes=[32], output_nbytes=[32])\n"
        "    assert (y == x * np.arange(1, 9, dtype=np.float32)).all()\n"
        "go(); a0 = _native.allocation_count()\n"
        "for _ in range(2):\n"
        "    mock.mock_set_capturing(s, 1); go(); mock.mock_set_capturing(s, 0)\n"
        "print('capture allocations', _native.allocation_count() - a0)\n"
    )
    env = dict(os.environ, **{env_name: "1"})
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_a_driver_without_capture_info_keys_captured_scratch_by_stream(tmp_path):
    assert "capture allocations 0" in _driver_variant(tmp_path, "MOCK_NO_CAPTURE_INFO")


def test_a_graph_that_refuses_the_user_object_keeps_the_scratch(tmp_path):
    # Scratch of its own per capture, never freed before release_segments (the graph could not hold it).
    assert "capture allocations 2" in _driver_variant(tmp_path, "MOCK_RETAIN_FAILS")


# --- dynamic batch (docs/bundle-format.md, "Dynamic batch") -------------------------------------------------


def test_dynamic_batch_replays_any_batch_and_reuses_scratch():
    from leapp.bundle.testing import dynamic_example_bundle

    data = dynamic_example_bundle(8, lo=1, hi=300)
    s = stream(0)
    for batch in (8, 1, 7, 300, 257, 1):
        x = np.random.default_rng(batch).standard_normal(batch).astype(np.float32)
        y = np.full(batch, np.nan, np.float32)
        run(data, [x], [y], s)
        np.testing.assert_array_equal(y, x * x)
    before = stats()["allocs"]
    for batch in (300, 7, 300, 1):  # scratch grew to 300 already: nothing more is allocated
        x = np.ones(batch, np.float32)
        y = np.empty(batch, np.float32)
        run(data, [x], [y], s)
    assert stats()["allocs"] == before


def test_dynamic_batch_errors_name_segment_and_input():
    from leapp.bundle.testing import dynamic_example_bundle

    data = dynamic_example_bundle(8, lo=2, hi=64)
    with pytest.raises(ValueError, match=r"example/warp_segment_0.*input 0 'x' has 65 rows.*not a batch in 2\.\.64"):
        run(data, [np.ones(65, np.float32)], [np.ones(65, np.float32)], stream(0))
    with pytest.raises(ValueError, match=r"input 0 'x' has 1 rows"):
        run(data, [np.ones(1, np.float32)], [np.ones(1, np.float32)], stream(0))
    with pytest.raises(ValueError, match=r"outputs\[0\] 'y' has 20 bytes, expected 16 .*at batch 4"):
        run(data, [np.ones(4, np.float32)], [np.ones(5, np.float32)], stream(0))
    with pytest.raises(ValueError, match=r"not a whole number of 4-byte rows"):
        _native.run_segment(_native.Bundle(data), [ptr(np.ones(4, np.float32))], [ptr(np.ones(4, np.float32))],
                            stream(0), 0, input_nbytes=[15], output_nbytes=[16])


def test_dynamic_batch_graphs_are_keyed_by_batch_and_scratch():
    """Same addresses, another batch: a graph made for batch 8 must not replay batch 4 (its grid, sizes and
    parameters are batch 8's); after the scratch grows, graphs of the old scratch are not replayed either."""
    from leapp.bundle.testing import dynamic_example_bundle

    data = dynamic_example_bundle(8, lo=1, hi=300)
    bundle = _native.Bundle(data)
    s = stream(0)
    x = np.random.default_rng(11).standard_normal(300).astype(np.float32)
    y = np.empty(300, np.float32)
    g0 = graph_stats()
    for n in (8, 4, 8, 4, 8, 300, 8, 1):
        y.fill(np.nan)
        _native.run_segment(bundle, [ptr(x)], [ptr(y)], s, 0, input_nbytes=[4 * n], output_nbytes=[4 * n])
        np.testing.assert_array_equal(y[:n], x[:n] * x[:n])
        assert np.isnan(y[n:]).all(), f"batch {n} wrote past its rows"
    g = delta(g0, graph_stats())
    assert g["graph_launches"] == 8
    # batch 8 and 4 each got a graph; 300 grew the scratch, so 8 after it needed a new one (and 1)
    assert g["instantiations"] + g["updates"] == 5, g


def test_dynamic_batch_recorded_with_warp_replays_at_other_batches(tmp_path):
    """End to end on the CPU: the recorder traces a dynamic node with real Warp kernels (the ones the fake
    driver emulates: affine_vec3, add_rows), the exporter learns the rules from its probes with Warp's own
    parameter layouts, and the runtime replays that one bundle at batches it never traced."""
    pytest.importorskip("warp")
    import cuda_warp_kernels as kernels
    import torch
    import warp as wp

    import leapp
    from leapp import annotate
    from leapp._export.exportable import build_exportable
    from leapp.bundle import read_bundle

    wp.init()

    @leapp.node("mockdyn", export_with="pt2", dynamic_batch=(1, 64))
    def node(x, a):
        y = torch.empty_like(x)
        out = torch.empty_like(a)
        hits = torch.zeros(1, dtype=torch.int32)
        bias = torch.arange(5.0)
        with annotate.warp_op():
            wp.launch(kernels.affine_vec3, dim=x.shape[0],
                      inputs=[wp.from_torch(x, dtype=wp.vec3), 2.0, wp.vec3(1.0, 2.0, 3.0)],
                      outputs=[wp.from_torch(y, dtype=wp.vec3), wp.from_torch(hits)], device="cpu")
            wp.launch(kernels.add_rows, dim=(a.shape[0], 5), inputs=[wp.from_torch(a), wp.from_torch(bias), 3],
                      outputs=[wp.from_torch(out)], device="cpu")
        return y, out

    with leapp.trace("mockdyn", save_path=str(tmp_path)) as session:
        node(torch.randn(16, 3), torch.randn(16, 5))
        node(torch.randn(16, 3), torch.randn(16, 5))
    data = build_exportable(session.record.nodes["mockdyn"]).segments[0].bundle
    manifest = read_bundle(data).manifest
    assert manifest["batch"] == {"traced": 16, "min": 1, "max": 64}
    sig_in, sig_out = manifest["signature"]["inputs"], manifest["signature"]["outputs"]
    bundle = _native.Bundle(data)
    s = stream(0)
    for n in (1, 7, 16, 64, 3):
        rng = np.random.default_rng(n)
        values = {(16, 3): rng.standard_normal((n, 3)).astype(np.float32),
                  (16, 5): rng.standard_normal((n, 5)).astype(np.float32),
                  (5,): np.arange(5, dtype=np.float32), (1,): np.zeros(1, np.int32)}
        ins = [values[tuple(e["shape"])] for e in sig_in]
        outs = [np.full([n if "batch_rule" in e else e["shape"][0]] + e["shape"][1:], -7,
                        np.int32 if e["dtype"] == "int32" else np.float32) for e in sig_out]
        _native.run_segment(bundle, [ptr(a) for a in ins], [ptr(a) for a in outs], s, 0,
                            input_nbytes=[a.nbytes for a in ins], output_nbytes=[a.nbytes for a in outs])
        got = {tuple(e["shape"]): o for e, o in zip(sig_out, outs)}
        np.testing.assert_allclose(got[(16, 3)], 2.0 * values[(16, 3)] + np.array([1, 2, 3], np.float32), rtol=1e-6)
        np.testing.assert_allclose(got[(16, 5)], values[(16, 5)] + np.arange(5, dtype=np.float32) * 3, rtol=1e-6)
        assert got[(1,)][0] == n  # one atomic add per thread: the launch ran exactly n threads
    with pytest.raises(ValueError, match=r"mockdyn/warp_segment_0.*has 65 rows.*1\.\.64"):
        big = [np.zeros((65,) + tuple(e["shape"][1:]), np.float32) if "batch_rule" in e else
               np.zeros(e["shape"], np.float32 if e["dtype"] == "float32" else np.int32) for e in sig_in]
        _native.run_segment(bundle, [ptr(a) for a in big], [ptr(a) for a in big[:len(sig_out)]], s, 0,
                            input_nbytes=[a.nbytes for a in big], output_nbytes=[1] * len(sig_out))
