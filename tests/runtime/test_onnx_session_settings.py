"""The settings of leapp.load's ONNX sessions: what eager torch computes, on the node's device and torch's stream.

CPU-only checks of what the GPU tests (test_onnx_cuda_ep.py, tests/export/test_onnx_cuda_ep_load.py)
rely on: the provider and run options built, the stream choice, and the runner's one IO binding
(changed tensors rebound, shared by threads) on the CPU EP.
"""

from __future__ import annotations

import threading

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

from leapp.runtime import onnx_runner
from leapp.runtime.onnx_runner import (
    CUDA_STREAM_LEGACY,
    DISABLE_SYNC_RUN_OPTION,
    GRAPH_ID_RUN_OPTION,
    OnnxRunner,
    cuda_ep_options,
    needs_handoff,
    onnx_providers,
    ort_stream_handle,
    run_config,
    stream_accepted,
    torch_uses_tf32_matmul,
)
from leapp.runtime.io import IOSpec

ort = pytest.importorskip("onnxruntime")

CUDA_AND_CPU = ["CUDAExecutionProvider", "CPUExecutionProvider"]


@pytest.fixture
def tf32_matmul():
    """Sets torch's float32-matmul TF32 switch for one test and restores it after."""
    saved = torch.backends.cuda.matmul.allow_tf32

    def set_(on: bool) -> None:
        torch.backends.cuda.matmul.allow_tf32 = on

    yield set_
    torch.backends.cuda.matmul.allow_tf32 = saved


def test_cuda_sessions_follow_torchs_tf32_setting(tf32_matmul):
    tf32_matmul(False)  # torch's default: ORT's default (use_tf32=1) would differ from eager by ~5e-4
    assert not torch_uses_tf32_matmul()
    assert cuda_ep_options(torch.device("cuda:0"))["use_tf32"] == "0"
    tf32_matmul(True)  # a user who opted into TF32 gets it in the exported ONNX nodes too
    assert torch_uses_tf32_matmul()
    assert cuda_ep_options(torch.device("cuda:0"))["use_tf32"] == "1"


def test_cuda_sessions_run_on_the_nodes_device(tf32_matmul):
    tf32_matmul(False)
    assert onnx_providers(torch.device("cuda:1"), CUDA_AND_CPU) == [
        ("CUDAExecutionProvider", {"device_id": "1", "use_tf32": "0"}), "CPUExecutionProvider"]
    assert onnx_providers(torch.device("cuda"), CUDA_AND_CPU)[0][1]["device_id"] == "0"


def test_cuda_sessions_run_on_the_given_stream(tf32_matmul):
    """The stream is ORT's user_compute_stream; has_user_compute_stream is set for versions that read the flag."""
    tf32_matmul(False)
    assert onnx_providers(torch.device("cuda:1"), CUDA_AND_CPU, stream_handle=0x7F00AB) == [
        ("CUDAExecutionProvider", {"device_id": "1", "use_tf32": "0", "has_user_compute_stream": "1",
                                   "user_compute_stream": str(0x7F00AB)}), "CPUExecutionProvider"]
    with pytest.raises(ValueError, match="user_compute_stream must be a non-null stream handle, got 0"):
        cuda_ep_options(torch.device("cuda:0"), stream_handle=0)


def test_cpu_nodes_and_cpu_builds_use_the_cpu_ep():
    assert onnx_providers(torch.device("cpu"), CUDA_AND_CPU) == ["CPUExecutionProvider"]
    assert onnx_providers(torch.device("cuda:0"), ["CPUExecutionProvider"]) == ["CPUExecutionProvider"]
    assert onnx_providers(torch.device("cpu"), CUDA_AND_CPU, stream_handle=5) == ["CPUExecutionProvider"]


def test_torchs_default_stream_is_passed_as_cuda_stream_legacy():
    """Handle 0 would make ORT create a stream of its own; cudaStreamLegacy (1) is the same stream as torch's 0."""
    assert CUDA_STREAM_LEGACY == 1
    assert ort_stream_handle(0) == 1
    assert ort_stream_handle(0x55D0C0DE) == 0x55D0C0DE


@pytest.mark.parametrize(("current", "session", "handoff"), [
    (0, 1, False),  # torch's default stream, session on the legacy stream: the same stream
    (0x1000, 0x1000, False),  # the side stream the session was made on
    (0x1000, 1, True),  # a side stream, session on the default stream
    (0, 0x1000, True),  # the default stream, session on a side stream
    (0x2000, 0x1000, True),
])
def test_calls_on_another_stream_hand_off(current, session, handoff):
    assert needs_handoff(current, session) is handoff


def test_stream_accepted_reads_the_cuda_eps_reported_options():
    reported = {"CUDAExecutionProvider": {"device_id": "0", "has_user_compute_stream": "1",
                                          "user_compute_stream": "140234"}, "CPUExecutionProvider": {}}
    assert stream_accepted(reported, 140234)
    assert not stream_accepted(reported, 140235)
    ignored = {"CUDAExecutionProvider": {"has_user_compute_stream": "0", "user_compute_stream": "0"}}
    assert not stream_accepted(ignored, 140234)
    assert not stream_accepted({"CPUExecutionProvider": {}}, 140234)
    assert not stream_accepted({"CUDAExecutionProvider": {}}, 140234)  # a CUDA EP that reports no stream


def test_run_options_skip_the_end_of_run_synchronisation():
    """ORT's key (onnxruntime_run_options_config_keys.h) set on a real RunOptions; host-sync mode leaves it unset."""
    assert DISABLE_SYNC_RUN_OPTION == "disable_synchronize_execution_providers"
    assert run_config(host_sync=False) == {DISABLE_SYNC_RUN_OPTION: "1", GRAPH_ID_RUN_OPTION: "0"}
    assert run_config(host_sync=True) == {GRAPH_ID_RUN_OPTION: "0"}
    options = onnx_runner._run_options(ort, host_sync=False)
    assert options.get_run_config_entry(DISABLE_SYNC_RUN_OPTION) == "1"


@pytest.mark.parametrize("host_sync", [False, True])
def test_run_options_name_the_default_graph_id(host_sync):
    """Unset, "gpu_graph_id" makes onnxruntime's Python run_with_iobinding pay a C++ exception per call
    (its get_run_config_entry raises); "0" is the id ORT assumes when it is unset."""
    options = onnx_runner._run_options(ort, host_sync=host_sync)
    assert GRAPH_ID_RUN_OPTION == "gpu_graph_id"
    assert options.get_run_config_entry(GRAPH_ID_RUN_OPTION) == "0"


# --- the runner on the CPU EP: one IO binding, changed tensors rebound, threads take turns -----------------------------

N = 257


def two_output_model(path) -> None:
    """``s = a + b``, ``p = a * b`` (float32[N]): two inputs and two outputs, so a stale binding shows."""
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, [N])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, [N])
    s = helper.make_tensor_value_info("s", TensorProto.FLOAT, [N])
    p = helper.make_tensor_value_info("p", TensorProto.FLOAT, [N])
    graph = helper.make_graph([helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Mul", ["a", "b"], ["p"])],
                              "g", [a, b], [s, p])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, str(path))


@pytest.fixture
def runner_on_cpu(tmp_path):
    path = tmp_path / "sum_product.onnx"
    two_output_model(path)
    specs_in = [IOSpec("a", torch.float32, (N,)), IOSpec("b", torch.float32, (N,))]
    specs_out = [IOSpec("s", torch.float32, (N,)), IOSpec("p", torch.float32, (N,))]
    return OnnxRunner(path, specs_in, specs_out, "cpu", needs_library=False)


def test_which_nodes_replay_from_a_graph_of_their_own(monkeypatch):
    """A plain call's node graph (PlainCallGraphs) needs the CUDA EP, a stream of its own and fixed shapes."""
    runner = OnnxRunner.__new__(OnnxRunner)  # the rule alone: no session
    runner.inputs, runner.outputs = [IOSpec("a", torch.float32, (N,))], [IOSpec("s", torch.float32, (N,))]
    monkeypatch.delenv(onnx_runner.ONNX_GRAPHS_ENV, raising=False)
    assert runner._graphs_refused(True, None) is None
    assert runner._graphs_refused(False, None) == "not on ONNX Runtime's CUDA EP"
    assert "whole-pipeline graph" in runner._graphs_refused(True, object())
    monkeypatch.setenv(onnx_runner.ONNX_GRAPHS_ENV, "0")
    assert runner._graphs_refused(True, None) == "LEAPP_ONNX_GRAPHS=0"
    monkeypatch.setenv(onnx_runner.ONNX_GRAPHS_ENV, "1")
    runner.outputs = [IOSpec("s", torch.float32, (N,), batch=(1, 4 * N))]
    assert "dynamic batch" in runner._graphs_refused(True, None)


def test_one_binding_is_rebound_on_every_call(runner_on_cpu):
    runner = runner_on_cpu
    assert runner.stream_mode == "cpu-ep" and runner.stream_reason == "node on cpu"
    assert runner.session.get_providers() == ["CPUExecutionProvider"]
    binding = runner._binding
    gen = torch.Generator().manual_seed(0)
    previous = None
    for _ in range(4):
        a, b = torch.randn(N, generator=gen), torch.randn(N, generator=gen)
        s, p = runner([a, b])
        assert runner._binding is binding
        torch.testing.assert_close(s, a + b, rtol=0, atol=0)
        torch.testing.assert_close(p, a * b, rtol=0, atol=0)
        if previous is not None:  # fresh outputs each call: the last call's results stay valid
            assert s.data_ptr() != previous[0].data_ptr()
            torch.testing.assert_close(previous[0], previous[2] + previous[3], rtol=0, atol=0)
        previous = (s, p, a, b)


class CountingBinding:
    """The runner's IO binding with its bind calls counted (the runner's own binding underneath)."""

    def __init__(self, binding):
        self.binding, self.calls = binding, []

    def bind_input(self, name, *args):
        self.calls.append(name)
        self.binding.bind_input(name, *args)

    def bind_output(self, name, *args):
        self.calls.append(name)
        self.binding.bind_output(name, *args)

    def __getattr__(self, attr):
        return getattr(self.binding, attr)


def test_only_changed_tensors_are_rebound(runner_on_cpu):
    """A call with the tensors of the last call binds nothing again; a new tensor for one name rebinds that name."""
    runner = runner_on_cpu
    counting = CountingBinding(runner._binding)
    runner._binding = counting
    a, b = torch.randn(N), torch.randn(N)
    s, p = runner([a, b])
    assert counting.calls[:2] == ["a", "b"]
    counting.calls.clear()
    del s, p  # the allocator may hand the outputs' memory back: bound pointers are compared, not tensors
    s, p = runner([a, b])
    assert "a" not in counting.calls and "b" not in counting.calls
    torch.testing.assert_close(s, a + b, rtol=0, atol=0)
    counting.calls.clear()
    b2 = torch.randn(N)
    keep = (s, p)  # held: the next outputs get new memory, so they must be rebound
    s, p = runner([a, b2])
    assert "b" in counting.calls and "a" not in counting.calls
    assert {"s", "p"} <= set(counting.calls)
    torch.testing.assert_close(s, a + b2, rtol=0, atol=0)
    torch.testing.assert_close(p, a * b2, rtol=0, atol=0)
    torch.testing.assert_close(keep[0], a + b, rtol=0, atol=0)


def test_non_contiguous_inputs_are_bound_contiguous(runner_on_cpu):
    wide = torch.randn(N, 2)
    s, p = runner_on_cpu([wide[:, 0], wide[:, 1]])  # strided views
    torch.testing.assert_close(s, wide[:, 0] + wide[:, 1], rtol=0, atol=0)
    torch.testing.assert_close(p, wide[:, 0] * wide[:, 1], rtol=0, atol=0)


def test_threads_calling_one_runner_get_their_own_results(runner_on_cpu):
    """ORT runs without the GIL: without the runner's lock, threads rebinding one binding read each other's tensors.
    (Each thread's tensors differ, so every call rebinds.)"""
    failures: list[str] = []

    def worker(seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        for i in range(400):
            a, b = torch.randn(N, generator=gen), torch.randn(N, generator=gen)
            s, p = runner_on_cpu([a, b])
            if not (torch.equal(s, a + b) and torch.equal(p, a * b)):
                failures.append(f"thread {seed} call {i}")

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures[:5]


def test_cuda_node_without_a_cuda_ep_runs_on_the_cpu_ep(tmp_path):
    """onnxruntime without CUDA (CI): a node recorded on CUDA runs on the CPU EP with host tensors, as before."""
    if "CUDAExecutionProvider" in ort.get_available_providers() and torch.cuda.is_available():
        pytest.skip("this onnxruntime has a CUDA EP and torch a GPU: the node runs on the CUDA EP")
    path = tmp_path / "sum_product.onnx"
    two_output_model(path)
    specs = [IOSpec(n, torch.float32, (N,)) for n in ("a", "b")]
    runner = OnnxRunner(path, specs, [IOSpec(n, torch.float32, (N,)) for n in ("s", "p")], "cuda:0", False)
    assert runner.stream_mode == "cpu-ep" and runner.io_device == torch.device("cpu")
    assert runner.session_stream is None and "providers available" in runner.stream_reason
    assert runner.graph is None and runner.no_graphs_reason == "not on ONNX Runtime's CUDA EP"
    a, b = torch.arange(N, dtype=torch.float32), torch.ones(N)
    s, p = runner([a, b])
    assert s.device.type == "cpu" and np.array_equal(s.numpy(), (a + 1).numpy()) and torch.equal(p, a)
