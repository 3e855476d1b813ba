"""Segment replay as one CUDA graph on a GPU (marked `cuda`): every path of the graph cache gives eager results.

The runtime replays a segment of two or more enqueues as one graph launch per
(stream, input and output addresses); these tests drive each path of that
cache with real Warp kernels (two launches and a zero init) and compare every
call with torch: repeated addresses (hits), more address sets than the cache
keeps (in-place updates), ever-changing addresses (op by op for a while), a
caller's torch.cuda.graph capture, threads sharing one stream, and graphs
switched off (LEAPP_SEGMENT_GRAPHS=0, in a child process).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from cuda_bundles import WARP_K, WARP_OFFSET, WARP_SCALE, compile_warp_module, warp_bundle

from leapp import _native

pytestmark = pytest.mark.cuda
N, ROWS, COLS = 5000, 33, 65


@pytest.fixture(scope="module")
def raw(tmp_path_factory) -> bytes:
    pytest.importorskip("warp", reason="compiling Warp kernels needs warp-lang")
    return warp_bundle(compile_warp_module(tmp_path_factory.mktemp("graphs_aot")), N, ROWS, COLS)


@pytest.fixture(scope="module")
def bundle(raw):
    return _native.Bundle(raw)


def inputs(dev, seed: int):
    g = torch.Generator(device=dev).manual_seed(seed)
    return [torch.randn(N, 3, device=dev, generator=g), torch.randn(ROWS, COLS, device=dev, generator=g),
            torch.randn(COLS, device=dev, generator=g)]


def outputs(dev):
    return [torch.full((N, 3), float("nan"), device=dev), torch.full((1,), -7, dtype=torch.int32, device=dev),
            torch.full((ROWS, COLS), float("nan"), device=dev)]


def run(bundle, ins, outs, stream=None):
    stream = torch.cuda.current_stream().cuda_stream if stream is None else stream
    _native.run_segment(bundle, [t.data_ptr() for t in ins], [t.data_ptr() for t in outs], stream,
                        ins[0].device.index, input_nbytes=[t.nbytes for t in ins], output_nbytes=[t.nbytes for t in outs])


def check(ins, outs):
    x, a, bias = ins
    # torch rounds a * b + c twice where the kernel may fuse it: float32 tolerances, as for any kernel
    torch.testing.assert_close(outs[0], WARP_SCALE * x + torch.tensor(WARP_OFFSET, device=x.device))
    assert outs[1].item() == N  # the zero init ran before the launch, every call
    torch.testing.assert_close(outs[2], a + bias * WARP_K)


def test_hits_updates_and_changing_addresses_all_equal_torch(dev, bundle):
    ins = inputs(dev, 1)
    kept = [outputs(dev) for _ in range(12)]  # more address sets than the 8 graphs kept per stream
    for rnd in range(3):
        for outs in kept:
            for t in outs:
                t.fill_(-1)
            run(bundle, ins, outs)
            torch.cuda.synchronize()
            check(ins, outs)
    for i in range(60):  # new addresses every call: op by op after a streak of misses, graphs again after
        ins = inputs(dev, 100 + i)
        outs = outputs(dev)
        run(bundle, ins, outs)
        torch.cuda.synchronize()
        check(ins, outs)


def test_input_contents_change_under_one_graph(dev, bundle):
    ins, outs = inputs(dev, 2), outputs(dev)
    for seed in range(5):
        fresh = inputs(dev, 200 + seed)
        for t, f in zip(ins, fresh):
            t.copy_(f)  # same addresses, new values: the same graph reads them
        run(bundle, ins, outs)
        torch.cuda.synchronize()
        check(ins, outs)


def test_inside_a_callers_capture(dev, bundle):
    ins, outs = inputs(dev, 3), outputs(dev)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        run(bundle, ins, outs)  # warm (and a graph of ours for these addresses on this stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run(bundle, ins, outs)
    for seed in range(3):
        for t, f in zip(ins, inputs(dev, 300 + seed)):
            t.copy_(f)
        for t in outs:
            t.fill_(-1)
        graph.replay()
        torch.cuda.synchronize()
        check(ins, outs)


def test_threads_sharing_one_stream(dev, bundle):
    stream = torch.cuda.Stream()
    failures = []

    def worker(seed):
        torch.cuda.set_device(dev)
        ins = inputs(dev, 400 + seed)
        sets = [outputs(dev) for _ in range(3)]
        try:
            for i in range(40):
                outs = sets[i % 3]
                with torch.cuda.stream(stream):
                    run(bundle, ins, outs, stream.cuda_stream)
                stream.synchronize()
                check(ins, outs)
        except AssertionError as e:
            failures.append((seed, str(e)[:300]))

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


def test_graphs_off_gives_the_same_bytes(dev, raw, bundle, tmp_path):
    """A child process with LEAPP_SEGMENT_GRAPHS=0 replays op by op; its outputs equal this process's."""
    ins, outs = inputs(dev, 5), outputs(dev)
    run(bundle, ins, outs)
    torch.cuda.synchronize()
    torch.save({"bundle": raw, "ins": [t.cpu() for t in ins]}, tmp_path / "case.pt")
    code = (
        "import sys, torch\n"
        "from leapp import _native\n"
        "case = torch.load(sys.argv[1])\n"
        "b = _native.Bundle(case['bundle'])\n"
        "ins = [t.cuda() for t in case['ins']]\n"
        f"outs = [torch.empty({N}, 3, device='cuda'), torch.empty(1, dtype=torch.int32, device='cuda'),"
        f" torch.empty({ROWS}, {COLS}, device='cuda')]\n"
        "for _ in range(3):\n"
        "    _native.run_segment(b, [t.data_ptr() for t in ins], [t.data_ptr() for t in outs],"
        " torch.cuda.current_stream().cuda_stream, 0, input_nbytes=[t.nbytes for t in ins],"
        " output_nbytes=[t.nbytes for t in outs])\n"
        "torch.cuda.synchronize(); torch.save([t.cpu() for t in outs], sys.argv[2])\n"
    )
    env = dict(os.environ, LEAPP_SEGMENT_GRAPHS="0")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "case.pt"), str(tmp_path / "out.pt")],
                          env=env, capture_output=True, text=True, timeout=300, cwd=Path(__file__).parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    theirs = torch.load(tmp_path / "out.pt")
    for mine, other in zip(outs, theirs):
        assert torch.equal(mine.cpu(), other)
