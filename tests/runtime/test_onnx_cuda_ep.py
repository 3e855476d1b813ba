"""GPU: a WarpSegment node on ONNX Runtime's CUDA EP (onnxruntime-gpu).

The node is placed on the CUDA EP with CPU fallback off (``session.disable_cpu_ep_fallback=1``:
creating the session fails if any node would run on the CPU EP), fed device tensors through IO
binding and compared with torch; and ORT's own CUDA graphs (``enable_cuda_graph=1``) replay the
segment with new input values written into the bound buffer. leapp.load's runner on the CUDA EP
is tested in tests/export/test_onnx_cuda_ep_load.py.

Marked ``cuda``; skipped with the reason where onnxruntime has no CUDAExecutionProvider.
"""

from __future__ import annotations

import pytest
import torch
from runtime_helpers import ort_session, warp_segment_model

from leapp.bundle.testing import example_bundle
from leapp.runtime import libraries
from leapp.runtime.onnx_runner import cuda_ep_options, ort_stream_handle

ort = pytest.importorskip("onnxruntime")

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not libraries.library_path("onnx").is_file(), reason="libleapp_warp_ort.so is not built"),
    pytest.mark.skipif("CUDAExecutionProvider" not in ort.get_available_providers(),
                       reason=f"onnxruntime {ort.__version__} has no CUDAExecutionProvider (onnxruntime-gpu is not "
                              "installed)"),
]

# ORT refuses the CPU EP in the provider list together with this entry ("Conflicting session configuration")
NO_CPU_FALLBACK = {"session.disable_cpu_ep_fallback": "1"}


def example_scale(n: int, device) -> torch.Tensor:
    """What the example bundle multiplies its input by: ``[1, 2, ..., n]``."""
    return torch.arange(1, n + 1, dtype=torch.float32, device=device)


def bind(session, x: torch.Tensor, y: torch.Tensor):
    """An IO binding of the example segment's ``x`` and ``y`` to two float32 CUDA tensors."""
    binding = session.io_binding()
    index = x.device.index or 0
    binding.bind_input("x", "cuda", index, 1, list(x.shape), x.data_ptr())
    binding.bind_output("y", "cuda", index, 1, list(y.shape), y.data_ptr())
    return binding


@pytest.mark.parametrize("n", [1024, 262144])
def test_warp_segment_node_runs_on_the_cuda_ep(n):
    dev = torch.device("cuda:0")
    session = ort_session(warp_segment_model(example_bundle(n)),
                          providers=[("CUDAExecutionProvider", cuda_ep_options(dev))], config=NO_CPU_FALLBACK)
    assert session.get_providers()[0] == "CUDAExecutionProvider", session.get_providers()
    gen = torch.Generator(device=dev).manual_seed(n)
    x = torch.randn(n, device=dev, generator=gen)
    y = torch.full((n,), float("nan"), device=dev)
    binding = bind(session, x, y)
    torch.cuda.synchronize(dev)  # this session runs on a stream of its own, not torch's
    for _ in range(2):
        session.run_with_iobinding(binding)
        torch.cuda.synchronize(dev)  # the session's stream is ORT's own: wait for the whole device
        torch.testing.assert_close(y, x * example_scale(n, dev), rtol=1e-6, atol=0)
        x.mul_(-0.5)
        torch.cuda.synchronize(dev)


@pytest.mark.parametrize("stream", ["ort", "torch-side-stream"])
def test_ort_cuda_graph_replays_the_segment_on_new_inputs(stream):
    """ORT's enable_cuda_graph: run 1 is regular, run 2 captures and replays, later runs replay.

    The bound buffers keep their addresses; each run sees the values written into ``x`` before
    it, and writes ``y`` (filled with NaN before every run, so a run that wrote nothing fails).
    """
    n = 4096
    dev = torch.device("cuda:0")
    options = {**cuda_ep_options(dev), "enable_cuda_graph": "1"}
    side = None
    if stream == "torch-side-stream":  # a capturable stream of torch's (the legacy default stream is not)
        side = torch.cuda.Stream(dev)
        options.update(cuda_ep_options(dev, ort_stream_handle(side.cuda_stream)))
    session = ort_session(warp_segment_model(example_bundle(n)),
                          providers=[("CUDAExecutionProvider", options)], config=NO_CPU_FALLBACK)
    assert session.get_providers()[0] == "CUDAExecutionProvider", session.get_providers()
    reported = session.get_provider_options()["CUDAExecutionProvider"]
    assert reported["enable_cuda_graph"] == "1", reported
    x = torch.zeros(n, device=dev)
    y = torch.empty(n, device=dev)
    binding = bind(session, x, y)
    gen = torch.Generator(device=dev).manual_seed(7)
    scale = example_scale(n, dev)
    for run in range(5):
        x.copy_(torch.randn(n, device=dev, generator=gen))
        y.fill_(float("nan"))
        torch.cuda.synchronize(dev)
        session.run_with_iobinding(binding)  # a replay ends with cudaStreamSynchronize (CUDAGraphManager::Replay)
        torch.cuda.synchronize(dev)
        torch.testing.assert_close(y, x * scale, rtol=1e-6, atol=0, msg=lambda m, run=run: f"run {run}: {m}")
