"""leapp/runtime/cuda_graphs.py: replaying a node's call as a CUDA graph (opt-in, ``leapp.load(..., cuda_graphs=True)``).

A plain call pays torch's dispatcher and one driver launch per kernel on the
host, every time. When a control loop calls a node again and again with the
same input tensors (same addresses: a preallocated observation buffer, or the
previous graphed node's outputs), the whole call can be captured once with
``torch.cuda.graph`` and replayed with one graph launch, which is what
``torch.compile(mode="reduce-overhead")`` and ONNX Runtime's
``enable_cuda_graph`` do too, with the same contract:

* The graph reads its inputs from the addresses it was captured with. A call
  is replayed only when every input has the captured address, dtype and
  shape, and is contiguous; new addresses run the call directly, and
  addresses seen twice get a graph of their own (at most ``max_graphs``,
  least recently used dropped), so a loop that never repeats never captures.
  Calls with non-contiguous inputs always run directly.
* Outputs are the graph's static tensors: **the next replay of the same graph
  overwrites them**. Clone what must outlive the next call.
* Graphs are kept per calling stream, each captured on a capture stream of
  its own for that stream. (The segment scratch a graph bakes in is its own
  whatever the stream: the native runtime gives every capture its own.)

With a fixed ``stream`` (the whole-pipeline graph of ``leapp.load``, see
``leapp.runtime.pipeline``), every graph is captured on that one stream and
replayed on the calling stream, and the calls follow one ``StreamOrder`` (shared
with the pipeline's ONNX nodes, whose sessions' buffers the graphs bake in): a
call from another stream than the previous call's first waits for that stream
on the device (an event), so replays, captures and the nodes' own runs never
overlap, whichever streams call.

Calls made while the current stream is itself being captured, and calls with
inputs off CUDA, run directly. A call that cannot be captured turns graphs
off for this callable, with a warning naming it and the reason.

``PlainCallGraphs`` is the other contract, the plain call's (no opt-in): any input
tensors work and every call returns fresh outputs (the graph's outputs cloned).
Input addresses that repeat get a graph that reads them in place; other inputs
are copied into static buffers of a graph of its own. What it saves is the
per-kernel host work of a runtime that launches one kernel (or one cuBLAS call)
at a time.
``leapp.runtime.onnx_runner`` uses it for ONNX nodes on ONNX Runtime's CUDA EP, and
``leapp.runtime.pipeline`` for a whole pipeline call (its ONNX nodes' graphs and the
pipeline's share one ``StreamOrder``: both bake in ONNX Runtime's buffers).
"""

from __future__ import annotations

import logging
import os
import threading
import warnings
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence

import torch

__all__ = ["IN_PLACE_GRAPHS_ENV", "PlainCallGraphs", "CudaGraphCall", "StreamOrder", "capture_blockers", "capture_refusal",
           "drop_all_graphs"]

log = logging.getLogger(__name__)

Key = tuple

# Ops that wait for the device without a data-dependent result (those are found by their
# symbolic sizes): a capture fails on them, and a failed capture leaves torch's CUDA RNG state
# unusable, so a graph holding one is never captured.
_SYNCHRONISING = ("_local_scalar_dense", "item", "_assert_async", "is_nonzero", "equal")


def capture_blockers(graph: torch.fx.Graph) -> list[str]:
    """The calls of ``graph`` that would make a CUDA graph capture fail (empty: capturable):
    values read back to the host and results whose sizes depend on the data."""
    found = []
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        name = str(node.target)  # "aten.nonzero.default"
        op = name.split(".", 1)[1] if name.startswith("aten.") else ""
        if any(op.startswith(s) for s in _SYNCHRONISING) or _data_dependent(node.meta.get("val")):
            found.append(f"{name} ({node.name})")
    return found


def capture_refusal(graph: torch.fx.Graph) -> str | None:
    """Why ``graph`` cannot be captured, naming its first blockers (None: it can)."""
    blockers = capture_blockers(graph)
    return f"not capturable: {', '.join(blockers[:3])}" if blockers else None


def _data_dependent(value) -> bool:
    """Whether a value's size comes from the data (an unbacked symbol, as nonzero gives). A size that
    follows an input's size (a dynamic batch, symbols backed by the inputs' shapes) is not: a graph
    captured for one input shape replays that shape (the capture is keyed by shapes)."""
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return _unbacked(value)
    if isinstance(value, torch.Tensor):
        return any(isinstance(d, torch.SymInt) and _unbacked(d) for d in value.shape)
    if isinstance(value, (list, tuple)):
        return any(_data_dependent(v) for v in value)
    return False


def _unbacked(value) -> bool:
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    try:
        return bool(free_unbacked_symbols(value))
    except Exception:  # noqa: BLE001 - an expression torch cannot analyse: treat it as data dependent
        return True


# Called on every call, so bound to torch's C functions directly (torch.cuda's Python helpers
# cost microseconds here): is the current stream capturing, and the current stream's handle.
_capturing = torch._C._cuda_isCurrentStreamCapturing
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (lambda i: torch.cuda.current_stream(i).cuda_stream)


def instantiate_replayable(graph: torch.cuda.CUDAGraph) -> None:
    """Instantiates a graph captured with ``keep_graph=True`` once it is known to hold no host-function node.

    A host function in a graph runs again at every replay on whatever its captured pointers hold by then:
    ONNX Runtime's CUDA EP frees pinned staging buffers from one (cudaLaunchHostFunc), and its replay aborts
    the process from a driver thread (cudaFreeHost in a callback, error 800). The C++ step graph refuses
    the same graphs (ext/pipeline/src/step_graph.cpp). Raises RuntimeError naming the count: the caller's
    capture-failure path then calls directly."""
    from leapp import _native

    hosts = _native.graph_host_nodes(graph.raw_cuda_graph())
    if hosts is None:
        raise RuntimeError("the CUDA driver could not list the captured graph's nodes (cuGraphGetNodes)")
    if hosts:
        raise RuntimeError(f"the capture recorded {hosts} host function(s) (ONNX Runtime's CUDA EP frees pinned "
                           "staging buffers from one), which every replay would run again")
    graph.instantiate()


def _replay_of(graph: torch.cuda.CUDAGraph) -> Callable[[torch.cuda.CUDAGraph], None]:
    """The C++ replay of torch's graph class where there is one (skipping the Python wrapper's
    memory-pool liveness check: this module holds the graph and its pool), else ``type(graph).replay``."""
    for cls in type(graph).__mro__[1:]:
        if cls.__module__ == "torch._C" and "replay" in vars(cls):
            return vars(cls)["replay"]
    return type(graph).replay


def _replay(entry: tuple) -> list[torch.Tensor]:
    """Replays a cached (replay function, graph, outputs) entry; its static outputs, in a new list."""
    entry[0](entry[1])
    return list(entry[2])


_live_calls: weakref.WeakSet = weakref.WeakSet()


def drop_all_graphs() -> None:
    """Forgets every graph captured so far (leapp.runtime.release_segments frees the memory they bake in);
    later calls capture again."""
    for call in list(_live_calls):
        call.drop_graphs()


class CudaGraphCall:
    """``fn(*tensors) -> list of tensors``, replayed from captured CUDA graphs where the inputs allow."""

    def __init__(self, fn: Callable[..., Sequence[torch.Tensor]], name: str, max_graphs: int = 4,
                 stream: torch.cuda.Stream | None = None):
        if max_graphs < 1:
            raise ValueError(f"{name}: max_graphs must be at least 1, got {max_graphs}")
        self.fn = fn
        self.name = name
        self.max_graphs = max_graphs
        self.enabled = True
        self.captures = 0  # graphs captured so far (tests and benchmarks read it)
        # key -> (replay function, graph, its static outputs)
        self._graphs: OrderedDict[Key, tuple[Callable, torch.cuda.CUDAGraph, list[torch.Tensor]]] = OrderedDict()
        self._seen: OrderedDict[Key, None] = OrderedDict()  # keys called once, directly
        self._capture_streams: dict[int, torch.cuda.Stream] = {}  # calling stream -> its capture stream
        self._lock = threading.Lock()
        self._stream = stream  # fixed: every capture runs on it (see the module docstring)
        self.order = StreamOrder() if stream is not None else None
        _live_calls.add(self)

    def drop_graphs(self) -> None:
        """Forgets this call's graphs (see drop_all_graphs)."""
        with self._lock:
            self._graphs.clear()

    def __call__(self, *inputs: torch.Tensor) -> list[torch.Tensor]:
        # The hot path: a few attribute reads per input and one dict lookup. This host-side
        # overhead is what the graph saves, so none of it goes through torch.cuda's Python helpers.
        if not self.enabled or not inputs or not inputs[0].is_cuda:
            return list(self.fn(*inputs))
        order = self.order
        if order is None:
            return self._call(inputs)
        with order.lock:
            if not _capturing():  # (inside an outer capture the caller orders its graph's replays)
                order.follow(self._stream.device)
            return self._call(inputs)

    def _call(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        key = (0 if self._stream is not None else _raw_stream(inputs[0].get_device()),
               *[(t.data_ptr(), t.dtype, t.shape, t.is_contiguous()) for t in inputs])
        hit = self._graphs.get(key)
        if hit is None:
            return self._miss(key, inputs)
        # (A hit while the stream is being captured, e.g. inside an outer torch.cuda.graph on the
        # very stream this graph was made for, launches the graph into that capture: a child graph.)
        if len(self._graphs) > 1:
            try:
                self._graphs.move_to_end(key)
            except KeyError:  # another thread dropped it meanwhile; `hit` keeps the graph alive
                pass
        hit[0](hit[1])  # _replay(hit), inlined: one Python call less per replay
        return list(hit[2])

    def _miss(self, key: Key, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        device = inputs[0].device
        if _capturing() or any(t.device != device or not t.is_contiguous() for t in inputs):
            # inside an outer capture, or layouts a graph would bake in: the call runs directly
            # (and reports mixed devices itself)
            return list(self.fn(*inputs))
        with self._lock:  # misses are rare: threads sharing this node take turns here
            return self._miss_locked(key, inputs)

    def _miss_locked(self, key: Key, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        if key in self._graphs:  # captured by another thread meanwhile
            return _replay(self._graphs[key])
        if key not in self._seen:
            self._seen[key] = None
            while len(self._seen) > 4 * self.max_graphs:
                self._seen.popitem(last=False)
            return list(self.fn(*inputs))  # first sight: also warms up one-time setup (modules, scratch)
        del self._seen[key]
        try:
            graph, outputs = self._capture(inputs, key[0])
        except Exception as e:  # noqa: BLE001 - any capture failure turns graphs off; the direct call stays correct
            self.enabled = False
            self._graphs.clear()
            warnings.warn(f"{self.name}: CUDA graph capture failed, calling directly from now on: "
                          f"{type(e).__name__}: {e}", RuntimeWarning, stacklevel=4)
            return list(self.fn(*inputs))
        log.debug("%s: captured a CUDA graph for %d input(s); %d graph(s) cached", self.name, len(inputs),
                  len(self._graphs) + 1)
        entry = self._graphs[key] = (_replay_of(graph), graph, outputs)
        while len(self._graphs) > self.max_graphs:
            self._graphs.popitem(last=False)
        # capture records only: this call's results come from the first replay
        return _replay(entry)

    def _capture(self, inputs: Sequence[torch.Tensor], stream: int) -> tuple[torch.cuda.CUDAGraph, list[torch.Tensor]]:
        device = inputs[0].device
        current = torch.cuda.current_stream(device)
        capture = self._stream or self._capture_streams.get(stream)
        if capture is None:
            capture = self._capture_streams[stream] = torch.cuda.Stream(device)
        capture.wait_stream(current)
        with torch.cuda.stream(capture):  # warm-up on the capture stream (its scratch), as torch.cuda.graph asks
            self.fn(*inputs)
        current.wait_stream(capture)
        graph = torch.cuda.CUDAGraph(keep_graph=True)
        # thread_local: only this thread's unsafe calls would break the capture, not other threads'
        # work (the warm-up above made every one-time allocation of the op already)
        with torch.cuda.graph(graph, stream=capture, capture_error_mode="thread_local"):
            outputs = list(self.fn(*inputs))
        instantiate_replayable(graph)
        self.captures += 1
        return graph, outputs


class StreamOrder:
    """The device order of calls that use the same buffers baked into graphs (ONNX Runtime's arena): a
    call on another stream than the previous one first waits for that stream (an event). ``lock``
    serialises enqueueing those calls; it is re-entrant, so a pipeline call holds it across the calls
    of its nodes, which take it too."""

    def __init__(self):
        self.lock = threading.RLock()
        self._last_raw: int | None = None  # the previous call's stream handle
        self._last_stream: torch.cuda.Stream | None = None
        self._event: torch.cuda.Event | None = None

    def follow(self, device: torch.device) -> None:
        """Makes the current stream of ``device`` wait for what the previous call enqueued, when that call ran on
        another stream (one handle compare otherwise). Called with ``lock`` held, outside captures."""
        raw = _raw_stream(device.index)
        if raw == self._last_raw:
            return
        current = torch.cuda.current_stream(device)
        if self._last_stream is not None:
            if self._event is None:
                self._event = torch.cuda.Event()
            self._event.record(self._last_stream)
            current.wait_event(self._event)
        self._last_stream, self._last_raw = current, raw


IN_PLACE_GRAPHS_ENV = "LEAPP_IN_PLACE_GRAPHS"  # how many in-place graphs a PlainCallGraphs keeps (default 2; 0: none)
_IDLE_CALLS = 256  # an in-place graph unused for this many calls may make room for new input addresses


def in_place_graphs_limit() -> int:
    """``LEAPP_IN_PLACE_GRAPHS`` as a count (default 2); a value that is not a count >= 0 is refused."""
    value = os.environ.get(IN_PLACE_GRAPHS_ENV, "2")
    if not (value.isascii() and value.isdigit()):  # '²'.isdigit() holds, int('²') fails
        raise ValueError(f"{IN_PLACE_GRAPHS_ENV}={value!r}: expected a number of graphs >= 0 (0 turns them off)")
    return int(value)


class PlainCallGraphs:
    """One node run captured as CUDA graphs, replayed with the plain call's contract: any input tensors,
    fresh outputs.

    ``run(inputs, static_outputs)`` enqueues the node on torch's current stream, which is
    ``stream`` while it is captured (a session opened on ``stream``); ``direct(inputs)`` runs it
    without a graph (and orders itself against the calling stream). ``inputs``/``outputs`` are
    the node's fixed (shape, dtype) pairs on ``stream``'s device. With ``bound_outputs`` (an ONNX
    Runtime binding) ``run`` writes into the given static outputs; without, ``static_outputs`` is
    None and ``run`` returns its outputs: the graph's static outputs are then the tensors the
    captured run made (in the graph's memory pool), so the graph holds no copy into buffers of its
    own. The caller serialises calls (the runner's lock).

    Two kinds of graph serve a call; both are replayed on the calling stream and their outputs cloned:

    - **In place**, for input addresses that repeat (a control loop's preallocated observation
      buffers, or a caching allocator handing the same blocks back each step): a graph that reads
      the call's own input tensors, captured the second time the same contiguous inputs are met.
      It reads those addresses at every replay, which is right for whatever tensors live there
      when a later call passes them. At most ``max_in_place`` (``LEAPP_IN_PLACE_GRAPHS``, default
      2); when they are all taken, one unused for the last 256 calls makes room, else the new
      addresses take the copy graph.
    - **Copies**, for any other inputs: a graph on static inputs of its own. The first such call
      runs directly (one-time setup: modules, the runtime's arena); the second copies its inputs
      into the static inputs and captures; later calls copy in, replay and clone out.

    - Each capture first runs once on ``stream`` (that call's results; the warm-up) and then
      captures a second run there, without executing it and without a host wait. Each graph has
      its own memory (torch's graph pool for the tensors the node makes, static outputs).
    - The graphs bake in the runtime's own buffers (ONNX Runtime's arena hands them to its next
      run again), so no two uses of the node may overlap on the device: a call on another stream
      than the previous one first waits for that stream (``order``, shared by the graphs that
      bake in the same buffers), and direct runs hand off to ``stream`` and back.
    - Calls inside an outer capture, with inputs of another shape, dtype or device, or while the
      current device is another one, run directly (``checked_inputs``: the caller has checked shapes
      and dtypes already, so only devices are). A capture that fails turns the graphs off with
      a ``RuntimeWarning`` naming the node; calls then run directly.
    """

    def __init__(self, name: str, run: Callable, direct: Callable, stream: torch.cuda.Stream,
                 inputs: Sequence[tuple[tuple[int, ...], torch.dtype]],
                 outputs: Sequence[tuple[tuple[int, ...], torch.dtype]], order: StreamOrder | None = None,
                 checked_inputs: bool = False, max_in_place: int | None = None, bound_outputs: bool = True):
        self.name = name
        self.bound_outputs = bound_outputs
        self.run = run
        self.direct = direct
        self.stream = stream
        self.device = stream.device
        self.index = stream.device.index
        self.inputs = [(torch.Size(shape), dtype) for shape, dtype in inputs]
        self.outputs = [(torch.Size(shape), dtype) for shape, dtype in outputs]
        self.enabled = True
        self.captures = 0  # graphs captured so far (tests and benchmarks read it)
        self.max_in_place = in_place_graphs_limit() if max_in_place is None else max_in_place
        self._entry: tuple | None = None  # the copy graph: (replay function, graph, static inputs, static outputs)
        # input addresses -> [replay function, graph, static outputs, the call count when last replayed]
        self._in_place: dict[tuple[int, ...], list] = {}
        self._seen: OrderedDict[tuple[int, ...], None] = OrderedDict()  # addresses met once, newest last
        self._tick = 0  # calls that fit the graphs' buffers
        self._calls = 0  # direct calls that could have been captured, since the last drop
        self.order = order or StreamOrder()
        self._checked_inputs = checked_inputs  # shapes and dtypes checked by the caller (the pipeline's check_inputs)
        self._check_device = torch.cuda.device_count() > 1
        _live_calls.add(self)

    def drop_graphs(self) -> None:
        """Forgets the graphs and their buffers (see drop_all_graphs); later calls capture again."""
        self._entry = None
        self._in_place = {}
        self._seen.clear()
        self._calls = 0

    def __call__(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        if _capturing():  # an outer capture records the direct run (on the session's stream, handed off)
            return self.direct(inputs)
        self.order.follow(self.device)
        if not self._fits(inputs):
            return self.direct(inputs)
        self._tick += 1
        key = _addresses(inputs) if self.max_in_place else None
        hit = self._in_place.get(key)
        if hit is not None:
            hit[3] = self._tick
            hit[0](hit[1])
            return [t.clone() for t in hit[2]]
        if not self.enabled:
            return self.direct(inputs)
        if key is not None:
            if key not in self._seen:
                self._seen[key] = None
                while len(self._seen) > 4 * self.max_in_place:
                    self._seen.popitem(last=False)
            elif self._room_in_place():  # met before: these addresses repeat
                del self._seen[key]
                return self._capture(inputs, key)
        return self._copies(inputs)

    def _room_in_place(self) -> bool:
        """Whether another in-place graph may be captured, dropping one idle for ``_IDLE_CALLS`` calls to make room."""
        graphs = self._in_place
        if len(graphs) < self.max_in_place:
            return True
        oldest = min(graphs, key=lambda k: graphs[k][3])
        if self._tick - graphs[oldest][3] < _IDLE_CALLS:
            return False
        del graphs[oldest]
        return True

    def _copies(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The call through the copy graph (captured on the second call that takes it)."""
        entry = self._entry
        if entry is None:
            if self._calls < 1:
                self._calls += 1
                return self.direct(inputs)
            return self._capture(inputs, None)
        if len(inputs) == 1:
            entry[2][0].copy_(inputs[0].detach() if inputs[0].requires_grad else inputs[0])
        else:  # one dispatcher call for all inputs
            torch._foreach_copy_(entry[2], [t.detach() if t.requires_grad else t for t in inputs])
        entry[0](entry[1])
        return [t.clone() for t in entry[3]]

    def _fits(self, inputs: Sequence[torch.Tensor]) -> bool:
        """Whether the call's inputs have the static buffers' shapes, dtypes and device."""
        if len(inputs) != len(self.inputs) or (self._check_device and torch._C._cuda_getDevice() != self.index):
            return False
        index = self.index
        checked = self._checked_inputs
        for t, (shape, dtype) in zip(inputs, self.inputs):
            if (not checked and (t.shape != shape or t.dtype != dtype)) or not t.is_cuda or t.get_device() != index:
                return False
        return True

    def _capture(self, inputs: Sequence[torch.Tensor], key: tuple[int, ...] | None) -> list[torch.Tensor]:
        """Captures the copy graph (``key`` None: on static inputs, the call's copied in) or the in-place graph
        of the call's input addresses ``key``; returns the call's results."""
        current = torch.cuda.current_stream(self.device)
        stream = self.stream
        try:
            with torch.inference_mode(False):  # buffers written in place by calls in and out of inference mode
                static_in = [torch.empty(shape, dtype=dtype, device=self.device) for shape, dtype in self.inputs
                             ] if key is None else [t.detach() for t in inputs]
                static_out = [torch.empty(shape, dtype=dtype, device=self.device) for shape, dtype in self.outputs
                              ] if self.bound_outputs else None
            if key is None:
                for static, value in zip(static_in, inputs):
                    static.copy_(value.detach())
            else:  # the caller's tensors are read on ``stream`` too: their memory waits for it before reuse
                for t in static_in:
                    t.record_stream(stream)
            stream.wait_stream(current)
            try:
                with torch.cuda.stream(stream):
                    warm = self.run(static_in, static_out)  # this call's results, and the runtime's one-time work
                    graph = torch.cuda.CUDAGraph(keep_graph=True)
                    # thread_local: other threads' CUDA work neither breaks this capture nor is broken by it;
                    # nothing executes while capturing, so there is no host wait here (torch.cuda.graph's
                    # synchronize is for freeing memory before a capture, which this one does not allocate)
                    graph.capture_begin(capture_error_mode="thread_local")
                    try:
                        made = self.run(static_in, static_out)
                    finally:
                        graph.capture_end()
                    instantiate_replayable(graph)
            finally:
                current.wait_stream(stream)  # the static buffers were made on the current stream
            if static_out is None:  # the captured run's own outputs; this call's are the warm-up's
                static_out = list(made)
                results = [t.clone() for t in warm]
                for t in warm:  # made on ``stream``: their memory waits for the clones before ``stream`` reuses it
                    t.record_stream(current)
            else:
                results = [t.clone() for t in static_out]
        except Exception as e:  # noqa: BLE001 - any capture failure turns graphs off; the direct call stays correct
            self.enabled = False
            self._entry = None
            self._in_place = {}
            warnings.warn(f"{self.name}: CUDA graph capture failed, calling directly from now on: "
                          f"{type(e).__name__}: {e}", RuntimeWarning, stacklevel=4)
            return self.direct(inputs)
        if key is None:
            self._entry = (_replay_of(graph), graph, static_in, static_out)
        else:
            self._in_place[key] = [_replay_of(graph), graph, static_out, self._tick]
        self.captures += 1
        log.debug("%s: captured a CUDA graph %s (%d input(s), %d output(s))", self.name,
                  "on buffers of its own" if key is None else "reading the call's inputs in place", len(static_in),
                  len(static_out))
        return results


def _addresses(inputs: Sequence[torch.Tensor]) -> tuple[int, ...] | None:
    """The inputs' addresses, the key of an in-place graph; None when one is not contiguous (a graph bakes in
    the layout it was captured with: the copy graph takes those calls)."""
    key = []
    for t in inputs:
        if not t.is_contiguous():
            return None
        key.append(t.data_ptr())
    return tuple(key)
