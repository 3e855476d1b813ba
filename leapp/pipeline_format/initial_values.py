"""leapp/pipeline_format/initial_values.py: ``initial_values.safetensors``, the initial state of an export.

An export whose nodes carry state (docs/state.md) names this file in
``pipeline.yaml`` (``initial_values: {path, sha256}``). It is a safetensors
file: 8 bytes of little-endian header length N, N bytes of JSON header
``{"<node>/<input>": {"dtype": "F32", "shape": [..], "data_offsets": [b, e]},
"__metadata__": {..}?}``, then the data. The file is untrusted input, so
this module checks it completely before a runtime makes a tensor of it:
bounded sizes, strict JSON, exactly one key per state edge, each entry's
dtype and shape those of its node input, offsets in order with no gap or
overlap and each entry's length its element size times its element count.
The C++ reader (ext/pipeline) checks the same, with the same texts.

Pure Python (no torch): the runtimes turn the checked bytes into tensors.
"""

from __future__ import annotations

from typing import Any

from leapp.bundle.strict_json import decode_strict_json

from .format import DTYPE_BYTES, MAX_PIPELINE_BYTES, PipelineError

__all__ = ["INITIAL_VALUES_FILE", "MAX_INITIAL_HEADER_BYTES", "SAFETENSORS_DTYPES", "StateEdge", "check_initial_values",
           "state_edges"]

INITIAL_VALUES_FILE = "initial_values.safetensors"
MAX_INITIAL_HEADER_BYTES = 16 << 20

# pipeline.yaml's dtype names -> safetensors' (the dtypes both can say)
SAFETENSORS_DTYPES = {
    "bool": "BOOL", "uint8": "U8", "int8": "I8", "int16": "I16", "int32": "I32", "int64": "I64", "uint16": "U16",
    "uint32": "U32", "uint64": "U64", "float16": "F16", "bfloat16": "BF16", "float32": "F32", "float64": "F64",
    "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2", "complex64": "C64",
}


class StateEdge(tuple):
    """(node, input, output, dtype, shape) of one state edge; ``key`` is its initial value's ``node/input``."""

    __slots__ = ()

    def __new__(cls, node: str, input: str, output: str, dtype: str, shape: list[int]):
        return super().__new__(cls, (node, input, output, dtype, tuple(shape)))

    node = property(lambda self: self[0])
    input = property(lambda self: self[1])
    output = property(lambda self: self[2])
    dtype = property(lambda self: self[3])
    shape = property(lambda self: self[4])

    @property
    def key(self) -> str:
        return f"{self.node}/{self.input}"


def state_edges(desc: dict) -> list[StateEdge]:
    """The state edges of a checked description, in ``edges`` order, with their input's dtype and shape."""
    inputs = {(n["name"], e["name"]): e for n in desc["nodes"] for e in n["inputs"]}
    out = []
    for edge in desc["edges"]:
        if edge.get("state", False):
            spec = inputs[edge["to_node"], edge["to_input"]]
            out.append(StateEdge(edge["to_node"], edge["to_input"], edge["from_output"], spec["dtype"], spec["shape"]))
    return out


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def check_initial_values(data: bytes, file: str, edges: list[StateEdge]) -> dict[str, memoryview]:
    """``node/input`` -> the bytes of its initial value (little-endian, C order), after checking ``data`` (the
    file's bytes) against the state edges; PipelineError naming ``file`` and the key otherwise."""
    if len(data) > MAX_PIPELINE_BYTES:
        raise PipelineError(f"{file}: {len(data)} bytes, more than the {MAX_PIPELINE_BYTES} bytes a pipeline's "
                            "tensors may hold (MAX_PIPELINE_BYTES)")
    if len(data) < 8:
        raise PipelineError(f"{file}: {len(data)} bytes, too short for a safetensors header length (8 bytes)")
    n = int.from_bytes(data[:8], "little")
    if n > MAX_INITIAL_HEADER_BYTES:
        raise PipelineError(f"{file}: header length {n} is more than {MAX_INITIAL_HEADER_BYTES} bytes")
    if 8 + n > len(data):
        raise PipelineError(f"{file}: header length {n} runs past the end of the file ({len(data)} bytes)")
    header = decode_strict_json(bytes(data[8:8 + n]), f"{file}: header", error=PipelineError)
    if not isinstance(header, dict):
        raise PipelineError(f"{file}: header: expected a JSON object, got {type(header).__name__}")
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise PipelineError(f"{file}: header: __metadata__ must map names to strings")
    expected = {e.key: e for e in edges}
    missing = [k for k in expected if k not in header]
    if missing:
        raise PipelineError(f"{file}: no initial value for state input {missing[0]!r} (keys: {sorted(header)})")
    extra = [k for k in header if k not in expected]
    if extra:
        raise PipelineError(f"{file}: key {extra[0]!r} is no state input of the pipeline (state inputs: "
                            f"{list(expected)})")
    body = memoryview(data)[8 + n:]
    spans = []
    for key, edge in expected.items():
        spans.append((_entry_span(header[key], key, edge, file), key))
    at = 0
    for (begin, end), key in sorted(spans):
        if begin != at:
            what = "overlaps the entry before it" if begin < at else f"leaves a gap of {begin - at} bytes before it"
            raise PipelineError(f"{file}: {key!r}: data_offsets [{begin}, {end}] {what}")
        at = end
    if at != len(body):
        raise PipelineError(f"{file}: the entries' data ends at byte {at} of {len(body)} data bytes (a file "
                            "holds its entries' data and nothing else)")
    return {key: body[begin:end] for (begin, end), key in spans}


def _entry_span(entry: Any, key: str, edge: StateEdge, file: str) -> tuple[int, int]:
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        raise PipelineError(f"{file}: {key!r}: expected an object with dtype, shape and data_offsets")
    want = SAFETENSORS_DTYPES.get(edge.dtype)
    if entry["dtype"] != want:
        raise PipelineError(f"{file}: {key!r}: dtype {entry['dtype']!r}, but state input {edge.input!r} of node "
                            f"{edge.node!r} is {edge.dtype} ({want})")
    shape = entry["shape"]
    if not isinstance(shape, list) or any(type(d) is not int for d in shape) or tuple(shape) != edge.shape:
        raise PipelineError(f"{file}: {key!r}: shape {shape!r}, but state input {edge.input!r} of node "
                            f"{edge.node!r} has shape {list(edge.shape)}")
    offsets = entry["data_offsets"]
    if (not isinstance(offsets, list) or len(offsets) != 2 or any(type(o) is not int for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]):
        raise PipelineError(f"{file}: {key!r}: data_offsets {offsets!r} must be [begin, end] with 0 <= begin <= end")
    size = DTYPE_BYTES[edge.dtype] * _numel(list(edge.shape))
    if offsets[1] - offsets[0] != size:
        raise PipelineError(f"{file}: {key!r}: data_offsets {offsets} hold {offsets[1] - offsets[0]} bytes, "
                            f"{edge.dtype}{list(edge.shape)} is {size} bytes")
    return offsets[0], offsets[1]
