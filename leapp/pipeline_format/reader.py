"""leapp/pipeline_format/reader.py: reading ``pipeline.yaml`` safely and checking it completely.

``pipeline.yaml`` is untrusted input (an export folder may come from anywhere),
so it is read in four steps, each refusing with a PipelineError that names the
file and the field (``nodes[2].inputs[0].shape``) or the line:

1. at most MAX_FILE_BYTES of UTF-8 text;
2. a streaming pass over the YAML events that refuses aliases, anchors and
   explicit tags (leapp never writes them; aliases are how a 700-byte file
   expands to gigabytes) and documents nested deeper than MAX_DEPTH or with
   more than MAX_VALUES values, before anything is composed;
3. a SafeLoader that refuses duplicate and non-string keys (PyYAML would keep
   the last of two equal keys silently) and resolves only JSON's scalar
   types (no timestamps, no merge keys);
4. the JSON Schema (``pipeline.schema.json``, ``jsonschema``), then what a
   schema cannot say: unique names, and edges, pipeline inputs and outputs
   that name existing nodes, inputs and outputs with the same dtype and shape,
   every node input fed exactly once, edges in execution order unless marked
   ``feedback``; state edges (``state: true``: feedback from a node to itself,
   feeding its input, its output never a pipeline output) and ``initial_values``
   present iff there are any; tensors' metadata finite and within its limits (``metadata``).

The writer (``leapp._export.pipeline_yaml``) checks what it writes with the
same functions, so a file leapp wrote always reads back equal.
"""

from __future__ import annotations

import functools
import hashlib
import json
import reprlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .format import (
    DTYPE_BYTES,
    MAX_DEPTH,
    MAX_INT,
    MAX_PIPELINE_BYTES,
    MAX_TENSOR_BYTES,
    MAX_FILE_BYTES,
    MAX_VALUES,
    PIPELINE_FILE,
    PIPELINE_FORMAT,
    PIPELINE_VERSION,
    PipelineError,
    schema,
)
from . import yaml_text
from .metadata import metadata_problem
from leapp.bundle.strict_json import decode_strict_json
from leapp.signing.readonce import check_read
from .paths import contained_path

__all__ = ["read_pipeline", "parse_description", "validate_description", "field_path", "prepare", "short_repr"]

_short = reprlib.Repr()
_short.maxstring = 60
_short.maxother = 60
_short.maxlist = _short.maxdict = 4
_short.maxlevel = 2


def short_repr(value: Any) -> str:
    """``value`` for a message, bounded (strings cut to 60 characters around ``...``): what a hostile name or
    path shows. The C++ readers write the same text (``ext/pipeline/src/pyrepr.h``)."""
    return _short.repr(value)


def field_path(parts: Iterable[str | int]) -> str:
    """``nodes[2].inputs[0].shape`` for ('nodes', 2, 'inputs', 0, 'shape')."""
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def read_pipeline(path: str | Path, twin: bool = True) -> tuple[Path, dict]:
    """(folder, checked description) for a pipeline folder or its pipeline.yaml; ``twin``: also refuse a
    ``pipeline.json`` beside it that disagrees (``check_twin``; off only to rewrite the twin).

    Raises:
        FileNotFoundError: the folder has no pipeline.yaml.
        PipelineError: pipeline.yaml leaves the folder (a symlink), is too large, is not
            YAML leapp could have written, or breaks the schema or its cross-references.
    """
    path = Path(path)
    folder = path.parent if path.is_file() else path
    file = folder / PIPELINE_FILE
    if not file.is_file():  # also refuses FIFOs and devices, which would block or never end
        raise FileNotFoundError(f"no {PIPELINE_FILE} in {folder}")
    contained_path(folder, PIPELINE_FILE, str(file))
    with open(file, "rb") as f:
        data = f.read(MAX_FILE_BYTES + 1)
    if len(data) <= MAX_FILE_BYTES:  # (a larger one is refused as such below) a signed folder: the signed bytes
        check_read(file, data)  # before any parsing (leapp.signing.readonce)
    described, differs = check_twin(folder, data) if twin else (None, None)  # first, in the C++ reader's order
    try:
        description = parse_description(data, file)
    except PipelineError:
        if differs is not None:  # not the twin's text, and not even a description: the C++ reader's refusal
            raise differs from None
        raise
    if described is not None and not _same(described, description):
        if differs is not None:
            raise differs
        # the twin's own text read back as other values: a rendering bug, never run on
        where = field_path(_first_difference(description, described))
        raise PipelineError(f"{folder / TWIN_FILE} and {file} disagree at {where}: the two descriptions of one "
                            "export must say the same (leapp-run reads pipeline.json, leapp.load pipeline.yaml)")
    return folder, description


TWIN_FILE = "pipeline.json"  # leapp.pipeline_format.twin writes it; named here, where it is read
TWIN_DIGEST_KEY = "pipeline_yaml_sha256"


def check_twin(folder: Path, yaml_bytes: bytes) -> tuple[dict | None, PipelineError | None]:
    """Checks ``pipeline.json`` (the twin leapp-run reads) against ``pipeline.yaml`` (``yaml_bytes``, read once), in
    the C++ reader's order and with its texts (ext/pipeline/src/description.cpp): strict JSON, a mapping, the sha256
    of those bytes. Returns (the twin's description, None) when those bytes are the twin's canonical rendering
    (``yaml_text``), so every reader acts on the document leapp-run acts on; (description, the C++ reader's
    refusal) when they are not: ``read_pipeline`` raises it unless the YAML holds the same values in another
    layout (an export written before the canonical text), which leapp-run alone refuses until
    ``leapp write-json``. (None, None) without a twin (exports made before it existed)."""
    file = folder / TWIN_FILE
    try:
        if not file.is_file():
            return None, None
        contained_path(folder, TWIN_FILE, str(file))
        with open(file, "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise PipelineError(f"{file}: cannot be read: {e}") from e
    hint = f"run `leapp write-json {folder}` to write it from pipeline.yaml (docs/pipeline-format.md, 'pipeline.json')"
    if len(raw) > MAX_FILE_BYTES:
        raise PipelineError(f"{file}: larger than {MAX_FILE_BYTES} bytes (leapp writes a few KiB per node)")
    check_read(file, raw)  # a signed folder: the signed bytes (leapp.signing.readonce)

    twin = decode_strict_json(raw, str(file), error=PipelineError, max_depth=MAX_DEPTH, max_values=MAX_VALUES)
    if not isinstance(twin, dict):
        validate_description(twin, file)  # refuses, as the C++ reader does: not a mapping
    yaml_file = folder / PIPELINE_FILE
    if len(yaml_bytes) > MAX_FILE_BYTES:
        raise PipelineError(f"{yaml_file}: larger than {MAX_FILE_BYTES} bytes (leapp writes a few KiB per node)")
    actual = hashlib.sha256(yaml_bytes).hexdigest()
    digest = twin.pop(TWIN_DIGEST_KEY, None)
    if not isinstance(digest, str):
        raise PipelineError(f"{file}: {TWIN_DIGEST_KEY}: missing (the sha256 of the pipeline.yaml it was made from): "
                            f"{hint}")
    if digest != actual:
        raise PipelineError(f"{file}: {TWIN_DIGEST_KEY}: {_short.repr(digest)} is not the sha256 of {yaml_file} ({actual}): "
                            f"pipeline.yaml changed after pipeline.json was written; {hint}")
    difference = yaml_text.first_difference(twin, yaml_bytes)
    if difference is None:
        return twin, None
    line, expected, path = difference
    where = yaml_text.shown(path) if path else "after the last field"
    return twin, PipelineError(f"{file}: {yaml_file} differs from it at line {line} ({where}), where leapp writes "
                               f"`{yaml_text.shown(expected)}`: the two descriptions of one export must say the same "
                               f"(leapp-run reads pipeline.json, leapp.load pipeline.yaml); {hint}")


def _same(a: Any, b: Any) -> bool:
    """Equal as JSON documents: 1, 1.0 and true differ (Python's == says they are equal)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def _first_difference(a: Any, b: Any, at: tuple = ()) -> tuple:
    """The path of the first value where ``a`` and ``b`` differ (``_same``), keys in sorted order."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            if key not in a or key not in b:
                return (*at, key)
            if not _same(a[key], b[key]):
                return _first_difference(a[key], b[key], (*at, key))
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            if not _same(x, y):
                return _first_difference(x, y, (*at, i))
    return at


def parse_description(data: bytes | str, file: str | Path = PIPELINE_FILE) -> dict:
    """The checked description held by ``data`` (the bytes of ``file``)."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    if len(data) > MAX_FILE_BYTES:
        raise PipelineError(f"{file}: larger than {MAX_FILE_BYTES} bytes (leapp writes a few KiB per node)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PipelineError(f"{file}: not UTF-8 text (byte {e.start}: {e.reason})") from e
    description = _load_yaml(text, file)
    validate_description(description, file)
    return description


def validate_description(description: Any, file: str | Path = PIPELINE_FILE) -> None:
    """Checks a parsed description against the schema and its cross-references; raises PipelineError."""
    if not isinstance(description, dict):
        raise PipelineError(f"{file}: expected a mapping at the top level, got {_describe(description)}")
    if description.get("format") != PIPELINE_FORMAT:
        raise PipelineError(f"{file}: not a leapp pipeline description (format must be {PIPELINE_FORMAT!r})")
    version = description.get("version")
    if type(version) is not int or version != PIPELINE_VERSION:
        raise PipelineError(f"{file}: unsupported pipeline.yaml version {version!r} (this leapp reads {PIPELINE_VERSION})")
    _check_schema(description, file)
    _check_references(description, file)
    _check_metadata(description, file)
    _check_batches(description, file)
    _check_sizes(description, file)


# --- YAML --------------------------------------------------------------------------------------------


def _yaml():
    import yaml

    return yaml


@functools.cache
def _loader_class():
    """A (C when available) SafeLoader that refuses duplicate and non-string keys and resolves JSON's scalars only."""
    yaml = _yaml()
    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    dropped = {"tag:yaml.org,2002:timestamp", "tag:yaml.org,2002:merge", "tag:yaml.org,2002:value"}
    resolvers = {
        first: [(tag, regexp) for tag, regexp in entries if tag not in dropped]
        for first, entries in yaml.SafeLoader.yaml_implicit_resolvers.items()
    }

    class StrictLoader(base):
        yaml_implicit_resolvers = resolvers

        def construct_mapping(self, node, deep=False):
            seen = {}
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag != "tag:yaml.org,2002:str":
                    raise yaml.constructor.ConstructorError(
                        None, None, "a mapping key that is not a string", key_node.start_mark
                    )
                if key_node.value in seen:
                    raise yaml.constructor.ConstructorError(
                        f"the key {key_node.value!r} first given", seen[key_node.value],
                        f"key {key_node.value!r} given twice", key_node.start_mark,
                    )
                seen[key_node.value] = key_node.start_mark
            return super().construct_mapping(node, deep)

    return StrictLoader


def _mark(mark) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "?"


def _check_events(text: str, file) -> None:
    """Refuses aliases, anchors, tags, extra documents, nesting > MAX_DEPTH and > MAX_VALUES values."""
    yaml = _yaml()
    depth = values = documents = 0
    for event in yaml.parse(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
        where = f"{file}: {_mark(event.start_mark)}"
        if isinstance(event, yaml.DocumentStartEvent):
            documents += 1
            if documents > 1:
                raise PipelineError(f"{where}: a second YAML document (pipeline.yaml holds one)")
        if not isinstance(event, yaml.NodeEvent):
            if isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
            continue
        if isinstance(event, yaml.AliasEvent):
            raise PipelineError(f"{where}: YAML alias *{event.anchor} (leapp never writes aliases; they are refused)")
        if event.anchor is not None:
            raise PipelineError(f"{where}: YAML anchor &{event.anchor} (leapp never writes anchors; they are refused)")
        if event.tag is not None:
            raise PipelineError(f"{where}: YAML tag {event.tag} (leapp never writes tags; they are refused)")
        values += 1
        if values > MAX_VALUES:
            raise PipelineError(f"{where}: more than {MAX_VALUES} values")
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                raise PipelineError(f"{where}: nested deeper than {MAX_DEPTH} levels")


def _load_yaml(text: str, file) -> Any:
    yaml = _yaml()
    try:
        _check_events(text, file)
        document = yaml.load(text, Loader=_loader_class())
    except yaml.MarkedYAMLError as e:
        context = f"{e.context} ({_mark(e.context_mark)}): " if e.context and e.context_mark is not None else ""
        raise PipelineError(f"{file}: {_mark(e.problem_mark)}: not valid YAML: {context}{e.problem}") from e
    except yaml.YAMLError as e:
        raise PipelineError(f"{file}: not valid YAML: {e}") from e
    if document is None:
        raise PipelineError(f"{file}: empty")
    return document


# --- the schema ----------------------------------------------------------------------------------------


def prepare() -> None:
    """Builds the schema validator now (jsonschema's import and the schema's own check, 0.05-0.2 s), so
    that the first read does not pay it: for processes that wait for work, such as the validation worker."""
    _validator()


@functools.cache
def _validator():
    from jsonschema import Draft202012Validator, validators

    Draft202012Validator.check_schema(schema())
    # "integer" is a YAML integer: 4.0 is a float and True a boolean, neither a dimension
    types = Draft202012Validator.TYPE_CHECKER.redefine(
        "integer", lambda _checker, value: isinstance(value, int) and not isinstance(value, bool)
    )
    return validators.extend(Draft202012Validator, type_checker=types)(schema())


_TYPE_WORDS = {
    "object": "a mapping",
    "array": "a list",
    "string": "a string",
    "integer": "an integer",
    "boolean": "true or false",
    "number": "a number",
}


def _describe(value: Any) -> str:
    kind = {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean", int: "an integer",
            float: "a float", type(None): "null"}.get(type(value), type(value).__name__)
    return f"{kind} {_short.repr(value)}" if value is not None else kind


def _error_text(error) -> tuple[str, str]:
    """(field, what is wrong) for one jsonschema error, without printing whole subtrees."""
    path = list(error.absolute_path)
    kind, expected, value = error.validator, error.validator_value, error.instance
    if kind == "required":
        missing = next((key for key in expected if key not in value), expected[0])
        return field_path(path + [missing]), "missing"
    if kind == "type":
        words = " or ".join(_TYPE_WORDS.get(t, t) for t in ([expected] if isinstance(expected, str) else expected))
        return field_path(path), f"expected {words}, got {_describe(value)}"
    if kind == "const":
        return field_path(path), f"must be {expected!r}, got {_describe(value)}"
    if kind == "enum":
        return field_path(path), f"{_short.repr(value)} is not one of {', '.join(map(str, expected))}"
    if kind == "pattern":
        described = error.schema.get("description") or f"matching {expected}"
        return field_path(path), f"{_short.repr(value)} is not {described}"
    if kind == "minimum":
        return field_path(path), f"{value} is below {expected}"
    if kind == "maximum":
        return field_path(path), f"{value} is above {expected}"
    if kind in ("minLength", "minItems"):
        return field_path(path), "must not be empty"
    return field_path(path), error.message[:300]


def _check_schema(description: dict, file) -> None:
    from jsonschema.exceptions import best_match

    errors = list(_validator().iter_errors(description))
    if not errors:
        return
    field, text = _error_text(best_match(errors))
    more = f" (and {len(errors) - 1} more problem{'s' * (len(errors) > 2)})" if len(errors) > 1 else ""
    raise PipelineError(f"{file}: {field}: {text}{more}")


# --- cross-references a schema cannot express -------------------------------------------------------------


def _spec(entry: dict) -> str:
    return f"{entry['dtype']}{entry['shape']}"


def _unique(entries: list[dict], field: str, file, what: str) -> dict[str, int]:
    """name -> index; refuses a name given twice."""
    index: dict[str, int] = {}
    for i, entry in enumerate(entries):
        name = entry["name"]
        if name in index:
            raise PipelineError(f"{file}: {field}[{i}].name: {what} {name!r} is also {field}[{index[name]}]")
        index[name] = i
    return index


def _check_references(desc: dict, file) -> None:
    nodes = desc["nodes"]
    node_index = _unique(nodes, "nodes", file, "node")
    ports = {}
    for n, node in enumerate(nodes):
        ports[node["name"]] = {
            side: {e["name"]: (i, e) for i, e in enumerate(node[side])} for side in ("inputs", "outputs")
        }
        for side in ("inputs", "outputs"):
            _unique(node[side], f"nodes[{n}].{side}", file, side[:-1])
    fed: dict[tuple[str, str], str] = {}

    def port(field: str, entry: dict, node_key: str, name_key: str, side: str) -> dict:
        node, name = entry[node_key], entry[name_key]
        if node not in ports:
            raise PipelineError(f"{file}: {field}.{node_key}: no node {node!r} (nodes: {list(ports)})")
        if name not in ports[node][side]:
            raise PipelineError(
                f"{file}: {field}.{name_key}: node {node!r} has no {side[:-1]} {name!r} ({side}: {list(ports[node][side])})"
            )
        return ports[node][side][name][1]

    def feed(field: str, node: str, name: str) -> None:
        if (node, name) in fed:
            raise PipelineError(f"{file}: {field}: input {name!r} of node {node!r} is already fed by {fed[node, name]}")
        fed[node, name] = field

    def same(field: str, a: dict, b: dict, text: str) -> None:
        if a["dtype"] != b["dtype"] or a["shape"] != b["shape"]:
            raise PipelineError(f"{file}: {field}: {text} {_spec(a)} to {_spec(b)}")

    state_outputs: dict[tuple[str, str], str] = {}
    for e, edge in enumerate(desc["edges"]):
        field = f"edges[{e}]"
        src = port(field, edge, "from_node", "from_output", "outputs")
        dst = port(field, edge, "to_node", "to_input", "inputs")
        same(field, src, dst, "joins")
        forward = node_index[edge["from_node"]] < node_index[edge["to_node"]]
        if edge.get("state", False):
            if not edge.get("feedback", False):
                raise PipelineError(f"{file}: {field}.state: a state edge needs 'feedback: true' (it carries the "
                                    "value to the next step)")
            if edge["from_node"] != edge["to_node"]:
                raise PipelineError(f"{file}: {field}.state: a state edge goes from a node to itself, not from "
                                    f"{edge['from_node']!r} to {edge['to_node']!r}")
            feed(field, edge["to_node"], edge["to_input"])
            state_outputs[edge["from_node"], edge["from_output"]] = field
        elif edge.get("feedback", False):
            if forward:
                raise PipelineError(
                    f"{file}: {field}.feedback: an edge to a later node is not feedback (nodes run in the listed order)"
                )
        elif not forward:
            raise PipelineError(
                f"{file}: {field}: goes from {edge['from_node']!r} back to {edge['to_node']!r} without "
                "'feedback: true' (nodes run in the listed order)"
            )
        else:
            feed(field, edge["to_node"], edge["to_input"])
    if state_outputs and "initial_values" not in desc:
        raise PipelineError(f"{file}: initial_values: missing (the state edges {sorted(state_outputs.values())} "
                            "need their initial values)")
    if "initial_values" in desc and not state_outputs:
        raise PipelineError(f"{file}: initial_values: present, but no edge has 'state: true'")
    _unique(desc["inputs"], "inputs", file, "pipeline input")
    for i, entry in enumerate(desc["inputs"]):
        for c, consumer in enumerate(entry["consumers"]):
            field = f"inputs[{i}].consumers[{c}]"
            spec = port(field, consumer, "node", "input", "inputs")
            same(field, entry, spec, "feeds")
            feed(field, consumer["node"], consumer["input"])
    for n, node in enumerate(nodes):
        for i, spec in enumerate(node["inputs"]):
            if (node["name"], spec["name"]) not in fed:
                raise PipelineError(
                    f"{file}: nodes[{n}].inputs[{i}]: input {spec['name']!r} of node {node['name']!r} is fed by "
                    "no edge and no pipeline input"
                )
    _unique(desc["outputs"], "outputs", file, "pipeline output")
    for o, entry in enumerate(desc["outputs"]):
        field = f"outputs[{o}]"
        spec = port(field, entry, "node", "output", "outputs")
        same(field, spec, entry, "returns")
        if (entry["node"], entry["output"]) in state_outputs:
            raise PipelineError(f"{file}: {field}: output {entry['output']!r} of node {entry['node']!r} is the state "
                                f"update of {state_outputs[entry['node'], entry['output']]}, never a pipeline output")


def _check_batches(desc: dict, file) -> None:
    """A tensor's optional ``batch: [min, max]`` (dynamic batch): min < max and the traced dim 0 inside it."""
    entries = [(f"nodes[{n}].{side}[{i}]", e) for n, node in enumerate(desc["nodes"])
               for side in ("inputs", "outputs") for i, e in enumerate(node[side])]
    entries += [(f"{side}[{i}]", e) for side in ("inputs", "outputs") for i, e in enumerate(desc[side])]
    for field, entry in entries:
        if "batch" not in entry:
            continue
        if len(entry["batch"]) != 2:
            raise PipelineError(f"{file}: {field}.batch: must be [min, max], got {len(entry['batch'])} values")
        lo, hi = entry["batch"]
        if not lo < hi:
            raise PipelineError(f"{file}: {field}.batch: min {lo} must be below max {hi}")
        if not entry["shape"] or not lo <= entry["shape"][0] <= hi:
            raise PipelineError(f"{file}: {field}.batch: dim 0 of shape {entry['shape']} must lie in [{lo}, {hi}]")


def tensor_bytes(dtype: str, shape: list[int]) -> int:
    """The bytes of a ``dtype`` tensor of ``shape``; above ``MAX_INT``, ``MAX_INT + 1`` (the C++ reader's count
    stops there too: a hostile shape's product can have thousands of digits)."""
    if 0 in shape:
        return 0
    n = DTYPE_BYTES[dtype]
    for d in shape:
        n *= d
        if n > MAX_INT:
            return MAX_INT + 1
    return n


def _bytes_text(n: int) -> str:
    return f"more than {MAX_INT} bytes" if n > MAX_INT else f"{n} bytes"


def _check_sizes(desc: dict, file) -> None:
    """What a runner allocates from the file, bounded before it allocates (docs/pipeline-format.md, "Tensor
    sizes"): each tensor at most MAX_TENSOR_BYTES (a dynamic batch at its maximum), all of them at most
    MAX_PIPELINE_BYTES. The C++ reader (ext/pipeline/src/description.cpp) checks the same, with these texts."""
    entries = [(f"nodes[{n}].{side}[{i}]", f"node {node['name']!r} {side[:-1]} {e['name']!r}", e)
               for n, node in enumerate(desc["nodes"]) for side in ("inputs", "outputs") for i, e in enumerate(node[side])]
    entries += [(f"{side}[{i}]", f"pipeline {side[:-1]} {e['name']!r}", e)
                for side in ("inputs", "outputs") for i, e in enumerate(desc[side])]
    total = 0
    for field, what, entry in entries:
        shape = list(entry["shape"])
        batch = entry.get("batch")
        if batch and shape:
            shape[0] = batch[1]
        n = tensor_bytes(entry["dtype"], shape)
        if n > MAX_TENSOR_BYTES:
            at = f" at its batch maximum {batch[1]}" if batch and shape else ""
            raise PipelineError(f"{file}: {field} ({what}): {entry['dtype']}{shape}{at} is {_bytes_text(n)}, more "
                                f"than the {MAX_TENSOR_BYTES} bytes a tensor may hold (MAX_TENSOR_BYTES, "
                                "docs/pipeline-format.md)")
        total += n
    if total > MAX_PIPELINE_BYTES:
        raise PipelineError(f"{file}: its {len(entries)} tensor entries hold {total} bytes in all, more than the "
                            f"{MAX_PIPELINE_BYTES} bytes a pipeline's tensors may hold (MAX_PIPELINE_BYTES, "
                            "docs/pipeline-format.md)")


def _check_metadata(desc: dict, file) -> None:
    """What the schema cannot say about tensors' metadata: finite numbers, depth and size (``metadata_problem``)."""
    sides = [(f"nodes[{n}].{side}", node[side]) for n, node in enumerate(desc["nodes"]) for side in ("inputs", "outputs")]
    for field, entries in [*sides, ("inputs", desc["inputs"]), ("outputs", desc["outputs"])]:
        for i, entry in enumerate(entries):
            if "metadata" in entry:
                problem = metadata_problem(entry["metadata"], f"{field}[{i}].metadata")
                if problem:
                    raise PipelineError(f"{file}: {problem}")
