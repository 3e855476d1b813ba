"""leapp sign: its signature is upstream's format (the upstream CLI accepts it); its refusals; the trust policy;
and that loading without trust imports no crypto library."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from signing_helpers import MODEL_SIGNING, copy, make_key, upstream_verify

from leapp.cli import main
from leapp.errors import SignatureError
from leapp.signing import TRUST_ENV, trusted_keys
from leapp.signing.sign import sign_folder
from leapp.signing.trust import verify_folder


@pytest.mark.parametrize("curve", ["a", "p384", "p521"])
def test_upstream_cli_accepts_leapps_signature(export, keys, tmp_path, curve):
    folder = copy(export, tmp_path / "mlp")
    assert main(["sign", str(folder), "--key", str(keys[curve][0])]) == 0
    assert (folder / "model.sig").is_file()
    assert upstream_verify(folder, keys[curve][1])
    assert not upstream_verify(folder, keys["other"][1])  # the oracle can say no
    (folder / "policy.onnx").write_bytes((folder / "policy.onnx").read_bytes() + b"\0")
    assert not upstream_verify(folder, keys[curve][1])


def test_the_statement_is_files_sha256_over_every_file(signed):
    bundle = json.loads((signed / "model.sig").read_text())
    import base64

    statement = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
    serialization = statement["predicate"]["serialization"]
    assert serialization["method"] == "files" and serialization["hash_type"] == "sha256"
    assert "model.sig" in serialization["ignore_paths"]
    names = sorted(r["name"] for r in statement["predicate"]["resources"])
    assert names == sorted(p.name for p in signed.iterdir() if p.name != "model.sig")


def _certificates(folder: Path, private_key: Path) -> tuple[Path, Path]:
    """(leaf certificate of ``private_key``, self-signed root) as PEM files, with code-signing usage."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = serialization.load_pem_private_key(private_key.read_bytes(), None)
    root_key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    root_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "leapp test root")])
    root = (x509.CertificateBuilder().subject_name(root_name).issuer_name(root_name)
            .public_key(root_key.public_key()).serial_number(1).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
            .sign(root_key, hashes.SHA256()))
    leaf = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "ci")]))
            .issuer_name(root_name).public_key(key.public_key()).serial_number(2)
            .not_valid_before(now - datetime.timedelta(days=1)).not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(True, False, False, False, False, False, False, False, False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CODE_SIGNING]), critical=False)
            .sign(root_key, hashes.SHA256()))
    out = folder / "leaf.pem", folder / "root.pem"
    out[0].write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    out[1].write_bytes(root.public_bytes(serialization.Encoding.PEM))
    return out


def test_certificate_signing_verifies_upstream(export, keys, tmp_path):
    folder = copy(export, tmp_path / "mlp")
    leaf, root = _certificates(tmp_path, keys["a"][0])
    assert main(["sign", str(folder), "--key", str(keys["a"][0]), "--certificate", str(leaf),
                 "--certificate-chain", str(root)]) == 0
    bundle = json.loads((folder / "model.sig").read_text())
    assert "x509CertificateChain" in bundle["verificationMaterial"]
    r = subprocess.run([str(MODEL_SIGNING), "verify", "certificate", str(folder), "--signature",
                        str(folder / "model.sig"), "--certificate_chain", str(root)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_sign_refuses_what_it_cannot_sign(export, keys, tmp_path, capsys):
    folder = copy(export, tmp_path / "mlp")
    with pytest.raises(SignatureError, match="no pipeline.yaml: leapp sign signs an export folder"):
        sign_folder(tmp_path, keys["a"][0])
    with pytest.raises(SignatureError, match="private key .*missing.pem: no such file"):
        sign_folder(folder, tmp_path / "missing.pem")
    with pytest.raises(SignatureError, match="rsa.pem: cannot sign with it"):
        sign_folder(folder, keys["rsa"][0])
    with pytest.raises(SignatureError, match="cannot sign with it"):
        sign_folder(folder, keys["a"][1])  # a public key
    os.symlink(folder / "policy.onnx", folder / "link.onnx")
    with pytest.raises(SignatureError, match="cannot be signed"):
        sign_folder(folder, keys["a"][0])
    assert not (folder / "model.sig").exists()
    assert main(["sign", str(folder), "--key", str(keys["a"][0])]) == 1
    assert "leapp sign: " in capsys.readouterr().err
    assert main(["sign", str(folder), "--key", str(keys["a"][0]), "--certificate-chain", "x.pem"]) == 2


def test_sign_without_the_extra_names_it(signed, keys):
    code = ("import sys; sys.modules['model_signing'] = None\n"
            "from leapp.cli import main\n"
            f"sys.exit(main(['sign', {str(signed)!r}, '--key', {str(keys['a'][0])!r}]))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "pip install 'leapp[signing]'" in r.stderr, r.stderr


def test_trust_policy():
    assert trusted_keys(None, {}) is None
    assert trusted_keys(None, {TRUST_ENV: ""}) is None and trusted_keys(None, {TRUST_ENV: "::"}) is None
    assert trusted_keys(None, {TRUST_ENV: "/k/a.pem:/k/b.pem"}) == ["/k/a.pem", "/k/b.pem"]
    assert trusted_keys("x.pem", {TRUST_ENV: "/k/a.pem"}) == ["x.pem"]  # explicit trust replaces the variable
    assert trusted_keys([Path("x.pem"), b"PEM"]) == ["x.pem", b"PEM"]
    with pytest.raises(SignatureError, match=r"trust=\[\] names no key"):
        trusted_keys([])
    with pytest.raises(SignatureError, match="int 3 is not a path or PEM bytes"):
        trusted_keys([3])


def test_loading_without_trust_imports_no_crypto(export):
    """`import leapp; leapp.load(...)` without trust or LEAPP_TRUST: no model_signing, OpenSSL, cryptography."""
    code = (f"import sys, leapp; p = leapp.load({str(export)!r}); p.run(**{{n: __import__('torch').zeros(s.shape) "
            "for n, s in p.inputs.items()}); print([m for m in ('model_signing', 'OpenSSL', 'cryptography') "
            "if m in sys.modules], p.signature)")
    env = {k: v for k, v in os.environ.items() if k != TRUST_ENV}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[-2] == "[] None"


PASSWORD = "correct horse battery staple"


@pytest.fixture(scope="module")
def encrypted_key(tmp_path_factory) -> tuple[Path, Path]:
    return make_key(tmp_path_factory.mktemp("encrypted"), "enc", password=PASSWORD)


@pytest.mark.parametrize("how", ["env", "file", "stdin"])
def test_an_encrypted_key_signs_with_its_password_from_a_source(export, encrypted_key, tmp_path, monkeypatch, how):
    """The password comes from an environment variable, a file or stdin, never from argv (ps shows argv)."""
    import io

    folder = copy(export, tmp_path / "mlp")
    source = {"env": "env:LEAPP_TEST_KEY_PASSWORD", "file": f"file:{tmp_path / 'pw.txt'}", "stdin": "stdin"}[how]
    monkeypatch.setenv("LEAPP_TEST_KEY_PASSWORD", PASSWORD)
    (tmp_path / "pw.txt").write_text(PASSWORD + "\n")
    monkeypatch.setattr("sys.stdin", io.StringIO(PASSWORD + "\n"))
    assert main(["sign", str(folder), "--key", str(encrypted_key[0]), "--password-from", source]) == 0
    assert verify_folder(folder, [encrypted_key[1]])


def test_password_sources_refuse_by_name(export, encrypted_key, tmp_path, monkeypatch, capsys):
    folder = copy(export, tmp_path / "mlp")
    key = str(encrypted_key[0])
    monkeypatch.delenv("LEAPP_NO_SUCH_PASSWORD", raising=False)
    assert main(["sign", str(folder), "--key", key, "--password-from", "env:LEAPP_NO_SUCH_PASSWORD"]) == 2
    assert "no variable LEAPP_NO_SUCH_PASSWORD" in capsys.readouterr().err
    assert main(["sign", str(folder), "--key", key, "--password-from", f"file:{tmp_path / 'absent'}"]) == 2
    assert "cannot read it" in capsys.readouterr().err
    assert main(["sign", str(folder), "--key", key, "--password-from", "file:/dev/zero"]) == 2  # endless: read no further
    assert "longer than 4096 characters" in capsys.readouterr().err
    assert main(["sign", str(folder), "--key", key, "--password-from", PASSWORD]) == 2  # a password given as such
    err = capsys.readouterr().err
    assert "give env:NAME, file:PATH or stdin" in err and PASSWORD not in err
    monkeypatch.setenv("LEAPP_TEST_KEY_PASSWORD", "wrong")
    assert main(["sign", str(folder), "--key", key, "--password-from", "env:LEAPP_TEST_KEY_PASSWORD"]) == 1
    assert "cannot sign with it" in capsys.readouterr().err
    assert main(["sign", str(folder), "--key", key]) == 1  # encrypted, and no password
    assert "cannot sign with it" in capsys.readouterr().err
    assert not (folder / "model.sig").exists()
    # a password as an argument is in the process list: refused by name, and not echoed
    assert main(["sign", str(folder), "--key", key, "--password", PASSWORD]) == 2
    err = capsys.readouterr().err
    assert "--password is refused" in err and PASSWORD not in err
    assert not (folder / "model.sig").exists()


def test_a_password_with_a_certificate_is_refused(export, keys, tmp_path):
    folder = copy(export, tmp_path / "mlp")
    with pytest.raises(SignatureError, match="a password cannot be used with a certificate"):
        sign_folder(folder, keys["a"][0], password="x", certificate=keys["a"][1])
