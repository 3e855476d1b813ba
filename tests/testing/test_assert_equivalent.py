"""leapp.testing.assert_equivalent on the CPU: passing exports, a changed constant caught and localised,
counterexample files that replay, routes chosen and skipped with reasons, hypothesis settings respected.

The pure-torch export (pre.pt2 + post.onnx) is made once per module; examples are few and cheap.
"""

from __future__ import annotations

import time
import unittest
from datetime import timedelta
from pathlib import Path

import hypothesis
import pytest
import torch
from hypothesis import strategies as st

import leapp
import testing_pipelines as P
from leapp.pipeline_format import PipelineError
from leapp.testing import (
    ROUTES,
    NoRunnableRoute,
    RouteSkippedWarning,
    assert_equivalent,
    input_strategy,
    replay_counterexample,
)
from leapp.testing.cpp_runner import leapp_run_path
from leapp._export.validate import cuda_problem

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")

NO_CUDA = cuda_problem() is not None


@pytest.fixture(scope="module")
def torch_export(tmp_path_factory) -> Path:
    return P.export_torch_pipeline(tmp_path_factory.mktemp("torchpipe"))


def test_pure_torch_export_passes(torch_export):
    result = assert_equivalent(P.step, torch_export, max_examples=15)
    assert result.export == "torchpipe" and result.examples == 15
    assert "load" in result.ran
    assert set(result.ran) | set(result.skipped) == set(ROUTES)
    assert all(result.skipped.values()), "every skipped route has a reason"
    assert "PT2 node 'pre' has no AOTInductor package" in result.skipped["cpp-runner"]
    if NO_CUDA:
        assert result.ran == ("load",)
        assert "runs exactly what route 'load' runs" in result.skipped["onnx-cpu-ep"]
        assert "CUDA" in result.skipped["onnx-cuda-ep"]
        assert "no PT2 node was exported on CUDA" in result.skipped["load-cuda-graphs"]


@pytest.fixture(scope="module")
def onnx_export(tmp_path_factory) -> Path:
    return P.export_torch_pipeline(tmp_path_factory.mktemp("onnxpipe"), "onnxpipe", P.onnx_step)


needs_leapp_run = pytest.mark.skipif(leapp_run_path() is None, reason="leapp-run was not built: ONNX Runtime's "
                                     "headers were missing (bash scripts/fetch-ort-headers.sh, then pip install -e .)")


@needs_leapp_run
def test_the_cpp_runner_route_runs_leapp_run(onnx_export):
    """All-ONNX export: leapp-run runs it in a child process, on host buffers and the CPU EP here."""
    result = assert_equivalent(P.onnx_step, onnx_export, routes=["load", "cpp-runner"], max_examples=6)
    assert result.ran == ("load", "cpp-runner") and result.examples == 6


@needs_leapp_run
def test_the_cpp_runner_route_catches_and_localises_a_change(onnx_export, tmp_path):
    with pytest.raises(AssertionError) as caught:
        # no shrinking: each shrink step is another leapp-run process, and localisation is what is checked here
        assert_equivalent(P.onnx_step_off, onnx_export, routes=["cpp-runner"], counterexample_dir=tmp_path,
                          settings=hypothesis.settings(max_examples=5, phases=[hypothesis.Phase.generate],
                                                       deadline=None))
    text = str(caught.value)
    assert "route 'cpp-runner'" in text, text
    assert "post (onnx, post.onnx): FIRST DIVERGING NODE" in text and "pre (onnx, pre.onnx): matches" in text, text


@needs_leapp_run
def test_the_cpp_runner_checks_inputs_like_leapp_load(onnx_export):
    from leapp.pipeline_format import read_pipeline
    from leapp.testing.cpp_runner import LeappRunPipeline

    runner = LeappRunPipeline(*read_pipeline(onnx_export))
    x, y = torch.randn(P.N, 3), torch.randn(P.N, 3)
    torch.testing.assert_close(runner.run(x=x, y=y)["output"], P.onnx_step(x, y))
    with pytest.raises(PipelineError, match=r"pipeline 'onnxpipe': input 'y' expects float32\[8, 3\], got float64\[8, 3\]"):
        runner.run(x=x, y=y.double())
    with pytest.raises(PipelineError, match=r"pipeline 'onnxpipe': no node 'nope' \(nodes: \['pre', 'post'\]\)"):
        runner.run_node("nope", z=x)


def test_a_changed_constant_is_caught_localised_and_replayed(torch_export, tmp_path):
    """step_off multiplies by 0.55 in node 'post' where the export has 0.5."""
    folder = tmp_path / "cx"
    with pytest.raises(AssertionError) as caught:
        assert_equivalent(P.step_off, torch_export, max_examples=20, counterexample_dir=folder)
    text = str(caught.value)
    assert "export 'torchpipe'" in text and "differs from eager step_off on route 'load'" in text
    assert "output 'output': max abs error" in text and "max rel error" in text
    assert "pre (pt2, pre.pt2): matches" in text
    assert "post (onnx, post.onnx): FIRST DIVERGING NODE" in text
    assert "=> node 'post' (traced at " in text and "testing_pipelines.py" in text
    assert "x: float32[8, 3] on cpu" in text and "y: float32[8, 3] on cpu" in text
    files = list(folder.iterdir())
    assert len(files) == 1 and files[0].name.startswith("torchpipe-") and files[0].suffix == ".pt"
    assert f"saved to {files[0]}" in text

    with pytest.raises(AssertionError) as replayed:
        replay_counterexample(files[0], P.step_off, torch_export)
    assert str(replayed.value) == text, "the file reproduces the same failure"
    fixed = replay_counterexample(files[0], P.step, torch_export)  # the eager code fixed: it passes
    assert "load" in fixed.ran and fixed.examples == 1


def _step_with_work_between_nodes(x, y):
    return P.post(P.pre(x, y) + 0.25)  # the + 0.25 is outside any node: not in the export


def test_eager_work_outside_nodes_is_reported(torch_export, tmp_path):
    with pytest.raises(AssertionError) as caught:
        assert_equivalent(_step_with_work_between_nodes, torch_export, max_examples=10, counterexample_dir=tmp_path)
    text = str(caught.value)
    assert "pre (pt2, pre.pt2): matches" in text and "post (onnx, post.onnx): matches" in text
    assert "FIRST DIVERGING NODE" not in text
    assert "eager work outside leapp.node (not exported) changes values between nodes:" in text
    assert "node 'pre' output 'output' -> node 'post' input 'z'" in text


def _step_returning_a_dict(x, y):
    return {"output": P.step(x, y)}


def test_fn_may_return_a_dict_by_output_name_and_wrong_results_are_named(torch_export):
    assert assert_equivalent(_step_returning_a_dict, torch_export, max_examples=3).examples == 3
    with pytest.raises(ValueError, match=r"returned a dict with keys \['out'\]; the export's outputs are \['output'\]"):
        assert_equivalent(lambda x, y: {"out": P.step(x, y)}, torch_export, max_examples=2)


def test_routes_narrow_and_unknown_routes_are_refused(torch_export):
    result = assert_equivalent(P.step, torch_export, routes=["onnx-cpu-ep"], max_examples=3)
    assert result.ran == ("onnx-cpu-ep",) and result.skipped == {}
    with pytest.raises(ValueError, match=r"unknown route\(s\) \['onnx'\]; the routes are \['load', 'load-cuda-graphs', "
                                         r"'onnx-cpu-ep', 'onnx-cuda-ep', 'cpp-runner'\]"):
        assert_equivalent(P.step, torch_export, routes=["onnx"])


def test_a_named_route_that_cannot_run_is_warned_about(torch_export):
    with pytest.warns(RouteSkippedWarning, match=r"'cpp-runner': .*PT2 node 'pre' has no AOTInductor package"):
        result = assert_equivalent(P.step, torch_export, routes=["load", "cpp-runner"], max_examples=2)
    assert result.ran == ("load",)


def test_no_runnable_route_is_a_skip_with_every_reason(torch_export):
    with pytest.raises(NoRunnableRoute) as caught:
        assert_equivalent(P.step, torch_export, routes=["cpp-runner"])
    assert isinstance(caught.value, unittest.SkipTest), "pytest reports it as a skip"
    assert "no route can run export 'torchpipe'" in str(caught.value)
    assert "cpp-runner: " in str(caught.value) and "`leapp aoti EXPORT_DIR pre` makes it" in str(caught.value)


@pytest.mark.skipif(not NO_CUDA, reason="checks Warp exports without a GPU; with one they run on CUDA "
                                        "(tests/testing/test_go2_routes.py)")
def test_warp_pipeline_without_a_gpu_runs_from_its_cpu_code(tmp_path):
    """A Warp export traced on the CPU carries its segments' CPU code: the 'load' route runs here (issue 36)."""
    result = assert_equivalent(P.warp_step, P.export_warp_pipeline(tmp_path), max_examples=5)
    assert result.ran == ("load",), result
    assert "cuda_graphs=True changes nothing" in result.skipped["load-cuda-graphs"]


@pytest.mark.skipif(not NO_CUDA, reason="checks the skip without a GPU; with one, Warp exports run "
                                        "(tests/testing/test_go2_routes.py)")
def test_warp_pipeline_without_cpu_code_or_gpu_is_skipped_with_reasons(tmp_path, monkeypatch):
    monkeypatch.setenv("LEAPP_CPU_CODE", "0")
    export = P.export_warp_pipeline(tmp_path)
    with pytest.raises(NoRunnableRoute) as caught:
        assert_equivalent(P.warp_step, export)
    text = str(caught.value)
    lines = dict(line.strip().split(": ", 1) for line in text.splitlines()[1:])
    assert list(lines) == list(ROUTES)
    assert "shifted/warp_segment_0" in lines["load"] and "captured on the CPU and hold no CPU code" in lines["load"]
    assert "CUDA is needed for Warp segment(s)" in lines["load"] and "no CUDA" in lines["load"]
    assert "cuda_graphs=True changes nothing" in lines["load-cuda-graphs"]
    assert lines["onnx-cpu-ep"] == lines["onnx-cuda-ep"] == "the export has no ONNX node"


def test_max_examples_and_the_active_profile(torch_export):
    """``settings=`` (or the active profile) is used as is; ``max_examples`` overrides only that."""
    result = assert_equivalent(P.step, torch_export, settings=hypothesis.settings(max_examples=4))
    assert result.examples == 4
    result = assert_equivalent(P.step, torch_export, settings=hypothesis.settings(max_examples=4), max_examples=2)
    assert result.examples == 2


def _slow_step(x, y):
    time.sleep(0.25)  # longer than hypothesis's default deadline (200 ms)
    return P.step(x, y)


def test_a_deadline_the_user_set_is_kept_the_default_one_dropped(torch_export):
    strict = hypothesis.settings(max_examples=2, deadline=timedelta(milliseconds=100), database=None,
                                 phases=[hypothesis.Phase.generate])  # no shrinking of 0.25 s examples
    with pytest.raises((hypothesis.errors.DeadlineExceeded, hypothesis.errors.FlakyFailure)):
        assert_equivalent(_slow_step, torch_export, settings=strict)
    default_deadline = hypothesis.settings(max_examples=2, deadline=timedelta(milliseconds=200), database=None)
    assert assert_equivalent(_slow_step, torch_export, settings=default_deadline).examples == 2


def test_custom_inputs_strategy(torch_export):
    seen = []

    def recording_step(x, y):
        seen.append(float(x.abs().max()))
        return P.step(x, y)

    strategy = input_strategy(torch_export, x=st.just(torch.full((P.N, 3), 0.5)))
    assert assert_equivalent(recording_step, torch_export, strategy, max_examples=3).examples == 3
    assert seen and all(v == 0.5 for v in seen)
    with pytest.raises(TypeError, match="inputs must be a hypothesis strategy"):
        assert_equivalent(P.step, torch_export, {"x": torch.zeros(P.N, 3)})


def test_not_inside_a_trace(torch_export, tmp_path):
    with leapp.trace("inside", save_path=str(tmp_path)):
        with pytest.raises(RuntimeError, match="called inside leapp.trace"):
            assert_equivalent(P.step, torch_export)


def test_load_takes_an_onnx_execution_provider(torch_export):
    from leapp.runtime.pipeline import load

    pipeline = load(torch_export, onnx_ep="cpu")
    assert pipeline.nodes["post"].runner.session.get_providers() == ["CPUExecutionProvider"]
    x = torch.ones(P.N, 3)
    torch.testing.assert_close(pipeline(x=x, y=x)["output"], P.step(x, x))
    with pytest.raises(PipelineError, match=r"onnx_ep='gpu': expected None \(the node's device\), or one of "
                                            r"\['cpu', 'cuda'\]"):
        load(torch_export, onnx_ep="gpu")


def test_outputs_are_compared_by_shape_dtype_values_and_nan_positions():
    from leapp.testing.outputs import compare_output

    nan = float("nan")
    eager = torch.tensor([1.0, nan, 3.0])
    assert compare_output("o", torch.tensor([1.0, nan, 3.0005]), eager, rtol=1e-3, atol=0).ok
    moved = compare_output("o", torch.tensor([nan, 2.0, 3.0]), eager, rtol=1e-3, atol=0)
    assert not moved.ok and moved.max_abs == float("inf")
    assert "2 of 3 elements outside" in moved.detail and "first at index [0]: export nan, eager 1" in moved.detail
    assert "got float64[3], eager float32[3]" in compare_output("o", eager.double(), eager, 1, 1).describe()
    assert "got float32[1, 3], eager float32[3]" in compare_output("o", eager[None], eager, 1, 1).describe()
    ints = compare_output("i", torch.tensor([1, 2]), torch.tensor([1, 3]), rtol=1.0, atol=5.0)
    assert not ints.ok and "first at index [1]: export 2, eager 3" in ints.detail, "integers compare exactly"


def test_the_cuda_graphs_route_refills_fixed_inputs_and_copies_outputs(torch_export):
    """What the route does around leapp.load(cuda_graphs=True), checked on the CPU: the same input tensors
    every call (what lets a CUDA graph replay), three calls the first time, outputs copied out."""
    from leapp.runtime.pipeline import load
    from leapp.testing.routes import OpenRoute

    calls = []
    pipeline = load(torch_export)
    route = OpenRoute(ROUTES["load-cuda-graphs"], pipeline)
    original = pipeline.run
    pipeline.run = lambda **kw: calls.append({k: v for k, v in kw.items()}) or original(**kw)
    for value in (1.0, 2.0):
        x = torch.full((P.N, 3), value)
        out = route.run({"x": x, "y": x})
        torch.testing.assert_close(out["output"], P.step(x, x))
    assert len(calls) == 4, "direct call, capture, replay; then one replay"
    assert all(c["x"] is calls[0]["x"] and c["y"] is calls[0]["y"] for c in calls), "one fixed tensor per input"
    assert calls[0]["x"] is not calls[0]["y"]


def test_value_names_from_the_export_never_become_paths(tmp_path):
    """The cpp-runner route writes inputs and reads outputs named by pipeline.yaml (untrusted): one plain name only."""
    from leapp.testing.cpp_runner import value_file

    assert value_file(tmp_path, "quat") == tmp_path / "quat.bin"
    for name in ("", ".", "..", "../escape", "a/b", "/abs", "nul\0byte"):
        with pytest.raises(PipelineError, match="cannot be a file name in"):
            value_file(tmp_path, name)
