"""The exporter writes only inside <save_path>/<session>/, also for records built without the recorder."""

from __future__ import annotations

import os

import pytest

import compile_records as cr
from leapp._export.compile import compile_session
from leapp.errors import ExportError

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")


def _tree(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("node_name", ["../escape", "a/b", "", "x" * 300, ".hidden"])
def test_hand_made_bad_node_name_writes_nothing(tmp_path, node_name):
    save = tmp_path / "save"
    record = cr.session(save, cr.mlp_node("policy", "torchscript"), cr.mlp_node(node_name, "torchscript"))
    with pytest.raises(ExportError, match="invalid name") as info:
        compile_session(record, validate=False)
    assert "compile_records.py" in str(info.value)  # the node's source
    assert _tree(tmp_path) == [], "nothing is written, inside or outside the folder"


@pytest.mark.parametrize("session_name", ["../escape", "..", "a/b"])
def test_hand_made_bad_session_name_writes_nothing(tmp_path, session_name):
    save = tmp_path / "save"
    record = cr.session(save, cr.mlp_node("policy", "torchscript"), name=session_name)
    with pytest.raises(ExportError, match=r"session .*invalid name"):
        compile_session(record, validate=False)
    assert _tree(tmp_path) == []


def test_artifact_path_that_is_a_symlink_out_of_the_folder_is_refused(tmp_path):
    save, outside = tmp_path / "save", tmp_path / "outside.pt"
    outside.write_bytes(b"not yours")
    (save / "demo").mkdir(parents=True)
    os.symlink(outside, save / "demo" / "policy.pt")
    record = cr.session(save, cr.mlp_node("policy", "torchscript"))
    with pytest.raises(ExportError, match=r"resolves to .*outside\.pt, outside .*demo"):
        compile_session(record, validate=False)
    assert outside.read_bytes() == b"not yours"


def test_session_folder_that_is_a_symlink_out_of_save_path_is_refused(tmp_path):
    save, elsewhere = tmp_path / "save", tmp_path / "elsewhere"
    save.mkdir()
    elsewhere.mkdir()
    os.symlink(elsewhere, save / "demo")
    record = cr.session(save, cr.mlp_node("policy", "torchscript"))
    with pytest.raises(ExportError, match="outside"):
        compile_session(record, validate=False)
    assert list(elsewhere.iterdir()) == []


def test_relative_save_path_exports_inside(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    record = cr.session("exports", cr.mlp_node("policy", "torchscript"))
    record.save_path = "exports"
    compile_session(record, validate=False)
    assert _tree(tmp_path) == ["exports", "exports/demo", "exports/demo/pipeline.json", "exports/demo/pipeline.yaml", "exports/demo/policy.pt"]
