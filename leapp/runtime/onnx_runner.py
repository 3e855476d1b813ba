"""leapp/runtime/onnx_runner.py: an ONNX node of ``leapp.load`` run by ONNX Runtime (CPU or CUDA EP).

A CUDA node on the CUDA EP runs **on torch's stream**, without waiting on the host when it replays
from a CUDA graph (below):

- The session is created with ``user_compute_stream`` = torch's current stream of the
  node's device at load time (torch's default stream, handle 0, is passed as
  ``cudaStreamLegacy``, see ``ort_stream_handle``), so every CUDA kernel of the session,
  the ``WarpSegment`` replays included (``KernelContext::GetGPUComputeStream``), is
  enqueued on that stream in order with torch's work.
- A run made while the stream is captured passes ``disable_synchronize_execution_providers=1``
  (the CUDA EP's ``OnRunEnd`` then skips its ``cudaStreamSynchronize``, which a capture forbids);
  outputs are ready in stream order, like any torch op's. Other runs let ONNX Runtime wait for
  its stream at the end of the run: without that wait, a model whose CUDA kernels stage host
  data through pinned memory (the all-ONNX go2 observation, ONNX Runtime 1.30) has the CUDA EP
  release those buffers from a host callback, whose ``cudaFreeHost`` fails (CUDA error 800) and
  aborts the process. The plain call replays most runs from a CUDA graph (below), so the wait
  is paid by the runs that are not captured.
- A call made while torch's current stream is another one hands off on the device:
  an event recorded on the current stream is waited on by the session stream, and
  one recorded on the session stream after the run is waited on by the current stream.

A fixed-shape node of the plain call (``leapp.load(folder)``) on the CUDA EP replays from a
CUDA graph (``cuda_graphs.PlainCallGraphs``): its session runs on a private stream, where the second
call captures one run on static buffers; later calls copy their inputs in, replay on torch's
current stream and return clones of the static outputs. ONNX Runtime's per-run host work (its
executor, one launch or cuBLAS call per kernel), which for a small MLP is many times its GPU work,
becomes one graph launch (figures: benchmarks/results/performance-history.md).
``LEAPP_ONNX_GRAPHS=0`` turns it off; ``no_graphs_reason`` says why a node has none.

What ORT itself synchronises, read in its sources (file and function names), is listed
in docs/runtime.md, "ONNX nodes on the CUDA EP". If ORT does not report the stream back
in ``get_provider_options`` (a build whose CUDA EP ignores ``user_compute_stream``), the
runner synchronises on the host instead, which is correct whatever stream ORT uses: wait for
torch's stream on the host, run, wait for the device (``stream_mode == "host-sync"``, with a
warning).

The CPU EP path (onnxruntime without CUDA, or a CPU node) takes host tensors in and out;
``libleapp_warp_ort.so`` stages segment I/O through pinned memory.
"""

from __future__ import annotations

import contextlib
import os
import threading
import warnings
from collections.abc import Mapping, Sequence

import torch

from leapp.pipeline_format import PipelineError, dtype_name
from leapp.runtime.cuda_graphs import _capturing
from leapp.runtime.runners import NodeRunner

__all__ = [
    "CUDA_SESSION_CONFIG",
    "CUDA_STREAM_LEGACY",
    "DISABLE_SYNC_RUN_OPTION",
    "GRAPH_ID_RUN_OPTION",
    "ONNX_GRAPHS_ENV",
    "OnnxRunner",
    "cuda_ep_options",
    "needs_handoff",
    "onnx_providers",
    "ort_stream_handle",
    "run_config",
    "session_options",
    "stream_accepted",
    "torch_uses_tf32_matmul",
]

CUDA_STREAM_LEGACY = 1  # cudaStreamLegacy: the legacy default stream, named by a non-null handle
DISABLE_SYNC_RUN_OPTION = "disable_synchronize_execution_providers"  # onnxruntime_run_options_config_keys.h
# onnxruntime's Python run_with_iobinding reads "gpu_graph_id" with get_run_config_entry, which raises
# (a C++ exception through pybind11, paid on every call; figures: benchmarks/results/performance-history.md)
# when the key is unset; "0" is the value ORT uses when it is unset (kCudaGraphAnnotationDefault), so setting
# it changes nothing else.
GRAPH_ID_RUN_OPTION = "gpu_graph_id"
ONNX_GRAPHS_ENV = "LEAPP_ONNX_GRAPHS"  # "0": plain calls of CUDA EP nodes run ONNX Runtime every time, no graph


def torch_uses_tf32_matmul() -> bool:
    """Whether torch computes float32 matmuls in TF32 (``torch.backends.cuda.matmul``; off by default)."""
    matmul = torch.backends.cuda.matmul
    precision = getattr(matmul, "fp32_precision", "none")  # torch >= 2.9; "none": allow_tf32 decides
    if precision in ("tf32", "ieee"):
        return precision == "tf32"
    return bool(matmul.allow_tf32)


def ort_stream_handle(torch_stream_handle: int) -> int:
    """The ``user_compute_stream`` handle for a torch stream handle.

    torch's default stream is handle 0, the legacy default stream. ORT reads a null
    ``user_compute_stream`` as "none given" (``CUDAExecutionProviderInfo::FromProviderOptions``
    sets ``has_user_compute_stream = user_compute_stream != nullptr``) and would run on a
    stream of its own; ``cudaStreamLegacy`` names the same legacy stream with a non-null handle.
    """
    return int(torch_stream_handle) or CUDA_STREAM_LEGACY


def needs_handoff(current_torch_stream_handle: int, session_ort_stream_handle: int) -> bool:
    """Whether a call on torch's current stream must hand off to the session's stream through events."""
    return ort_stream_handle(current_torch_stream_handle) != session_ort_stream_handle


def cuda_ep_options(device: torch.device, stream_handle: int | None = None) -> dict[str, str]:
    """ONNX Runtime CUDA EP options that compute what eager torch computes on ``device``.

    ORT's CUDA EP defaults to ``use_tf32=1``, torch to TF32 off for float32 matmul: an
    MLP then differs from eager by TF32's rounding, orders of magnitude above float32's
    (figures: benchmarks/results/performance-history.md). The session follows torch's
    setting when it is made; ``device_id`` puts it on the node's
    device (without it the EP uses device 0 whatever the node's device).
    ``stream_handle`` (an ``ort_stream_handle``) makes the session run on that stream;
    ``has_user_compute_stream`` is set too, for ORT versions that read the flag.
    """
    options = {"device_id": str(device.index or 0), "use_tf32": "1" if torch_uses_tf32_matmul() else "0"}
    if stream_handle is not None:
        if stream_handle <= 0:
            raise ValueError(f"user_compute_stream must be a non-null stream handle, got {stream_handle}")
        options.update(has_user_compute_stream="1", user_compute_stream=str(int(stream_handle)))
    return options


# Session config of a CUDA EP session: leave a MatMul + Add pair (a linear layer as leapp writes it,
# leapp/_export/onnx_gemm.py) as it is; ORT's CUDA Gemm with a bias is two GEMMs. ext/pipeline's
# C++ runner sets the same entry.
CUDA_SESSION_CONFIG = {"optimization.disable_specified_optimizers": "MatMulAddFusion"}


def session_options(ort, cuda: bool, library: str | None):
    """ONNX Runtime ``SessionOptions`` of a node's session: leapp's op library, and ``CUDA_SESSION_CONFIG``
    when the session asks for the CUDA EP."""
    options = ort.SessionOptions()
    if library is not None:
        options.register_custom_ops_library(library)
    if cuda:
        for key, value in CUDA_SESSION_CONFIG.items():
            options.add_session_config_entry(key, value)
    return options


def onnx_providers(device: torch.device, available: Sequence[str], stream_handle: int | None = None) -> list:
    """The providers of a node's session: CUDA EP (with ``cuda_ep_options``) for a CUDA node when available."""
    if device.type == "cuda" and "CUDAExecutionProvider" in available:
        return [("CUDAExecutionProvider", cuda_ep_options(device, stream_handle)), "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


def stream_accepted(provider_options: Mapping[str, Mapping[str, str]], stream_handle: int) -> bool:
    """Whether the session's CUDA EP reports running on ``stream_handle`` (``get_provider_options``)."""
    cuda = provider_options.get("CUDAExecutionProvider") or {}
    return str(cuda.get("has_user_compute_stream", "0")) == "1" and str(cuda.get("user_compute_stream")) == str(
        int(stream_handle))


def run_config(host_sync: bool) -> dict[str, str]:
    """The run-option entries of a call: without ``host_sync``, ORT does not wait for the CUDA stream;
    ``gpu_graph_id`` is set to ORT's default (see ``GRAPH_ID_RUN_OPTION``)."""
    config = {GRAPH_ID_RUN_OPTION: "0"}
    if not host_sync:
        config[DISABLE_SYNC_RUN_OPTION] = "1"
    return config


def _run_options(ort, host_sync: bool):
    options = ort.RunOptions()
    for key, value in run_config(host_sync).items():
        options.add_run_config_entry(key, value)
    return options


_ONNX_TYPES = {
    torch.float32: 1,
    torch.uint8: 2,
    torch.int8: 3,
    torch.int16: 5,
    torch.int32: 6,
    torch.int64: 7,
    torch.bool: 9,
    torch.float16: 10,
    torch.float64: 11,
    torch.bfloat16: 16,
}


def _onnx_type(dtype: torch.dtype) -> int:
    try:
        return _ONNX_TYPES[dtype]
    except KeyError:
        raise PipelineError(f"dtype {dtype_name(dtype)} cannot cross an ONNX boundary in leapp") from None


_preloaded = False


def _preload_cuda_libraries(ort) -> bool:
    """``onnxruntime.preload_dlls()`` once per process (ORT >= 1.21): loads the CUDA and cuDNN libraries
    its CUDA EP needs from the nvidia wheels when nothing (e.g. torch of the same CUDA major) has."""
    global _preloaded
    preload = getattr(ort, "preload_dlls", None)
    if _preloaded or preload is None:
        return False
    _preloaded = True
    with contextlib.suppress(Exception):  # it prints what it could not load; the retry below tells
        preload()
    return True


def _shape_at(spec, batch: int | None) -> tuple[int, ...]:
    """An output's shape for a call: dim 0 is the call's batch when the node has a dynamic batch."""
    if batch is None or spec.batch is None:
        return tuple(spec.shape)
    return (batch,) + tuple(spec.shape[1:])


class OnnxRunner(NodeRunner):
    """An ONNX Runtime session with leapp's op library; CUDA EP when present and the node ran on CUDA.

    ``stream_mode``: ``"torch-stream"`` (CUDA EP on torch's stream, no host wait), ``"host-sync"``
    (CUDA EP that did not take the stream: waits on the host before and after each run) or ``"cpu-ep"``;
    ``stream_reason`` says why; ``graph`` is the node's ``PlainCallGraphs`` (``no_graphs_reason`` when
    none). One IO binding per runner; each call rebinds only the names whose
    tensor (pointer, shape, dtype) changed since the last (each name bound costs host time in ORT's Python
    binding; figures: benchmarks/results/performance-history.md); a lock makes
    calls from several threads take turns (it is held while enqueueing, never across a wait
    for the GPU in ``torch-stream`` mode).
    """

    backend = "onnx"

    def __init__(self, path, inputs, outputs, device, needs_library: bool, stream: torch.cuda.Stream | None = None,
                 model: bytes | None = None):
        """``stream``: the torch stream the CUDA EP session runs on (a whole-pipeline graph's); by default
        torch's current stream at load, or a private one for a node replayed from its own graph. ``model``:
        the model's bytes, self-contained, that the session opens (None: the file at ``path``)."""
        super().__init__(path, inputs, outputs, device)
        self.model_bytes = model
        import onnxruntime as ort

        from leapp.runtime import libraries

        self._ort = ort
        self._library = None
        library = libraries.library_path("onnx")
        if library.is_file():
            self._library = str(library)
        elif needs_library:
            libraries.require_library("onnx")  # raises the op library's not-found message
        self.session_stream: torch.cuda.Stream | None = None  # torch's stream the session runs on
        self.ort_stream: int | None = None  # its handle as passed to ORT (ort_stream_handle)
        wants_cuda = (self.device.type == "cuda" and "CUDAExecutionProvider" in ort.get_available_providers()
                      and torch.cuda.is_available())
        # the device ORT runs on (cuda_ep_options: device_id = index or 0), also for a node recorded on "cuda"
        self.cuda_device = torch.device("cuda", self.device.index or 0) if self.device.type == "cuda" else None
        self.graph = None  # the node's PlainCallGraphs when its plain calls replay from one
        self.no_graphs_reason = self._graphs_refused(wants_cuda, stream)
        if wants_cuda:
            if self.cuda_device.index >= torch.cuda.device_count():
                raise PipelineError(f"{self.path}: the node was exported on {self.device}, torch sees "
                                    f"{torch.cuda.device_count()} CUDA device(s) here")
            if self.no_graphs_reason is None:
                stream = torch.cuda.Stream(self.cuda_device)  # a capture needs a stream other than the legacy one
            self.session_stream = stream if stream is not None else torch.cuda.current_stream(self.cuda_device)
            self.ort_stream = ort_stream_handle(self.session_stream.cuda_stream)
        self.session = self._open(wants_cuda)
        on_cuda = "CUDAExecutionProvider" in self.session.get_providers()
        if wants_cuda and not on_cuda and _preload_cuda_libraries(ort):
            retry = self._open(True)  # ORT starts its CUDA EP without a failure when CUDA libraries are missing
            if "CUDAExecutionProvider" in retry.get_providers():
                self.session, on_cuda = retry, True
        if on_cuda and stream_accepted(self.session.get_provider_options(), self.ort_stream):
            self.stream_mode, self.stream_reason = "torch-stream", (
                f"CUDA EP on torch's stream {self.session_stream.cuda_stream:#x} of {self.cuda_device}")
        elif on_cuda:
            self.stream_mode, self.stream_reason = "host-sync", (
                "this onnxruntime's CUDA EP did not report user_compute_stream back (get_provider_options: "
                f"{dict(self.session.get_provider_options().get('CUDAExecutionProvider', {}))}); "
                "each call waits for torch's stream and for the device on the host")
            warnings.warn(f"ONNX node {self.path.name}: {self.stream_reason}", RuntimeWarning, stacklevel=2)
        else:
            self.stream_mode = "cpu-ep"
            if self.device.type != "cuda":
                self.stream_reason = f"node on {self.device}"
            elif not wants_cuda:
                self.stream_reason = (f"providers available: {ort.get_available_providers()}, "
                                      f"torch.cuda.is_available() {torch.cuda.is_available()}")
            else:
                self.stream_reason = ("onnxruntime's CUDA EP did not start, also after onnxruntime.preload_dlls() "
                                      "(missing CUDA or cuDNN libraries? ORT's log above says)")
                warnings.warn(f"ONNX node {self.path.name} runs on ONNX Runtime's CPU EP: {self.stream_reason}",
                              RuntimeWarning, stacklevel=2)
        self.io_device = self.cuda_device if on_cuda else torch.device("cpu")
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]
        if len(self.input_names) != len(self.inputs) or len(self.output_names) != len(self.outputs):
            raise PipelineError(
                f"{self.path}: the model has inputs {self.input_names} and outputs {self.output_names}, "
                f"pipeline.yaml lists {[s.name for s in self.inputs]} and {[s.name for s in self.outputs]}"
            )
        self._binding = self.session.io_binding()
        self._bound: dict[str, tuple] = {}  # name -> (data_ptr, shape, dtype) last bound
        self._io_type = "cuda" if self.io_device.type == "cuda" else "cpu"  # ORT's device name and index
        self._io_index = self.io_device.index or 0
        # outside a capture ORT waits for its stream at the end of a run (the module docstring says why)
        self._run_options = _run_options(ort, host_sync=True)
        self._capture_options = _run_options(ort, host_sync=self.stream_mode != "torch-stream")
        self._output_types = [_onnx_type(spec.dtype) for spec in self.outputs]
        self._lock = threading.Lock()
        self._ready = self._done = None  # hand-off events, made on first use
        # ORT's OnRunStart calls cudaSetDevice(device_id): put the caller's device back where there are several
        self._device_guard = on_cuda and torch.cuda.device_count() > 1
        if self.no_graphs_reason is None and self.stream_mode != "torch-stream":
            self.no_graphs_reason = f"ONNX Runtime runs it in {self.stream_mode} mode"
        if self.no_graphs_reason is None:
            from leapp.runtime.cuda_graphs import PlainCallGraphs

            self.graph = PlainCallGraphs(f"ONNX node {self.path.name}", self._run_bound, self._direct, self.session_stream,
                                   [(s.shape, s.dtype) for s in self.inputs], [(s.shape, s.dtype) for s in self.outputs])
            self._lock = self.graph.order.lock
        self.order = None  # the StreamOrder its calls follow (join_order); a node graph follows its own

    def join_order(self, order) -> None:
        """Orders this node's calls with the graphs that bake in its session's buffers (the pipeline's
        ``PlainCallGraphs`` or whole-pipeline ``CudaGraphCall``): one ``StreamOrder``, whose lock is then this
        runner's. Before the first call."""
        self.order = order
        self._lock = order.lock
        if self.graph is not None:
            self.graph.order = order

    def _graphs_refused(self, wants_cuda: bool, stream) -> str | None:
        """Why this node's plain calls do not replay from a graph of its own (None: they do)."""
        if not wants_cuda:
            return "not on ONNX Runtime's CUDA EP"
        if stream is not None:
            return "runs on a given stream (the whole-pipeline graph's, leapp.load(..., cuda_graphs=True))"
        if os.environ.get(ONNX_GRAPHS_ENV, "1") == "0":
            return f"{ONNX_GRAPHS_ENV}=0"
        if any(spec.batch is not None for spec in (*self.inputs, *self.outputs)):
            return "a dynamic batch (ONNX Runtime's intermediate buffers move with the batch)"
        return None

    def _open(self, cuda: bool):
        ort = self._ort
        available = ort.get_available_providers() if cuda else ["CPUExecutionProvider"]
        providers = onnx_providers(self.device, available, self.ort_stream if cuda else None)
        options = session_options(ort, providers[0] != "CPUExecutionProvider", self._library)
        try:  # enable_fallback=0: a CUDA EP that fails must raise, not silently become the CPU EP
            source = self.model_bytes if self.model_bytes is not None else str(self.path)
            return ort.InferenceSession(source, options, providers=providers, enable_fallback=0)
        except Exception as e:  # ORT raises its own Fail/InvalidGraph types
            raise PipelineError(f"onnxruntime could not load {self.path}: {e}") from e

    def __call__(self, inputs):
        with self._lock:
            if self.graph is not None:
                return self.graph(inputs)
            if self.order is not None and not _capturing():
                self.order.follow(self.cuda_device)
            return self._direct(inputs)

    def direct(self, inputs):
        """A run of ONNX Runtime, never this node's graph (what a whole-pipeline graph captures)."""
        with self._lock:
            return self._direct(inputs)

    def _direct(self, inputs):
        if self.stream_mode == "torch-stream":
            return self._check_outputs(self._call_on_stream(inputs))
        return self._check_outputs(self._call_synchronously(inputs))

    def _run_bound(self, tensors: Sequence[torch.Tensor], outs: Sequence[torch.Tensor]) -> None:
        """One run on given buffers, enqueued on the session's stream (the graph's capture and warm-up)."""
        self._bind(tensors, outs)
        self.session.run_with_iobinding(self._binding, self._options())

    def _options(self):
        """This run's options: no host wait while torch's current stream is captured (a wait would break the
        capture), a wait otherwise (the module docstring)."""
        return self._capture_options if torch.cuda.is_current_stream_capturing() else self._run_options

    def _bind(self, tensors: Sequence[torch.Tensor], outs: Sequence[torch.Tensor]) -> None:
        """Points the runner's binding at this call's tensors; a name whose pointer, shape and dtype are
        those it is bound to already is left as it is (a name bound again replaces its value)."""
        binding, bound = self._binding, self._bound
        for name, t in zip(self.input_names, tensors):
            key = (t.data_ptr(), t.shape, t.dtype)  # torch.Size and dtype compare by value
            if bound.get(name) != key:
                bound.pop(name, None)  # a failed bind leaves the name unknown, never stale
                binding.bind_input(name, self._io_type, self._io_index, _onnx_type(t.dtype), list(t.shape), key[0])
                bound[name] = key
        for name, spec, kind, t in zip(self.output_names, self.outputs, self._output_types, outs):
            key = (t.data_ptr(), t.shape, spec.dtype)  # t.shape: the spec's, with this call's batch when dynamic
            if bound.get(name) != key:
                bound.pop(name, None)
                binding.bind_output(name, self._io_type, self._io_index, kind, list(t.shape), key[0])
                bound[name] = key

    def _prepare(self, inputs) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Contiguous inputs on the I/O device and fresh outputs, made on torch's current stream."""
        tensors = [t.to(self.io_device).contiguous() for t in inputs]
        batch = next((int(t.shape[0]) for t, s in zip(tensors, self.inputs) if s.batch is not None), None)
        outs = [torch.empty(_shape_at(spec, batch), dtype=spec.dtype, device=self.io_device) for spec in self.outputs]
        return tensors, outs

    def _call_on_stream(self, inputs) -> list[torch.Tensor]:
        """CUDA EP on the session's stream; nothing waits on the host.

        Temporaries (inputs copied to the device or made contiguous) and the outputs are
        allocated on torch's current stream. With a hand-off, the current stream waits for the
        session stream's event before this function drops the temporaries, so their memory is
        reused only by work ordered after the run: no ``record_stream`` is needed.
        """
        guard = torch.cuda.device(self.io_device) if self._device_guard else contextlib.nullcontext()
        with guard:
            tensors, outs = self._prepare(inputs)
            current = torch.cuda.current_stream(self.io_device)
            handoff = needs_handoff(current.cuda_stream, self.ort_stream)
            if handoff:
                if self._ready is None:
                    self._ready, self._done = torch.cuda.Event(), torch.cuda.Event()
                self._ready.record(current)
                self.session_stream.wait_event(self._ready)
            try:
                self._bind(tensors, outs)  # after the wait: a bind that copies does so on the session stream
                self.session.run_with_iobinding(self._binding, self._options())
            finally:  # also after a failed run: what it enqueued may still read the temporaries
                if handoff:
                    self._done.record(self.session_stream)
                    current.wait_event(self._done)
        return outs

    def _call_synchronously(self, inputs) -> list[torch.Tensor]:
        """The CPU EP (host tensors) and a CUDA EP that ignored the stream: ORT runs when torch's work is done
        and returns when its own is."""
        tensors, outs = self._prepare(inputs)
        on_cuda = self.io_device.type == "cuda"
        if on_cuda:
            torch.cuda.current_stream(self.io_device).synchronize()
        self._bind(tensors, outs)
        self.session.run_with_iobinding(self._binding, self._run_options)
        if on_cuda:
            self._binding.synchronize_outputs()  # cudaDeviceSynchronize: ORT's streams wrote our outputs
        return outs
