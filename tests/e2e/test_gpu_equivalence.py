"""Exported == eager, property-based (hypothesis draws the inputs), plus CUDA graph capture and stream order.

Each example traces a scenario of e2e_scenarios on cuda:0 (pass 1, pass 2,
one more sample), compiles it with validate=True (the real runtime runs the
recorded samples), then compares the export with eager Warp on new inputs
through leapp's public test helper, leapp.testing.assert_equivalent (routes
'load' and 'load-cuda-graphs': fixed input tensors refilled, as a control
loop does). Outputs are compared on the CPU.

On a machine without a GPU the equivalence property runs on the CPU instead (the scenarios traced on the
CPU, their segments exported with CPU code, docs/export-cpu.md); the GPU test machine's Warp cannot build
CPU kernels, so there it is CUDA only. All kernels live in e2e_scenarios (compiled once per process).
"""

from __future__ import annotations

import gc

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import e2e_scenarios as E
from warp_devices import warp_device
import leapp
from leapp import _native
from leapp._export.cuda_code import KNOWN_CUBIN_ARCHS
from leapp.pipeline_format import read_pipeline
from leapp.runtime.runners import load_pt2
from leapp.runtime.cuda_graphs import CudaGraphCall
from leapp.runtime.pt2_program import Pt2Program
from leapp.testing import assert_equivalent

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning", "ignore::UserWarning"),
]

DEVICE = "cuda:0"
CUBIN_ARCHS = set(KNOWN_CUBIN_ARCHS)  # LEAPP_CUDA_ARCHS may name any of them


@pytest.fixture(scope="module", autouse=True)
def _gpu():
    """Warp and torch on cuda:0; cubins for this GPU only (the runtime picks that one anyway), so exports are fast.
    Without a GPU only the cpu_fallback test runs here (the others are skipped before this fixture)."""
    if warp_device() == "cpu":
        yield
        return
    major, minor = torch.cuda.get_device_capability(0)
    with pytest.MonkeyPatch.context() as mp:
        if major * 10 + minor in CUBIN_ARCHS:
            mp.setenv("LEAPP_CUDA_ARCHS", str(major * 10 + minor))
        yield


def _outputs(result) -> list[torch.Tensor]:
    return [result] if isinstance(result, torch.Tensor) else list(result)


# --- exported == eager --------------------------------------------------------------------------------

segment_plans = st.builds(
    E.SegmentPlan, st.lists(st.sampled_from(E.LAUNCHES), min_size=1, max_size=3).map(tuple), st.booleans()
)
scenarios = st.builds(
    E.Scenario,
    dtype=st.sampled_from(E.DTYPES),
    n=st.one_of(st.sampled_from([1, 2, 255, 256, 257, 1000, 4097]), st.integers(1, 70_000)),
    segments=st.lists(segment_plans, min_size=1, max_size=2).map(tuple),
    backend=st.sampled_from(["pt2", "onnx"]),
    seed=st.integers(0, 2**16),
    scale=st.sampled_from([0.01, 1.0, 100.0]),
)
RICH = (E.SegmentPlan(("affine", "accumulate", "twist"), copy_out=True), E.SegmentPlan(("mix",)))


# 16 drawn scenarios on the GPU; 6 on the CPU fallback, where each one compiles CPU code for every segment and the
# CI machine (2 cores, budgeted time) runs it: the explicit @examples below run on both.
EXAMPLES = 16 if torch.cuda.is_available() else 6


@pytest.mark.cpu_fallback
@settings(max_examples=EXAMPLES, suppress_health_check=[HealthCheck.nested_given])  # assert_equivalent is a @given
@example(s=E.Scenario("uint8", 1, (E.SegmentPlan(("affine",)),), backend="onnx"))
@example(s=E.Scenario("mat33", 257, RICH, backend="pt2", seed=3, scale=2.0))
@example(s=E.Scenario("float16", 1000, (E.SegmentPlan(("twist", "accumulate"), True), E.SegmentPlan(("mix", "affine"))),
                      backend="onnx", seed=4, scale=100.0))
@example(s=E.Scenario("int64", 4097, RICH, backend="pt2", seed=5))
@given(s=scenarios)
def test_exported_equals_eager(tmp_path_factory, s):
    device = warp_device()
    folder = tmp_path_factory.mktemp("gpu")
    step, report = E.trace_and_compile(s, folder, device, validate=True)
    assert report["e2e"].status == "passed", f"{s.describe()}\n{report}"
    assert sorted(o["name"] for o in read_pipeline(folder / "e2e")[1]["outputs"]) == sorted(s.output_names)
    # Inputs never seen while tracing (the scenario's own values and scale); E.assert_same's tolerances.
    new_inputs = st.integers(100, 10_000).map(lambda k: {"x": E.make_input(s, s.seed * 10 + k, device)})
    result = assert_equivalent(step, folder / "e2e", new_inputs, rtol=1e-5, atol=1e-6, max_examples=3,
                               routes=["load", "load-cuda-graphs"])
    # ONNX nodes are never graphed, so for them 'load-cuda-graphs' is skipped as the same as 'load' (and on the
    # CPU it changes nothing for any node).
    graphed = s.backend == "pt2" and device != "cpu"
    assert result.ran == (("load", "load-cuda-graphs") if graphed else ("load",)), f"{s.describe()}: {result}"


# --- the PT2 op inside CUDA graphs and on the caller's stream --------------------------------------

GRAPH_SCENARIO = E.Scenario("vec3", 1000, RICH, backend="pt2", seed=7)


@pytest.fixture(scope="module")
def pt2_export(tmp_path_factory):
    """(eager step, the PT2 file, its output names in order) for GRAPH_SCENARIO."""
    folder = tmp_path_factory.mktemp("graph")
    step, report = E.trace_and_compile(GRAPH_SCENARIO, folder, DEVICE, validate=True)
    assert report.ok, str(report)
    names = [o.name for o in leapp.load(folder / "e2e").nodes["e2e"].outputs]
    return step, folder / "e2e" / "e2e.pt2", names


@pytest.fixture(params=["module", "direct", "cuda-graphs"])
def pt2_program(pt2_export, request):
    """(eager step, a callable of the loaded PT2 program, output names): torch's ``.module()`` wrapper,
    leapp's direct graph call (``Pt2Program``, what leapp.load runs), or that call replayed from
    captured CUDA graphs (``leapp.load(..., cuda_graphs=True)``)."""
    step, path, names = pt2_export
    program = load_pt2(path)
    if request.param == "module":
        return step, program.module(), names
    direct = Pt2Program(program)
    assert direct.direct, direct.reason
    if request.param == "cuda-graphs":
        return step, CudaGraphCall(direct, "e2e"), names
    return step, direct, names


def test_pt2_op_replays_inside_a_cuda_graph(pt2_program):
    step, module, names = pt2_program
    s = GRAPH_SCENARIO
    static_x = E.make_input(s, 500, DEVICE)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up, as torch.cuda.graph's documentation asks
        for _ in range(2):
            module(static_x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = _outputs(module(static_x))
    for k in (501, 502, 503):  # new values through the captured graph
        x = E.make_input(s, k, DEVICE)
        static_x.copy_(x)
        graph.replay()
        torch.cuda.synchronize()
        want = step(x)
        for name, got in zip(names, static_out):
            E.assert_same(got, want[name], f"graph replay with input {k}, output '{name}'")


def test_pt2_op_runs_on_the_current_stream(pt2_program):
    step, module, names = pt2_program
    s = GRAPH_SCENARIO
    x = E.make_input(s, 600, DEVICE)
    want = step(x)
    staged = torch.zeros_like(x)
    side = torch.cuda.Stream()  # torch's streams are non-blocking: nothing orders them with other streams
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        module(staged)  # warm-up on this stream (its scratch is allocated here)
        torch.cuda._sleep(50_000_000)  # keep `side` busy (tens of ms) ...
        staged.copy_(x)  # ... so only work ordered after this copy on `side` reads x
        out = _outputs(module(staged))
        again = _outputs(module(staged))
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    for name, got, got2 in zip(names, out, again):
        E.assert_same(got, want[name], f"side-stream call, output '{name}'")
        E.assert_same(got2, want[name], f"second side-stream call, output '{name}'")


def test_calls_on_a_warm_stream_take_no_device_memory(pt2_program):
    """Seen from outside whichever library serves the op: free device memory and torch's cudaMalloc count.

    (leapp._native.allocation_count() counts only leapp._native's own replays, so it is checked too
    when the op is served by the Python kernels, which replay through leapp._native.)
    """
    _, module, _ = pt2_program
    from leapp.runtime import ops

    x = E.make_input(GRAPH_SCENARIO, 700, DEVICE)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            module(x)  # warm-up: scratch for this stream, torch's cached blocks for the outputs
        gc.collect()  # earlier tests' Warp arrays are freed now, not inside the measured window
        torch.cuda.synchronize()
        free, native, stats = torch.cuda.mem_get_info(0)[0], _native.allocation_count(), torch.cuda.memory_stats(0)
        for _ in range(300):  # a per-call allocation of even a few KB would add up to megabytes here
            module(x)
        torch.cuda.synchronize()
    assert torch.cuda.memory_stats(0)["num_device_alloc"] == stats["num_device_alloc"], "torch called cudaMalloc"
    # (memory pools may hand memory back at a synchronisation, so more free memory is fine)
    assert torch.cuda.mem_get_info(0)[0] >= free, "free device memory shrank over 300 warm calls"
    if not ops.native_library_loaded():
        assert _native.allocation_count() == native, "leapp._native allocated during warm calls"
