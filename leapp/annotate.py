"""leapp.annotate: mark a node's inputs, outputs and Warp segments.

Outside an active ``leapp.trace`` session every function here is a no-op that
returns its arguments, so production code keeps its annotations.
"""

from __future__ import annotations

from typing import Any

from leapp._recorder.node import declare_inputs, declare_outputs
from leapp._recorder.segment import WarpOp
from leapp._recorder.state import declare_state
from leapp._recorder.state import update_state as _update_state

__all__ = ["input_tensors", "output_tensors", "state_tensors", "update_state", "warp_op"]


def input_tensors(node: str, values: dict[str, Any], metadata: dict[str, dict] | None = None) -> Any:
    """Declare the inputs of ``node`` (torch tensors or ``wp.array``s), in dict order.

    Returns the values: one value when the dict has one entry, else a tuple in
    dict order. Inside a session, use the returned values: an input that is a
    view of a larger allocation comes back as a dense copy (the exported
    boundary is a dense tensor).

    ``metadata`` maps some of the names to the user's fields for deployment, e.g.
    ``{"quat": {"kind": "base_quat", "frame": "world"}}``: strings, numbers, booleans,
    lists and mappings of them (docs/recorder.md, "Metadata"). They are written to
    pipeline.yaml and exposed by ``leapp.load`` and the C++ runner.
    """
    return declare_inputs(node, values, metadata)


def output_tensors(node: str, values: dict[str, Any], metadata: dict[str, dict] | None = None) -> Any:
    """Declare the outputs of ``node``; returns the values and takes ``metadata`` like ``input_tensors``."""
    return declare_outputs(node, values, metadata)


def state_tensors(node: str, values: dict[str, Any], metadata: dict[str, dict] | None = None) -> Any:
    """Declare state of ``node``: inputs that each step takes from the node's own previous step (docs/state.md).

    Returns the values like ``input_tensors``. Each must be updated in the same run with ``update_state``;
    the value at the node's first traced call is the export's initial value (``Pipeline.reset()``).
    """
    return declare_state(node, values, metadata)


def update_state(node: str, values: dict[str, Any]) -> Any:
    """Give each state declared by ``state_tensors`` its value for the next step (node outputs ``<name>_out``);
    returns the values like ``output_tensors``. Same dtype and shape as the state."""
    return _update_state(node, values)


def warp_op(node: str | None = None) -> WarpOp:
    """One Warp segment: ``with annotate.warp_op(): wp.launch(...)`` (also usable as a decorator).

    ``node`` defaults to the enclosing ``leapp.node``. The block holds an owner
    token: entering another ``warp_op`` while it is open raises.
    """
    return WarpOp(node)
