"""leapp/_recorder/node.py: ``leapp.node`` and one execution of a node inside a session.

Outside a session ``leapp.node`` costs two context-variable reads (the
session, then the observer of ``leapp.testing``'s observation mode): the
decorator calls the function directly and the context manager does nothing.
Inside, each execution is a ``NodeRun`` that owns a scoped dispatch mode
(popped on exit, also when the body raised) and, in the capture pass, the FX
graph of the node.
"""

from __future__ import annotations

import copy
import functools
import inspect
from typing import Any, Callable

import torch
import warp as wp

from leapp._contract.backends import backend_problem
from leapp._contract.names import NAME_RULE, identifier, name_problem, shown
from leapp._contract.records import NodeRecord, Probe, Sample, SegmentRecord, StateSpec, TensorSpec
from leapp._warp_private import array_base
from leapp.bundle.format import MAX_BATCH  # the largest batch a bundle's rules may name
from leapp.errors import TraceError
from leapp.pipeline_format import metadata_problem

from .dtypes import check_boundary_dtype, is_warp_array, spec_for_array, spec_for_tensor
from .fx_graph import GraphRecorder, NodeDispatchMode
from .observe import ObservedRun, current_observer
from .session import MAX_SAMPLES, NodeState, Session, current_session
from .source import user_location

__all__ = ["NodeScope", "NodeRun", "declare_inputs", "declare_outputs"]

_PASS_NAMES = ("discovery", "capture")


class NodeRun:
    """One execution of one node: pass index, recorder, declared inputs and outputs."""

    def __init__(self, session: Session, state: NodeState, source: str) -> None:
        self.session = session
        self.state = state
        self.name = state.name
        self.source = source
        self.pass_index = state.runs
        # A dynamic_batch node's later passes are captures too until it has its probes (docs/recorder.md 1.0).
        self.probing = (state.dynamic_batch is not None and self.pass_index >= 2 and state.record is not None
                        and len(state.record.probes) < 2)
        self.capturing = self.pass_index == 1 or self.probing
        self.recorder = GraphRecorder(state.name, build=self.capturing, owners=session.owners)
        self.mode = NodeDispatchMode(self.recorder)
        self.inputs: list[tuple[str, torch.Tensor, TensorSpec]] = []
        self.outputs: list[tuple[str, Any, torch.Tensor, TensorSpec]] = []
        self.segments_met: list = []  # DiscoveredSegment (pass 1, samples) or SegmentRecord (capture)
        # Each captured segment's wp.Graph, alive until this run ends: a graph's allocations (the arrays its block
        # created) are then still graph memory no later segment's graph can be given, whatever Python collects.
        self.captured_graphs: list = []
        self.sample_inputs: list[torch.Tensor] = []
        # annotate.state_tensors / update_state (leapp._recorder.state): state name -> where it was declared /
        # updated, and output name -> the state whose update it is
        self.states: dict[str, str] = {}
        self.state_updates: dict[str, str] = {}
        self.state_outputs: dict[str, str] = {}
        self.state_values: dict[str, torch.Tensor] = {}  # the discovery pass's state inputs (initial values)
        self._mode_on = False

    @property
    def pass_name(self) -> str:
        if self.probing:
            return f"probe pass {self.pass_index + 1}"
        return _PASS_NAMES[self.pass_index] if self.pass_index < 2 else f"sample pass {self.pass_index + 1}"

    @property
    def keeps_sample(self) -> bool:
        state = self.state
        if self.pass_index == 1 or self.probing:
            return True  # a probe's sample is at another batch size: always worth validating
        return self.pass_index > 1 and state.record is not None and len(state.record.samples) < MAX_SAMPLES

    def enter(self) -> None:
        self.mode.__enter__()
        self._mode_on = True

    def abort(self) -> None:
        """Undo scoped state after an exception; the execution is not counted."""
        block = self.session.block
        if block is not None and block.run is self:
            block.close(failed=True)
        self._pop_mode()
        self.session.current = None

    def _pop_mode(self) -> None:
        if self._mode_on:
            self._mode_on = False
            self.mode.__exit__(None, None, None)

    # ---- declarations ----

    def declare_input(self, name: str, value: Any, where: str, *, edge: bool = True) -> Any:
        """``edge``: False for a state input, fed by its own node's previous step only (no recorded edge)."""
        if any(name == n for n, _, _ in self.inputs):
            raise TraceError(f"node '{self.name}': input {name!r} declared twice (at {where}).")
        rec = self.recorder
        with rec.paused_recording():
            if is_warp_array(value):
                check_boundary_dtype(value.dtype, f"input {name!r} of node '{self.name}'", where)
                spec = spec_for_array(name, value)
                _, ptr, capacity = array_base(value)
                if not (value.is_contiguous and ptr == value.ptr and capacity == value.capacity):
                    # A view of a larger allocation: the export boundary is a dense tensor.
                    value = wp.clone(value)
                t = wp.to_torch(value, requires_grad=False)
                spec.dtype = t.dtype
            elif isinstance(value, torch.Tensor):
                spec = spec_for_tensor(name, value)
                if value.requires_grad:
                    # The export has no autograd; wp.from_torch would allocate and zero a gradient in the segment.
                    value = value.detach()
                if not (value.is_contiguous() and value.storage_offset() == 0
                        and value.numel() * value.element_size() == value.untyped_storage().nbytes()):
                    value = value.clone(memory_format=torch.contiguous_format)
                t = value
            else:
                raise TraceError(
                    f"node '{self.name}': input {name!r} at {where} is a {type(value).__name__}; "
                    "expected a torch.Tensor or a wp.array."
                )
            if self.keeps_sample:
                self.sample_inputs.append(t.detach().clone())
        rec.placeholder(name, t, spec)
        self.inputs.append((name, t, spec))
        if edge:
            self.session.record_edge(self.name, name, t)
        return value

    def declare_output(self, name: str, value: Any, where: str) -> Any:
        if any(name == n for n, _, _, _ in self.outputs):
            if name in self.state_outputs:
                state = self.state_outputs[name]
                raise TraceError(
                    f"node '{self.name}': output {name!r} at {where} has the name of the update of state {state!r} "
                    f"(annotate.update_state at {self.state_updates[state]} names it {name!r}); rename one of them."
                )
            raise TraceError(f"node '{self.name}': output {name!r} declared twice (at {where}).")
        rec = self.recorder
        if is_warp_array(value):
            check_boundary_dtype(value.dtype, f"output {name!r} of node '{self.name}'", where)
            with rec.paused_recording():
                t = wp.to_torch(value, requires_grad=False)
            spec = spec_for_array(name, value)
            spec.dtype = t.dtype  # what the user's tensor is (unsigned dtypes depend on the torch version)
        elif isinstance(value, torch.Tensor):
            t, spec = value, spec_for_tensor(name, value)
        else:
            raise TraceError(
                f"node '{self.name}': output {name!r} at {where} is a {type(value).__name__}; "
                "expected a torch.Tensor or a wp.array."
            )
        rec.value_of(t)  # binds storage aliases and segment outputs now, while they are live
        self.outputs.append((name, value, t, spec))
        self.session.register_output(self.name, name, t)
        return value

    # ---- end of the execution ----

    def finish(self) -> None:
        """Fold this execution into the node's state according to its pass."""
        self._pop_mode()
        state = self.state
        self._check_states()
        if self.pass_index == 0:
            state.discovered = list(self.segments_met)
            state.initial_state = dict(self.state_values)
        elif self.pass_index == 1:
            self._finish_capture()
        elif self.probing:
            self._finish_probe()
        else:
            self._finish_sample()
        state.runs += 1

    def _finish_capture(self) -> None:
        state, rec = self.state, self.recorder
        segments: list[SegmentRecord] = list(self.segments_met)
        state.skipped = state.discovered[len(segments):]
        out_nodes = [rec.value_of(t) for _, _, t, _ in self.outputs]
        _refuse_segments_without_outputs(self.name, segments)
        graph = rec.finish(out_nodes, class_name=f"leapp_node_{identifier(self.name)}")
        state.record = NodeRecord(
            name=self.name,
            export_with=state.export_with,
            backend_params=dict(state.backend_params),
            source=state.source,
            inputs=[spec for _, _, spec in self.inputs],
            outputs=[spec for _, _, _, spec in self.outputs],
            graph=graph,
            segments=segments,
            samples=[self._sample()],
            dynamic_batch=state.dynamic_batch,
            state=[StateSpec(n, self.state_outputs_of[n], state.initial_state[n]) for n in self.states],
        )
        if state.dynamic_batch is not None:
            lo, hi = state.dynamic_batch
            batch = self.batch()
            if not lo <= batch <= hi:
                state.record = None
                raise TraceError(
                    f"leapp.node('{self.name}') at {self.source}: the capture pass ran at batch {batch} (dim 0 of "
                    f"input {self.inputs[0][0]!r}), outside its dynamic_batch=({lo}, {hi})."
                )
        self.session.notes.extend(rec.notes)

    @property
    def state_outputs_of(self) -> dict[str, str]:
        """state name -> the name of its update output."""
        return {state: output for output, state in self.state_outputs.items()}

    def _check_states(self) -> None:
        """Every declared state updated; the same states as the node's first run (docs/state.md)."""
        for name, where in self.states.items():
            if name not in self.state_updates:
                raise TraceError(
                    f"node '{self.name}': state {name!r} declared by annotate.state_tensors at {where} is never "
                    f"updated in this run ({self.pass_name}); call annotate.update_state('{self.name}', "
                    f"{{{name!r}: new_value}}) before the node ends."
                )
        known = self.state.initial_state
        if self.pass_index > 0 and list(self.states) != list(known):
            raise TraceError(
                f"leapp.node('{self.name}') at {self.source} ({self.pass_name}) declares states {list(self.states)}, "
                f"its first run declared {list(known)}; a node declares the same states in the same order every run."
            )

    def batch(self) -> int:
        """The batch of a dynamic_batch execution: dim 0 of every input and output (checked)."""
        where = f"leapp.node('{self.name}', dynamic_batch={self.state.dynamic_batch}) at {self.source}"
        if not self.inputs:
            raise TraceError(f"{where} declares no input; dim 0 of the inputs is the batch, so it needs one.")
        values = [("input", n, t) for n, t, _ in self.inputs] + [("output", n, t) for n, _, t, _ in self.outputs]
        first = values[0]
        if first[2].dim() == 0:
            raise TraceError(f"{where}: input {first[1]!r} is 0-d; dim 0 of every input and output is the batch.")
        batch = int(first[2].shape[0])
        for side, name, t in values:
            if t.dim() == 0 or int(t.shape[0]) != batch:
                shape = tuple(t.shape)
                raise TraceError(
                    f"{where} ({self.pass_name}): {side} {name!r} has shape {shape}, but dim 0 of every input and "
                    f"output is the batch, {batch} here (dim 0 of input {first[1]!r}). A size that depends on the "
                    "batch must come from the inputs' shapes (x.shape[0]), not from a Python value."
                )
        return batch

    def _finish_probe(self) -> None:
        state = self.state
        record = state.record
        batch = self.batch()
        seen = [record.inputs[0].shape[0]] + [p.batch for p in record.probes]
        if batch in seen or len(self.segments_met) != len(record.segments):
            why = ("at a batch size already captured" if batch in seen else
                   f"met {len(self.segments_met)} Warp segments, the capture pass {len(record.segments)}")
            self.session.notes.append(f"node '{self.name}' {self.pass_name} at batch {batch}: {why}; kept as a "
                                      "validation sample, not as a probe.")
            self._finish_sample()
            return
        lo, hi = state.dynamic_batch
        if not lo <= batch <= hi:
            raise TraceError(
                f"leapp.node('{self.name}') at {self.source} ({self.pass_name}) ran at batch {batch}, outside its "
                f"dynamic_batch=({lo}, {hi})."
            )
        out_nodes = [self.recorder.value_of(t) for _, _, t, _ in self.outputs]
        graph = self.recorder.finish(out_nodes, class_name=f"leapp_node_{identifier(self.name)}_probe")
        record.probes.append(Probe(batch, list(self.segments_met), graph))
        record.samples.append(self._sample())

    def _finish_sample(self) -> None:
        state = self.state
        if state.record is None:
            return
        if len(self.segments_met) != len(state.discovered):
            self.session.notes.append(
                f"node '{self.name}' {self.pass_name}: met {len(self.segments_met)} Warp segments, discovery met "
                f"{len(state.discovered)}; this execution is not kept as a validation sample."
            )
            return
        if self.keeps_sample:
            state.record.samples.append(self._sample())

    def _sample(self) -> Sample:
        with self.recorder.paused_recording():
            outputs = [t.detach().clone() for _, _, t, _ in self.outputs]
        return Sample(inputs=list(self.sample_inputs), outputs=outputs)



def _active_run(session: Session, node: str, api: str, where: str) -> NodeRun:
    run = session.current
    if run is None:
        raise TraceError(f"{api}('{node}') at {where} is outside leapp.node('{node}').")
    if run.name != node:
        raise TraceError(f"{api}('{node}') at {where} is inside leapp.node('{run.name}'), not leapp.node('{node}').")
    return run


def _unpack(values: list) -> Any:
    return values[0] if len(values) == 1 else tuple(values)


def declare_inputs(node: str, values: dict, metadata: dict | None = None) -> Any:
    return _declare(node, values, "annotate.input_tensors", NodeRun.declare_input, metadata)


def declare_outputs(node: str, values: dict, metadata: dict | None = None) -> Any:
    return _declare(node, values, "annotate.output_tensors", NodeRun.declare_output, metadata)


def _declare(node: str, values: dict, api: str, declare, metadata: dict | None = None) -> Any:
    """Both annotations: a no-op outside a session (observed in observation mode), else each value declared
    on the node's active run, with its metadata checked and attached to its spec."""
    session = current_session()
    if session is None:
        observer = current_observer()
        if observer is not None:
            observer.declare(node, values, outputs=declare is NodeRun.declare_output, where=user_location())
        return _unpack(list(values.values()))
    where = user_location()
    run = _active_run(session, node, api, where)
    side = "output" if declare is NodeRun.declare_output else "input"
    checked = _checked_metadata(metadata, values, f"{api}('{node}') at {where}", side)
    out = [declare(run, name, v, where) for name, v in values.items()]
    specs = run.outputs if side == "output" else run.inputs
    for entry in specs[len(specs) - len(values):]:
        entry[-1].metadata = checked.get(entry[0], {})
    return _unpack(out)


def _checked_metadata(metadata: Any, values: dict, where: str, side: str) -> dict[str, dict]:
    """``metadata`` as name -> a copy of its fields, after checking it names declared values and holds plain data."""
    if metadata is None:
        return {}
    if not isinstance(metadata, dict):
        raise TraceError(f"{where}: metadata must map {side} names to mappings, got {type(metadata).__name__}.")
    unknown = [name for name in metadata if name not in values]
    if unknown:
        raise TraceError(f"{where}: metadata for {unknown}, which this call does not declare ({side}s: {list(values)}).")
    checked = {}
    for name, fields in metadata.items():
        problem = metadata_problem(fields, f"metadata of {side} {name!r}")
        if problem:
            raise TraceError(f"{where}: {problem}.")
        checked[name] = copy.deepcopy(fields)
    return checked


def _is_value(x) -> bool:
    return isinstance(x, torch.Tensor) or is_warp_array(x)


class NodeScope:
    """``leapp.node(name, export_with=..., **backend_params)``: context manager and decorator."""

    __slots__ = ("name", "export_with", "backend_params", "dynamic_batch", "_runs")

    def __init__(self, name: str, export_with: str = "onnx", *, dynamic_batch: Any = None,
                 **backend_params: Any) -> None:
        _check_declaration(name, export_with, backend_params)
        self.name = name
        self.export_with = export_with
        self.backend_params = backend_params
        self.dynamic_batch = dynamic_batch_range(name, dynamic_batch)
        self._runs: list[NodeRun | None] = []

    # ---- context manager ----

    def __enter__(self) -> NodeScope:
        session = current_session()
        if session is not None:
            self._runs.append(self._begin(session, user_location()))
        else:
            observer = current_observer()
            self._runs.append(None if observer is None else observer.begin(self.name))
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        run = self._runs.pop() if self._runs else None
        if isinstance(run, ObservedRun):
            run.end(failed=exc is not None)
        elif run is not None:
            _end(run, exc is not None)
        return False

    def _begin(self, session: Session, source: str) -> NodeRun:
        if session.current is not None:
            raise TraceError(
                f"leapp.node('{self.name}') at {source} is inside leapp.node('{session.current.name}'); "
                "nodes cannot be nested."
            )
        state = session.node_state(self.name, self.export_with, self.backend_params, source, self.dynamic_batch)
        run = NodeRun(session, state, source)
        session.current = run
        run.enter()
        return run

    # ---- decorator ----

    def __call__(self, fn: Callable) -> Callable:
        signature = inspect.signature(fn)
        source = user_location()

        @functools.wraps(fn)
        def traced(*args, **kwargs):
            session = current_session()
            if session is None:
                observer = current_observer()
                if observer is None:
                    return fn(*args, **kwargs)
                return _observed_call(observer, self.name, fn, signature, source, args, kwargs)
            run = self._begin(session, source)
            try:
                bound = signature.bind(*args, **kwargs)
                original = dict(bound.arguments)
                where = f"{source} (arguments of {fn.__qualname__})"
                for pname, value in list(bound.arguments.items()):
                    bound.arguments[pname] = _declare_structure(run, pname, value, where)
                result = fn(*bound.args, **bound.kwargs)
                _declare_result(run, result, f"{source} (return value of {fn.__qualname__})")
            except BaseException:
                _end(run, failed=True)
                raise
            _end(run, failed=False)
            if run.pass_index == 1 and run.state.record is not None and self.dynamic_batch is not None:
                traced_batch = run.state.record.inputs[0].shape[0]
                for b in probe_batches(traced_batch, *self.dynamic_batch):
                    probe = {k: _resized(v, b) for k, v in original.items()}
                    bound_probe = signature.bind_partial()
                    bound_probe.arguments.update(probe)
                    traced(*bound_probe.args, **bound_probe.kwargs)
            return result

        return traced


def _observed_call(observer, name: str, fn: Callable, signature, source: str, args, kwargs) -> Any:
    """The decorated function called as outside a session, its arguments and result observed under the
    names the recorder gives them (``_declare_structure`` / ``_declare_result``)."""
    run = observer.begin(name)
    try:
        try:
            arguments = signature.bind(*args, **kwargs).arguments
        except TypeError:
            arguments = {}  # fn raises the caller's TypeError itself, as outside a session
        where = f"{source} (arguments of {fn.__qualname__})"
        for pname, value in arguments.items():
            _declare_structure(run, pname, value, where)  # observed only: fn gets the caller's own objects
        result = fn(*args, **kwargs)
        try:
            _declare_result(run, result, f"{source} (return value of {fn.__qualname__})")
        except TraceError as e:  # what a trace would refuse is noted, not raised, in eager code
            run.observation.notes.append(str(e))
    except BaseException:
        run.end(failed=True)
        raise
    run.end(failed=False)
    return result


DEFAULT_DYNAMIC_BATCH = (1, 65536)


def dynamic_batch_range(name: str, value: Any) -> tuple[int, int] | None:
    """``dynamic_batch=`` as (min, max), or None; refused where the node is declared (docs/recorder.md 1.0)."""
    if value is None or value is False:
        return None
    if value is True:
        return DEFAULT_DYNAMIC_BATCH
    ok = (isinstance(value, (tuple, list)) and len(value) == 2
          and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
          and 1 <= value[0] < value[1] <= MAX_BATCH)
    if not ok:
        raise TraceError(
            f"leapp.node({name!r}) at {user_location()}: dynamic_batch={value!r} must be True or a (min, max) pair of "
            f"integers with 1 <= min < max <= {MAX_BATCH}."
        )
    return int(value[0]), int(value[1])


def probe_batches(traced: int, lo: int, hi: int) -> list[int]:
    """The batch sizes the decorator probes at: min and max of the range, else sizes next to the traced one."""
    out: list[int] = []
    for b in (lo, hi, traced + 1, traced - 1, traced + 2, traced - 2, (lo + hi) // 2):
        if lo <= b <= hi and b != traced and b not in out:
            out.append(b)
    return out[:2]


def _resized(value: Any, batch: int) -> Any:
    """A node argument at another batch: tensors and Warp arrays sliced or tiled along dim 0; others as they are."""
    if isinstance(value, torch.Tensor):
        if value.dim() == 0:
            return value
        n = value.shape[0]
        if batch <= n:
            return value[:batch].clone()
        reps = -(-batch // n)
        return torch.cat([value] * reps)[:batch].contiguous()
    if is_warp_array(value):
        t = _resized(wp.to_torch(value, requires_grad=False), batch)
        return wp.from_torch(t, dtype=value.dtype)
    if isinstance(value, (tuple, list)):
        items = [_resized(v, batch) for v in value]
        return type(value)(items) if isinstance(value, list) else tuple(items)
    if isinstance(value, dict):
        return {k: _resized(v, batch) for k, v in value.items()}
    return value


_CHECKED: set[tuple[str, str]] = set()  # declarations without backend_params already found valid


def _check_declaration(name: Any, export_with: Any, backend_params: dict) -> None:
    """Refuse a bad name, backend or backend parameter where the node is declared (also outside a session).

    A ``with leapp.node(...)`` in a loop declares the node on every iteration,
    so a valid (name, backend) pair without parameters is remembered.
    """
    key = (name, export_with) if type(name) is str and type(export_with) is str else None
    if key is not None and not backend_params and key in _CHECKED:
        return
    problem = name_problem(name)
    if problem is not None:
        raise TraceError(
            f"leapp.node({shown(name)}) at {user_location()}: invalid node name ({problem}). A node's name is the file "
            f"name of its artifact (<name>.onnx, .pt2 or .pt), so it must be {NAME_RULE}."
        )
    problem = backend_problem(export_with, backend_params)
    if problem is not None:
        raise TraceError(f"leapp.node({name!r}) at {user_location()}: {problem}.")
    if key is not None and not backend_params:
        if len(_CHECKED) >= 4096:
            _CHECKED.clear()
        _CHECKED.add(key)


def _end(run: NodeRun, failed: bool) -> None:
    session = run.session
    if failed:
        run.abort()
        return
    try:
        if session.block is not None and session.block.run is run:
            block = session.block
            block.close(failed=True)
            raise TraceError(f"leapp.node('{run.name}') exited while Warp segment '{block.segment_id}' is open.")
        run.finish()
    finally:
        run._pop_mode()
        session.current = None


def _declare_structure(run: NodeRun, name: str, value: Any, where: str) -> Any:
    if _is_value(value):
        return run.declare_input(name, value, where)
    if isinstance(value, (tuple, list)) and any(_is_value(v) for v in value):
        items = [run.declare_input(f"{name}_{i}", v, where) if _is_value(v) else v for i, v in enumerate(value)]
        return type(value)(items) if isinstance(value, list) else tuple(items)
    if isinstance(value, dict) and any(_is_value(v) for v in value.values()):
        return {k: run.declare_input(f"{name}_{k}", v, where) if _is_value(v) else v for k, v in value.items()}
    return value


def _declare_result(run: NodeRun, result: Any, where: str) -> None:
    if _is_value(result):
        run.declare_output("output", result, where)
    elif isinstance(result, (tuple, list)) and result and all(_is_value(v) for v in result):
        for i, v in enumerate(result):
            run.declare_output(f"output_{i}", v, where)
    elif isinstance(result, dict) and result and all(_is_value(v) for v in result.values()):
        for k, v in result.items():
            run.declare_output(str(k), v, where)
    else:
        raise TraceError(
            f"leapp.node('{run.name}') at {where}: a traced function must return a tensor, a tuple/list of "
            f"tensors or a dict of tensors, got {type(result).__name__}."
        )


def _refuse_segments_without_outputs(node: str, segments: list[SegmentRecord]) -> None:
    """A segment whose writes nothing in the node uses afterwards exports as a call with no results, which
    torch.export cannot load back and ONNX drops: refuse it while the user's code is at hand."""
    for segment in segments:
        if segment.captured_ops and not segment.outputs:
            raise TraceError(
                f"Warp segment {segment.id} opened at {segment.source} in node '{node}' writes nothing the node "
                "uses after the block: no traced tensor, no array read later (by torch, by another segment or as a "
                f"node output). Its operations ({', '.join(segment.captured_ops)}) would export as dead code. Read "
                "its results after the block (wp.to_torch(array) or the tensor it wrote), or move it out of the node."
            )
