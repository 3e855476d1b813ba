"""The validation cache (leapp/_export/validation_cache.py): the same question is answered once.

A later compile() of the same node (artifact bytes, sample inputs, software, environment) takes the outputs a
fresh process returned before and compares them anew with its own eager outputs and tolerances; anything else
runs the fresh process again.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import compile_records as cr
from leapp._export import validate, validate_process, validation_cache
from leapp._export.compile import compile_session
from leapp._export.validate import NodeArtifactJob, validate_nodes
from leapp.errors import ValidationError

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("LEAPP_CACHE_DIR", str(folder))
    monkeypatch.delenv("LEAPP_NO_CACHE", raising=False)
    return folder


@pytest.fixture
def fresh_runs(monkeypatch):
    """Counts the nodes handed to a fresh validation process."""
    runs = []
    real = validate.run_in_fresh_process

    def counting(jobs, folder, timeout=validate_process.VALIDATION_TIMEOUT_S):
        runs.extend(job.record.name for job in jobs)
        return real(jobs, folder, timeout)

    monkeypatch.setattr(validate, "run_in_fresh_process", counting)
    return runs


def _nodes(**mlp):
    return cr.mlp_node("policy", "onnx", **mlp), cr.mlp_node("act", "pt2", n_in=3, n_out=2, seed=3)


def test_an_unchanged_export_is_validated_once(tmp_path, cache_dir, fresh_runs):
    first = compile_session(cr.session(tmp_path / "a", *_nodes()))
    assert fresh_runs == ["policy", "act"] and not any(n.validation.cached for n in first)
    second = compile_session(cr.session(tmp_path / "b", *_nodes()))  # another folder, the same bytes
    assert fresh_runs == ["policy", "act"], "the second compile started a validation process"
    assert [(n.status, n.validation.cached) for n in second] == [("passed", True), ("passed", True)]
    assert "passed (cached)" in str(second)
    for a, b in zip(first, second):
        assert [(o.name, o.max_abs) for o in a.validation.outputs] == [(o.name, o.max_abs) for o in b.validation.outputs]
    assert len(list((cache_dir / validation_cache.SUBDIR).glob("*.bin"))) == 2


def test_only_the_changed_node_runs_again(tmp_path, cache_dir, fresh_runs):
    compile_session(cr.session(tmp_path / "a", *_nodes()))
    x = torch.randn(2, 5, generator=torch.Generator().manual_seed(7))
    report = compile_session(cr.session(tmp_path / "b", *_nodes(samples=[x])))  # new sample inputs for policy
    assert fresh_runs == ["policy", "act", "policy"]
    assert [n.validation.cached for n in report] == [False, True]


def test_cached_outputs_are_compared_with_this_processs_eager_outputs(tmp_path, cache_dir, fresh_runs):
    record = cr.session(tmp_path / "a", *_nodes())
    report = compile_session(record)
    node = record.nodes["policy"]
    job = NodeArtifactJob(node, "onnx", tmp_path / "a" / "demo" / report["policy"].artifact)
    node.samples[0].outputs[0] = node.samples[0].outputs[0] + 0.5  # eager now says something else
    [result] = validate_nodes([job], 1e-3, 1e-5, folder=tmp_path / "a" / "demo")
    assert result.cached and result.status == "failed" and "differs from eager" in result.reason
    assert fresh_runs == ["policy", "act"]


def test_a_failed_node_is_not_kept(tmp_path, cache_dir, fresh_runs):
    def wrong():
        node = cr.mlp_node("policy", "onnx")
        node.samples[0].outputs[0] = node.samples[0].outputs[0] + 1.0
        return node

    for folder in ("a", "b"):
        with pytest.raises(ValidationError):
            compile_session(cr.session(tmp_path / folder, wrong()))
    assert fresh_runs == ["policy", "policy"]


@pytest.mark.parametrize("change", ["no-cache", "environment", "tampered-artifact", "corrupt-entry"])
def test_anything_else_runs_a_fresh_process(tmp_path, cache_dir, fresh_runs, monkeypatch, caplog, change):
    first = compile_session(cr.session(tmp_path / "a", cr.mlp_node("policy", "onnx")))
    if change == "no-cache":
        monkeypatch.setenv("LEAPP_NO_CACHE", "1")
    elif change == "environment":
        monkeypatch.setenv("LEAPP_VALIDATION_CACHE_TEST", "1")  # the worker would see it
    elif change == "corrupt-entry":
        [entry] = (cache_dir / validation_cache.SUBDIR).glob("*.bin")
        data = bytearray(entry.read_bytes())
        data[-40] ^= 1
        entry.write_bytes(bytes(data))
    if change == "tampered-artifact":  # the file on disk is not the one pipeline.yaml names: the worker says so
        artifact = tmp_path / "a" / "demo" / first["policy"].artifact
        record = cr.session(tmp_path / "a", cr.mlp_node("policy", "onnx"))
        node = record.nodes["policy"]
        artifact.write_bytes(artifact.read_bytes() + b"\0")
        [result] = validate_nodes([NodeArtifactJob(node, "onnx", artifact)], 1e-3, 1e-5, folder=tmp_path / "a" / "demo")
        assert not result.cached and result.status == "error" and "sha256" in result.reason, result.reason
    else:
        with caplog.at_level(logging.WARNING, logger="leapp._export.binary_cache"):
            report = compile_session(cr.session(tmp_path / "b", cr.mlp_node("policy", "onnx")))
        assert report["policy"].status == "passed" and not report["policy"].validation.cached
        if change == "corrupt-entry":
            assert "sha256 mismatch" in caplog.text
    assert fresh_runs == ["policy", "policy"]


def test_the_key_names_every_input_of_the_question(tmp_path, cache_dir):
    record = cr.session(tmp_path / "a", cr.mlp_node("policy", "onnx"))
    report = compile_session(record)
    node = record.nodes["policy"]
    job = NodeArtifactJob(node, "onnx", tmp_path / "a" / "demo" / report["policy"].artifact)
    entry = {"name": "policy", "backend": "onnx", "artifact": str(job.artifact.resolve()), "device": "cpu"}
    cache = validation_cache.default_cache()
    key = cache.key(job, entry, None)
    assert key == cache.key(job, dict(entry), None)
    assert cache.key(job, dict(entry, device="cpu", extra=1), None) != key
    node.samples[0].inputs[0] = node.samples[0].inputs[0].clone().add_(1e-6)
    assert cache.key(job, entry, None).inputs != key.inputs
    assert cache.key(job, dict(entry, sha256="0" * 64), None) is None  # the file is not the one named


def test_a_pt2_node_exported_again_in_a_new_process(tmp_path, cache_dir):
    """What a user does: run the export script again. The second process starts no validation worker, and the
    archive is the same bytes (torch's provenance metadata, which held addresses, is not saved)."""
    script = tmp_path / "export.py"
    script.write_text(textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        import compile_records as cr
        from leapp._export import validate_process
        from leapp._export.compile import compile_session
        report = compile_session(cr.session(sys.argv[1], cr.mlp_node("act", "pt2", n_in=3, n_out=2, seed=3)))
        print(json.dumps([report["act"].status, report["act"].validation.cached, validate_process._SPAWNED]))
    """))
    env = {**__import__("os").environ, "LEAPP_VALIDATION_PRESTART": "0"}
    results = []
    for run in ("a", "b"):
        done = subprocess.run([sys.executable, str(script), str(tmp_path / run)], capture_output=True, text=True,
                              env=env, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert results == [["passed", False, 1], ["passed", True, 0]], results
    assert (tmp_path / "a/demo/act.pt2").read_bytes() == (tmp_path / "b/demo/act.pt2").read_bytes()
