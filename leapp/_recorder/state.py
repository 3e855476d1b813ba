"""leapp/_recorder/state.py: ``annotate.state_tensors`` and ``annotate.update_state``, a node's state.

A state is a node input that, at every step after the first, takes what the
node returned for it at the step before (a recurrent policy's hidden state,
the last action). The recorder declares it as an input (no recorded edge:
only the node's own previous step feeds it) and its update as the output
``<name>_out``; the value at the node's first traced call is the initial
value the runtimes start from (docs/state.md).
"""

from __future__ import annotations

from typing import Any

from leapp._contract.names import shown
from leapp.errors import TraceError

from .node import NodeRun, _active_run, _checked_metadata, _unpack
from .observe import current_observer
from .session import current_session
from .source import user_location

__all__ = ["STATE_OUTPUT_SUFFIX", "declare_state", "update_state", "state_output_name"]

STATE_OUTPUT_SUFFIX = "_out"


def state_output_name(name: str) -> str:
    """The node output that carries state ``name`` to the next step."""
    return f"{name}{STATE_OUTPUT_SUFFIX}"


def _check_values(api: str, node: str, values: Any, where: str) -> None:
    if not isinstance(values, dict) or not values:
        raise TraceError(f"{api}({shown(node)}) at {where}: expects a non-empty dict of name -> tensor, got "
                         f"{type(values).__name__}.")


def declare_state(node: str, values: dict, metadata: dict | None = None) -> Any:
    """``annotate.state_tensors``: the values as node inputs marked state; outside a session, the values."""
    session = current_session()
    where = user_location()
    api = "annotate.state_tensors"
    if session is None:
        observer = current_observer()
        if observer is not None:
            observer.declare(node, values, outputs=False, where=where)
        return _unpack(list(values.values()))
    _check_values(api, node, values, where)
    run = _active_run(session, node, api, where)
    if run.state.dynamic_batch is not None:
        lo, hi = run.state.dynamic_batch
        raise TraceError(
            f"{api}('{node}') at {where}: node '{node}' has dynamic_batch=({lo}, {hi}); state with a dynamic batch is "
            "refused for now: its initial value has the traced batch (docs/state.md, 'Dynamic batch')."
        )
    checked = _checked_metadata(metadata, values, f"{api}('{node}') at {where}", "input")
    out = []
    for name, value in values.items():
        if name in run.states:
            raise TraceError(f"{api}('{node}') at {where}: state {name!r} declared twice (first at {run.states[name]}).")
        out.append(run.declare_input(name, value, where, edge=False))
        run.states[name] = where
        _, t, spec = run.inputs[-1]
        spec.metadata = checked.get(name, {})
        if run.pass_index == 0:
            with run.recorder.paused_recording():
                run.state_values[name] = t.detach().to("cpu", copy=True)
    return _unpack(out)


def update_state(node: str, values: dict) -> Any:
    """``annotate.update_state``: the values as the outputs ``<name>_out`` of the states they update."""
    session = current_session()
    where = user_location()
    api = "annotate.update_state"
    if session is None:
        observer = current_observer()
        if observer is not None:
            observer.declare(node, {state_output_name(k): v for k, v in values.items()}, outputs=True, where=where)
        return _unpack(list(values.values()))
    _check_values(api, node, values, where)
    run = _active_run(session, node, api, where)
    out = []
    for name, value in values.items():
        out.append(_update_one(run, api, name, value, where))
    return _unpack(out)


def _update_one(run: NodeRun, api: str, name: str, value: Any, where: str) -> Any:
    node = run.name
    if name not in run.states:
        declared = f" (states declared: {list(run.states)})" if run.states else ""
        raise TraceError(f"{api}('{node}') at {where}: state {name!r} was not declared by annotate.state_tensors "
                         f"in this run of node '{node}'{declared}.")
    if name in run.state_updates:
        raise TraceError(f"{api}('{node}') at {where}: state {name!r} updated twice (first at "
                         f"{run.state_updates[name]}).")
    output = state_output_name(name)
    taken = next((n for n, _, _, _ in run.outputs if n == output), None)
    if taken is not None:
        raise TraceError(
            f"{api}('{node}') at {where}: the update of state {name!r} is the node output {output!r}, but node "
            f"'{node}' already declares an output {output!r}; rename one of them."
        )
    result = run.declare_output(output, value, where)
    run.state_updates[name] = where
    run.state_outputs[output] = name
    spec = run.outputs[-1][3]
    state_spec = next(s for n, _, s in run.inputs if n == name)
    if spec.dtype != state_spec.dtype or tuple(spec.shape) != tuple(state_spec.shape):
        raise TraceError(
            f"{api}('{node}') at {where}: the update of state {name!r} is {_text(spec)}, the state input "
            f"(declared at {run.states[name]}) is {_text(state_spec)}; an update has the state's dtype and shape."
        )
    return result


def _text(spec) -> str:
    return f"{str(spec.dtype).removeprefix('torch.')}{list(spec.shape)}"
