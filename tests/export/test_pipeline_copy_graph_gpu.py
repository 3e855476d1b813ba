"""GPU: a plain ``leapp.load`` call of a two-node pipeline replayed as one CUDA graph (the pipeline's PlainCallGraphs).

The pipeline: ``obs`` (PT2, two example Warp segments between torch ops) feeds ``act`` (ONNX on ONNX
Runtime's CUDA EP, one segment). A plain call copies its inputs into the graph's buffers, replays
every node with one graph launch and clones the outputs, so the plain call's contract must hold:
any input tensors, fresh outputs, results equal to what the nodes compute, stream order without a
host wait, threads on their own streams (also mixed with ``run_node`` of the ONNX node, whose own
graph bakes in the same ONNX Runtime buffers), calls inside an outer capture, ``release_segments``,
no device allocation per call. ``LEAPP_PIPELINE_GRAPH=0`` runs node by node. The last test checks the
``cuda_graphs=True`` whole-pipeline graph's ordering with the same pipeline.

Needs onnxruntime-gpu and onnxscript; skipped with the reason otherwise.
"""

from __future__ import annotations

import threading

import pytest
import torch
from test_onnx_cuda_ep_load import assert_no_device_allocation, call_behind_a_sleep, replay_outer_capture

import compile_records as cr
import leapp
from leapp._export.compile import compile_session
from leapp.runtime import libraries, release_segments
from leapp.runtime.cuda_graphs import IN_PLACE_GRAPHS_ENV
from leapp.runtime.pipeline import PIPELINE_GRAPH_ENV

ort = pytest.importorskip("onnxruntime")

pytestmark = [pytest.mark.cuda, pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")]

N = 2048


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    """obs (PT2, 2 segments) -> act (ONNX, 1 segment), recorded on cuda:0 and validated."""
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip(f"onnxruntime {ort.__version__} has no CUDAExecutionProvider (onnxruntime-gpu is not installed)")
    for backend in ("onnx", "pt2"):
        if not libraries.library_path(backend).is_file():
            pytest.skip(f"the {backend} op library is not built")
    pytest.importorskip("onnxscript", reason="onnxscript is not installed (torch.onnx.export(dynamo=True) needs it)")
    folder = tmp_path_factory.mktemp("plain_graphs")
    obs = cr.segment_node("obs", "pt2", n=N, segments=2, device="cuda", samples=2)
    act = cr.segment_node("act", "onnx", n=N, segments=1, device="cuda", samples=2)
    report = compile_session(cr.session(folder, obs, act, edges=[("obs", "out", "act", "x")]),
                             bundles=cr.example_bundles)
    assert report["obs"].status == report["act"].status == "passed", str(report)
    return folder / "demo"


def expected(x: torch.Tensor) -> dict[str, torch.Tensor]:
    out, h = cr.expected_segment_outputs(x, 2)
    act_out, act_h = cr.expected_segment_outputs(out, 1)
    return {"obs_h": h, "act_out": act_out, "act_h": act_h}


def check(got: dict, x: torch.Tensor, what: str = "") -> None:
    want = expected(x)
    assert set(got) == set(want), list(got)
    for name, w in want.items():
        torch.testing.assert_close(got[name], w, rtol=1e-5, atol=1e-5, msg=lambda m, n=name: f"{what} {n}: {m}")


def outputs_by_role(pipeline, out: dict) -> dict[str, torch.Tensor]:
    """The pipeline's outputs keyed '<node>_<output>' (the export names them by its own rules)."""
    return {f"{node}_{output}": out[key] for key, (node, output) in pipeline.output_sources.items()}


def check_threads(pipeline, calls, threads: int = 3) -> None:
    """Runs ``calls(seed, generator) -> [(kind, x, outputs)]`` in ``threads`` threads, each on a stream of its own,
    then checks every call's outputs: the pipeline's (kind "pipeline") or the ONNX node's alone ("act")."""
    results: dict[int, list] = {}
    errors: list[str] = []

    def worker(seed: int) -> None:
        try:
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                results[seed] = calls(seed, torch.Generator(device="cuda").manual_seed(seed))
            stream.synchronize()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(f"thread {seed}: {e!r}")

    workers = [threading.Thread(target=worker, args=(seed,)) for seed in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    assert not errors, errors
    torch.cuda.synchronize()
    for seed, done in results.items():
        for i, (kind, x, out) in enumerate(done):
            if kind == "pipeline":
                check(outputs_by_role(pipeline, out), x, f"thread {seed} call {i}")
            else:
                for got, want in zip((out["out"], out["h"]), cr.expected_segment_outputs(x, 1)):
                    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def loaded(two_nodes, x: torch.Tensor):
    """A fresh load whose plain-call graph is captured: call 1 runs node by node, call 2 captures a graph reading
    ``x`` in place, call 3 replays it."""
    pipeline = leapp.load(two_nodes)
    assert pipeline.plain_graphs is not None, pipeline.plain_graphs_reason
    for _ in range(3):
        pipeline(x=x)
    assert pipeline.plain_graphs.captures == 1 and list(pipeline.plain_graphs._in_place) == [(x.data_ptr(),)]
    return pipeline


def static_outputs(graph) -> set[int]:
    """The addresses of every static output of a PlainCallGraphs's graphs (copy graph and in-place graphs)."""
    tensors = [*(graph._entry[3] if graph._entry else []), *(t for g in graph._in_place.values() for t in g[2])]
    return {t.data_ptr() for t in tensors}


def test_plain_calls_replay_one_graph_with_fresh_outputs(two_nodes):
    pipeline = loaded(two_nodes, torch.randn(N, device="cuda"))
    graph = pipeline.plain_graphs
    gen = torch.Generator(device="cuda").manual_seed(3)
    kept = []
    for i in range(6):
        x = torch.randn(N, device="cuda", generator=gen) * 10.0 ** (i - 3)  # a new tensor each call
        kept.append((x, pipeline(x=x)))
    torch.cuda.synchronize()
    assert graph.captures == 2 and graph._entry is not None  # new addresses: the copy graph took them
    static = static_outputs(graph)
    for i, (x, out) in enumerate(kept):  # each call's outputs still hold its own results
        assert not {t.data_ptr() for t in out.values()} & static
        check(outputs_by_role(pipeline, out), x, f"call {i}")
    x = torch.randn(N, device="cuda", generator=gen)
    assert_no_device_allocation(lambda: pipeline(x=x))


def test_a_repeated_input_tensor_is_read_in_place_with_its_new_values(two_nodes):
    """A control loop refilling one input buffer: its graph reads the buffer itself (no copy in), every call sees
    the values written before it, outputs stay fresh, and nothing is allocated on the device per call."""
    x = torch.randn(N, device="cuda")
    pipeline = loaded(two_nodes, x)
    graph = pipeline.plain_graphs
    gen = torch.Generator(device="cuda").manual_seed(4)
    kept = []
    for i in range(6):
        new = torch.randn(N, device="cuda", generator=gen) * 10.0 ** (i - 3)
        x.copy_(new)
        kept.append((new, pipeline(x=x)))
    torch.cuda.synchronize()
    static = static_outputs(graph)
    assert len({t.data_ptr() for _, out in kept for t in out.values()}) == 3 * len(kept)  # fresh, all of them
    for i, (new, out) in enumerate(kept):
        assert not {t.data_ptr() for t in out.values()} & static
        check(outputs_by_role(pipeline, out), new, f"call {i}")
    assert graph.captures == 1 and graph._entry is None  # no copy graph was needed
    assert_no_device_allocation(lambda: pipeline(x=x))


def test_in_place_graphs_are_bounded_and_other_buffers_take_the_copy_graph(two_nodes, monkeypatch):
    """LEAPP_IN_PLACE_GRAPHS (read at load) bounds the in-place graphs; a third buffer's calls copy into the copy
    graph's own, and calls alternating between all three stay right."""
    monkeypatch.setenv(IN_PLACE_GRAPHS_ENV, "2")
    pipeline = leapp.load(two_nodes)
    graph = pipeline.plain_graphs
    buffers = [torch.randn(N, device="cuda") for _ in range(3)]
    for x in buffers:
        for _ in range(3):
            pipeline(x=x)
    assert list(graph._in_place) == [(buffers[0].data_ptr(),), (buffers[1].data_ptr(),)]
    assert graph._entry is not None and graph.captures == 3
    gen = torch.Generator(device="cuda").manual_seed(6)
    kept = []
    for i in range(9):
        x = buffers[(2 * i) % 3]
        x.copy_(torch.randn(N, device="cuda", generator=gen))
        kept.append((x.clone(), pipeline(x=x)))
    torch.cuda.synchronize()
    for i, (x, out) in enumerate(kept):
        check(outputs_by_role(pipeline, out), x, f"call {i}")
    assert graph.captures == 3


def test_no_in_place_graphs_when_turned_off(two_nodes, monkeypatch):
    monkeypatch.setenv(IN_PLACE_GRAPHS_ENV, "0")
    pipeline = leapp.load(two_nodes)
    x = torch.randn(N, device="cuda")
    for _ in range(4):
        out = pipeline(x=x)
    torch.cuda.synchronize()
    check(outputs_by_role(pipeline, out), x)
    assert pipeline.plain_graphs._in_place == {} and pipeline.plain_graphs._entry is not None


def test_off_by_environment_runs_node_by_node(two_nodes, monkeypatch):
    monkeypatch.setenv(PIPELINE_GRAPH_ENV, "0")
    pipeline = leapp.load(two_nodes)
    assert pipeline.plain_graphs is None and pipeline.plain_graphs_reason == f"{PIPELINE_GRAPH_ENV}=0"
    assert pipeline.nodes["act"].runner.graph is not None  # the ONNX node keeps its own graph
    x = torch.randn(N, device="cuda")
    for _ in range(3):
        out = pipeline(x=x)
    torch.cuda.synchronize()
    check(outputs_by_role(pipeline, out), x)


def test_a_call_does_not_wait_on_the_host_and_follows_stream_order(two_nodes):
    side = torch.cuda.Stream()
    x = torch.zeros(N, device="cuda")
    with torch.cuda.stream(side):
        pipeline = loaded(two_nodes, x)
    new = torch.randn(N, device="cuda")
    out = call_behind_a_sleep(side, x, new, lambda: pipeline(x=x))
    check(outputs_by_role(pipeline, out), new)


def test_threads_mix_pipeline_calls_and_the_onnx_nodes_own_calls(two_nodes):
    """Both graphs bake in the ONNX session's buffers: calls of either, from threads on their own streams, are
    ordered one after the other on the device (one StreamOrder), so every result stays right."""
    pipeline = loaded(two_nodes, torch.randn(N, device="cuda"))

    def calls(seed: int, gen: torch.Generator) -> list:
        out = []
        for i in range(20):
            x = torch.randn(N, device="cuda", generator=gen)
            if (i + seed) % 3 == 0:
                out.append(("act", x, pipeline.run_node("act", x=x)))
            else:
                out.append(("pipeline", x, pipeline(x=x)))
        return out

    check_threads(pipeline, calls)
    assert pipeline.plain_graphs.captures == 2  # x's in-place graph (loaded), the copy graph for the threads' tensors


def test_a_call_inside_an_outer_capture_runs_node_by_node(two_nodes):
    static_x = torch.randn(N, device="cuda")
    pipeline = loaded(two_nodes, static_x)
    replay_outer_capture(lambda: pipeline(x=static_x), static_x,
                         lambda captured: check(outputs_by_role(pipeline, captured), static_x, "outer replay"))
    x = torch.randn(N, device="cuda")
    out = pipeline(x=x)
    torch.cuda.synchronize()
    check(outputs_by_role(pipeline, out), x, "after the outer capture")
    assert pipeline.plain_graphs.captures == 2  # x's address is new: the copy graph (loaded's first call warmed it up)


def test_release_segments_drops_the_graph_and_it_is_captured_again(two_nodes):
    pipeline = loaded(two_nodes, torch.randn(N, device="cuda"))
    torch.cuda.synchronize()
    assert release_segments() >= 1
    assert pipeline.plain_graphs._entry is None and pipeline.plain_graphs._in_place == {}
    kept = []  # new addresses every call
    for i in range(3):  # node by node, capture, replay: each prepares what release freed and stays right
        kept.append(torch.randn(N, device="cuda") * (i + 1))
        out = pipeline(x=kept[-1])
        torch.cuda.synchronize()
        check(outputs_by_role(pipeline, out), kept[-1], f"call {i} after release")
    assert pipeline.plain_graphs.captures == 2


def test_whole_pipeline_graph_serves_threads_and_run_node_on_their_own_streams(two_nodes):
    """cuda_graphs=True: each thread's input tensor gets its graph (captured on the pipeline's stream, replayed on
    the thread's); those graphs and the ONNX node's direct runs bake in one session's buffers and follow one
    StreamOrder, so results stay right while threads mix pipeline calls and run_node."""
    pipeline = leapp.load(two_nodes, cuda_graphs=True)
    assert pipeline.graph is not None, pipeline.graph_reason

    def calls(seed: int, gen: torch.Generator) -> list:
        out = []
        x = torch.empty(N, device="cuda")  # this thread's fixed input: its own graph
        for i in range(20):
            x.copy_(torch.randn(N, device="cuda", generator=gen))
            if (i + seed) % 4 == 0:
                out.append(("act", x.clone(), pipeline.run_node("act", x=x)))
            else:  # the graph's outputs are overwritten by this thread's next replay: cloned
                out.append(("pipeline", x.clone(), {k: v.clone() for k, v in pipeline(x=x).items()}))
        return out

    check_threads(pipeline, calls)
    assert pipeline.graph.captures == 3  # one per thread's input tensor
