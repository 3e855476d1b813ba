"""compile_session: backends, files, pipeline.yaml, the report and validation errors (CPU)."""

from __future__ import annotations

import hashlib
import re

import pytest
import torch
import yaml

import compile_records as cr
from leapp._export.compile import compile_session
from leapp._contract.records import Sample
from leapp.errors import ExportError, ValidationError

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")


def _sha(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("backend", ["torchscript", "tensorrt"])
def test_segment_node_on_other_backend_is_not_implemented(tmp_path, backend):
    record = cr.session(tmp_path, cr.mlp_node("policy", "onnx"), cr.segment_node("obs", backend))
    with pytest.raises(NotImplementedError) as info:
        compile_session(record, bundles=cr.example_bundles)
    text = str(info.value)
    assert "'onnx'" in text and "'pt2'" in text and "obs/warp_segment_0" in text and "obs" in text
    assert "compile_records.py" in text  # the node's source
    assert not (tmp_path / "demo").exists(), "nothing is written when a backend is unsupported"


def test_unknown_backend_for_pure_node(tmp_path):
    record = cr.session(tmp_path, cr.mlp_node("policy", "tensorrt"))
    with pytest.raises(ExportError, match=r"unknown export_with='tensorrt'.*'torchscript'"):
        compile_session(record)


def test_empty_session(tmp_path):
    with pytest.raises(ExportError, match="no leapp.node was recorded"):
        compile_session(cr.session(tmp_path))


def test_compile_without_validation_writes_artifacts_and_pipeline_yaml(tmp_path):
    obs = cr.segment_node("obs", "pt2", n=5, segments=2)
    proj = cr.two_output_node("proj", "onnx", n=5)
    policy = cr.mlp_node("policy", "onnx", output_name="out")  # 'out' collides with obs's output
    record = cr.session(tmp_path, obs, proj, policy, edges=[("obs", "h", "proj", "x")], name="go2")
    record.constants_report = ["obs/warp_segment_0: array 'c' (4 bytes) snapshotted at file.py:3"]

    def bundles(seg):
        return cr.two_output_bundles(seg) if seg.node == "proj" else cr.example_bundles(seg)

    report = compile_session(record, validate=False, bundles=bundles)

    folder = tmp_path / "go2"
    assert sorted(p.name for p in folder.iterdir()) == ["obs.pt2", "pipeline.json", "pipeline.yaml", "policy.onnx", "proj.onnx"]
    desc = yaml.safe_load((folder / "pipeline.yaml").read_text())
    assert desc["format"] == "leapp.pipeline" and desc["version"] == 1 and desc["name"] == "go2"
    assert [n["name"] for n in desc["nodes"]] == ["obs", "proj", "policy"]
    for entry in desc["nodes"]:
        assert entry["sha256"] == _sha(folder / entry["artifact"])
    obs_entry = desc["nodes"][0]
    assert obs_entry["backend"] == "pt2" and obs_entry["artifact"] == "obs.pt2"
    assert obs_entry["inputs"] == [{"name": "x", "dtype": "float32", "shape": [5]}]
    assert [o["name"] for o in obs_entry["outputs"]] == ["out", "h"]
    assert [s["id"] for s in obs_entry["segments"]] == ["obs/warp_segment_0", "obs/warp_segment_1"]
    seg0 = obs_entry["segments"][0]
    assert seg0["source"].startswith("tests/export/compile_records.py:") and seg0["device"] == "cpu"
    assert re.fullmatch(r"[0-9a-f]{64}", seg0["digest"]) and seg0["kernels"] == ["example_scale"]
    assert desc["nodes"][1]["outputs"][1] == {"name": "count1", "dtype": "int32", "shape": [2, 2]}
    assert desc["edges"] == [{"from_node": "obs", "from_output": "h", "to_node": "proj", "to_input": "x"}]
    # caller-fed inputs: obs.x and policy.obs; proj.x comes from the edge
    assert [(i["name"], [c["node"] for c in i["consumers"]]) for i in desc["inputs"]] == [("x", ["obs"]), ("obs", ["policy"])]
    # final outputs: everything no edge consumes; the two 'out's are told apart by their node
    assert [(o["name"], o["node"], o["output"]) for o in desc["outputs"]] == [
        ("obs.out", "obs", "out"),
        ("y2", "proj", "y2"),
        ("count1", "proj", "count1"),
        ("policy.out", "policy", "out"),
    ]
    producer = desc["producer"]
    assert producer["torch"] == str(torch.__version__)
    assert {"leapp", "warp", "onnx", "onnxruntime", "python"} <= set(producer)
    assert producer["cuda_toolkit"] == "none" and producer["ptx_isa"] == "7.5"  # from the example bundles
    assert desc["constants"] == record.constants_report

    assert [n.node for n in report] == ["obs", "proj", "policy"]
    assert report["obs"].segments == ["obs/warp_segment_0", "obs/warp_segment_1"]
    assert all(n.status == "skipped" for n in report) and report.ok
    table = str(report)
    assert "node" in table and "backend" in table and "validation" in table
    assert re.search(r"obs\s+pt2\s+obs.pt2\s+obs/warp_segment_0, obs/warp_segment_1\s+skipped", table), table


def test_validation_cannot_run_for_cpu_captured_segment(tmp_path):
    """On a machine without CUDA (or with CPU-captured segments), validation fails by name."""
    record = cr.session(tmp_path, cr.segment_node("x", "pt2", n=4), cr.mlp_node("policy", "onnx"))
    with pytest.raises(ValidationError) as info:
        compile_session(record, bundles=cr.example_bundles)
    text = str(info.value)
    assert text.startswith("Model validation failed for 1 node(s): ['x']"), text
    assert "x/warp_segment_0" in text and "captured on the CPU" in text and "compile_records.py" in text
    report = info.value.report
    assert report["x"].status == "needs-cuda" and report["policy"].status == "passed"
    assert (tmp_path / "demo" / "pipeline.yaml").is_file(), "artifacts are written before validation"


def test_validation_reports_mismatch_with_errors(tmp_path):
    node = cr.mlp_node("policy", "pt2")
    node.samples[0].outputs[0] = node.samples[0].outputs[0] + 0.5  # eager "disagrees" with the export
    record = cr.session(tmp_path, node)
    with pytest.raises(ValidationError) as info:
        compile_session(record)
    text = str(info.value)
    assert text.startswith("Model validation failed for 1 node(s): ['policy']")
    assert "output 'actions' differs from eager (max abs 0.5" in text
    check = info.value.report["policy"].validation.outputs[0]
    assert check.max_abs == pytest.approx(0.5, abs=1e-5) and not check.ok


def test_validation_without_samples_fails(tmp_path):
    node = cr.mlp_node("policy", "onnx")
    node.samples = []
    with pytest.raises(ValidationError, match=r"(?s)\['policy'\].*no recorded samples"):
        compile_session(cr.session(tmp_path, node))


@pytest.mark.parametrize("backend", ["onnx", "pt2", "torchscript"])
def test_pure_torch_nodes_validate_on_cpu(tmp_path, backend):
    node = cr.mlp_node("policy", backend, batch=3)
    node.samples.append(Sample([torch.ones(3, 5)], [node.graph(torch.ones(3, 5))[0].detach()]))
    report = compile_session(cr.session(tmp_path, node), rtol=1e-4, atol=1e-5)
    entry = report["policy"]
    assert entry.status == "passed" and entry.validation.samples == 2
    assert entry.artifact == {"onnx": "policy.onnx", "pt2": "policy.pt2", "torchscript": "policy.pt"}[backend]
    assert entry.validation.outputs[0].max_abs < 1e-4
    assert "passed" in str(report)


def test_edge_with_mismatched_specs_is_rejected(tmp_path):
    a = cr.mlp_node("a", "pt2", n_out=3)
    b = cr.mlp_node("b", "pt2", n_in=4, input_name="obs")
    record = cr.session(tmp_path, a, b, edges=[("a", "actions", "b", "obs")])
    with pytest.raises(ExportError, match=r"joins float32\[2, 3\] to float32\[2, 4\]"):
        compile_session(record, validate=False)


def test_recompile_overwrites(tmp_path):
    record = cr.session(tmp_path, cr.mlp_node("policy", "pt2"))
    compile_session(record)
    first = (tmp_path / "demo" / "policy.pt2").read_bytes()
    record.nodes["policy"] = cr.mlp_node("policy", "pt2", seed=3)
    compile_session(record)
    assert (tmp_path / "demo" / "policy.pt2").read_bytes() != first
