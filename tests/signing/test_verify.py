"""Verification through every Python entry point (leapp.load, leapp verify, leapp ros2, PolicyNode) and leapp-run:
what is accepted, each refusal of issue 50 with one text from every reader, LEAPP_TRUST, and read-once."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from signing_helpers import (copy, leapp_load_refusal, leapp_run_refusal, native_verifier, run_trust_supported,
                             upstream_sign)

import leapp
from leapp import _native
from leapp.cli import main
from leapp.errors import SignatureError
from leapp.signing import TRUST_ENV

pytestmark = pytest.mark.skipif(not native_verifier(), reason="leapp._native has no verify_folder: rebuild leapp")


def _zeros(pipeline) -> dict[str, torch.Tensor]:
    return {n: torch.linspace(-1, 1, torch.Size(s.shape).numel()).reshape(s.shape) for n, s in pipeline.inputs.items()}


def test_load_with_trust_runs_what_an_unsigned_load_runs(signed, export, keys, monkeypatch):
    monkeypatch.delenv(TRUST_ENV, raising=False)
    plain = leapp.load(export)
    checked = leapp.load(signed, trust=str(keys["a"][1]))
    assert plain.signature is None
    assert sorted(checked.signature.digests) == ["pipeline.json", "pipeline.yaml", "policy.onnx", "post.onnx"]
    for name, value in plain(**_zeros(plain)).items():
        assert torch.equal(value, checked(**_zeros(checked))[name])
    # a list of keys: one of them signed it; PEM bytes are keys too; pipeline.yaml's path is the folder's
    assert leapp.load(signed / "pipeline.yaml", trust=[keys["other"][1], keys["a"][1].read_bytes()]).signature


@pytest.mark.parametrize("curve", ["p384", "p521"])
def test_every_curve_verifies(export, keys, tmp_path, curve):
    folder = copy(export, tmp_path / "mlp")
    assert main(["sign", str(folder), "--key", str(keys[curve][0])]) == 0
    assert leapp.load(folder, trust=keys[curve][1]).signature is not None
    assert "signed by a key not in the trust list" in leapp_load_refusal(folder, keys["a"][1])


def test_leapp_accepts_a_folder_signed_by_upstream_cli(export, keys, tmp_path, capsys):
    folder = copy(export, tmp_path / "mlp")
    r = upstream_sign(folder, keys["a"][0])
    assert r.returncode == 0, r.stderr
    assert leapp.load(folder, trust=keys["a"][1]).signature is not None
    assert main(["verify", str(folder), "--trust", str(keys["a"][1])]) == 0
    assert "signature verified: 4 files" in capsys.readouterr().out
    assert main(["verify", str(folder), "--trust", str(keys["other"][1])]) == 1


def test_leapp_trust_is_the_policy(signed, keys, monkeypatch, capsys):
    monkeypatch.setenv(TRUST_ENV, f"{keys['other'][1]}:{keys['a'][1]}")
    assert leapp.load(signed).signature is not None  # trust=None: LEAPP_TRUST's keys
    assert main(["verify", str(signed)]) == 0
    monkeypatch.setenv(TRUST_ENV, str(keys["other"][1]))
    with pytest.raises(SignatureError, match="signed by a key not in the trust list"):
        leapp.load(signed)
    assert main(["verify", str(signed)]) == 1
    assert leapp.load(signed, trust=keys["a"][1]).signature is not None  # an explicit trust replaces it
    assert main(["verify", str(signed), "--trust", str(keys["a"][1])]) == 0
    monkeypatch.setenv(TRUST_ENV, "")
    assert main(["verify", str(signed)]) == 2
    assert "no trusted key" in capsys.readouterr().err
    with pytest.raises(SignatureError, match=r"trusted key .*nowhere.pem: cannot be read"):
        leapp.load(signed, trust="nowhere.pem")


def _statement_edit(folder: Path, edit) -> None:
    bundle = json.loads((folder / "model.sig").read_text())
    edit(bundle)
    (folder / "model.sig").write_text(json.dumps(bundle))


def _tamper(case: str, folder: Path, keys) -> str:
    """Applies refusal ``case`` of issue 50 to a signed folder; returns a piece of the text it must be refused with."""
    sig = folder / "model.sig"
    if case == "unsigned":
        sig.unlink()
        return "model.sig: missing; the export is not signed"
    if case == "wrong key":
        from signing_helpers import sign

        sign(folder, keys["other"][0])
        return "signed by a key not in the trust list"
    if case.startswith("byte "):
        name = case.removeprefix("byte ")
        data = bytearray((folder / name).read_bytes())
        data[len(data) // 2] ^= 0x01
        (folder / name).write_bytes(bytes(data))
        return f"{name}: sha256 "
    if case == "added":
        (folder / "notes.txt").write_text("x")
        return "files the signature does not list: notes.txt"
    if case == "removed":
        (folder / "post.onnx").unlink()
        return "files the signature lists are missing: post.onnx"
    if case == "renamed":
        (folder / "post.onnx").rename(folder / "post2.onnx")
        return "does not list: post2.onnx; files the signature lists are missing: post.onnx"
    if case == "symlink":
        os.symlink("policy.onnx", folder / "alias.onnx")
        return "'alias.onnx' is a symbolic link"
    if case == "truncated":
        sig.write_bytes(sig.read_bytes()[:300])
        return "model.sig: invalid JSON"
    if case == "huge":
        sig.write_bytes(b" " * (16 << 20) + b"{}")
        return "more than the 16 MiB a model signature may have"
    if case == "deep":
        sig.write_text("[" * 5000 + "]" * 5000)
        return "nesting deeper than"
    if case == "bad base64":
        _statement_edit(folder, lambda b: b["dsseEnvelope"].update(payload=b["dsseEnvelope"]["payload"][:-3] + "*=="))
        return "base64"
    if case == "payload type":
        _statement_edit(folder, lambda b: b["dsseEnvelope"].update(payloadType="application/json"))
        return "payloadType"
    raise AssertionError(case)


CASES = ["unsigned", "wrong key", "byte pipeline.yaml", "byte pipeline.json", "byte policy.onnx", "byte post.onnx",
         "added", "removed", "renamed", "symlink", "truncated", "huge", "deep", "bad base64", "payload type"]


@pytest.mark.parametrize("case", CASES)
def test_every_refusal_has_one_text_in_every_reader(signed, keys, case, capsys, monkeypatch):
    monkeypatch.delenv(TRUST_ENV, raising=False)
    expected = _tamper(case, signed, keys)
    public = keys["a"][1]
    text = leapp_load_refusal(signed, public)
    assert expected in text, text
    assert main(["verify", str(signed), "--trust", str(public)]) == 1
    assert capsys.readouterr().err.strip() == f"leapp verify: {text}"
    if run_trust_supported():
        assert leapp_run_refusal(signed, public) == text


def test_upstream_serialization_options_leapp_does_not_take_are_refused(export, keys, tmp_path):
    """A folder signed with shards (upstream's other serialization) is refused naming it."""
    folder = copy(export, tmp_path / "mlp")
    from model_signing import hashing, signing

    (signing.Config().use_elliptic_key_signer(private_key=keys["a"][0])
     .set_hashing_config(hashing.Config().use_shard_serialization().set_ignored_paths(paths=["model.sig"]))
     .sign(folder, folder / "model.sig"))
    assert "shards" in leapp_load_refusal(folder, keys["a"][1])


@pytest.mark.parametrize("name", ["pipeline.yaml", "pipeline.json", "policy.onnx", "post.onnx"])
def test_a_file_swapped_after_the_check_is_refused_at_its_read(signed, keys, monkeypatch, name):
    """The real verifier checks the real folder; then, before the loader reads, the file is swapped (as a process
    racing the load would): the read-once check refuses the bytes it read."""
    original = _native.verify_folder

    def verify_then_swap(folder, pems, signature):
        digests = original(folder, pems, signature)
        path = Path(folder) / name
        data = bytearray(path.read_bytes())
        data[-2] ^= 0x20 if name.endswith(("yaml", "json")) and data[-2] != 0x0A else 0x01
        path.write_bytes(bytes(data))
        return digests

    monkeypatch.setattr(_native, "verify_folder", verify_then_swap)
    with pytest.raises(SignatureError, match=f"{name} changed after its signature was checked") as info:
        leapp.load(signed, trust=keys["a"][1])
    if run_trust_supported() and name != "pipeline.yaml":  # leapp-run reads pipeline.json first: its swap
        from signing_helpers import LEAPP_RUN

        swapped = signed / name
        env = {k: v for k, v in os.environ.items() if k != TRUST_ENV}
        r = subprocess.run([str(LEAPP_RUN), str(signed), "--trust", str(keys["a"][1]), "--check"], capture_output=True,
                           text=True, timeout=120, env=env)
        assert r.returncode == 1 and str(swapped) in r.stderr, r.stderr  # the folder now differs from its signature
    assert str(info.value).endswith(")") and "signed " in str(info.value)


def test_ros2_refuses_an_export_it_cannot_trust(signed, keys, monkeypatch):
    pytest.importorskip("rclpy", reason="ROS 2's Python packages are not installed (leapp[ros2])")
    env = {k: v for k, v in os.environ.items() if k != TRUST_ENV}
    command = [sys.executable, "-m", "leapp.cli", "ros2", str(signed), "--rate", "10", "--dry-run"]
    r = subprocess.run([*command, "--trust", str(keys["other"][1])], capture_output=True, text=True, timeout=300,
                       env=env)
    assert r.returncode == 2 and "leapp ros2: " in r.stderr and "not in the trust list" in r.stderr, r.stderr
    r = subprocess.run(command, capture_output=True, text=True, timeout=300, env={**env, TRUST_ENV: str(keys["other"][1])})
    assert r.returncode == 2 and "not in the trust list" in r.stderr, r.stderr
    r = subprocess.run([*command, "--trust", str(keys["a"][1])], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr

    from leapp.ros2.node import PolicyNode

    unchecked = leapp.load(signed, trust=None) if os.environ.get(TRUST_ENV) is None else None
    monkeypatch.setenv(TRUST_ENV, str(keys["a"][1]))
    with pytest.raises(SignatureError, match="loaded without its signature checked"):
        PolicyNode(unchecked, rate_hz=10.0)


def test_verify_refuses_no_signature_file_named_elsewhere(signed, keys, tmp_path):
    """The signature file is the folder's model.sig: a signature outside does not count."""
    shutil.move(signed / "model.sig", tmp_path / "model.sig")
    assert "not signed" in leapp_load_refusal(signed, keys["a"][1])
