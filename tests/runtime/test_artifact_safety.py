"""A node's .pt2 archive from elsewhere: leapp refuses what torch.export.load would run code from.

The crafted archives here carry a pickle whose loading creates a marker folder: the tests show that
torch.export.load itself runs it, and that leapp.load, the runner and ``leapp aoti`` refuse the file
first, naming the member, without the marker appearing.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import random
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
import yaml

import leapp
from leapp.pipeline_format import PipelineError, read_pipeline, sha256_file, write_twin
from leapp.runtime.artifact_safety import check_pt2_archive


class _Marker:
    """Unpickling it calls os.mkdir(path): any full unpickler that reads it leaves the folder behind."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return os.mkdir, (self.path,)


def _export_policy(save: Path, name: str, width: int, **node_params) -> Path:
    """``save/name``: one ``policy`` MLP node (``width`` inputs and hidden units) exported without validation."""
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Tanh(), torch.nn.Linear(width, 3))

    @leapp.node("policy", **node_params)
    def policy(obs):
        return mlp(obs)

    with leapp.trace(name, save_path=save) as session, torch.no_grad():
        for _ in range(2):
            policy(torch.randn(4, width))
    session.compile(validate=False)
    return save / name


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> Path:
    return _export_policy(tmp_path_factory.mktemp("pt2_archive"), "arch", 6, export_with="pt2")


def _rewrite(src: Path, dst: Path, change) -> None:
    """``dst``: ``src``'s archive with ``change(name, bytes) -> bytes | None`` applied (None drops a member);
    ``change`` may return extra members under the key ``"+"`` when called with name ``"+"``."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as zout:
        root = zin.namelist()[0].split("/", 1)[0] + "/"
        for info in zin.infolist():
            data = change(info.filename[len(root):], zin.read(info))
            if data is not None:
                zout.writestr(info.filename, data)
        for name, data in (change("+", None) or {}).items():
            zout.writestr(root + name, data)


def _reseal(folder: Path) -> None:
    """pipeline.yaml's sha256 of the artifact updated, as whoever crafted the folder would."""
    desc = yaml.safe_load((folder / "pipeline.yaml").read_text())
    desc["nodes"][0]["sha256"] = sha256_file(folder / desc["nodes"][0]["artifact"])
    (folder / "pipeline.yaml").write_text(yaml.safe_dump(desc, sort_keys=False))
    write_twin(folder)


def _with_pickled_weight(export: Path, tmp_path: Path, payload_for, flag=True) -> Path:
    """The export with its first weight marked ``use_pickle`` and replaced by ``payload_for(its name)``."""
    folder = tmp_path / "crafted"
    folder.mkdir()
    for f in export.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    (folder / "policy.pt2").unlink()
    chosen = {}

    def change(name, data):
        if name == "+":
            return None
        if name.endswith("_weights_config.json"):
            config = json.loads(data)
            fqn = next(iter(config["config"]))
            config["config"][fqn]["use_pickle"] = flag
            chosen["file"], chosen["payload"] = config["config"][fqn]["path_name"], payload_for(fqn)
            return json.dumps(config).encode()
        return data

    _rewrite(export / "policy.pt2", folder / "tmp.pt2", change)
    _rewrite(folder / "tmp.pt2", folder / "policy.pt2",
             lambda name, data: None if name == "+" else chosen["payload"] if name == f"data/weights/{chosen['file']}" else data)
    (folder / "tmp.pt2").unlink()
    _reseal(folder)
    return folder


def test_leapps_own_export_passes(export):
    check_pt2_archive(export / "policy.pt2")
    leapp.load(export)


@pytest.mark.parametrize("flag", [True, 1, "yes"])  # torch tests the flag with `if`: any true value pickles
def test_a_code_running_pickle_is_refused_before_torch_unpickles_it(export, tmp_path, flag):
    marker = tmp_path / "ran"
    folder = _with_pickled_weight(export, tmp_path, lambda _: pickle.dumps(_Marker(marker)), flag)
    with pytest.raises(PipelineError) as refused:
        leapp.load(folder)
    text = str(refused.value)
    assert text.startswith("pipeline 'arch' node 'policy': policy.pt2: data/weights/") and "weights-only" in text
    assert "can run any code" in text and not marker.exists()
    # the threat is real: torch's own load runs the pickle
    from leapp.runtime import ops

    ops.ensure_registered()
    with pytest.raises(Exception):  # what torch makes of the mkdir's None does not matter
        torch.export.load(str(folder / "policy.pt2"))
    assert marker.is_dir()


def test_a_plain_tensor_pickle_still_loads(export, tmp_path):
    """A pickled payload torch's weights-only unpickler reads is let through (what torch then does with it)."""
    original = leapp.load(export)
    weights = original.nodes["policy"].runner.program.program.state_dict

    def saved(fqn):
        buffer = io.BytesIO()
        torch.save(weights[fqn].detach().clone(), buffer)
        return buffer.getvalue()

    folder = _with_pickled_weight(export, tmp_path, saved)
    x = torch.randn(4, 6)
    got, want = leapp.load(folder)(obs=x), original(obs=x)
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in got)


@pytest.mark.parametrize(("member", "expected"), [
    ("data/aotinductor/model/model.so", "an AOTInductor model, which torch.export.load loads as native code"),
    ("data/constants/opaque_obj_0", None),  # checked through the config below
    ("evil/anything", "not a member of a PT2 program archive"),
])
def test_members_outside_a_plain_program_are_refused(export, tmp_path, member, expected):
    target = tmp_path / "policy.pt2"
    if expected is None:
        def change(name, data):
            if name == "+":
                return {member: pickle.dumps(_Marker(tmp_path / "ran"))}
            if name.endswith("_constants_config.json"):
                return json.dumps({"config": {"obj": {"path_name": "opaque_obj_0", "use_pickle": False}}}).encode()
            return data
        expected = "an opaque object ('obj'), which torch unpickles with a pickler that can run code"
    else:
        def change(name, data):
            return {member: b"\x7fELF"} if name == "+" else data
    _rewrite(export / "policy.pt2", target, change)
    with pytest.raises(PipelineError, match=r"policy\.pt2: " + member.replace(".", r"\.")) as refused:
        check_pt2_archive(target)
    assert expected in str(refused.value)
    assert not (tmp_path / "ran").exists()


def test_compressed_members_and_non_archives_are_refused(export, tmp_path):
    packed = tmp_path / "policy.pt2"
    with zipfile.ZipFile(export / "policy.pt2") as zin, zipfile.ZipFile(packed, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            zout.writestr(info.filename, zin.read(info))
    with pytest.raises(PipelineError, match="compressed; torch.export.save stores members uncompressed"):
        check_pt2_archive(packed)
    junk = tmp_path / "junk.pt2"
    junk.write_bytes(b"not a zip")
    with pytest.raises(PipelineError, match=r"junk\.pt2 is not a PT2 archive \(a zip file\)"):
        check_pt2_archive(junk)


def test_a_member_stored_twice_is_refused(export, tmp_path):
    """Two copies of one name: a check that read one copy could pass while a loader reads the other."""
    target = tmp_path / "policy.pt2"
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # zipfile warns about the duplicate name it writes
        _rewrite(export / "policy.pt2", target,
                 lambda name, data: {"data/weights/weight_0": b"x"} if name == "+" else data)
    with pytest.raises(PipelineError, match=r"data/weights/weight_0: stored twice in the archive"):
        check_pt2_archive(target)


def test_a_code_running_sample_input_is_refused(export, tmp_path):
    """torch falls back to the full unpickler for sample inputs the weights-only one refuses."""
    target = tmp_path / "policy.pt2"
    marker = tmp_path / "ran"
    _rewrite(export / "policy.pt2", target,
             lambda name, data: None if name == "+" else
             pickle.dumps(_Marker(marker)) if name.startswith("data/sample_inputs/") else data)
    with pytest.raises(PipelineError, match=r"data/sample_inputs/model\.pt: a pickle torch's weights-only"):
        check_pt2_archive(target)
    assert not marker.exists()



# --- ONNX: external data ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def onnx_export(tmp_path_factory) -> Path:
    """An ONNX node whose weights leapp exported as external data (pipeline.yaml lists the file)."""
    return _export_policy(tmp_path_factory.mktemp("onnx_external"), "ext", 64,  # 16 KiB of weights: external
                          export_with="onnx", external_data=True)


def _retarget(onnx_export: Path, tmp_path: Path, location: str, secret: bytes = b"") -> Path:
    """A copy whose model points its first external tensor at ``location`` (resealed, as a crafter would)."""
    import onnx

    folder = tmp_path / "crafted"
    folder.mkdir()
    for f in onnx_export.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    model = onnx.load(str(folder / "policy.onnx"), load_external_data=False)
    tensor = next(t for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL)
    for entry in tensor.external_data:
        if entry.key == "location":
            entry.value = location
        elif entry.key == "offset":
            entry.value = "0"
    (folder / "policy.onnx").write_bytes(model.SerializeToString())
    _reseal(folder)
    return folder


def test_leapps_external_data_passes_and_loads(onnx_export):
    desc = yaml.safe_load((onnx_export / "pipeline.yaml").read_text())
    assert desc["nodes"][0]["files"], "the export keeps its weights in a file pipeline.yaml lists"
    out = leapp.load(onnx_export)(obs=torch.ones(4, 64))
    assert len(out) == 1


@pytest.mark.parametrize("location", ["../secret.bin", "/etc/hostname", "sub/../../secret.bin", "link.bin",
                                      "unlisted.bin"])
def test_external_data_outside_the_nodes_files_is_refused(onnx_export, tmp_path, location):
    """A location out of the folder, absolute, through a symlink, or to a file pipeline.yaml does not list
    (so its sha256 was never checked): refused before ONNX Runtime opens the model."""
    (tmp_path / "secret.bin").write_bytes(b"S" * 65536)
    folder = _retarget(onnx_export, tmp_path, location)
    (folder / "link.bin").symlink_to(tmp_path / "secret.bin")
    (folder / "unlisted.bin").write_bytes(b"U" * 65536)
    with pytest.raises(PipelineError) as refused:
        leapp.load(folder)
    text = str(refused.value)
    assert text.startswith("pipeline 'ext' node 'policy': policy.onnx: graph.initializer ")
    assert f"external data location {location!r}" in text


LEAPP_RUN = Path(sys.executable).with_name("leapp-run")
needs_leapp_run = pytest.mark.skipif(not LEAPP_RUN.is_file(), reason="leapp-run was not built: ONNX Runtime's "
                                     "headers are missing (bash scripts/fetch-ort-headers.sh, then pip install -e .)")


def _cpp_text(folder: Path) -> str | None:
    """leapp-run's refusal of ``folder`` (opening every node), or None when it opens."""
    r = subprocess.run([str(LEAPP_RUN), str(folder), "--describe"], capture_output=True, text=True, timeout=120)
    return None if r.returncode == 0 else r.stderr.strip().removeprefix("leapp-run: ")


@needs_leapp_run
def test_leapp_run_opens_leapps_external_data(onnx_export):
    assert _cpp_text(onnx_export) is None


_LOCATIONS = ["policy.onnx.data", "../secret.bin", "/etc/hostname", "", "a/../policy.onnx.data", "link.bin",
              "unlisted.bin", "sub/x.bin", "caf\u00e9 'q'.bin"]


def _external(tensor, locations, marked: bool = True):
    import onnx

    if marked:
        tensor.data_location = onnx.TensorProto.EXTERNAL
    for location in locations:
        entry = tensor.external_data.add()
        entry.key, entry.value = "location", location


@needs_leapp_run
@pytest.mark.parametrize("seed", range(12))
def test_both_readers_refuse_the_same_first_external_location(onnx_export, tmp_path, seed):
    """Random external tensors in every place a model can hold one (initializers, sparse initializers, node
    attributes, subgraphs, functions, training graphs): leapp.load and leapp-run refuse with one text."""
    import onnx
    from onnx import helper

    rng = random.Random(seed)
    folder = tmp_path / "crafted"
    shutil.copytree(onnx_export, folder)
    (tmp_path / "secret.bin").write_bytes(b"S" * 65536)
    (folder / "link.bin").symlink_to(tmp_path / "secret.bin")
    (folder / "unlisted.bin").write_bytes(b"U" * 65536)
    data_file = next(p.name for p in folder.iterdir() if p.suffix == ".data")
    pool = [data_file if x == "policy.onnx.data" else x for x in _LOCATIONS]
    model = onnx.load(str(folder / "policy.onnx"), load_external_data=False)

    def tensor(name):
        t = onnx.TensorProto(name=name, data_type=onnx.TensorProto.FLOAT, dims=[1])
        _external(t, rng.sample(pool, rng.randint(0, 2)), marked=rng.random() < 0.8)
        return t

    for k in range(rng.randint(0, 2)):
        model.graph.initializer.append(tensor(f"extra{k}"))
    if rng.random() < 0.5:
        model.graph.sparse_initializer.append(helper.make_sparse_tensor(tensor("sv"), tensor("si"), [4]))
    if rng.random() < 0.6:
        model.graph.node.append(helper.make_node("Constant", [], ["c0"], value=tensor("cv"), name="const"))
    if rng.random() < 0.5:
        sub = helper.make_graph([helper.make_node("Constant", [], ["s"], value=tensor("sub_t"))], "sub", [], [],
                                initializer=[tensor("sub_init")])
        model.graph.node.append(helper.make_node("If", ["cond"], ["o"], then_branch=sub, else_branch=sub))
    if rng.random() < 0.4:
        model.functions.append(helper.make_function("dom", "f", [], ["y"], [
            helper.make_node("Constant", [], ["y"], value=tensor("fv"))], [helper.make_opsetid("", 17)]))
    if rng.random() < 0.5:  # a local function's attribute default: onnx 1.16+ FunctionProto.attribute_proto
        function = helper.make_function("dom", "g", [], ["z"], [helper.make_node("Constant", [], ["z"], value_float=1.0)],
                                        [helper.make_opsetid("", 17)])
        function.attribute_proto.append(helper.make_attribute("default_t", tensor("fd")))
        model.functions.append(function)
    if rng.random() < 0.4:
        info = model.training_info.add()
        info.initialization.initializer.append(tensor("ti"))
    (folder / "policy.onnx").write_bytes(model.SerializeToString())
    _reseal(folder)
    try:
        leapp.load(folder)
        python = None
    except PipelineError as e:
        python = str(e)
    cpp = _cpp_text(folder)
    if python is not None and "external data location" in python:
        assert cpp == python
    else:  # nothing the check refuses: whatever ONNX Runtime makes of the model, the check said nothing
        assert cpp is None or "external data location" not in cpp, cpp


@needs_leapp_run
def test_leapp_runs_model_walk_survives_corrupt_bytes(onnx_export, tmp_path):
    """Seeded corruptions of the model's bytes (flipped bytes, cut ends, inflated lengths) that protobuf itself
    refuses: leapp-run refuses them with a message, never a crash or a hang (its own wire-format walk reads
    them before ONNX Runtime does). Run under ASan as docs/building.md shows for the full check."""
    import onnx
    from google.protobuf.message import DecodeError

    folder = tmp_path / "crafted"
    shutil.copytree(onnx_export, folder)
    good = (onnx_export / "policy.onnx").read_bytes()
    rng = random.Random(7)
    tried = 0
    for case in range(400):
        data = bytearray(good)
        kind = case % 3
        if kind == 0:
            for _ in range(rng.randint(1, 4)):
                data[rng.randrange(len(data))] = rng.randrange(256)
        elif kind == 1:
            del data[rng.randrange(1, len(data)):]
        else:
            at = rng.randrange(len(data))
            data[at:at] = bytes([0x3A, 0xFF, 0xFF, 0xFF, 0x0F])  # field 7, length-delimited, ~4 GiB
        try:
            onnx.ModelProto().ParseFromString(bytes(data))
            continue  # protobuf reads it: what ONNX Runtime does with such a model is not this test's business
        except DecodeError:
            pass
        (folder / "policy.onnx").write_bytes(bytes(data))
        _reseal(folder)
        r = subprocess.run([str(LEAPP_RUN), str(folder), "--describe"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 1 and r.stderr.startswith("leapp-run: "), (case, r.returncode, r.stderr[-500:])
        tried += 1
        if tried == 40:
            break
    assert tried == 40


def test_leapp_inspect_reports_what_load_would_refuse(export, onnx_export, tmp_path, capsys):
    """``leapp inspect FOLDER`` vets a folder before anyone loads it: the same refusals, as problems."""
    from leapp.cli.inspect import inspect_path

    assert inspect_path(export) == 0 and inspect_path(onnx_export) == 0
    capsys.readouterr()
    (tmp_path / "p").mkdir()
    pt2 = _with_pickled_weight(export, tmp_path / "p", lambda _: pickle.dumps(_Marker(tmp_path / "ran")))
    assert inspect_path(pt2) > 0
    assert "node policy: unsafe to load: policy.pt2: data/weights/" in capsys.readouterr().out
    assert not (tmp_path / "ran").exists()
    (tmp_path / "o").mkdir()
    onnx_folder = _retarget(onnx_export, tmp_path / "o", "../secret.bin")
    assert inspect_path(onnx_folder) > 0
    assert "node policy: unsafe to load: policy.onnx: graph.initializer " in capsys.readouterr().out


def test_a_function_attribute_default_pointing_outside_is_refused(onnx_export, tmp_path):
    """ORT 1.20-1.23 read a local function's default tensor from wherever its location points."""
    import onnx
    from onnx import helper

    folder = tmp_path / "crafted"
    shutil.copytree(onnx_export, folder)
    model = onnx.load(str(folder / "policy.onnx"), load_external_data=False)
    function = helper.make_function("dom", "leak", [], ["z"], [helper.make_node("Constant", [], ["z"], value_float=1.0)],
                                    [helper.make_opsetid("", 17)])
    secret = onnx.TensorProto(name="s", data_type=onnx.TensorProto.UINT8, dims=[6])
    _external(secret, ["../secret.txt"])
    function.attribute_proto.append(helper.make_attribute("value", secret))
    model.functions.append(function)
    (folder / "policy.onnx").write_bytes(model.SerializeToString())
    _reseal(folder)
    expected = ("function 'leak' attribute default 'value': external data location '../secret.txt' is not a plain "
                "relative path inside the export folder")
    with pytest.raises(PipelineError, match=re.escape(expected)):
        leapp.load(folder)
    cpp = _cpp_text(folder)
    assert cpp is None or expected in cpp, cpp  # None: no leapp-run built here


# --- PT2: what torch reads is what was checked --------------------------------------------------------------


def _evil_torch_pickle(marker: Path) -> bytes:
    buf = io.BytesIO()
    torch.save({"x": _Marker(marker)}, buf)
    return buf.getvalue()


def _crafted_pt2_folder(export: Path, tmp_path: Path, change) -> Path:
    folder = tmp_path / "crafted"
    shutil.copytree(export, folder)
    (folder / "policy.pt2").unlink()
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # zipfile warns about names it writes twice
        _rewrite(export / "policy.pt2", folder / "policy.pt2", change)
    _reseal(folder)
    return folder


def _refused_everywhere(folder: Path, marker: Path, capsys, match: str) -> None:
    """leapp.load and leapp inspect refuse the folder, and nothing unpickled the marker."""
    from leapp.cli.inspect import inspect_path

    with pytest.raises(PipelineError, match=match):
        leapp.load(folder)
    assert inspect_path(folder) > 0
    assert re.search(match, capsys.readouterr().out)
    assert not marker.exists(), "the crafted pickle ran"


def test_a_sample_input_in_another_case_is_refused(export, tmp_path, capsys):
    """torch looks members up without case and falls back to the full unpickler for sample inputs."""
    marker = tmp_path / "ran"
    folder = _crafted_pt2_folder(export, tmp_path, lambda name, data: (
        {"data/sample_inputs/model.PT": _evil_torch_pickle(marker)} if name == "+" else
        None if name == "data/sample_inputs/model.pt" else data))
    _refused_everywhere(folder, marker, capsys, r"data/sample_inputs/model\.PT: not a member of a PT2 program archive")


def test_a_weight_shadowed_by_another_case_is_refused(export, tmp_path, capsys):
    """A harmless weight_0 checked, a WEIGHT_0 that torch's case-insensitive lookup may read instead."""
    marker = tmp_path / "ran"

    def change(name, data):
        if name == "+":
            return {"data/weights/WEIGHT_0": _evil_torch_pickle(marker)}
        if name.endswith("_weights_config.json"):
            config = json.loads(data)
            for entry in config["config"].values():
                if entry["path_name"] == "weight_0":
                    entry["use_pickle"] = True
            return json.dumps(config).encode()
        if name == "data/weights/weight_0":
            buf = io.BytesIO()
            torch.save(torch.zeros(1), buf)
            return buf.getvalue()
        return data

    folder = _crafted_pt2_folder(export, tmp_path, change)
    _refused_everywhere(folder, marker, capsys, r"data/weights/WEIGHT_0: stored twice in the archive")


def test_torch_reads_only_the_members_python_checked(export, tmp_path, monkeypatch):
    """A file holding a second archive: whatever torch's zip reader would pick, it is given a new archive made
    of the members Python's zipfile read and checked, and nothing else."""
    import zipfile as zf

    from leapp.runtime import artifact_safety

    marker = tmp_path / "ran"
    evil = io.BytesIO()
    with zf.ZipFile(evil, "w", zf.ZIP_STORED) as z:
        z.writestr("policy/data/sample_inputs/model.pt", _evil_torch_pickle(marker))
        z.writestr("policy/archive_format", b"pt2")
    folder = tmp_path / "crafted"
    shutil.copytree(export, folder)
    (folder / "policy.pt2").write_bytes(evil.getvalue() + (export / "policy.pt2").read_bytes())
    _reseal(folder)
    seen = []
    real_load = torch.export.load
    monkeypatch.setattr(torch.export, "load", lambda f, *a, **k: seen.append(f.getvalue()) or real_load(f, *a, **k))
    data = (folder / "policy.pt2").read_bytes()
    try:
        leapp.load(folder)
    except PipelineError:
        pass  # refusing is as good: what matters is what torch was handed, below
    assert not marker.exists(), "the crafted pickle ran"
    for given in seen:
        assert given == artifact_safety.canonical_pt2(data, "policy.pt2")
        with zf.ZipFile(io.BytesIO(given)) as z:
            assert z.read("archive/data/sample_inputs/model.pt") == b""


# --- one description: pipeline.json (leapp-run's) and pipeline.yaml (leapp.load's) must agree ------------------


def _refusals(folder: Path, capsys) -> list[str]:
    """What leapp.load, the validation worker's reader, leapp inspect and leapp-run (when built) say of ``folder``."""
    from leapp.cli.inspect import inspect_path
    from leapp.runtime.pipeline import read_description

    with pytest.raises(PipelineError) as loaded:
        leapp.load(folder)
    with pytest.raises(PipelineError) as read:
        read_description(folder)
    capsys.readouterr()
    assert inspect_path(folder) > 0 and str(loaded.value) in capsys.readouterr().out
    texts = [str(loaded.value), str(read.value)]
    if LEAPP_RUN.is_file():
        texts.append(_cpp_text(folder))
    return texts


@pytest.mark.parametrize("edited", ["pipeline.json", "pipeline.yaml"])
def test_two_descriptions_that_name_different_artifacts_are_refused_alike(export, tmp_path, capsys, edited):
    """Issue 33's folder: one file names other.pt2, the other policy.pt2, and the twin's digest of pipeline.yaml
    is right (kept, or recomputed over the edited YAML). leapp.load, the validation worker's reader, leapp inspect
    and leapp-run refuse it with one text, naming the line and field."""
    folder = tmp_path / "crafted"
    shutil.copytree(export, folder)
    shutil.copy(folder / "policy.pt2", folder / "other.pt2")
    twin = json.loads((folder / "pipeline.json").read_text())
    if edited == "pipeline.json":
        twin["nodes"][0]["artifact"] = "other.pt2"
        expected, found = "other.pt2", "policy.pt2"
    else:
        yaml_file = folder / "pipeline.yaml"
        yaml_file.write_text(yaml_file.read_text().replace("artifact: policy.pt2", "artifact: other.pt2"))
        twin["pipeline_yaml_sha256"] = sha256_file(yaml_file)
        expected, found = "policy.pt2", "other.pt2"
    (folder / "pipeline.json").write_text(json.dumps(twin))
    texts = _refusals(folder, capsys)
    assert len(set(texts)) == 1, texts
    assert f"(nodes[0].artifact), where leapp writes `    artifact: {expected}`" in texts[0], texts[0]
    assert f"{folder / 'pipeline.yaml'} differs from it at line" in texts[0] and found not in texts[0]


def test_a_yaml_of_the_same_values_in_another_layout_reads_in_python_only(export, tmp_path, capsys):
    """pipeline.yaml in another layout of the same values, the twin's digest recomputed (an export written before
    the canonical text): the Python readers prove the two agree and read it; leapp-run cannot parse YAML and refuses
    it, naming `leapp write-json`, which makes the pair again. The same layout with one value changed is refused by
    every reader with one text."""
    folder = tmp_path / "crafted"
    shutil.copytree(export, folder)
    _, description = read_pipeline(folder)
    yaml_file = folder / "pipeline.yaml"

    def write(desc):
        yaml_file.write_text(yaml.safe_dump(desc, sort_keys=False))
        twin = json.loads((folder / "pipeline.json").read_text())
        twin["pipeline_yaml_sha256"] = sha256_file(yaml_file)
        (folder / "pipeline.json").write_text(json.dumps(twin))

    write(description)
    assert read_pipeline(folder)[1] == description
    leapp.load(folder)
    if LEAPP_RUN.is_file():
        cpp = _cpp_text(folder)
        assert "differs from it at line" in cpp and "leapp write-json" in cpp, cpp
    changed = json.loads(json.dumps(description))
    changed["nodes"][0]["artifact"] = "other.pt2"
    write(changed)
    texts = _refusals(folder, capsys)
    assert len(set(texts)) == 1 and "differs from it at line" in texts[0], texts
    write_twin(folder)  # from the (changed) pipeline.yaml: both files canonical again
    assert read_pipeline(folder)[1]["nodes"][0]["artifact"] == "other.pt2"
    write(description)
    write_twin(folder)
    if LEAPP_RUN.is_file():  # past the description: a PT2 node needs the AOTInductor package leapp-run runs
        cpp = _cpp_text(folder)
        assert cpp is None or "without an AOTInductor package" in cpp, cpp


@pytest.mark.parametrize("twin_text", ['{"a": 1, "a": 2}', '{"x": NaN}', "[]", "{"])
def test_a_twin_that_is_not_leapps_json_is_refused(export, tmp_path, twin_text):
    folder = tmp_path / "crafted"
    shutil.copytree(export, folder)
    (folder / "pipeline.json").write_text(twin_text)
    with pytest.raises(PipelineError, match=r"pipeline\.json: "):
        leapp.load(folder)


def test_a_stale_twin_is_refused_by_both_readers_with_one_text(export, tmp_path):
    folder = tmp_path / "crafted"
    shutil.copytree(export, folder)
    (folder / "pipeline.yaml").write_text((folder / "pipeline.yaml").read_text() + "\n")
    with pytest.raises(PipelineError, match="pipeline.yaml changed after pipeline.json was written") as loaded:
        leapp.load(folder)
    cpp = _cpp_text(folder)
    assert cpp is None or str(loaded.value) in cpp, (cpp, str(loaded.value))


def test_a_refusal_quotes_hostile_names_bounded(onnx_export, tmp_path):
    """A node, attribute and location of 1 MB each (issue 33: Python once answered with a 1,048,848-character
    message): the refusal shows each cut to 60 characters around "...", the same text from leapp-run."""
    import onnx
    from onnx import helper

    folder = tmp_path / "crafted"
    shutil.copytree(onnx_export, folder)
    model = onnx.load(str(folder / "policy.onnx"), load_external_data=False)
    t = onnx.TensorProto(name="t", data_type=onnx.TensorProto.FLOAT, dims=[1])
    _external(t, ["x" * 1_000_000 + ".bin"])
    node = helper.make_node("Identity", ["x"], ["y"], name="n" * 999_999 + "\u00e9")
    node.attribute.append(helper.make_attribute("a" * 1_000_000, t))
    model.graph.node.append(node)
    (folder / "policy.onnx").write_bytes(model.SerializeToString())
    _reseal(folder)
    with pytest.raises(PipelineError, match="external data location 'xxx") as loaded:
        leapp.load(folder)
    text = str(loaded.value)
    assert len(text) < 1000 and f"graph.node '{'n' * 27}...{'n' * 27}\u00e9' attribute '{'a' * 27}...{'a' * 28}'" in text
    if LEAPP_RUN.is_file():
        assert _cpp_text(folder) == text


@needs_leapp_run
def test_leapp_runs_walk_keeps_no_list_of_locations(onnx_export, tmp_path):
    """A node with a 1 MB name and 1,000 external tensors, every location allowed: the walk used to keep one
    (place, location) pair per tensor, each place repeating the name (1 GB here); now each is checked as found.
    leapp-run's peak memory stays far below that, whatever ONNX Runtime then makes of the model."""
    import onnx
    from onnx import helper

    folder = tmp_path / "crafted"
    shutil.copytree(onnx_export, folder)
    data_file = next(p.name for p in folder.iterdir() if p.suffix == ".data")
    model = onnx.load(str(folder / "policy.onnx"), load_external_data=False)
    node = helper.make_node("Identity", ["x"], ["y"], name="n" * 1_000_000)
    for k in range(1000):
        t = onnx.TensorProto(name=f"t{k}", data_type=onnx.TensorProto.FLOAT, dims=[1])
        _external(t, [data_file])
        node.attribute.append(helper.make_attribute(f"a{k}", t))
    model.graph.node.append(node)
    (folder / "policy.onnx").write_bytes(model.SerializeToString())
    _reseal(folder)
    probe = ("import resource, subprocess, sys; subprocess.run(sys.argv[1:], capture_output=True, timeout=300); "
             "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    done = subprocess.run([sys.executable, "-c", probe, str(LEAPP_RUN), str(folder), "--describe"],
                          capture_output=True, text=True, timeout=320)
    peak_kib = int(done.stdout.strip().splitlines()[-1])
    assert peak_kib < 400 * 1024, f"leapp-run peaked at {peak_kib / 1024:.0f} MiB"
