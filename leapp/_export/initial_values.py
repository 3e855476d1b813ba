"""leapp/_export/initial_values.py: writes ``initial_values.safetensors``, the states' initial values.

One entry per state (docs/state.md), keyed ``node/input``, holding the state
input's value at the node's first traced call. Written with the
``safetensors`` package (its header is sorted, so an export is byte for byte
reproducible) and read back through the readers' own check
(``leapp.pipeline_format.check_initial_values``) before pipeline.yaml names it.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from leapp._contract.records import SessionRecord
from leapp.errors import ExportError
from leapp.pipeline_format import (INITIAL_VALUES_FILE, SAFETENSORS_DTYPES, PipelineError, StateEdge,
                                   check_initial_values, dtype_name)

__all__ = ["record_state_edges", "write_initial_values"]


def record_state_edges(record: SessionRecord) -> list[StateEdge]:
    """Each node's states as state edges, in node order; refuses a state its node does not declare alike."""
    edges = []
    for node in record.nodes.values():
        inputs = {s.name: s for s in node.inputs}
        outputs = {s.name: s for s in node.outputs}
        for state in node.state:
            where = f"session '{record.name}' node '{node.name}' state {state.input!r}"
            if state.input not in inputs or state.output not in outputs:
                raise ExportError(f"{where}: the node has no input {state.input!r} or no output {state.output!r}")
            spec, out = inputs[state.input], outputs[state.output]
            initial = state.initial
            for what, dtype, shape in (("output " + repr(state.output), out.dtype, out.shape),
                                       ("initial value", initial.dtype, initial.shape)):
                if dtype != spec.dtype or tuple(shape) != tuple(spec.shape):
                    raise ExportError(f"{where}: its {what} is {dtype_name(dtype)}{list(shape)}, the input "
                                      f"{dtype_name(spec.dtype)}{list(spec.shape)}")
            if dtype_name(spec.dtype) not in SAFETENSORS_DTYPES:
                raise ExportError(f"{where}: dtype {dtype_name(spec.dtype)} cannot be an initial value (safetensors "
                                  f"holds {sorted(SAFETENSORS_DTYPES)})")
            if node.dynamic_batch is not None:
                raise ExportError(f"{where}: state in a node with dynamic_batch is refused (docs/state.md)")
            edges.append(StateEdge(node.name, state.input, state.output, dtype_name(spec.dtype), list(spec.shape)))
    return edges


def write_initial_values(record: SessionRecord, folder: Path) -> dict | None:
    """Writes ``folder/initial_values.safetensors``; returns pipeline.yaml's ``initial_values`` entry, or None
    (and writes nothing) when no node has state."""
    edges = record_state_edges(record)
    if not edges:
        return None
    from safetensors.torch import save

    initial = {f"{n.name}/{s.input}": s.initial for n in record.nodes.values() for s in n.state}
    tensors = {key: initial[key].detach().to("cpu").contiguous() for key in (e.key for e in edges)}
    # One metadata key: safetensors keeps metadata in a hash map whose order changes from call to call, and an
    # export must be byte-reproducible (pipeline.yaml's producer says who wrote it).
    data = save(tensors, metadata={"format": "pt"})
    path = Path(folder) / INITIAL_VALUES_FILE
    try:
        check_initial_values(data, str(path), edges)
    except PipelineError as e:
        raise ExportError(f"session '{record.name}': leapp would write an invalid {e}") from e
    path.write_bytes(data)
    return {"path": INITIAL_VALUES_FILE, "sha256": hashlib.sha256(data).hexdigest()}
