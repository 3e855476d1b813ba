"""GPU: the AOTInductor package of a real Warp node (``leapp aoti``) equals eager on fresh inputs and replays in a CUDA graph.

One scenario of e2e_scenarios (float32[1000], two segments with torch work between them) is
traced on cuda:0, exported without validation (the comparisons below are the check) and
compiled once with ``leapp.aoti.package`` (the H200 took 79 s for a similar node, most of it
Inductor's cold caches). CPU CI covers the same route through the fake driver
(tests/runtime/test_aoti.py); this is the real driver, the real op library and Inductor's
CUDA code generation.
"""

from __future__ import annotations

import time

import pytest
import torch
import warp as wp

import e2e_scenarios as E
import leapp
from leapp._export.cuda_code import KNOWN_CUBIN_ARCHS
import leapp.aoti

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning", "ignore::UserWarning"),
]

DEVICE = "cuda:0"
CUBIN_ARCHS = set(KNOWN_CUBIN_ARCHS)  # LEAPP_CUDA_ARCHS may name any of them
SCENARIO = E.Scenario("float32", 1000, (E.SegmentPlan(("affine", "accumulate"), copy_out=True), E.SegmentPlan(("mix",))),
                      backend="pt2", seed=3)


@pytest.fixture(scope="module", autouse=True)
def _gpu():
    """Warp and torch on cuda:0; cubins for this GPU only (the runtime picks that one anyway), so the export is fast."""
    wp.init()
    if not wp.is_cuda_available() or not torch.cuda.is_available():
        pytest.skip("Warp or torch sees no CUDA device")
    major, minor = torch.cuda.get_device_capability(0)
    with pytest.MonkeyPatch.context() as mp:
        if major * 10 + minor in CUBIN_ARCHS:
            mp.setenv("LEAPP_CUDA_ARCHS", str(major * 10 + minor))
        yield


@pytest.fixture(scope="module")
def aoti_export(tmp_path_factory):
    """(eager step, export folder, package path, the node's output names in order)."""
    folder = tmp_path_factory.mktemp("aoti_gpu")
    step, report = E.trace_and_compile(SCENARIO, folder, DEVICE, validate=False)
    assert report.ok, str(report)
    export = folder / "e2e"
    start = time.perf_counter()
    path = leapp.aoti.package(export, "e2e")
    print(f"\nleapp.aoti.package: {time.perf_counter() - start:.1f} s, {path.stat().st_size} bytes, torch {torch.__version__}")
    names = [o.name for o in leapp.load(export).nodes["e2e"].outputs]
    return step, export, path, names


def _outputs(result) -> list[torch.Tensor]:
    return [result] if isinstance(result, torch.Tensor) else list(result)


def test_aoti_package_equals_eager_on_fresh_inputs(aoti_export):
    step, export, path, names = aoti_export
    model = torch._inductor.aoti_load_package(str(path))
    pipeline = leapp.load(export)
    for k in (100, 101):  # inputs never seen while tracing
        x = E.make_input(SCENARIO, SCENARIO.seed * 10 + k, DEVICE)
        want = step(x)
        loaded = pipeline.run_node("e2e", x=x)
        got = _outputs(model(x))
        assert len(got) == len(names), (len(got), names)
        for name, tensor in zip(names, got):
            assert tensor.device == x.device, (name, tensor.device)
            E.assert_same(tensor, want[name], f"AOTInductor output '{name}' on input {k} vs eager")
            E.assert_same(tensor, loaded[name], f"AOTInductor output '{name}' on input {k} vs leapp.load")


def test_aoti_package_replays_inside_a_cuda_graph(aoti_export):
    """``run_single_threaded=True``: torch's multi-runner loader waits on events between calls, which a capture refuses."""
    step, _, path, names = aoti_export
    model = torch._inductor.aoti_load_package(str(path), run_single_threaded=True)
    static_x = E.make_input(SCENARIO, 500, DEVICE)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up before capture: the op reads a GPU-resident bundle back once
        for _ in range(2):
            model(static_x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = _outputs(model(static_x))
    for k in (501, 502, 503):  # new values through the captured graph
        x = E.make_input(SCENARIO, k, DEVICE)
        static_x.copy_(x)
        graph.replay()
        torch.cuda.synchronize()
        want = step(x)
        for name, got in zip(names, static_out):
            E.assert_same(got, want[name], f"graph replay with input {k}, output '{name}'")
