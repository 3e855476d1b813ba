"""The README example exported twice, in two fresh processes, gives byte-identical files (GPU).

Its ``action.onnx`` used to bake a ``clone`` initializer of uninitialised GPU
memory (the gradient ``wp.from_torch`` allocated for the policy output, which
requires grad), so every export differed. The CPU counterpart, with the same
node shapes, is tests/recorder/test_reproducible_export.py.
"""

from __future__ import annotations

import hashlib

import onnx
import pytest
import yaml
from test_examples import report_statuses, run_example

FILES = ["action.onnx", "obs.pt2", "pipeline.json", "pipeline.yaml", "policy.onnx"]


@pytest.mark.cuda
def test_go2_pipeline_exports_are_byte_identical(tmp_path):
    folders = []
    for run in ("first", "second"):
        proc = run_example("go2_pipeline.py", "--out", str(tmp_path / run), "--envs", "64")
        nodes = ["obs", "policy", "action"]
        assert report_statuses(proc.stdout, nodes) == dict.fromkeys(nodes, "passed"), proc.stdout
        folders.append(tmp_path / run / "go2")
    for folder in folders:
        assert sorted(p.name for p in folder.iterdir()) == FILES
    for name in FILES:
        assert (folders[0] / name).read_bytes() == (folders[1] / name).read_bytes(), name
    desc = yaml.safe_load((folders[0] / "pipeline.yaml").read_text())
    for node in desc["nodes"]:
        assert node["sha256"] == hashlib.sha256((folders[1] / node["artifact"]).read_bytes()).hexdigest()
    model = onnx.load(str(folders[0] / "action.onnx"))
    assert [i.name for i in model.graph.initializer] == ["warp_segment_0_bundle"], "only the bundle is baked"
