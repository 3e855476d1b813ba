"""The same code and inputs give byte-identical artifacts and pipeline.yaml, in one process and in two.

The README pipeline's ``action.onnx`` used to differ on every export: its
input (the policy's output) requires grad, ``wp.from_torch`` allocated a
gradient inside the capture, and the recorder baked that undefined memory as
a ``clone`` initializer (see test_requires_grad.py). Byte equality across
exports into different folders, seconds apart, also shows that no save path,
temporary name or timestamp reaches the files.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import onnx
import pytest
import reproducible_pipeline
import torch
import yaml

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")
FILES = ["action.onnx", "obs.pt2", "pipeline.json", "pipeline.yaml", "policy.pt2"]
_FRESH_PROCESS = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, sys.argv[1])
    import reproducible_pipeline
    reproducible_pipeline.export(sys.argv[2])
    """
)


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """Two exports in this process and one in a fresh process, each into its own folder."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LEAPP_CUDA_ARCHS", "90")  # one cubin target keeps it fast; determinism does not depend on it
        folders = []
        for i in range(2):
            save = tmp_path_factory.mktemp(f"same_process_{i}")
            reproducible_pipeline.export(str(save))
            folders.append(save / "go2")
        save = tmp_path_factory.mktemp("fresh_process")
        here = str(Path(reproducible_pipeline.__file__).parent)
        out = subprocess.run([sys.executable, "-c", _FRESH_PROCESS, here, str(save)], capture_output=True, text=True,
                             timeout=300, env=dict(os.environ))
        assert out.returncode == 0, out.stderr[-3000:]
        folders.append(save / "go2")
    return folders


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_exports_are_byte_identical(exports):
    for folder in exports:
        assert sorted(p.name for p in folder.iterdir()) == FILES
    first = exports[0]
    for other in exports[1:]:
        for name in FILES:
            assert (first / name).read_bytes() == (other / name).read_bytes(), f"{name}: {first} vs {other}"


def test_pipeline_yaml_digests_are_identical_and_true(exports):
    digests = []
    for folder in exports:
        desc = yaml.safe_load((folder / "pipeline.yaml").read_text())
        nodes = {n["name"]: n["sha256"] for n in desc["nodes"]}
        assert nodes == {n: _sha(folder / a) for n, a in (("obs", "obs.pt2"), ("policy", "policy.pt2"),
                                                          ("action", "action.onnx"))}
        digests.append((nodes, [s["digest"] for n in desc["nodes"] for s in n["segments"]]))
    assert digests[0] == digests[1] == digests[2]


def test_action_bakes_only_its_bundle(exports):
    """No initializer of undefined memory: the Warp node's only constant is its bundle."""
    model = onnx.load(str(exports[0] / "action.onnx"))
    assert [i.name for i in model.graph.initializer] == ["warp_segment_0_bundle"]
    assert [i.name for i in model.graph.input] == ["raw"] and [o.name for o in model.graph.output] == ["action"]
    (node,) = model.graph.node
    assert list(node.input) == ["raw", "warp_segment_0_bundle"] and list(node.output) == ["action"]
    assert (model.producer_name, model.producer_version) == ("pytorch", torch.__version__)


def test_no_temporary_or_export_paths_leak(exports):
    for folder in exports:
        for name in FILES:
            data = (folder / name).read_bytes()
            assert b"leapp-segment-" not in data  # capture_save's temporary folder
            assert str(folder.parent).encode() not in data  # where it was exported


def test_exports_from_two_checkouts_are_byte_identical(tmp_path):
    """The same code exported from checkouts at different paths gives the same bytes: recorded sources are relative
    to the working directory (leapp/_export/source_paths.py), so no checkout path reaches the files."""
    module = Path(reproducible_pipeline.__file__)
    folders = []
    for checkout in (tmp_path / "alice" / "robot", tmp_path / "bob" / "src" / "robot-copy"):
        checkout.mkdir(parents=True)
        (checkout / module.name).write_bytes(module.read_bytes())
        out = subprocess.run([sys.executable, "-c", _FRESH_PROCESS, str(checkout), "exports"], cwd=checkout,
                             capture_output=True, text=True, timeout=300,
                             env={**os.environ, "LEAPP_CUDA_ARCHS": "90"})
        assert out.returncode == 0, out.stderr[-3000:]
        folders.append(checkout / "exports" / "go2")
    for name in FILES:
        data = (folders[0] / name).read_bytes()
        assert data == (folders[1] / name).read_bytes(), name
        assert str(tmp_path).encode() not in data, name
    desc = yaml.safe_load((folders[0] / "pipeline.yaml").read_text())
    sources = [desc_node["source"] for desc_node in desc["nodes"]]
    assert all(s.startswith(f"{module.name}:") for s in sources), sources
