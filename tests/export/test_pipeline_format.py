"""leapp.pipeline_format: pipeline.yaml's schema, safe reader, limits and containment rule (no artifact runs).

The writer's output must read back equal (hypothesis over generated sessions); any truncation,
dropped field or replaced value must give a PipelineError naming the file and field, never
another exception type.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from leapp import pipeline_format as pf
from leapp._export.exportable import SegmentExport
from leapp._export.pipeline_yaml import NodeArtifact, describe_pipeline, dump_pipeline_yaml, write_pipeline_yaml
from leapp._contract.records import NodeRecord, SessionRecord, TensorSpec
from leapp.errors import ExportError
from leapp.pipeline_format import PipelineError, parse_description, read_pipeline, validate_description

# --- generated sessions, written by the real writer -------------------------------------------------------

# Names YAML would read as something else unless quoted, plus arbitrary text. No '.': the writer
# names colliding pipeline inputs/outputs 'node.name' (see test_writer_refuses_colliding_names).
_TRICKY = ["null", "true", "~", "1", "0x1f", "1e3", "2020-01-01", "=", "<<", "- a", "a: b", "'", '"', "[x]",
           "&a", "*a", "!x", "%YAML", "#", " x ", "é", "\t", "a\nb", "\x85", "\u2028", "😀"]
NAMES = st.one_of(
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="."), min_size=1, max_size=6),
    st.sampled_from(_TRICKY),
)
DTYPES = st.sampled_from([torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.bool, torch.uint8,
                          torch.uint32, torch.complex64])
# within MAX_TENSOR_BYTES and MAX_PIPELINE_BYTES (the readers refuse larger tensors): small dims, or dims up to
# 2^40 with a 0 among them (an empty tensor), which still render every digit
SHAPES = (st.lists(st.integers(0, 2**6), max_size=3)
          | st.lists(st.integers(0, 2**40), max_size=2).map(lambda dims: [*dims, 0])).map(tuple)
HEX64 = st.text("0123456789abcdef", min_size=64, max_size=64)
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)


@st.composite
def sessions(draw):
    """(SessionRecord, per-node (segments, extra file count)): forward and feedback edges, shared inputs."""
    names = draw(st.lists(NAMES, min_size=1, max_size=4, unique=True))
    nodes: dict[str, NodeRecord] = {}
    edges = []
    for j, name in enumerate(names):
        outputs = [TensorSpec(n, draw(DTYPES), draw(SHAPES)) for n in draw(st.lists(NAMES, max_size=3, unique=True))]
        inputs = []
        for n in draw(st.lists(NAMES, max_size=3, unique=True)):
            earlier = [(m, o) for m in names[:j] for o in nodes[m].outputs]
            if earlier and draw(st.booleans()):
                src, out = draw(st.sampled_from(earlier))
                inputs.append(TensorSpec(n, out.dtype, out.shape))
                edges.append((src, out.name, name, n))
            else:
                warp = draw(st.sampled_from([None, "vec3f"]))
                inputs.append(TensorSpec(n, draw(DTYPES), draw(SHAPES), warp, draw(SHAPES) if warp else None))
        nodes[name] = NodeRecord(name, "onnx", {}, draw(TEXT), inputs, outputs, None, [], [])
    fed = {(e[2], e[3]) for e in edges}
    for j, name in enumerate(names):  # feedback: an output of this or a later node into an unfed input
        for spec in nodes[name].inputs:
            later = [(m, o) for m in names[j:] for o in nodes[m].outputs]
            if (name, spec.name) not in fed and later and draw(st.booleans()):
                src, out = draw(st.sampled_from(later))
                spec.dtype, spec.shape = out.dtype, out.shape
                edges.append((src, out.name, name, spec.name))
    plans = [
        (draw(st.lists(st.tuples(NAMES, TEXT, st.sampled_from(["cpu", "cuda:0", "cuda:1"]), HEX64, TEXT,
                                 st.dictionaries(TEXT, TEXT, max_size=2)), max_size=2)),
         draw(st.integers(0, 1)))
        for _ in names
    ]
    record = SessionRecord(draw(NAMES), "", nodes, edges, draw(st.lists(TEXT, max_size=3)))
    return record, plans


def _describe(record, plans, folder: Path) -> dict:
    artifacts = []
    for j, (node, (segments, extra)) in enumerate(zip(record.nodes.values(), plans)):
        path = folder / f"node{j}.onnx"
        path.write_bytes(f"artifact {j}".encode())
        extra_files = [folder / f"node{j}.onnx.data"] * extra
        for p in extra_files:
            p.write_bytes(b"data")
        exports = [SegmentExport(id_, src, dev, "b", b"", digest, "", {"kernels": [{"entry": k}], "producer": prod})
                   for id_, src, dev, digest, k, prod in segments]
        artifacts.append(NodeArtifact(node, "onnx", path, extra_files, exports))
    return describe_pipeline(record, artifacts, folder)


@settings(max_examples=30)
@given(sessions())
def test_writer_output_reads_back_equal(generated):
    record, plans = generated
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        description = _describe(record, plans, folder)
        write_pipeline_yaml(description, folder)
        assert read_pipeline(folder) == (folder, description)
        assert read_pipeline(folder / "pipeline.yaml")[1] == description


def _generated_text(generated) -> tuple[dict, str]:
    record, plans = generated
    with tempfile.TemporaryDirectory() as tmp:
        description = _describe(record, plans, Path(tmp))
    return description, dump_pipeline_yaml(description)


@settings(max_examples=30)
@given(sessions(), st.data())
def test_truncation_at_any_line_is_refused(generated, data):
    _, text = _generated_text(generated)
    lines = text.splitlines(keepends=True)
    keep = data.draw(st.integers(0, len(lines) - 1))
    try:
        parse_description("".join(lines[:keep]))
    except PipelineError as e:
        assert str(e).startswith("pipeline.yaml: "), e
        return
    # Parsed: a document that ends in a list (constants: ["", "", ""]) is still a valid, shorter description
    # without its last items. Only such a cut may parse; the digest and the JSON twin catch it.
    assert keep > 0 and all(line.startswith("  - ") for line in lines[keep:]), "".join(lines[max(0, keep - 3):])


@settings(max_examples=30)
@given(sessions(), st.data())
def test_truncation_at_any_byte_gives_a_pipeline_error_or_a_valid_description(generated, data):
    description, text = _generated_text(generated)
    raw = text.encode("utf-8")
    cut = data.draw(st.integers(0, len(raw)))
    try:
        parse_description(raw[:cut])
    except PipelineError:
        return
    assert cut > len(raw) - len(text.splitlines()[-1].encode()) - 2  # only a cut in the last line can still parse


_OPTIONAL = {"feedback", "warp_dtype", "logical_shape"}


def _paths(value, prefix=()):
    """Every (path, key-or-index) in a description, depth first."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield prefix + (key,)
            yield from _paths(item, prefix + (key,))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield prefix + (index,)
            yield from _paths(item, prefix + (index,))


def _parent(description, path):
    node = description
    for part in path[:-1]:
        node = node[part]
    return node


@settings(max_examples=30)
@given(sessions(), st.data())
def test_dropping_any_field_is_refused_naming_it(generated, data):
    description, _ = _generated_text(generated)
    keys = [p for p in _paths(description) if isinstance(p[-1], str)]
    path = data.draw(st.sampled_from(keys))
    dropped = _parent(description, path).pop(path[-1])
    free_form = "producer" in path[:-1]  # producer maps: any keys, none required
    if path[-1] == "feedback" and dropped is True:  # optional, but this edge goes back: it needs it
        with pytest.raises(PipelineError, match=rf"p.yaml: {re.escape(pf.field_path(path[:-1]))}: .*'feedback: true'"):
            validate_description(description, "p.yaml")
        return
    if path[-1] in _OPTIONAL or free_form:
        validate_description(description)
        return
    with pytest.raises(PipelineError) as info:
        validate_description(description, "p.yaml")
    if path not in (("format",), ("version",)):
        assert str(info.value).startswith(f"p.yaml: {pf.field_path(path)}: missing"), str(info.value)


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=30)
@given(sessions(), st.data())
def test_replacing_any_value_gives_a_pipeline_error_or_a_valid_description(generated, data):
    description, _ = _generated_text(generated)
    path = data.draw(st.sampled_from(list(_paths(description))))
    _parent(description, path)[path[-1]] = data.draw(JSONISH)
    try:
        validate_description(description)
    except PipelineError:
        pass
    text = yaml.safe_dump(description, sort_keys=False)
    try:
        assert parse_description(text) == description or description != description  # NaN is not equal to itself
    except PipelineError:
        pass


# --- what the schema and cross-references refuse, naming the field --------------------------------------------


def _valid() -> dict:
    """pre (obs -> feat) -> policy (feat -> raw), with the last raw fed back into pre."""
    def tensor(name, shape):
        return {"name": name, "dtype": "float32", "shape": list(shape)}

    def node(name, inputs, outputs):
        return {"name": name, "backend": "pt2", "artifact": f"{name}.pt2", "sha256": "a" * 64, "files": [],
                "source": "x.py:1", "device": "cpu", "inputs": inputs, "outputs": outputs, "segments": []}

    return {
        "format": "leapp.pipeline", "version": 1, "name": "chain", "producer": {"leapp": "0.1.0"},
        "nodes": [node("pre", [tensor("obs", [2, 4]), tensor("last", [2, 3])], [tensor("feat", [2, 5])]),
                  node("policy", [tensor("feat", [2, 5])], [tensor("raw", [2, 3])])],
        "edges": [{"from_node": "pre", "from_output": "feat", "to_node": "policy", "to_input": "feat"},
                  {"from_node": "policy", "from_output": "raw", "to_node": "pre", "to_input": "last", "feedback": True}],
        "inputs": [tensor("obs", [2, 4]) | {"consumers": [{"node": "pre", "input": "obs"}]},
                   tensor("last", [2, 3]) | {"consumers": [{"node": "pre", "input": "last"}]}],
        "outputs": [{"name": "raw", "node": "policy", "output": "raw", "dtype": "float32", "shape": [2, 3]}],
        "constants": [],
    }


def _set(path, value):
    def mutate(d):
        _parent(d, path)[path[-1]] = value
    return mutate


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (_set(("nodes", 1, "inputs", 0, "shape", 1), -5), r"nodes\[1\]\.inputs\[0\]\.shape\[1\]: -5 is below 0"),
        (_set(("nodes", 1, "inputs", 0, "shape", 0), 2.0), r"nodes\[1\]\.inputs\[0\]\.shape\[0\]: expected an integer, got a float 2\.0"),
        (_set(("nodes", 0, "outputs", 0, "dtype"), "float31"), r"nodes\[0\]\.outputs\[0\]\.dtype: 'float31' is not one of bool, "),
        (_set(("nodes", 0, "sha256"), "A" * 64), r"nodes\[0\]\.sha256: 'AAAA.*' is not 64 lowercase hex digits"),
        (_set(("nodes", 0, "device"), "mps"), r"nodes\[0\]\.device: 'mps' is not 'cpu' or 'cuda:N'"),
        (_set(("nodes", 0, "backend"), "tflite"), r"nodes\[0\]\.backend: 'tflite' is not one of onnx, pt2, torchscript"),
        (_set(("nodes", 0, "files"), {"path": "x"}), r"nodes\[0\]\.files: expected a list, got a mapping"),
        (_set(("nodes", 0, "name"), ""), r"nodes\[0\]\.name: must not be empty"),
        (_set(("nodes",), None), r"nodes: expected a list, got null"),
        (_set(("edges", 1, "feedback"), "yes"), r"edges\[1\]\.feedback: expected true or false"),
        (_set(("nodes", 1, "name"), "pre"), r"nodes\[1\]\.name: node 'pre' is also nodes\[0\]"),
        (_set(("nodes", 1, "inputs", 0, "name"), "feat2"), r"edges\[0\]\.to_input: node 'policy' has no input 'feat'"),
        (_set(("edges", 0, "from_node"), "post"), r"edges\[0\]\.from_node: no node 'post' \(nodes: \['pre', 'policy'\]\)"),
        (_set(("edges", 0, "from_output"), "obs"), r"edges\[0\]\.from_output: node 'pre' has no output 'obs' \(outputs: \['feat'\]\)"),
        (_set(("nodes", 1, "inputs", 0, "shape"), [2, 6]), r"edges\[0\]: joins float32\[2, 5\] to float32\[2, 6\]"),
        (_set(("edges", 1, "feedback"), False), r"edges\[1\]: goes from 'policy' back to 'pre' without 'feedback: true'"),
        (_set(("edges", 0, "feedback"), True), r"edges\[0\]\.feedback: an edge to a later node is not feedback"),
        (_set(("inputs", 0, "consumers"), []), r"inputs\[0\]\.consumers: must not be empty"),
        (_set(("inputs", 0, "consumers", 0, "node"), "policy"), r"inputs\[0\]\.consumers\[0\]\.input: node 'policy' has no input 'obs'"),
        (_set(("inputs", 1, "consumers", 0, "input"), "obs"), r"inputs\[1\]\.consumers\[0\]: feeds float32\[2, 3\] to float32\[2, 4\]"),
        (_set(("inputs", 0, "consumers"), [{"node": "policy", "input": "feat"}]),
         r"inputs\[0\]\.consumers\[0\]: feeds float32\[2, 4\] to float32\[2, 5\]"),
        (lambda d: d["inputs"].pop(0), r"nodes\[0\]\.inputs\[0\]: input 'obs' of node 'pre' is fed by no edge and no pipeline input"),
        (lambda d: d["inputs"].append(dict(d["inputs"][0])), r"inputs\[2\]\.name: pipeline input 'obs' is also inputs\[0\]"),
        (lambda d: d["inputs"][1]["consumers"].append({"node": "pre", "input": "obs"}),
         r"inputs\[1\]\.consumers\[1\]: feeds float32\[2, 3\] to float32\[2, 4\]"),
        (lambda d: d["edges"].append(dict(d["edges"][0])), r"edges\[2\]: input 'feat' of node 'policy' is already fed by edges\[0\]"),
        (_set(("outputs", 0, "output"), "feat"), r"outputs\[0\]\.output: node 'policy' has no output 'feat'"),
        (_set(("outputs", 0, "shape"), [3, 2]), r"outputs\[0\]: returns float32\[2, 3\] to float32\[3, 2\]"),
        (_set(("version",), 2), r"unsupported pipeline.yaml version 2 \(this leapp reads 1\)"),
        (_set(("version",), True), r"unsupported pipeline.yaml version True"),
        (_set(("format",), "onnx"), r"not a leapp pipeline description \(format must be 'leapp.pipeline'\)"),
        (lambda d: d.clear(), r"not a leapp pipeline description"),
    ],
)
def test_refusals_name_the_file_and_field(mutate, message):
    description = _valid()
    validate_description(description, "f/pipeline.yaml")
    mutate(description)
    with pytest.raises(PipelineError, match=r"^f/pipeline\.yaml: " + message):
        validate_description(description, "f/pipeline.yaml")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[1, 2]", r"expected a mapping at the top level, got a list \[1, 2\]"),
        ("just text", r"expected a mapping at the top level, got a string 'just text'"),
        ("", r"empty"),
        ("# only a comment\n", r"empty"),
        ("a: [1, 2\n", r"line 2, column 1: not valid YAML: .*"),
        ("a: 1\na: 2\n", r"line 2, column 1: not valid YAML: the key 'a' first given \(line 1, column 1\): key 'a' given twice"),
        ("1: a\n", r"line 1, column 1: not valid YAML: a mapping key that is not a string"),
        ("? [a]\n: b\n", r"line 1, column 3: not valid YAML: a mapping key that is not a string"),
        ("a: !!binary aGk=\n", r"line 1, column 4: YAML tag tag:yaml.org,2002:binary \(leapp never writes tags"),
        ("a: !!python/object:os.system {}\n", r"line 1, column 4: YAML tag tag:yaml.org,2002:python/object:os.system"),
        ("a: &x 1\nb: 2\n", r"line 1, column 4: YAML anchor &x \(leapp never writes anchors"),
        ("a: 1\n---\nb: 2\n", r"line 2, column 1: a second YAML document"),
    ],
)
def test_yaml_refusals(text, message):
    with pytest.raises(PipelineError, match=r"^p\.yaml: " + message):
        parse_description(text, "p.yaml")


def test_scalars_resolve_as_json_types_only():
    """A timestamp-looking or '=' plain scalar stays a string (PyYAML's safe loader makes a date or fails)."""
    description = _valid()
    text = dump_pipeline_yaml(description).replace("name: chain", "name: 2020-01-01")
    assert parse_description(text)["name"] == "2020-01-01"
    assert parse_description(text.replace("name: 2020-01-01", "name: =", 1))["name"] == "="


def test_not_utf8():
    with pytest.raises(PipelineError, match=r"^p.yaml: not UTF-8 text \(byte 8: invalid start byte\)"):
        parse_description(b"name: a\n\xff", "p.yaml")


def test_alias_bomb_is_refused_at_once():
    """700 bytes that PyYAML's safe loader expands to 9**9 strings: refused at the first anchor."""
    lines = ["format: leapp.pipeline", "version: 1", "a: &a [x, x, x, x, x, x, x, x, x]"]
    for prev, name in zip("abcdefgh", "bcdefghi"):
        lines.append(f"{name}: &{name} [" + ", ".join([f"*{prev}"] * 9) + "]")
    lines.append("nodes: [{name: *i}]")
    text = "\n".join(lines) + "\n"
    assert len(text) < 700
    start = time.perf_counter()
    with pytest.raises(PipelineError, match=r"^p.yaml: line 3, column 4: YAML anchor &a"):
        parse_description(text, "p.yaml")
    assert time.perf_counter() - start < 5


@pytest.mark.parametrize("separator", ["", "\n"])
def test_deep_nesting_is_refused_before_composing(separator):
    """100000 '[': PyYAML's C composer recurses once per level (a segfault), its pure-Python one hits the
    recursion limit. The event pass stops at MAX_DEPTH; libyaml's scanner, looking ahead along one
    line, may stop first at its own limit (1000)."""
    start = time.perf_counter()
    text = "a: b\nc: " + ("[" + separator) * 100_000 + "]" * 100_000
    expected = rf"nested deeper than {pf.MAX_DEPTH}" if separator else "nested deeper than|maximum nesting depth"
    with pytest.raises(PipelineError, match=rf"^p.yaml: line \d+, column \d+: (not valid YAML: .*)?({expected})"):
        parse_description(text, "p.yaml")
    assert time.perf_counter() - start < 5


def test_value_count_is_bounded(monkeypatch):
    text = dump_pipeline_yaml(_valid())
    monkeypatch.setattr("leapp.pipeline_format.reader.MAX_VALUES", 20)
    with pytest.raises(PipelineError, match=r"^pipeline.yaml: line \d+, column \d+: more than 20 values"):
        parse_description(text)


def test_file_size_is_bounded(tmp_path):
    text = dump_pipeline_yaml(_valid())
    padding = pf.MAX_FILE_BYTES - len(text.encode())
    (tmp_path / "pipeline.yaml").write_text(text + "#" * (padding - 1) + "\n")
    assert read_pipeline(tmp_path)[1] == _valid()  # exactly at the limit: read
    with open(tmp_path / "pipeline.yaml", "a") as f:
        f.write("#")
    with pytest.raises(PipelineError, match=rf"pipeline.yaml: larger than {pf.MAX_FILE_BYTES} bytes"):
        read_pipeline(tmp_path)


# --- paths -------------------------------------------------------------------------------------------------


def _folder(tmp_path) -> Path:
    folder = tmp_path / "export"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "a.pt2").write_bytes(b"a")
    (tmp_path / "outside.pt2").write_bytes(b"o")
    os.symlink(tmp_path / "outside.pt2", folder / "out.pt2")
    os.symlink(tmp_path / "missing.pt2", folder / "dangling.pt2")
    os.symlink("sub/a.pt2", folder / "in.pt2")
    os.symlink("loop", folder / "loop")
    return folder


@pytest.mark.parametrize(
    ("rel", "message"),
    [
        ("../outside.pt2", r"path '\.\./outside\.pt2' leaves the pipeline folder .* \(paths are relative, without '\.\.'\)"),
        ("../missing.pt2", r"path '\.\./missing\.pt2' leaves the pipeline folder .* \(paths are relative, without '\.\.'\)"),
        ("sub/../sub/a.pt2", r"path 'sub/\.\./sub/a\.pt2' leaves the pipeline folder"),
        ("/etc/hostname", r"path '/etc/hostname' leaves the pipeline folder"),
        ("a\0b", r"path 'a\\x00b' leaves the pipeline folder"),
        (".", r"path '\.' leaves the pipeline folder .* \(it resolves to "),
        ("out.pt2", r"path 'out\.pt2' leaves the pipeline folder .* \(it resolves to .*outside\.pt2\)"),
        ("dangling.pt2", r"path 'dangling\.pt2' leaves the pipeline folder .* \(it resolves to .*missing\.pt2\)"),
        ("loop", r"path 'loop' cannot be resolved in "),
        ("", r"expected a non-empty relative path, got ''"),
    ],
)
def test_containment_refusals(tmp_path, rel, message):
    with pytest.raises(PipelineError, match=r"^p.yaml: nodes\[0\]\.artifact: " + message):
        pf.contained_path(_folder(tmp_path), rel, "p.yaml: nodes[0].artifact")


def test_containment_accepts_paths_and_symlinks_inside(tmp_path):
    folder = _folder(tmp_path)
    target = (folder / "sub" / "a.pt2").resolve()
    assert pf.contained_path(folder, "sub/a.pt2", "w") == target
    assert pf.contained_path(folder, "./sub//a.pt2", "w") == target
    assert pf.contained_path(folder, "in.pt2", "w") == target
    assert pf.contained_path(folder, "new.pt2", "w") == (folder / "new.pt2").resolve()  # need not exist


def test_pipeline_yaml_itself_must_stay_in_the_folder(tmp_path):
    (tmp_path / "elsewhere.yaml").write_text(dump_pipeline_yaml(_valid()))
    (tmp_path / "export").mkdir()
    os.symlink(tmp_path / "elsewhere.yaml", tmp_path / "export" / "pipeline.yaml")
    with pytest.raises(PipelineError, match=r"pipeline.yaml: path 'pipeline.yaml' leaves the pipeline folder"):
        read_pipeline(tmp_path / "export")


# --- the schema document and the writer ----------------------------------------------------------------------


def test_schema_is_a_valid_draft_2020_12_document_shipped_as_json():
    from jsonschema import Draft202012Validator

    with open(pf.SCHEMA_FILE, encoding="utf-8") as f:
        document = json.load(f)
    Draft202012Validator.check_schema(document)
    assert document == pf.schema() and document["$schema"].endswith("/draft/2020-12/schema")


def test_schema_dtypes_are_torch_dtypes_and_cover_bundle_and_onnx_dtypes():
    from leapp.bundle.format import DTYPES as BUNDLE_DTYPES
    from leapp.runtime.onnx_runner import _ONNX_TYPES

    names = pf.schema()["$defs"]["dtype"]["enum"]
    for name in names:
        assert isinstance(getattr(torch, name), torch.dtype) and pf.dtype_name(getattr(torch, name)) == name
    assert set(BUNDLE_DTYPES) <= set(names)
    assert {pf.dtype_name(d) for d in _ONNX_TYPES} <= set(names)


def test_pipeline_format_and_inspect_import_without_torch():
    # `import leapp` registers the torch op where torch is installed; blocked here, so this shows that
    # the format and the CLI themselves need no torch (as on a machine without it).
    code = ("import sys; sys.modules['torch'] = None; import leapp.pipeline_format, leapp.cli; "
            "assert sys.modules['torch'] is None, 'torch imported'")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]


def _node(name, inputs, outputs, dtype=torch.float32):
    return NodeRecord(name, "onnx", {}, "x.py:1", [TensorSpec(n, dtype, (2,)) for n in inputs],
                      [TensorSpec(n, dtype, (2,)) for n in outputs], None, [], [])


def _artifacts(record, folder):
    artifacts = []
    for j, node in enumerate(record.nodes.values()):
        (folder / f"n{j}.onnx").write_bytes(b"x")
        artifacts.append(NodeArtifact(node, "onnx", folder / f"n{j}.onnx"))
    return artifacts


def test_writer_refuses_colliding_names(tmp_path):
    """Two nodes read 'x' with different shapes: the pipeline inputs become 'a.x' and 'b.x', and a third
    node's own input 'a.x' collides. leapp.load used to keep one of the two silently."""
    a, b, c = _node("a", ["x"], ["y"]), _node("b", ["x"], ["z"]), _node("c", ["a.x"], ["w"])
    b.inputs[0].shape = (3,)
    record = SessionRecord("s", str(tmp_path), {"a": a, "b": b, "c": c}, [], [])
    description = describe_pipeline(record, _artifacts(record, tmp_path), tmp_path)
    with pytest.raises(ExportError, match=r"session 's': leapp would write an invalid pipeline.yaml: inputs\[2\]\.name: "
                                          r"pipeline input 'a.x' is also inputs\[0\]"):
        write_pipeline_yaml(description, tmp_path)
    assert not (tmp_path / "pipeline.yaml").exists()


def test_writer_refuses_a_dtype_the_format_does_not_have(tmp_path):
    record = SessionRecord("s", str(tmp_path), {"a": _node("a", ["x"], ["y"], dtype=torch.qint8)}, [], [])
    with pytest.raises(ExportError, match=r"invalid pipeline.yaml: \S+\.dtype: 'qint8' is not one of bool, .* \(and 3 more problems\)"):
        write_pipeline_yaml(describe_pipeline(record, _artifacts(record, tmp_path), tmp_path), tmp_path)


def test_writer_never_writes_aliases_for_shared_objects(tmp_path):
    description = _valid()
    description["nodes"][1]["inputs"] = description["nodes"][0]["outputs"]  # the same list object twice
    text = dump_pipeline_yaml(description)
    assert "&" not in text and "*" not in text
    assert parse_description(text) == description


@pytest.mark.parametrize(
    ("batch", "message"),
    [
        ([4, 1], r"nodes\[0\]\.inputs\[0\]\.batch: min 4 must be below max 1"),
        ([3, 8], r"nodes\[0\]\.inputs\[0\]\.batch: dim 0 of shape \[2, 4\] must lie in \[3, 8\]"),
        ([1, 8, 9], r"nodes\[0\]\.inputs\[0\]\.batch: must be \[min, max\], got 3 values"),
        ([0, 8], r"nodes\[0\]\.inputs\[0\]\.batch\[0\]: 0 is below 1"),
        ([1], r"nodes\[0\]\.inputs\[0\]\.batch: "),
        ("1..8", r"nodes\[0\]\.inputs\[0\]\.batch: expected a list"),
    ],
)
def test_dynamic_batch_field(batch, message):
    """``batch: [min, max]`` on a tensor (docs/pipeline-format.md, "Dynamic batch"): read into IOSpec.batch."""
    from leapp.runtime.io import IOSpec

    description = _valid()
    description["nodes"][0]["inputs"][0]["batch"] = [1, 64]
    validate_description(description, "f/pipeline.yaml")
    spec = IOSpec.from_yaml(description["nodes"][0]["inputs"][0], "x")
    assert spec.batch == (1, 64) and spec.accepts((64, 4)) and spec.accepts((1, 4))
    assert not spec.accepts((65, 4)) and not spec.accepts((8, 5)) and not spec.accepts((8,))
    description["nodes"][0]["inputs"][0]["batch"] = batch
    with pytest.raises(PipelineError, match=r"^f/pipeline\.yaml: " + message):
        validate_description(description, "f/pipeline.yaml")


# --- the canonical text: pipeline.yaml is the rendering of the description, read back equal -------------------

_JSON_SCALARS = (st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70)
                 | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12)
                 | st.sampled_from(["yes", "No", "null", "on", "1e5", "0x1f", ".inf", "a: b", "- x", "#", "'q'",
                                    "x\u2028y", "\u0085", "\ufeff", "tab\there", "caf\u00e9", "~", "", "a/b-c.d"]))
_JSON_VALUES = st.recursive(_JSON_SCALARS, lambda inner: st.lists(inner, max_size=4)
                            | st.dictionaries(st.text(max_size=8) | st.sampled_from(["yes", "a b", "x:"]), inner,
                                              max_size=4), max_leaves=25)


def _same_json(a, b) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)  # 1 and 1.0 and true differ


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=8), _JSON_VALUES, min_size=1, max_size=5))
def test_canonical_text_reads_back_as_the_same_values(description):
    """Any JSON object rendered by yaml_text reads back, through leapp's strict YAML loader, as the same values
    and types: the text leapp writes for people says exactly what the twin says for leapp-run."""
    from leapp.pipeline_format import reader

    text = pf.yaml_text(description)
    assert text.endswith("\n") and "\r" not in text
    assert _same_json(reader._load_yaml(text, "pipeline.yaml"), description)


def test_the_exporter_writes_the_canonical_text(tmp_path):
    description = _valid()
    assert dump_pipeline_yaml(description) == pf.yaml_text(description)
    assert "\n  - name: " in pf.yaml_text(description)  # readable: block lists, plain names
