"""The C++ runner (ext/pipeline: libleapp_pipeline.so, leapp-run) against leapp.load, on the CPU.

One real export (a policy MLP and a torch post-processing node, both ONNX, recorded on the CPU through
leapp's public API) is shared by the module. leapp-run's outputs must equal leapp.load's bit for bit;
every refusal (tampered artifact, bad wiring, stale or missing pipeline.json) must carry leapp.load's
text, the file prefix naming pipeline.json where Python names pipeline.yaml (the file each one read).
"""

from __future__ import annotations

import copy
import json
import random
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import leapp
from leapp import _native
from runtime_helpers import record_mlp
from leapp.pipeline_format import PipelineError, read_pipeline, sha256_file, twin_text, yaml_text

LEAPP_RUN = Path(sys.executable).with_name("leapp-run")
pytestmark = pytest.mark.skipif(
    not LEAPP_RUN.is_file(), reason="leapp-run was not built: ONNX Runtime's headers are missing "
    "(bash scripts/fetch-ort-headers.sh, then pip install -e . again)")




@pytest.fixture(scope="module")
def export(tmp_path_factory) -> Path:
    return record_mlp(tmp_path_factory.mktemp("cpp"))


@pytest.fixture(scope="module")
def dynamic_export(tmp_path_factory) -> Path:
    """The same two nodes with a dynamic batch 1..64: pipeline.yaml's tensors carry ``batch`` ranges."""
    return record_mlp(tmp_path_factory.mktemp("cpp_dynamic"), dynamic_batch=(1, 64))


@pytest.fixture
def folder(export, tmp_path) -> Path:
    """A private copy to tamper with."""
    return Path(shutil.copytree(export, tmp_path / "mlp"))


def _leapp_run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([str(LEAPP_RUN), *map(str, args)], capture_output=True, text=True, timeout=120)


def _write_inputs(pipeline, folder: Path, seed: int = 1) -> dict[str, torch.Tensor]:
    folder.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    inputs = {name: (torch.randn(spec.shape, generator=g) * 3).to(spec.dtype) for name, spec in pipeline.inputs.items()}
    for name, t in inputs.items():
        (folder / f"{name}.bin").write_bytes(t.numpy().tobytes())
    return inputs


def _cpp_refusal(folder: Path) -> str:
    r = _leapp_run(folder, "--check")
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    return r.stderr.strip().removeprefix("leapp-run: ")


def _python_text(error: Exception, folder: Path) -> str:
    """Python's message with the file it read (pipeline.yaml) named as the C++ side's (pipeline.json)."""
    return str(error).replace(f"{folder}/pipeline.yaml", f"{folder}/pipeline.json")


def test_leapp_run_equals_leapp_load_bit_for_bit(export, tmp_path):
    pipeline = leapp.load(export)
    for seed in (1, 2):
        inputs = _write_inputs(pipeline, tmp_path / f"in{seed}", seed)
        r = _leapp_run(export, "--in", tmp_path / f"in{seed}", "--out", tmp_path / f"out{seed}", "--time", "5")
        assert r.returncode == 0, r.stderr
        assert "policy" in r.stdout and "post" in r.stdout and "total" in r.stdout  # --time's per-node lines
        expected = pipeline(**inputs)
        assert set(expected) == {p.name.removesuffix(".bin") for p in (tmp_path / f"out{seed}").iterdir()}
        for name, t in expected.items():
            got = (tmp_path / f"out{seed}" / f"{name}.bin").read_bytes()
            assert got == t.contiguous().numpy().tobytes(), name


def test_one_node_runs_alone_with_node(export, tmp_path):
    """--node NAME: the node's own inputs and outputs are the files (what leapp.testing localises with)."""
    pipeline = leapp.load(export)
    g = torch.Generator().manual_seed(3)
    node = pipeline.nodes["post"]
    inputs = {spec.name: torch.randn(spec.shape, generator=g) for spec in node.inputs}
    (tmp_path / "in").mkdir()
    for name, t in inputs.items():
        (tmp_path / "in" / f"{name}.bin").write_bytes(t.numpy().tobytes())
    r = _leapp_run(export, "--in", tmp_path / "in", "--out", tmp_path / "out", "--node", "post", "--time", "3")
    assert r.returncode == 0, r.stderr
    assert "  post " in r.stdout and "  policy " not in r.stdout, r.stdout  # --time: the node's one line
    expected = pipeline.run_node("post", **inputs)
    for name, t in expected.items():
        assert (tmp_path / "out" / f"{name}.bin").read_bytes() == t.contiguous().numpy().tobytes(), name
    r = _leapp_run(export, "--in", tmp_path / "in", "--out", tmp_path / "out", "--node", "../post")
    assert r.returncode == 2 and "--node: pipeline 'mlp' has no node '../post' (nodes: ['policy', 'post'])" in r.stderr


def test_missing_input_file_and_wrong_byte_count_exit_2(export, tmp_path):
    pipeline = leapp.load(export)
    _write_inputs(pipeline, tmp_path / "in")
    name = next(iter(pipeline.inputs))
    (tmp_path / "in" / f"{name}.bin").unlink()
    r = _leapp_run(export, "--in", tmp_path / "in", "--out", tmp_path / "out")
    assert r.returncode == 2 and f"input '{name}'" in r.stderr and "is missing" in r.stderr, r.stderr
    spec = pipeline.inputs[name]
    (tmp_path / "in" / f"{name}.bin").write_bytes(b"\0" * 7)
    r = _leapp_run(export, "--in", tmp_path / "in", "--out", tmp_path / "out")
    nbytes = int(np.prod(spec.shape)) * spec.dtype.itemsize
    assert r.returncode == 2 and f"has 7 bytes, expected {nbytes}" in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()
    r = _leapp_run(export, "--in", tmp_path / "in")
    assert r.returncode == 2 and "usage:" in r.stderr


def test_tampered_artifact_is_refused_with_leapp_loads_text(folder):
    with open(folder / "post.onnx", "ab") as f:
        f.write(b"\0")
    with pytest.raises(PipelineError) as python:
        leapp.load(folder)
    assert "has sha256" in str(python.value)
    assert _cpp_refusal(folder) == _python_text(python.value, folder)
    (folder / "post.onnx").unlink()
    with pytest.raises(PipelineError) as python:
        leapp.load(folder)
    assert _cpp_refusal(folder) == _python_text(python.value, folder)


def _write_both(folder: Path, description) -> None:
    """pipeline.yaml as leapp renders a mapping (no validation; PyYAML's text for anything else) and its twin,
    bound to it."""
    text = yaml_text(description) if isinstance(description, dict) else yaml.safe_dump(description)
    (folder / "pipeline.yaml").write_text(text, encoding="utf-8")
    (folder / "pipeline.json").write_text(
        twin_text(description, sha256_file(folder / "pipeline.yaml")) if isinstance(description, dict)
        else json.dumps(description), encoding="utf-8")


def _edits(desc: dict):
    """Named hand-written wiring errors (each a function of a copy of the description)."""
    def edit(fn):
        d = copy.deepcopy(desc)
        fn(d)
        return d
    yield "unknown edge output", edit(lambda d: d["edges"][0].update(from_output="nope"))
    yield "unknown edge node", edit(lambda d: d["edges"][0].update(to_node="ghost"))
    yield "shape mismatch", edit(lambda d: d["nodes"][1]["inputs"][0].update(shape=[16, 13]))
    yield "backward edge", edit(lambda d: d["edges"][0].update(from_node="post", from_output="output",
                                                                to_node="policy", to_input="obs"))
    yield "duplicate node", edit(lambda d: d["nodes"][1].update(name="policy"))
    yield "unfed input", edit(lambda d: d["inputs"].pop())
    yield "missing sha256", edit(lambda d: d["nodes"][0].pop("sha256"))
    yield "bad dtype", edit(lambda d: d["nodes"][0]["inputs"][0].update(dtype="float33"))
    yield "negative dimension", edit(lambda d: d["nodes"][0]["inputs"][0]["shape"].__setitem__(1, -5))
    yield "float dimension", edit(lambda d: d["nodes"][0]["inputs"][0]["shape"].__setitem__(1, 4.0))
    yield "bool dimension", edit(lambda d: d["nodes"][0]["inputs"][0]["shape"].__setitem__(1, True))
    yield "huge dimension", edit(lambda d: d["nodes"][0]["inputs"][0]["shape"].__setitem__(1, 2**63))
    yield "artifact outside", edit(lambda d: d["nodes"][0].update(artifact="../policy.onnx"))
    yield "version", edit(lambda d: d.update(version=2))
    yield "format", edit(lambda d: d.update(format="other"))
    yield "device", edit(lambda d: d["nodes"][0].update(device="tpu:0"))
    yield "empty name", edit(lambda d: d.update(name=""))
    yield "several problems", edit(lambda d: (d["nodes"][0].pop("files"), d["edges"][0].pop("to_node"),
                                              d["outputs"][0].update(shape="x")))
    yield "top level list", [1, 2]


def test_bad_wiring_is_refused_with_leapp_loads_text(export, tmp_path):
    _, desc = read_pipeline(export)
    for what, bad in _edits(desc):
        folder = Path(shutil.copytree(export, tmp_path / what.replace(" ", "_")))
        _write_both(folder, bad)
        with pytest.raises(PipelineError) as python:
            leapp.load(folder)
        assert _cpp_refusal(folder) == _python_text(python.value, folder), what


_POOL = [None, True, False, 0, -1, 4.0, 2**63, "", "x", "float32", "a'b\n" * 20, [], [1, "y"], {}, {"k": 1}]


def _paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, (*prefix, i))


def _replacements_refused_alike(export: Path, tmp_path: Path, seed: int, cases: int, pool: list,
                                paths_of=lambda paths: paths, load: bool = False) -> int:
    """Seeded replacements of a value (or removals of a key) at ``paths_of(every path)``: both readers accept,
    or both refuse with one text (``load``: as ``_refused_alike``). Returns how many cases both refused."""
    _, desc = read_pipeline(export)
    paths = paths_of([p for p in _paths(desc) if p])
    rng = random.Random(seed)
    folder = Path(shutil.copytree(export, tmp_path / "m"))
    refused = 0
    for case in range(cases):
        bad = copy.deepcopy(desc)
        path = rng.choice(paths)
        parent = bad
        for part in path[:-1]:
            parent = parent[part]
        if isinstance(parent, dict) and rng.random() < 0.3:
            del parent[path[-1]]
        else:
            parent[path[-1]] = copy.deepcopy(rng.choice(pool))
        _write_both(folder, bad)
        refused += _refused_alike(folder, (case, path), load) is not None
    return refused


def _refused_alike(folder: Path, context, load: bool = False) -> str | None:
    """Both readers accept ``folder``, or both refuse it with one text (``context`` names the case on failure);
    that text, None when they accept. The wiring is compared with read_pipeline; the artifacts, which only a
    load reads, with leapp.load where leapp-run refuses them, and with ``load`` where it accepts them too."""
    try:
        read_pipeline(folder)
        python = None
    except PipelineError as e:
        python = _python_text(e, folder)
    r = _leapp_run(folder, "--check")
    cpp = r.stderr.strip().removeprefix("leapp-run: ") if r.returncode else None
    if python is None and (cpp is not None or load):  # the wiring passed: the artifacts decide
        try:
            leapp.load(folder)
        except PipelineError as e:
            python = _python_text(e, folder)
    assert r.returncode in (0, 1) and cpp == python, (context, cpp, python)
    return cpp


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=st.lists(st.sampled_from(["policy.onnx", "post.onnx", "sub", ".", "..", "...", "..x", "x..", "", "a b",
                                       "caf\u00e9", "\\..", ".. "]), min_size=1, max_size=4),
       absolute=st.booleans())
def test_both_readers_keep_artifact_paths_inside_the_folder_alike(export, tmp_path, parts, absolute):
    """Any artifact path (a '..' component anywhere, '...' or '..x' names that are not one, an absolute path,
    empty components): both readers accept it, or both refuse it with one text."""
    _, desc = read_pipeline(export)
    bad = copy.deepcopy(desc)
    bad["nodes"][0]["artifact"] = ("/" if absolute else "") + "/".join(parts)
    folder = tmp_path / "p"
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(export, folder)
    _write_both(folder, bad)
    _refused_alike(folder, bad["nodes"][0]["artifact"])


def _place(path: Path, kind: str, folder: Path, outside: Path) -> None:
    """Makes ``path`` (a name in the export folder) a ``kind`` of thing: the policy model's bytes, a directory
    holding them, or a symbolic link (relative or absolute) to them inside or outside the folder, to nothing,
    to itself, or to ``x`` (a chain)."""
    model = folder / "policy.onnx"
    if kind == "file":
        shutil.copyfile(model, path)
    elif kind == "dir":
        path.mkdir()
        shutil.copyfile(model, path / "policy.onnx")
    else:
        target = {"link to a file inside": Path("policy.onnx"), "absolute link inside": model.resolve(),
                  "link to a file outside": outside / "policy.onnx", "link to a directory inside": Path("sub"),
                  "link to a directory outside": outside, "dangling link": Path("nowhere"),
                  "link to itself": Path(path.name), "link to x": Path("x")}[kind]
        path.symlink_to(target)


_KINDS = ["file", "dir", "link to a file inside", "absolute link inside", "link to a file outside",
          "link to a directory inside", "link to a directory outside", "dangling link", "link to itself", "link to x"]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(x=st.sampled_from(_KINDS), d=st.sampled_from(_KINDS),
       artifact=st.sampled_from(["x", "d/policy.onnx", "x/policy.onnx", "d/x", "./d//policy.onnx"]))
def test_both_readers_follow_symbolic_links_alike(export, tmp_path, x, d, artifact):
    """An artifact reached through symbolic links (to files or directories, inside or outside the folder,
    dangling, looping): both readers accept it, or both refuse it with one text; neither reads a file outside
    (the copies outside hold other bytes, which would show as a sha256 mismatch)."""
    folder, outside = tmp_path / "p", tmp_path / "outside"
    shutil.rmtree(tmp_path, ignore_errors=True)
    shutil.copytree(export, folder)
    outside.mkdir()
    (outside / "policy.onnx").write_bytes((folder / "policy.onnx").read_bytes() + b"outside")
    (folder / "sub").mkdir()
    shutil.copyfile(folder / "policy.onnx", folder / "sub" / "policy.onnx")
    _place(folder / "x", x, folder, outside)
    _place(folder / "d", d, folder, outside)
    _, desc = read_pipeline(export)
    bad = copy.deepcopy(desc)
    bad["nodes"][0]["artifact"] = artifact
    _write_both(folder, bad)
    text = _refused_alike(folder, (x, d, artifact), load=True)
    assert text is None or "sha256" not in text, (x, d, artifact, text)


def test_a_chain_of_thousands_of_links_is_refused_not_a_crash(export, tmp_path):
    """A hostile folder with a chain of 1,500 symbolic links as the artifact: both readers refuse it (Python at
    its recursion limit, C++ at the same bound) and leapp-run does not exhaust its stack."""
    folder = Path(shutil.copytree(export, tmp_path / "p"))
    for i in range(1500):
        (folder / f"l{i}").symlink_to(f"l{i + 1}" if i < 1499 else "policy.onnx")
    _, desc = read_pipeline(export)
    bad = copy.deepcopy(desc)
    bad["nodes"][0]["artifact"] = "l0"
    _write_both(folder, bad)
    with pytest.raises(PipelineError, match="cannot be resolved"):
        leapp.load(folder)
    r = _leapp_run(folder, "--check")
    assert r.returncode == 1 and "more than 1000 symbolic links in a chain" in r.stderr, r.stderr


def test_random_value_replacements_refused_alike(export, tmp_path):
    """Seeded replacements of any value (or removals of any key): both readers accept, or both refuse with one text."""
    assert _replacements_refused_alike(export, tmp_path, 14, 120, _POOL) > 60  # the mutations do reach the checks


_BATCH_POOL = [*_POOL, 1, 64, 65, 2**31 - 1, 2**31, [1, 64], [0, 64], [64, 1], [1, 2**31], [1], [1, 2, 3], [1.0, 64],
               [True, 64], ["1", 64], [1, 16]]


@pytest.mark.parametrize(("batch", "message"), [
    ([64, 64], "nodes[0].inputs[0].batch: min 64 must be below max 64"),
    ([1, 8, 64], "nodes[0].inputs[0].batch: must be [min, max], got 3 values"),
    ([32, 64], "nodes[0].inputs[0].batch: dim 0 of shape [16, 48] must lie in [32, 64]"),
])
def test_batch_ranges_refused_with_leapp_loads_text(dynamic_export, tmp_path, batch, message):
    _, desc = read_pipeline(dynamic_export)
    bad = copy.deepcopy(desc)
    bad["nodes"][0]["inputs"][0]["batch"] = batch
    folder = Path(shutil.copytree(dynamic_export, tmp_path / "b"))
    _write_both(folder, bad)
    with pytest.raises(PipelineError) as python:
        leapp.load(folder)
    assert message in str(python.value)
    assert _cpp_refusal(folder) == _python_text(python.value, folder)


@pytest.mark.parametrize("artifact", ["x" * 300, "d/" + "y" * 5000])
def test_an_artifact_name_too_long_for_the_file_system_is_missing_in_both_readers(folder, artifact, capsys):
    """A name longer than the file system takes (ENAMETOOLONG): leapp.load, leapp-run and leapp inspect report
    the artifact missing, where Path.is_file raised OSError and the C++ reader called it a symlink loop."""
    _, desc = read_pipeline(folder)
    desc["nodes"][1]["artifact"] = artifact
    _write_both(folder, desc)
    with pytest.raises(PipelineError) as python:
        leapp.load(folder)
    assert str(python.value).endswith(f"artifact {folder / artifact} is missing")
    assert _cpp_refusal(folder) == _python_text(python.value, folder)
    from leapp.cli.inspect import inspect_path

    assert inspect_path(folder) != 0
    assert f"{artifact} is missing" in capsys.readouterr().out


def _nested(levels: int):
    value = 1
    for k in range(levels):
        value = [value] if k % 2 else {"k": value}
    return value


@pytest.mark.parametrize(("where", "metadata", "message"), [
    (("nodes", 0, "inputs", 0), {"a": _nested(7)}, None),  # 8 levels with the mapping itself: allowed
    (("nodes", 0, "inputs", 0), {"a": _nested(8)},
     "nodes[0].inputs[0].metadata.a[0].k[0].k[0].k[0]: nested deeper than 8 levels"),
    (("outputs", 0), {"b": [1, {"c": _nested(9)}]}, "outputs[0].metadata.b[1].c.k[0].k[0].k: nested deeper than 8 levels"),
    (("nodes", 1, "outputs", 0), {"names": ["joint_\u00e9"] * 1500},  # UTF-8: 2 bytes per é
     "nodes[1].outputs[0].metadata: 16511 bytes as JSON, more than 16384 (metadata labels a tensor)"),
    (("inputs", 0), {"names": "x" * 16372}, None),  # 16384 bytes exactly: allowed
    (("inputs", 0), {"names": "x" * 16373}, "inputs[0].metadata: 16385 bytes as JSON, more than 16384"),
    (("inputs", 0), {"abs_max": 2.5}, None),  # the ROS 2 node's magnitude limit (docs/ros2.md)
    (("inputs", 0), {"abs_max": 10**300}, None),
    (("inputs", 0), {"abs_max": 0}, "inputs[0].metadata.abs_max: 0 is not a positive finite number"),
    (("inputs", 0), {"abs_max": -1.5}, "inputs[0].metadata.abs_max: -1.5 is not a positive finite number"),
    (("inputs", 0), {"abs_max": True}, "inputs[0].metadata.abs_max: True is not a positive finite number"),
    (("outputs", 0), {"abs_max": "x" * 80}, "outputs[0].metadata.abs_max: '" + "x" * 59 + " is not a positive"),
    (("outputs", 0), {"abs_max": 10**400}, "outputs[0].metadata.abs_max: 1000000000"),
])
def test_metadata_limits_refused_with_leapp_loads_text(export, tmp_path, where, metadata, message):
    """Tensors' metadata deeper than 8 levels or larger than 16 KiB as JSON: leapp-run refuses pipeline.json
    with the text leapp.load gives for pipeline.yaml, and both accept what is within the limits."""
    _, desc = read_pipeline(export)
    bad = copy.deepcopy(desc)
    entry = bad
    for key in where:
        entry = entry[key]
    entry["metadata"] = metadata
    folder = Path(shutil.copytree(export, tmp_path / "m"))
    _write_both(folder, bad)
    if message is None:
        leapp.load(folder)
        assert _leapp_run(folder, "--check").returncode == 0
        return
    with pytest.raises(PipelineError) as python:
        leapp.load(folder)
    assert message in str(python.value)
    assert _cpp_refusal(folder) == _python_text(python.value, folder)


_METADATA_POOL = [*_POOL, 0.1, 1e-05, 1e16, -0.0, 2**53 + 1, 1.5e300, "\u00e9\U0001f600", "x" * 16360, "x" * 16400,
                  ["\u00e9" * 4000, 1e-07], _nested(6), _nested(7), _nested(8), {"k": _nested(7)}, [[[[[[[[1]]]]]]]]]


def test_metadata_replacements_refused_alike(export, tmp_path):
    """Values inside tensors' metadata replaced (deep nests, sizes at the 16 KiB limit, floats whose JSON text
    Python and C++ must write alike): both readers accept, or both refuse with one text."""
    _, desc = read_pipeline(export)
    labelled = copy.deepcopy(desc)
    for entry in [*labelled["inputs"], *labelled["outputs"], *labelled["nodes"][0]["inputs"]]:
        entry["metadata"] = {"kind": "joints", "units": ["rad", 1.5], "names": {"a": [1, 2]}}
    folder = Path(shutil.copytree(export, tmp_path / "labelled"))
    _write_both(folder, labelled)
    leapp.load(folder)

    def in_metadata(paths):
        return [p for p in paths if "metadata" in p[:-1] or p[-1] == "metadata"]

    assert _replacements_refused_alike(folder, tmp_path, 16, 120, _METADATA_POOL, in_metadata) > 30


def test_batch_field_replacements_refused_alike(dynamic_export, tmp_path):
    """A dynamic-batch export's ``batch`` ranges (and their neighbours) replaced or removed: the C++ reader of
    pipeline.json and the Python reader of pipeline.yaml accept alike, or refuse with one text."""
    _, desc = read_pipeline(dynamic_export)
    assert any("batch" in p for p in _paths(desc)), "the export has batch ranges"

    def near_batch(paths):
        return [p for p in paths if "batch" in p or p[-1] in ("shape", 0)] or paths

    assert _replacements_refused_alike(dynamic_export, tmp_path, 15, 150, _BATCH_POOL, near_batch) > 60


def test_stale_or_missing_twin_names_leapp_write_json(folder):
    with open(folder / "pipeline.yaml", "a", encoding="utf-8") as f:
        f.write("# edited by hand\n")
    with pytest.raises(PipelineError) as python:  # both readers refuse a twin of another pipeline.yaml alike
        leapp.load(folder)
    text = _cpp_refusal(folder)
    assert "pipeline.yaml changed after pipeline.json was written" in text and "leapp write-json" in text
    assert text == str(python.value)
    (folder / "pipeline.json").unlink()
    text = _cpp_refusal(folder)
    assert text.startswith(f"no pipeline.json in {folder}") and f"leapp write-json {folder}" in text
    r = subprocess.run([str(Path(sys.executable).with_name("leapp")), "write-json", str(folder)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == str(folder / "pipeline.json"), r.stderr
    assert _leapp_run(folder, "--check").returncode == 0


_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=10)
    | st.sampled_from(["yes", "OFF", "null", "a/b-c.d", "x\u2028y", "\u0085\ufeff", "\t\"\\", "caf\u00e9"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=30)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(description=st.dictionaries(st.text(max_size=6), _VALUES, min_size=1, max_size=6))
def test_both_readers_render_one_canonical_text(tmp_path, description):
    """The C++ reader renders any twin to the bytes leapp.pipeline_format.yaml_text writes (floats as Python's
    repr, escapes, plain or quoted strings), so the pair leapp writes always passes it: leapp-run refuses these
    folders for what the schema says (no `format`), never because pipeline.yaml differs from its twin. One
    byte changed in pipeline.yaml (digest recomputed) is refused by both readers with one text."""
    description.pop("pipeline_yaml_sha256", None)
    folder = tmp_path / "f"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    _write_both(folder, description)
    text = _cpp_refusal(folder)
    assert "differs from it" not in text and "not a leapp pipeline description" in text, text
    data = (folder / "pipeline.yaml").read_bytes()
    at = len(data) // 2
    (folder / "pipeline.yaml").write_bytes(data[:at] + bytes([data[at] ^ 0x01]) + data[at + 1:])
    twin = json.loads((folder / "pipeline.json").read_text())
    twin["pipeline_yaml_sha256"] = sha256_file(folder / "pipeline.yaml")
    (folder / "pipeline.json").write_text(json.dumps(twin))
    with pytest.raises(PipelineError) as python:
        read_pipeline(folder)
    assert "differs from it at line" in str(python.value)
    assert _cpp_refusal(folder) == str(python.value)


def test_find_package_leapp_builds_a_program(export, tmp_path, cmake_build_with_leapp):
    """find_package(leapp) with `leapp --cmake-dir`: a program links leapp::pipeline, lists the I/O and runs."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "CMakeLists.txt").write_text(textwrap.dedent("""\
        cmake_minimum_required(VERSION 3.18)
        project(use_leapp CXX)
        find_package(leapp 0.1 REQUIRED)
        add_executable(use_leapp main.cpp)
        target_link_libraries(use_leapp PRIVATE leapp::pipeline)
        set_target_properties(use_leapp PROPERTIES BUILD_RPATH "$<TARGET_FILE_DIR:leapp::pipeline>")
        """))
    (src / "main.cpp").write_text(textwrap.dedent("""\
        #include <leapp/pipeline.h>
        #include <cstdio>
        #include <vector>
        int main(int, char** argv) {
          try {
            auto p = leapp::Pipeline::open(argv[1]);
            std::map<std::string, const void*> in; std::map<std::string, void*> out;
            std::vector<std::vector<char>> keep;
            for (const auto& t : p->inputs()) { keep.emplace_back(t.byte_size()); in[t.name] = keep.back().data();
              std::printf("in %s %s %zu\\n", t.name.c_str(), t.dtype.c_str(), t.byte_size()); }
            for (const auto& t : p->outputs()) { keep.emplace_back(t.byte_size()); out[t.name] = keep.back().data();
              std::printf("out %s %s %zu\\n", t.name.c_str(), t.dtype.c_str(), t.byte_size()); }
            p->run(in, {});
          } catch (const leapp::PipelineError& e) { std::printf("refused: %s\\n", e.what()); return 3; }
          return 0;
        }
        """))
    build = cmake_build_with_leapp(src, tmp_path / "build")
    r = subprocess.run([str(build / "use_leapp"), str(export)], capture_output=True, text=True, timeout=120)
    pipeline = leapp.load(export)
    for name, spec in pipeline.inputs.items():
        assert f"in {name} float32 {int(np.prod(spec.shape)) * 4}" in r.stdout
    # run() without its output buffers is refused with leapp.load's wording for missing names
    assert r.returncode == 3 and "Pipeline 'mlp': outputs missing ['output']; expected ['output']" in r.stdout, r.stdout


def test_device_cuda_without_a_gpu_is_an_error_not_an_abort(export, tmp_path):
    """Opening with device buffers where no CUDA EP or driver is usable fails with exit 1 and the reason; the
    pipeline's destructor used to call the driver loader while that error unwound and abort (exit 134)."""
    from leapp import _native

    if _native.driver_status()["available"]:
        pytest.skip("this machine has a CUDA driver: the refusal needs a machine without one")
    _write_inputs(leapp.load(export), tmp_path / "in")
    r = _leapp_run(export, "--in", tmp_path / "in", "--out", tmp_path / "out", "--device", "cuda")
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert r.stderr.startswith("leapp-run: ") and ("CUDA execution provider" in r.stderr or "CUDA driver" in r.stderr)


def test_leapp_run_bounds_what_it_reads_and_starts(export, tmp_path):
    """Sizes are checked before reading (a sparse 3 GiB input is refused unread), --threads has a cap, and a shape
    whose byte count overflows is refused when the description is read instead of wrapping to a small size."""
    pipeline = leapp.load(export)
    name, spec = next(iter(pipeline.inputs.items()))
    ins = tmp_path / "in"
    _write_inputs(pipeline, ins)
    with open(ins / f"{name}.bin", "r+b") as f:
        f.truncate(3 << 30)
    r = _leapp_run(export, "--in", ins, "--out", tmp_path / "out")
    assert r.returncode != 0 and f"has {3 << 30} bytes, expected" in r.stderr, r.stderr
    r = _leapp_run(export, "--in", ins, "--out", tmp_path / "out", "--threads", "20000")
    assert r.returncode == 2 and "--threads: at most" in r.stderr, (r.returncode, r.stderr)
    _, desc = read_pipeline(export)
    bad = copy.deepcopy(desc)
    huge = [2**62 + 1] + list(bad["inputs"][0]["shape"][1:])
    bad["inputs"][0]["shape"] = huge
    fed = {(c["node"], c["input"]) for c in bad["inputs"][0]["consumers"]}  # the same shape where it is consumed
    for node in bad["nodes"]:
        for entry in node["inputs"]:
            if (node["name"], entry["name"]) in fed:
                entry["shape"] = huge
    folder = Path(shutil.copytree(export, tmp_path / "huge"))
    _write_both(folder, bad)
    r = _leapp_run(folder, "--describe")
    assert r.returncode == 1 and "a tensor may hold (MAX_TENSOR_BYTES" in r.stderr, r.stderr  # refused when read
    assert "SafeInt" not in r.stderr


def test_an_artifact_over_the_size_limit_is_refused_unread_by_both_readers(export, monkeypatch):
    size = (export / "pipeline.yaml").stat().st_size  # every artifact is larger than the description
    monkeypatch.setenv("LEAPP_MAX_ARTIFACT_BYTES", str(size))
    with pytest.raises(PipelineError, match=r"bytes, more than the limit of .* \(LEAPP_MAX_ARTIFACT_BYTES\)") as python:
        leapp.load(export)
    r = _leapp_run(export, "--describe")
    assert r.returncode == 1 and str(python.value) in r.stderr, (r.stderr, str(python.value))


def test_onnx_warp_segments_without_a_cuda_device_are_refused_at_open(tmp_path, mock_driver_dir):
    """Issue 34: an ONNX node's Warp segment run on the CPU EP without a CUDA device failed inside the run, leapp's
    reason after ONNX Runtime's log line and status text. It is now refused at open, leapp's reason alone."""
    import importlib.util

    from runtime_helpers import mock_driver_env

    from leapp._export.compile import compile_session

    spec = importlib.util.spec_from_file_location("_cpp_compile_records",
                                                  Path(__file__).resolve().parents[1] / "export" / "compile_records.py")
    cr = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cr)
    compile_session(cr.session(tmp_path, cr.segment_node("act", "onnx", n=8, device="cpu", samples=0)),
                    validate=False, bundles=cr.example_bundles)
    folder = tmp_path / "demo"
    r = subprocess.run([str(LEAPP_RUN), str(folder), "--describe"], env=mock_driver_env(mock_driver_dir, MOCK_DEVICES="0"),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and r.stderr.strip() == (
        "leapp-run: pipeline 'demo' node 'act': 1 of its 1 Warp segment(s) hold no CPU code for this machine and "
        "replay on a CUDA device (on ONNX Runtime's CPU EP through pinned host memory), and this machine has none: "
        "the CUDA driver reports no device"), r.stderr
    r = subprocess.run([str(LEAPP_RUN), str(folder), "--describe"], env=mock_driver_env(mock_driver_dir),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "node act onnx ort-cpu" in r.stdout, r.stderr


def _peak_threads(*args) -> int:
    """The most threads /proc shows for a leapp-run process over its run (sampled every 10 ms)."""
    import time

    proc = subprocess.Popen([str(LEAPP_RUN), *map(str, args)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    peak = 0
    try:
        while proc.poll() is None:
            try:
                status = Path(f"/proc/{proc.pid}/status").read_text()
            except OSError:
                break
            peak = max(peak, int(next(line.split()[1] for line in status.splitlines() if line.startswith("Threads:"))))
            time.sleep(0.01)
    finally:
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return peak


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="counts threads through Linux's /proc")
def test_onnx_runtime_threads_are_explicit_and_bounded(export, tmp_path):
    """Issue 34 (a real-time step): leapp sets ONNX Runtime's threads instead of taking its defaults (a pool per
    session, one thread per core, spinning between steps). By default a session adds no thread (the caller's
    thread runs each node); --threads N adds N - 1 per session, whatever the machine's core count."""
    pipeline = leapp.load(export)
    _write_inputs(pipeline, tmp_path / "in")
    common = (export, "--in", tmp_path / "in", "--out", tmp_path / "out", "--time", "3000")
    alone = _peak_threads(*common)
    assert alone <= 2, alone  # the main thread (and at most one of ONNX Runtime's environment)
    # the environment's thread comes and goes: sampled every 10 ms, a loaded machine may see it in one run only
    threaded = _peak_threads(*common, "--threads", "3") - 2 * len(pipeline.nodes)
    assert 1 <= threaded <= 2, (threaded, alone)


def test_fixed_rate_loop_reports_latency_percentiles_and_deadlines(export, tmp_path):
    """Issue 34: `leapp-run --rate HZ --duration S` runs the step as a control loop does (absolute start times)
    and reports p50/p99/p99.9/max latency and missed deadlines; the outputs are the step's, as without it."""
    import re

    pipeline = leapp.load(export)
    inputs = _write_inputs(pipeline, tmp_path / "in")
    r = _leapp_run(export, "--in", tmp_path / "in", "--out", tmp_path / "out", "--rate", "500", "--duration", "0.2")
    assert r.returncode == 0, r.stderr
    m = re.search(r"pipeline 'mlp': (\d+) steps at 500 Hz on cpu \(period 2000\.0 us\), latency \(us\): p50 ([\d.]+)  "
                  r"p99 ([\d.]+)  p99\.9 ([\d.]+)  max ([\d.]+); missed deadlines (\d+) \([\d.]+%\), late starts (\d+)",
                  r.stdout)
    assert m, r.stdout
    steps, p50, p99, p999, worst, missed, late = (float(v) for v in m.groups())
    assert steps == 100 and 0 < p50 <= p99 <= p999 <= worst and missed <= steps and late <= steps
    for name, t in pipeline(**inputs).items():
        assert (tmp_path / "out" / f"{name}.bin").read_bytes() == t.contiguous().numpy().tobytes(), name
    for args, text in (((("--rate", "500"),), "--rate and --duration go together"),
                       ((("--rate", "0"), ("--duration", "1")), "--rate: a rate in Hz from 1 to 100000, got '0'"),
                       ((("--rate", "5"), ("--duration", "-1")), "--duration: seconds, more than 0"),
                       ((("--rate", "5"), ("--duration", "1"), ("--time", "3")), "one of them")):
        flat = [v for pair in args for v in pair]
        r = _leapp_run(export, "--in", tmp_path / "in", "--out", tmp_path / "out2", *flat)
        assert r.returncode == 2 and text in r.stderr, (args, r.stderr)


@pytest.mark.skipif(_native.driver_status()["available"], reason="a CUDA driver is present (this is about a machine without one)")
def test_device_buffers_without_a_driver_name_the_driver_first(export, tmp_path):
    """Without a driver, onnxruntime-gpu would not help: leapp-run --device cuda names the missing driver, whatever
    ONNX Runtime build is installed."""
    pipeline = leapp.load(export)
    _write_inputs(pipeline, tmp_path / "in")
    r = _leapp_run(export, "--in", tmp_path / "in", "--out", tmp_path / "out", "--device", "cuda")
    assert r.returncode != 0
    assert "libcuda.so.1" in r.stdout + r.stderr or "cuInit" in r.stdout + r.stderr, r.stdout + r.stderr
    assert "onnxruntime-gpu" not in r.stdout + r.stderr
