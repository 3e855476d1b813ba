"""User metadata of inputs and outputs: annotate -> pipeline.yaml / pipeline.json -> leapp.load, and refusals (CPU)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

import leapp
from leapp import annotate
from leapp.errors import TraceError
from leapp.pipeline_format import MAX_METADATA_BYTES, PipelineError, read_pipeline, sha256_file, twin_text, yaml_text

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")
LEAPP_RUN = Path(sys.executable).with_name("leapp-run")
needs_leapp_run = pytest.mark.skipif(not LEAPP_RUN.is_file(), reason="leapp-run was not built (ONNX Runtime's headers)")

QUAT = {"kind": "base_quat", "frame": "world", "order": ["w", "x", "y", "z"], "note": 'scalar "w" first\n\tµ°\x01'}
JOINTS = {"kind": "joint_positions", "units": "rad", "joints": ["FL_hip", "FL_thigh"], "rate_hz": 50.0,
          "limits": {"low": -1.5, "high": 1.5}, "calibrated": True, "count": 2}
ACTION = {"kind": "joint_targets", "units": "rad", "control_rate_hz": 50}


def record(save_path, metadata=None, out_metadata=None, name="robot"):
    """obs(quat, joints) -> obs; act(obs, joints) -> action: 'joints' is one pipeline input read by both nodes."""
    metadata = {"quat": QUAT, "joints": JOINTS} if metadata is None else metadata
    out_metadata = {"action": ACTION} if out_metadata is None else out_metadata
    quat, joints = torch.randn(4, 4), torch.randn(4, 2)
    with leapp.trace(name, save_path=save_path) as session, torch.no_grad():
        for _ in range(3):
            with leapp.node("obs", export_with="onnx"):
                q, j = annotate.input_tensors("obs", {"quat": quat, "joints": joints}, metadata=metadata)
                obs = annotate.output_tensors("obs", {"obs": torch.cat([q * 2.0, j], dim=-1)})
            with leapp.node("act", export_with="onnx"):
                o, j2 = annotate.input_tensors("act", {"obs": obs, "joints": joints}, metadata={"joints": JOINTS})
                annotate.output_tensors("act", {"action": torch.tanh(o[:, :2]) + j2}, metadata=out_metadata)
    session.compile(validate=False)
    return save_path / name


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    return record(tmp_path_factory.mktemp("metadata"))


def test_metadata_is_written_to_pipeline_yaml_and_its_json_twin(export):
    desc = yaml.safe_load((export / "pipeline.yaml").read_text())
    inputs = {e["name"]: e for e in desc["inputs"]}
    assert inputs["quat"]["metadata"] == QUAT and inputs["joints"]["metadata"] == JOINTS
    assert desc["outputs"][0]["metadata"] == ACTION
    obs, act = desc["nodes"]
    assert [e.get("metadata") for e in obs["inputs"]] == [QUAT, JOINTS] and "metadata" not in obs["outputs"][0]
    assert act["inputs"][1]["metadata"] == JOINTS and act["outputs"][0]["metadata"] == ACTION
    twin = json.loads((export / "pipeline.json").read_text())
    assert {e["name"]: e.get("metadata") for e in twin["inputs"]} == {"quat": QUAT, "joints": JOINTS}


def test_leapp_load_exposes_the_metadata(export):
    pipeline = leapp.load(export)
    assert pipeline.inputs["quat"].metadata == QUAT and pipeline.inputs["joints"].metadata == JOINTS
    assert pipeline.outputs["action"].metadata == ACTION and pipeline.outputs["action"].shape == (4, 2)
    assert pipeline.nodes["obs"].inputs[0].metadata == QUAT and pipeline.nodes["obs"].outputs[0].metadata == {}
    out = pipeline(quat=torch.randn(4, 4), joints=torch.randn(4, 2))
    assert set(out) == {"action"}


def test_exports_without_metadata_still_load(export, tmp_path):
    """A pipeline.yaml written before metadata existed (no 'metadata' keys) loads, with empty metadata."""
    folder = shutil.copytree(export, tmp_path / "old")
    _, desc = read_pipeline(folder)
    for entry in [*desc["inputs"], *desc["outputs"], *(e for n in desc["nodes"] for e in n["inputs"] + n["outputs"])]:
        entry.pop("metadata", None)
    (folder / "pipeline.yaml").write_text(yaml.safe_dump(desc, sort_keys=False))
    (folder / "pipeline.json").unlink()  # such an export had no twin either
    pipeline = leapp.load(folder)
    assert pipeline.inputs["quat"].metadata == {} and pipeline.outputs["action"].metadata == {}


@pytest.mark.parametrize(("metadata", "problem"), [
    ({"quat": {"kind": None}}, "metadata of input 'quat'.kind: null is not a string, number, boolean"),
    ({"quat": {"rate": float("nan")}}, "metadata of input 'quat'.rate: nan is not a finite number"),
    ({"quat": {1: "x"}}, "metadata of input 'quat': key 1 is not a string"),
    ({"quat": {"t": torch.zeros(1)}}, "metadata of input 'quat'.t: Tensor"),
    ({"quat": ["base_quat"]}, "metadata of input 'quat': expected a mapping, got list"),
    ({"quat": {"blob": "x" * MAX_METADATA_BYTES}}, f"more than {MAX_METADATA_BYTES} "),
    ({"quat": {"a": [[[[[[[[1]]]]]]]]}}, "nested deeper than 8 levels"),
    ({"quaternion": {"kind": "base_quat"}}, "metadata for ['quaternion'], which this call does not declare"),
    ("base_quat", "metadata must map input names to mappings, got str"),
])
def test_bad_metadata_is_refused_where_it_is_declared(tmp_path, metadata, problem):
    with pytest.raises(TraceError) as error:
        record(tmp_path, metadata=metadata)
    text = str(error.value)
    assert f"annotate.input_tensors('obs') at {__file__}:" in text, text  # the user's file and line
    assert problem in text, text


def test_one_pipeline_input_with_two_different_metadata_is_refused(tmp_path):
    from leapp.errors import ExportError

    with pytest.raises(ExportError, match="pipeline input 'joints' has metadata .* in node 'obs' but .* in node 'act'"):
        record(tmp_path, metadata={"joints": {"kind": "other"}})


def _rewrite(folder, edit) -> None:
    _, desc = read_pipeline(folder)
    edit(desc)
    (folder / "pipeline.yaml").write_text(yaml_text(desc))
    (folder / "pipeline.json").write_text(twin_text(desc, sha256_file(folder / "pipeline.yaml")))


@pytest.mark.parametrize(("edit", "problem"), [
    (lambda d: d["inputs"][0].update(metadata={"kind": None}),
     "inputs[0].metadata.kind: expected a string or a number or true or false or a list or a mapping, got null"),
    (lambda d: d["inputs"][0].update(metadata=["base_quat"]), "inputs[0].metadata: expected a mapping, got a list"),
    (lambda d: d["nodes"][1]["outputs"][0].update(metadata={"big": "x" * MAX_METADATA_BYTES}),
     f"nodes[1].outputs[0].metadata: {MAX_METADATA_BYTES + 10} bytes as JSON, more than {MAX_METADATA_BYTES}"),
])
def test_readers_refuse_bad_metadata_in_pipeline_yaml(export, tmp_path, edit, problem):
    folder = shutil.copytree(export, tmp_path / "bad")
    _rewrite(folder, edit)
    with pytest.raises(PipelineError) as error:
        leapp.load(folder)
    assert str(error.value).startswith(f"{folder}/pipeline.yaml: {problem}"), str(error.value)
    if LEAPP_RUN.is_file() and "bytes as JSON" not in problem:  # the C++ reader checks types, not the size limit
        r = subprocess.run([str(LEAPP_RUN), str(folder), "--check"], capture_output=True, text=True, timeout=120)
        python = str(error.value).replace(f"{folder}/pipeline.yaml", f"{folder}/pipeline.json")
        assert r.returncode == 1 and r.stderr.strip().removeprefix("leapp-run: ") == python, r.stderr


def _described(stdout: str) -> dict[str, str]:
    """leapp-run --describe's lines: '[  ]input|output NAME DTYPE[SHAPE] METADATA' -> {'input NAME': METADATA}."""
    out = {}
    for line in stdout.splitlines():
        if line.startswith(("input ", "output ")):
            kind, name, rest = line.split(" ", 2)
            out[f"{kind} {name}"] = rest.split("] ", 1)[1]
    return out


@needs_leapp_run
def test_the_cpp_runner_exposes_the_metadata_as_json_text(export):
    r = subprocess.run([str(LEAPP_RUN), str(export), "--describe"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    compact = lambda value: json.dumps(value, ensure_ascii=False, separators=(",", ":"))  # noqa: E731
    assert _described(r.stdout) == {"input quat": compact(QUAT), "input joints": compact(JOINTS),
                                    "output action": compact(ACTION)}
    assert "  output obs float32[4, 6] {}" in r.stdout.splitlines()  # a node output without metadata


def test_non_finite_numbers_in_metadata_are_refused_on_read(export, tmp_path):
    folder = shutil.copytree(export, tmp_path / "nan")
    text = (folder / "pipeline.yaml").read_text().replace("rate_hz: 50.0", "rate_hz: .nan")
    assert ".nan" in text
    (folder / "pipeline.yaml").write_text(text)
    (folder / "pipeline.json").unlink()  # the YAML reader's check: leapp-run's twin cannot hold a NaN
    with pytest.raises(PipelineError, match=r"inputs\[1\]\.metadata\.rate_hz: nan is not a finite number"):
        leapp.load(folder)


def test_leapp_inspect_prints_the_metadata(export):
    import io

    from leapp.cli import inspect_path

    out = io.StringIO()
    assert inspect_path(export, out) == 0
    assert 'outputs: action: float32[4, 2] {"kind": "joint_targets", "units": "rad", "control_rate_hz": 50}' in out.getvalue()
