"""The LEAPP bundle's fields against docs/leapp-bundle.md, its warnings, and its refusals (CPU, no client needed)."""

from __future__ import annotations

import hashlib
import shutil
import warnings

import pytest
import yaml

from leapp.cli import main
from leapp.interchange import LeappBundleError, LeappBundleWarning, bundle_description, write_leapp_bundle
from leapp.pipeline_format import read_pipeline

from bundle_pipelines import ACTION, JOINTS, record_obs_act

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", LeappBundleWarning)
        folder = record_obs_act(tmp_path_factory.mktemp("bundle"), leapp_bundle=True)
    return folder, [w for w in caught if issubclass(w.category, LeappBundleWarning)]


def test_compile_writes_the_bundle_with_every_field(export):
    folder, _ = export
    doc = yaml.safe_load((folder / "robot.yaml").read_text())
    assert list(doc) == ["models", "pipeline", "system information"]
    assert list(doc["models"]) == ["obs", "act"]  # run order: the client runs models in the yaml's order
    obs, act = doc["models"]["obs"], doc["models"]["act"]
    assert obs["inputs"] == [
        {"name": "quat", "dtype": "float32", "shape": [2, 4], "type": "tensor"},
        {"name": "joints", "dtype": "float32", "shape": [2, 2], "type": "tensor", "kind": JOINTS["kind"],
         "element_names": [["hip", "knee"]]},  # a flat list of names becomes one axis; 'units' is not a field
    ]
    assert obs["outputs"] == [{"name": "obs", "dtype": "float32", "shape": [2, 6], "type": "tensor"}]
    assert act["outputs"][0]["kind"] == ACTION["kind"] and act["outputs"][0]["element_names"] == [["a0", "a1", "a2"]]
    for name, model, backend in (("obs", obs, "onnx"), ("act", act, "pt2")):
        data = (folder / model["parameters"]["model_path"]).read_bytes()
        assert model["parameters"] == {"model_path": f"{name}.{backend}", "backend": backend,
                                       "md5sum": hashlib.md5(data).hexdigest(),
                                       "sha256sum": hashlib.sha256(data).hexdigest()}
    assert doc["pipeline"] == {"data_flow": {"obs/obs": ["act/obs"]}, "feedback_flow": {}, "feedback_connections": {},
                               "inputs": {"obs": ["quat", "joints"]}, "outputs": {"act": ["action"]}}
    _, desc = read_pipeline(folder)
    info = doc["system information"]
    assert info["leapp version"] == desc["producer"]["leapp"] and info["torch version"] == desc["producer"]["torch"]


def test_a_pt2_node_is_warned_about_by_name(export):
    _, caught = export
    assert [str(w.message).split(":")[0] for w in caught] == ["node 'act' is a pt2 node"]
    assert "Triton" in str(caught[0].message)


def test_the_command_writes_the_same_file_and_prints_warnings(export, tmp_path, capsys):
    folder = shutil.copytree(export[0], tmp_path / "copy")
    (folder / "robot.yaml").unlink()
    assert main(["write-leapp-bundle", str(folder)]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == str(folder / "robot.yaml")
    assert "leapp write-leapp-bundle: warning: node 'act' is a pt2 node" in err
    assert (folder / "robot.yaml").read_text() == (export[0] / "robot.yaml").read_text()


def test_an_artifact_changed_after_export_is_refused_by_name(export, tmp_path, capsys):
    folder = shutil.copytree(export[0], tmp_path / "edited")
    data = bytearray((folder / "obs.onnx").read_bytes())
    data[-1] ^= 1
    (folder / "obs.onnx").write_bytes(bytes(data))
    with pytest.raises(LeappBundleError, match=r"obs\.onnx: sha256 is [0-9a-f]{64}, but pipeline\.yaml records"):
        write_leapp_bundle(folder)
    assert main(["write-leapp-bundle", str(folder)]) == 1
    assert capsys.readouterr().err.startswith(f"leapp write-leapp-bundle: error: {folder / 'obs.onnx'}: sha256 is ")


def _edit(export, tmp_path, change):
    """A copy of the export whose pipeline.yaml ``change`` edited (its JSON twin removed: Python reads YAML alone)."""
    folder = shutil.copytree(export[0], tmp_path / "edited")
    (folder / "pipeline.json").unlink()
    _, desc = read_pipeline(folder)
    change(desc)
    (folder / "pipeline.yaml").write_text(yaml.safe_dump(desc, sort_keys=False))
    return folder


@pytest.mark.parametrize("names, why", [
    (["hip"], "axis 1 has 1 names for a dimension of 2"),
    ([["hip", "knee"], ["x"], ["y"]], "has 3 axes, but the tensor has shape"),
    ([1, 2], "is not a name, a list of names, or a list of lists of names"),
])
def test_element_names_the_old_format_cannot_say_are_refused(export, tmp_path, names, why):
    def change(desc):
        desc["nodes"][0]["inputs"][1]["metadata"]["element_names"] = names

    with pytest.raises(LeappBundleError, match=f"node 'obs' input 'joints': metadata element_names .*{why}"):
        write_leapp_bundle(_edit(export, tmp_path, change))


def test_a_session_named_pipeline_is_refused(export, tmp_path):
    with pytest.raises(LeappBundleError, match="a session named 'pipeline' would write its LEAPP bundle over"):
        write_leapp_bundle(_edit(export, tmp_path, lambda desc: desc.update(name="pipeline")))


def test_a_graph_input_order_that_differs_from_pipeline_yaml_is_refused(export, tmp_path):
    def change(desc):  # the client feeds an ONNX model by position: a swapped order would swap the values
        node = desc["nodes"][0]
        node["inputs"].reverse()

    with pytest.raises(LeappBundleError, match=r"obs\.onnx: node 'obs': the ONNX graph's inputs are \['quat', "
                                               r"'joints'\], but pipeline\.yaml lists \['joints', 'quat'\]"):
        write_leapp_bundle(_edit(export, tmp_path, change))


def test_bundle_description_is_what_the_writer_writes(export):
    folder, _ = export
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LeappBundleWarning)
        assert bundle_description(folder) == yaml.safe_load((folder / "robot.yaml").read_text())
