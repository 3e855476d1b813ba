"""leapp.runtime.pipeline.load: digests, wiring, input checks, missing op libraries (CPU)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import yaml

import compile_records as cr
from leapp._export.compile import compile_session
from leapp.errors import RuntimeLibraryNotFound
from leapp.runtime import pipeline as rt
from leapp.runtime.io import IOSpec
from leapp.runtime.open_artifact import make_runner
from leapp.pipeline_format import PipelineError, sha256_file

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    """pre (pt2: 4 -> 5) -> policy (onnx: 5 -> 3) -> post (torchscript: 3 -> 3), plus a shared caller input."""
    folder = tmp_path_factory.mktemp("chain")
    pre = cr.mlp_node("pre", "pt2", batch=2, n_in=4, hidden=6, n_out=5, input_name="obs", output_name="feat", seed=1)
    policy = cr.mlp_node("policy", "onnx", batch=2, n_in=5, hidden=8, n_out=3, input_name="feat", output_name="raw", seed=2)
    post = cr.mlp_node("post", "torchscript", batch=2, n_in=3, hidden=4, n_out=3, input_name="raw", output_name="actions", seed=3)
    # re-derive downstream samples from upstream eager outputs so that validation compares a real chain
    record = cr.session(
        folder,
        pre,
        policy,
        post,
        edges=[("pre", "feat", "policy", "feat"), ("policy", "raw", "post", "raw")],
        name="chain",
    )
    compile_session(record, validate=False)
    return folder / "chain", record


def _eager(record, obs):
    feat = record.nodes["pre"].graph(obs)[0]
    raw = record.nodes["policy"].graph(feat)[0]
    return raw, record.nodes["post"].graph(raw)[0]


def test_run_matches_the_eager_chain(chain):
    folder, record = chain
    pipe = rt.load(folder)
    assert list(pipe.nodes) == ["pre", "policy", "post"]
    assert list(pipe.inputs) == ["obs"] and list(pipe.outputs) == ["actions"]
    obs = torch.randn(2, 4)
    out = pipe(obs=obs)
    _, actions = _eager(record, obs)
    assert set(out) == {"actions"}
    torch.testing.assert_close(out["actions"], actions.detach(), rtol=1e-4, atol=1e-5)
    # numpy inputs are accepted
    torch.testing.assert_close(pipe.run(obs=obs.numpy())["actions"], out["actions"])


def test_run_node_alone(chain):
    folder, record = chain
    pipe = rt.load(folder)
    feat = torch.randn(2, 5)
    got = pipe.run_node("policy", feat=feat)
    torch.testing.assert_close(got["raw"], record.nodes["policy"].graph(feat)[0].detach(), rtol=1e-4, atol=1e-5)
    with pytest.raises(PipelineError, match=r"no node 'nope' \(nodes: \['pre', 'policy', 'post'\]\)"):
        pipe.run_node("nope")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({}, r"Pipeline 'chain': inputs missing \['obs'\]; expected \['obs'\]"),
        ({"obs": torch.zeros(2, 4), "extra": torch.zeros(1)}, r"unexpected \['extra'\]"),
        ({"obs": torch.zeros(2, 4, dtype=torch.float64)}, r"input 'obs' expects float32\[2, 4\], got float64\[2, 4\]"),
        ({"obs": torch.zeros(3, 4)}, r"input 'obs' expects float32\[2, 4\], got float32\[3, 4\]"),
        ({"obs": [[0.0] * 4] * 2}, r"input 'obs': expected a torch.Tensor or numpy array, got list"),
    ],
)
def test_input_errors_name_the_input(chain, kwargs, message):
    pipe = rt.load(chain[0])
    with pytest.raises(PipelineError, match=message):
        pipe(**kwargs)


def test_tampered_artifact_names_file_and_both_digests(chain, tmp_path):
    import shutil

    folder = tmp_path / "copy"
    shutil.copytree(chain[0], folder)
    recorded = yaml.safe_load((folder / "pipeline.yaml").read_text())["nodes"][1]["sha256"]
    with open(folder / "policy.onnx", "ab") as f:
        f.write(b"\0")
    actual = sha256_file(folder / "policy.onnx")
    with pytest.raises(PipelineError) as info:
        rt.load(folder)
    text = str(info.value)
    assert "policy.onnx" in text and recorded in text and actual in text and "node 'policy'" in text


def test_not_a_pipeline_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="no pipeline.yaml"):
        rt.load(tmp_path)
    (tmp_path / "pipeline.yaml").write_text("format: other\n")
    (tmp_path / "pipeline.json").unlink(missing_ok=True)  # an edited pipeline.yaml: its twin would be stale
    with pytest.raises(PipelineError, match="not a leapp pipeline description"):
        rt.load(tmp_path)
    (tmp_path / "pipeline.yaml").write_text("format: leapp.pipeline\nversion: 9\n")
    (tmp_path / "pipeline.json").unlink(missing_ok=True)  # an edited pipeline.yaml: its twin would be stale
    with pytest.raises(PipelineError, match="unsupported pipeline.yaml version 9"):
        rt.load(tmp_path)


def test_artifact_path_may_not_leave_the_folder(chain, tmp_path):
    import shutil

    folder = tmp_path / "copy"
    shutil.copytree(chain[0], folder)
    desc = yaml.safe_load((folder / "pipeline.yaml").read_text())
    desc["nodes"][0]["artifact"] = "../outside.pt2"
    (folder / "pipeline.yaml").write_text(yaml.safe_dump(desc))
    (folder / "pipeline.json").unlink(missing_ok=True)  # an edited pipeline.yaml: its twin would be stale
    with pytest.raises(PipelineError, match="leaves the pipeline folder"):
        rt.load(folder)


def test_feedback_edge_becomes_caller_state(tmp_path):
    """An edge into an earlier node (last action -> obs) is carried by the caller between runs."""
    obs = cr.mlp_node("obs", "pt2", n_in=3, n_out=4, input_name="last", output_name="obs", seed=4)
    policy = cr.mlp_node("policy", "pt2", n_in=4, n_out=3, input_name="obs", output_name="action", seed=5)
    record = cr.session(
        tmp_path, obs, policy, edges=[("obs", "obs", "policy", "obs"), ("policy", "action", "obs", "last")], name="loop"
    )
    compile_session(record, validate=False)
    desc = yaml.safe_load((tmp_path / "loop" / "pipeline.yaml").read_text())
    assert desc["edges"][1]["feedback"] is True and "feedback" not in desc["edges"][0]
    pipe = rt.load(tmp_path / "loop")
    assert list(pipe.inputs) == ["last"] and list(pipe.outputs) == ["action"]
    last = torch.zeros(2, 3)
    for _ in range(2):
        expected = policy.graph(obs.graph(last)[0])[0].detach()
        last = pipe(last=last)["action"]
        torch.testing.assert_close(last, expected, rtol=1e-4, atol=1e-5)


def test_segment_nodes_need_their_op_library(tmp_path, monkeypatch):
    compile_session(cr.session(tmp_path, cr.segment_node("obs", "onnx", n=4), name="a"), False, bundles=cr.example_bundles)
    compile_session(cr.session(tmp_path, cr.segment_node("feet", "pt2", n=4), name="b"), False, bundles=cr.example_bundles)
    missing = tmp_path / "nowhere" / "libleapp_warp_ort.so"
    monkeypatch.setenv("LEAPP_WARP_ONNX_CUSTOM_OP_LIBRARY", str(missing))
    with pytest.raises(RuntimeLibraryNotFound) as info:
        rt.load(tmp_path / "a")
    assert str(info.value) == (
        f"LEAPP Warp onnx runtime was not found at {missing}. "
        "Run leapp-build-warp-runtime or set LEAPP_WARP_ONNX_CUSTOM_OP_LIBRARY."
    )
    monkeypatch.delenv("LEAPP_WARP_ONNX_CUSTOM_OP_LIBRARY")
    monkeypatch.setenv("LEAPP_WARP_PT2_CUSTOM_OP_LIBRARY", str(tmp_path / "libleapp_warp_torch.so"))
    with pytest.raises(RuntimeLibraryNotFound, match="LEAPP Warp pt2 runtime was not found at"):
        rt.load(tmp_path / "b")


_LOAD_SEGMENT_PIPELINE = textwrap.dedent(
    """
    import sys, torch
    import leapp
    pipe = leapp.load(sys.argv[1])  # registers leapp::warp_segment before torch.export.load
    module = pipe.nodes["obs"].runner.program.program  # the ExportedProgram it calls directly
    ops = [n for n in module.graph.nodes if n.op == "call_function" and n.target is torch.ops.leapp.warp_segment.default]
    print(len(ops), list(pipe.inputs), list(pipe.outputs))
    """
)


def test_pt2_segment_pipeline_loads_in_a_fresh_process(tmp_path):
    record = cr.session(tmp_path, cr.segment_node("obs", "pt2", n=4, segments=2), name="seg")
    compile_session(record, validate=False, bundles=cr.example_bundles)
    out = subprocess.run(
        [sys.executable, "-c", _LOAD_SEGMENT_PIPELINE, str(tmp_path / "seg")], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "2 ['x'] ['out', 'h']"


def test_numpy_and_torch_dtypes_cross_onnx(tmp_path):
    """Every boundary dtype goes through IO binding (bfloat16 has no numpy type)."""
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64):
        runner_dir = tmp_path / str(dtype).removeprefix("torch.")
        runner_dir.mkdir()
        path = runner_dir / "m.onnx"
        torch.onnx.export(
            _Rotate().eval(), (torch.zeros(3, dtype=dtype),), str(path), dynamo=True, input_names=["a"], output_names=["b"], verbose=False
        )
        spec = [IOSpec("a", dtype, (3,))], [IOSpec("b", dtype, (3,))]
        runner = make_runner("onnx", path, *spec, device="cpu")
        x = torch.tensor([1, 2, 3], dtype=dtype)
        (y,) = runner([x])
        assert y.dtype == dtype and torch.equal(y, torch.roll(x, -1)), dtype


class _Rotate(torch.nn.Module):
    def forward(self, a):
        return torch.cat([a[1:], a[:1]])


def test_running_a_segment_without_a_driver_fails_clearly(tmp_path):
    """On a driverless machine the ORT op (CPU EP) and the torch op say what is missing and which segment."""
    from leapp import _native

    if _native.driver_status()["available"]:
        pytest.skip("a CUDA driver is present on this machine")
    compile_session(cr.session(tmp_path, cr.segment_node("obs", "onnx", n=4), name="a"), False, bundles=cr.example_bundles)
    compile_session(cr.session(tmp_path, cr.segment_node("obs", "pt2", n=4), name="b"), False, bundles=cr.example_bundles)
    with pytest.raises(PipelineError, match=r"(?s)node 'obs' \(obs.onnx\).*obs/warp_segment_0.*no CUDA driver"):
        rt.load(tmp_path / "a")(x=torch.zeros(4))
    with pytest.raises(PipelineError, match=r"(?s)node 'obs' \(obs.pt2\).*obs/warp_segment_0.*CUDA"):
        rt.load(tmp_path / "b")(x=torch.zeros(4))


# --- hostile and damaged export folders ----------------------------------------------------------------------


def _copy(chain, tmp_path):
    import shutil

    folder = tmp_path / "copy"
    shutil.copytree(chain[0], folder)
    return folder


def test_truncated_pipeline_yaml_is_refused_at_every_line(chain, tmp_path):
    """Once, the first 5 lines loaded as a pipeline of 0 nodes and a cut before 'outputs:' returned {}."""
    folder = _copy(chain, tmp_path)
    file = folder / "pipeline.yaml"
    lines = file.read_text().splitlines(keepends=True)
    (folder / "pipeline.json").unlink()  # the YAML reader's refusals: a twin would be refused first, as stale
    for keep in range(len(lines)):
        file.write_text("".join(lines[:keep]))
        with pytest.raises(PipelineError, match=rf"^{file}: "):
            rt.load(folder)
    file.write_text("".join(lines[:5]))
    with pytest.raises(PipelineError, match=rf"^{file}: (nodes|edges)"):
        rt.load(folder)
    file.write_text("".join(lines[:next(i for i, line in enumerate(lines) if line.startswith("outputs:"))]))
    with pytest.raises(PipelineError, match=rf"^{file}: outputs: missing"):
        rt.load(folder)


def test_missing_field_names_the_file_and_field(chain, tmp_path):
    """Once a bare KeyError: 'sha256'."""
    folder = _copy(chain, tmp_path)
    desc = yaml.safe_load((folder / "pipeline.yaml").read_text())
    del desc["nodes"][1]["sha256"]
    (folder / "pipeline.yaml").write_text(yaml.safe_dump(desc, sort_keys=False))
    (folder / "pipeline.json").unlink(missing_ok=True)  # an edited pipeline.yaml: its twin would be stale
    with pytest.raises(PipelineError, match=rf"^{folder / 'pipeline.yaml'}: nodes\[1\]\.sha256: missing$"):
        rt.load(folder)


def test_a_duplicate_key_cannot_hide_a_field(chain, tmp_path):
    """PyYAML keeps the last of two equal keys; a second 'artifact' would silently win."""
    folder = _copy(chain, tmp_path)
    file = folder / "pipeline.yaml"
    file.write_text(file.read_text().replace("    artifact: policy.onnx\n", "    artifact: policy.onnx\n    artifact: pre.pt2\n"))
    (folder / "pipeline.json").unlink()  # the YAML reader's refusal: a twin would be refused first, as stale
    with pytest.raises(PipelineError, match=r"line \d+, column 5: not valid YAML: the key 'artifact' first given .* given twice"):
        rt.load(folder)


def test_alias_bomb_is_refused(tmp_path):
    """A 700-byte file that PyYAML's safe loader expands to 9**9 strings drove leapp.load to MemoryError."""
    lines = ["format: leapp.pipeline", "version: 1", "name: bomb", "a: &a [x, x, x, x, x, x, x, x, x]"]
    for prev, name in zip("abcdefgh", "bcdefghi"):
        lines.append(f"{name}: &{name} [" + ", ".join([f"*{prev}"] * 9) + "]")
    lines.append("nodes: [{name: n, inputs: [{name: *i, dtype: float32, shape: [1]}]}]")
    (tmp_path / "pipeline.yaml").write_text("\n".join(lines) + "\n")
    (tmp_path / "pipeline.json").unlink(missing_ok=True)  # an edited pipeline.yaml: its twin would be stale
    with pytest.raises(PipelineError, match=r"pipeline.yaml: line 4, column 4: YAML anchor &a"):
        rt.load(tmp_path)


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("nodes", 1, "inputs", 0, "shape", 1), -5, r"nodes\[1\]\.inputs\[0\]\.shape\[1\]: -5 is below 0"),
        (("nodes", 0, "outputs", 0, "dtype"), "float31", r"nodes\[0\]\.outputs\[0\]\.dtype: 'float31' is not one of "),
        (("nodes", 0, "device"), "gpu", r"nodes\[0\]\.device: 'gpu' is not 'cpu' or 'cuda:N'"),
        (("edges", 0, "from_output"), "nope", r"edges\[0\]\.from_output: node 'pre' has no output 'nope'"),
        (("inputs", 0, "consumers", 0, "node"), "post", r"inputs\[0\]\.consumers\[0\]\.input: node 'post' has no input 'obs'"),
        (("nodes", 2, "name"), "pre", r"nodes\[2\]\.name: node 'pre' is also nodes\[0\]"),
        (("version",), "1", r"unsupported pipeline.yaml version '1'"),
    ],
)
def test_malformed_fields_are_refused_before_anything_opens(chain, tmp_path, path, value, message):
    folder = _copy(chain, tmp_path)
    desc = yaml.safe_load((folder / "pipeline.yaml").read_text())
    target = desc
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    (folder / "pipeline.yaml").write_text(yaml.safe_dump(desc, sort_keys=False))
    (folder / "pipeline.json").unlink(missing_ok=True)  # an edited pipeline.yaml: its twin would be stale
    with pytest.raises(PipelineError, match=rf"^{folder / 'pipeline.yaml'}: {message}"):
        rt.load(folder)


def test_top_level_must_be_a_mapping(tmp_path):
    (tmp_path / "pipeline.yaml").write_text("- format: leapp.pipeline\n")
    (tmp_path / "pipeline.json").unlink(missing_ok=True)  # an edited pipeline.yaml: its twin would be stale
    with pytest.raises(PipelineError, match=r"pipeline.yaml: expected a mapping at the top level, got a list"):
        rt.load(tmp_path)


def test_paths_leaving_the_folder_are_refused_before_hashing(chain, tmp_path, monkeypatch):
    import os

    folder = _copy(chain, tmp_path)
    (tmp_path / "outside.onnx").write_bytes((folder / "policy.onnx").read_bytes())
    os.symlink(tmp_path / "outside.onnx", folder / "link.onnx")
    from leapp.pipeline_format import paths

    hashed = []  # every file load reads to hash: read_checked reads through paths.read_bounded
    real = paths.read_bounded
    monkeypatch.setattr(paths, "read_bounded", lambda p, *a, **k: hashed.append(Path(p).resolve()) or real(p, *a, **k))
    desc = yaml.safe_load((folder / "pipeline.yaml").read_text())
    for field, value in [("artifact", "link.onnx"), ("artifact", str(tmp_path / "outside.onnx")),
                         ("files", [{"path": "../outside.onnx", "sha256": "0" * 64}])]:
        changed = yaml.safe_load(yaml.safe_dump(desc))
        changed["nodes"][1][field] = value
        (folder / "pipeline.yaml").write_text(yaml.safe_dump(changed, sort_keys=False))
        (folder / "pipeline.json").unlink(missing_ok=True)  # an edited pipeline.yaml: its twin would be stale
        hashed.clear()
        with pytest.raises(PipelineError, match=r"nodes\[1\]\.(artifact|files\[0\]\.path) \(pipeline 'chain' node "
                                                r"'policy'\): path .* leaves the pipeline folder"):
            rt.load(folder)
        assert (tmp_path / "outside.onnx").resolve() not in hashed, hashed
    assert hashed, "the spy saw no read at all: it no longer watches what load hashes"


@pytest.mark.parametrize(("node", "artifact"), [("pre", "pre.pt2"), ("policy", "policy.onnx"), ("post", "post.pt")])
def test_truncated_artifact_with_a_rewritten_sha256_names_node_and_file(chain, tmp_path, node, artifact):
    """Once a raw BadZipFile (PT2), a torch RuntimeError (TorchScript) or an ORT error without the node."""
    folder = _copy(chain, tmp_path)
    path = folder / artifact
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    text = (folder / "pipeline.yaml").read_text()
    (folder / "pipeline.yaml").write_text(text.replace(sha256_file(chain[0] / artifact), sha256_file(path)))
    (folder / "pipeline.json").unlink(missing_ok=True)  # an edited pipeline.yaml: its twin would be stale
    with pytest.raises(PipelineError, match=rf"^pipeline 'chain' node '{node}': cannot open {path} \(.*is the file "
                                            r"corrupt or truncated\?\): ") as info:
        rt.load(folder)
    assert info.value.__cause__ is not None
