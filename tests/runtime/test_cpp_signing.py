"""Signed exports in the C++ runner: leapp-run --trust and $LEAPP_TRUST over the native verifier (ext/signing).

Exports are signed in the test by the upstream model-signing library (its Python API, the `signing` extra), so
what leapp-run accepts is what upstream writes. Every refusal is checked for its text and exit status 1, and
for the same text from leapp._native.verify_folder (the one verifier both readers call). The read-once rule is
checked on a real swap: a preloaded shim changes pipeline.json between the verifier's read and the loader's.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from leapp import _native
from runtime_helpers import record_mlp

LEAPP_RUN = Path(sys.executable).with_name("leapp-run")
pytestmark = [
    pytest.mark.skipif(not LEAPP_RUN.is_file(), reason="leapp-run was not built: ONNX Runtime's headers are missing "
                       "(bash scripts/fetch-ort-headers.sh, then pip install -e . again)"),
    pytest.mark.skipif(not hasattr(_native, "verify_folder"), reason="leapp._native was built without ext/signing"),
]
model_signing = pytest.importorskip("model_signing", reason="the signing extra is not installed (pip install -e '.[signing]')")
ec = pytest.importorskip("cryptography.hazmat.primitives.asymmetric.ec", reason="cryptography comes with model-signing")
from cryptography.hazmat.primitives import serialization  # noqa: E402  (after the skips above)
from cryptography.hazmat.primitives.asymmetric import rsa  # noqa: E402


def _key(folder: Path, name: str, curve=ec.SECP256R1) -> tuple[Path, Path]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048) if curve is rsa else ec.generate_private_key(curve())
    private, public = folder / f"{name}.pem", folder / f"{name}.pub.pem"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


def _upstream_sign(folder: Path, private: Path) -> None:
    """model_signing's API as its CLI `sign key` calls it: the signature inside the folder, left out of it."""
    from model_signing import hashing, signing

    config = signing.Config().use_elliptic_key_signer(private_key=private)
    config.set_hashing_config(hashing.Config().set_ignored_paths(paths=["model.sig"]))
    config.sign(folder, folder / "model.sig")


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    root = tmp_path_factory.mktemp("keys")
    return {"p256": _key(root, "p256"), "p384": _key(root, "p384", ec.SECP384R1),
            "p521": _key(root, "p521", ec.SECP521R1), "other": _key(root, "other"),
            "k1": _key(root, "k1", ec.SECP256K1), "rsa": _key(root, "rsa", rsa)}


@pytest.fixture(scope="module")
def signed(tmp_path_factory, keys) -> Path:
    folder = record_mlp(tmp_path_factory.mktemp("signed"))
    _upstream_sign(folder, keys["p256"][0])
    return folder


@pytest.fixture
def folder(signed, tmp_path) -> Path:
    """A private copy to tamper with."""
    return Path(shutil.copytree(signed, tmp_path / "mlp", symlinks=True))


def _run(*args, env_trust: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "LEAPP_TRUST"}
    if env_trust is not None:
        env["LEAPP_TRUST"] = env_trust
    return subprocess.run([str(LEAPP_RUN), *map(str, args)], capture_output=True, text=True, timeout=120, env=env)


def _refusal(folder: Path, *trust: Path) -> str:
    """leapp-run --check's refusal (exit 1), which must be leapp._native.verify_folder's text too."""
    r = _run(folder, "--check", *[a for key in trust for a in ("--trust", key)])
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    text = r.stderr.strip().removeprefix("leapp-run: ")
    with pytest.raises(_native.SignatureError) as info:
        _native.verify_folder(str(folder), [key.read_bytes() for key in trust])
    assert str(info.value).replace("trusted key 1", str(trust[0])) == text
    return text


def _write_inputs(folder: Path) -> None:
    folder.mkdir()
    (folder / "obs.bin").write_bytes(bytes(16 * 48 * 4))
    (folder / "default_pos.bin").write_bytes(bytes(16 * 12 * 4))


@pytest.mark.parametrize("curve", ["p256", "p384", "p521"])
def test_leapp_run_runs_an_export_upstream_signed_with_a_trusted_key(signed, keys, curve, tmp_path):
    folder = signed
    if curve != "p256":
        folder = Path(shutil.copytree(signed, tmp_path / "mlp"))
        _upstream_sign(folder, keys[curve][0])
    _write_inputs(tmp_path / "in")
    # one trusted key of several is enough
    r = _run(folder, "--trust", keys["other"][1], "--trust", keys[curve][1], "--in", tmp_path / "in",
             "--out", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    assert any((tmp_path / "out").glob("*.bin")), r.stdout
    digests = _native.verify_folder(str(folder), [keys[curve][1].read_bytes()])
    assert set(digests) == {p.relative_to(folder).as_posix() for p in folder.rglob("*")
                            if p.is_file() and p.name != "model.sig"}
    assert _run(folder, "--check", "--trust", keys[curve][1]).returncode == 0


def test_a_wrong_key_and_an_unsigned_export_are_refused(signed, keys, tmp_path):
    text = _refusal(signed, keys["other"][1])
    assert text == f"{signed}/model.sig: signed by a key not in the trust list (1 key trusted)"
    unsigned = Path(shutil.copytree(signed, tmp_path / "unsigned", ignore=shutil.ignore_patterns("model.sig")))
    text = _refusal(unsigned, keys["p256"][1])
    assert text == f"{unsigned}/model.sig: missing; the export is not signed (trust is configured)"


@pytest.mark.parametrize("key, expected", [
    ("rsa", "a key of type RSA; model signing keys are elliptic curve keys of P-256, P-384 or P-521"),
    ("k1", "an elliptic curve key of curve 'secp256k1'; model signing supports P-256, P-384 and P-521"),
])
def test_a_trusted_key_of_another_type_is_refused_naming_it(signed, keys, key, expected):
    r = _run(signed, "--check", "--trust", keys[key][1])
    assert r.returncode == 1 and r.stderr.strip() == f"leapp-run: {keys[key][1]}: {expected}", r.stderr
    private = keys["p256"][0]
    r = _run(signed, "--check", "--trust", private)
    assert r.returncode == 1 and "a private key (PRIVATE KEY); trust takes the public key only" in r.stderr


def _onnx(folder: Path) -> str:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.onnx"))[0]


def test_a_changed_byte_in_any_file_is_refused_naming_it(folder, keys):
    signed_digests = _native.verify_folder(str(folder), [keys["p256"][1].read_bytes()])
    for rel in ("pipeline.yaml", _onnx(folder)):
        path = folder / rel
        original = path.read_bytes()
        data = bytearray(original)
        data[len(data) // 2] ^= 0x01
        path.write_bytes(bytes(data))
        text = _refusal(folder, keys["p256"][1])
        assert text.startswith(f"{folder}/{rel}: sha256 ") and text.endswith(
            f" differs from the signed {signed_digests[rel]}; the file changed after it was signed"), text
        path.write_bytes(original)
    assert _run(folder, "--check", "--trust", keys["p256"][1]).returncode == 0


def test_an_added_removed_or_renamed_file_is_refused_naming_it(folder, keys):
    pub = keys["p256"][1]
    (folder / "extra.txt").write_text("x")
    assert _refusal(folder, pub) == (f"{folder}: files the signature does not list: extra.txt "
                                     f"(signature {folder}/model.sig)")
    (folder / "extra.txt").unlink()
    onnx = _onnx(folder)
    (folder / onnx).rename(folder / (onnx + ".moved"))
    assert _refusal(folder, pub) == (f"{folder}: files the signature does not list: {onnx}.moved; files the "
                                     f"signature lists are missing: {onnx} (signature {folder}/model.sig)")
    (folder / (onnx + ".moved")).unlink()
    assert _refusal(folder, pub) == (f"{folder}: files the signature lists are missing: {onnx} "
                                     f"(signature {folder}/model.sig)")


@pytest.mark.parametrize("where", ["file", "folder", "ignored"])
def test_a_symbolic_link_anywhere_is_refused(folder, keys, where):
    if where == "file":
        (folder / "link.onnx").symlink_to(folder / _onnx(folder))
        name = "link.onnx"
    elif where == "folder":
        (folder / "sub").symlink_to(folder.parent, target_is_directory=True)
        name = "sub"
    else:  # inside .git, an ignored path: still refused, as upstream refuses it
        (folder / ".git").mkdir()
        (folder / ".git" / "HEAD").symlink_to("/etc/hostname")
        name = ".git/HEAD"
    assert _refusal(folder, keys["p256"][1]) == f"{folder}: '{name}' is a symbolic link; a signed export may hold none"


def _bundle(folder: Path) -> dict:
    return json.loads((folder / "model.sig").read_text())


def _payload(doc: dict) -> dict:
    return json.loads(base64.b64decode(doc["dsseEnvelope"]["payload"]))


@pytest.mark.parametrize("case", ["truncated", "huge", "deep", "base64", "payload_type", "not_json", "signatures",
                                  "shards"])
def test_a_hostile_signature_file_is_refused_with_its_reason(folder, keys, case):
    sig = folder / "model.sig"
    text = sig.read_text()
    doc = _bundle(folder)
    prefix = f"{sig}: "
    if case == "truncated":
        sig.write_text(text[: len(text) // 2])
        expected = prefix + "invalid JSON: "
    elif case == "huge":
        sig.write_bytes(b" " * (16 * 1024 * 1024 + 1))
        expected = prefix + f"{16 * 1024 * 1024 + 1} bytes, more than the 16 MiB a model signature may have"
    elif case == "deep":
        sig.write_text("[" * 100 + "]" * 100)
        expected = prefix + "invalid JSON: "
    elif case == "base64":
        doc["dsseEnvelope"]["payload"] = doc["dsseEnvelope"]["payload"][:-4] + "A*A="
        sig.write_text(json.dumps(doc))
        expected = prefix + "dsseEnvelope.payload: invalid base64 ('*' is not in its alphabet at character "
    elif case == "payload_type":
        doc["dsseEnvelope"]["payloadType"] = "application/json"
        sig.write_text(json.dumps(doc))
        expected = prefix + "dsseEnvelope.payloadType is 'application/json', expected 'application/vnd.in-toto+json'"
    elif case == "not_json":
        sig.write_bytes(b"\xff\xfe")
        expected = prefix + "not valid UTF-8 at byte 0"
    elif case == "signatures":
        doc["dsseEnvelope"]["signatures"] *= 2
        sig.write_text(json.dumps(doc))
        expected = prefix + "dsseEnvelope.signatures: 2 signatures; model signing writes exactly one"
    else:  # a folder upstream-signed with shards: refused for its serialization, after the signature verified
        from model_signing import hashing, signing

        config = signing.Config().use_elliptic_key_signer(private_key=keys["p256"][0])
        config.set_hashing_config(hashing.Config().use_shard_serialization().set_ignored_paths(paths=["model.sig"]))
        config.sign(folder, sig)
        expected = (prefix + "statement (dsseEnvelope.payload): predicate.serialization.method is 'shards', expected "
                    "'files'; leapp accepts folders signed file by file (model_signing's default), not 'shards'")
    text = _refusal(folder, keys["p256"][1])
    assert text.startswith(expected), text
    if case == "deep":
        assert "depth" in text or "nest" in text, text


def test_the_statement_must_be_signed(folder, keys):
    """A statement edited under a kept signature (a file's digest replaced): the signature no longer verifies."""
    doc = _bundle(folder)
    payload = _payload(doc)
    payload["predicate"]["resources"][0]["digest"] = "0" * 64
    doc["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(payload).encode()).decode()
    (folder / "model.sig").write_text(json.dumps(doc))
    assert _refusal(folder, keys["p256"][1]).endswith("signed by a key not in the trust list (1 key trusted)")


def test_leapp_trust_is_the_policy_and_trust_replaces_it(signed, keys, tmp_path):
    unsigned = Path(shutil.copytree(signed, tmp_path / "unsigned", ignore=shutil.ignore_patterns("model.sig")))
    assert _run(unsigned, "--check").returncode == 0  # no trust configured: no signature required
    policy = f"{keys['other'][1]}::{keys['p256'][1]}"  # ':'-separated, an empty entry skipped
    r = _run(unsigned, "--check", env_trust=policy)
    assert r.returncode == 1 and "model.sig: missing; the export is not signed" in r.stderr, r.stderr
    assert _run(signed, "--check", env_trust=policy).returncode == 0
    assert _run(signed, "--describe", env_trust=policy).returncode == 0
    r = _run(signed, "--check", env_trust=str(keys["other"][1]))
    assert r.returncode == 1 and "signed by a key not in the trust list" in r.stderr
    # --trust replaces $LEAPP_TRUST (docs/deploy.md): the policy's wrong key is not consulted
    assert _run(signed, "--check", "--trust", keys["p256"][1], env_trust=str(keys["other"][1])).returncode == 0
    r = _run(signed, "--check", env_trust=str(tmp_path / "absent.pem"))
    assert r.returncode == 1 and f"trusted key {tmp_path}/absent.pem: cannot be opened" in r.stderr


SWAP_SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Appends a space to the first file opened with open() whose path ends in $SWAP_SUFFIX: the verifier reads
   through openat() beneath the folder, the loader with open(), so this lands between the two reads. */
static int done;
typedef int (*open_fn)(const char*, int, ...);

static void swap(const char* path) {
  const char* suffix = getenv("SWAP_SUFFIX");
  size_t n = suffix ? strlen(suffix) : 0, m = strlen(path);
  if (done || !n || m < n || strcmp(path + m - n, suffix)) return;
  done = 1;
  open_fn real = (open_fn)dlsym(RTLD_NEXT, "open");
  int fd = real(path, O_WRONLY | O_APPEND);
  if (fd >= 0) { (void)!write(fd, " ", 1); close(fd); }
}

#define WRAP(name)                                              \
  int name(const char* path, int flags, ...) {                  \
    mode_t mode = 0;                                            \
    if (flags & O_CREAT) {                                      \
      va_list ap; va_start(ap, flags); mode = va_arg(ap, int); va_end(ap); \
    }                                                           \
    swap(path);                                                 \
    return ((open_fn)dlsym(RTLD_NEXT, #name))(path, flags, mode); \
  }
WRAP(open)
WRAP(open64)
"""


@pytest.mark.parametrize("suffix", ["/pipeline.json", ".onnx"])
def test_a_file_swapped_after_verification_is_refused_at_read(folder, keys, tmp_path, suffix):
    """Read-once: the bytes the runner parses are compared with the signed digest when it reads them. The shim
    changes the file after the verifier hashed it: an appended space leaves pipeline.json valid and its twin digest
    right, so only the signed digest can catch it (for an ONNX model the signed digest is checked first)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler to build the swapping shim")
    shim = tmp_path / "swap.so"
    (tmp_path / "swap.c").write_text(textwrap.dedent(SWAP_SHIM))
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", shim, tmp_path / "swap.c", "-ldl"], check=True)
    env = {k: v for k, v in os.environ.items() if k != "LEAPP_TRUST"}
    env.update(LD_PRELOAD=str(shim), SWAP_SUFFIX=suffix)
    target = folder / ("pipeline.json" if suffix == "/pipeline.json" else _onnx(folder))
    before = target.read_bytes()
    r = subprocess.run([str(LEAPP_RUN), str(folder), "--check", "--trust", str(keys["p256"][1])],
                       capture_output=True, text=True, timeout=120, env=env)
    assert target.read_bytes() == before + b" ", "the shim did not swap the file"
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert f"{target} changed after its signature was checked (sha256 " in r.stderr, r.stderr
    # without trust the same swap of pipeline.json goes unnoticed: the check above is the signature's
    if suffix == "/pipeline.json":
        target.write_bytes(before)
        env.pop("LEAPP_TRUST", None)
        r = subprocess.run([str(LEAPP_RUN), str(folder), "--check"], capture_output=True, text=True, timeout=120,
                           env=env)
        assert r.returncode == 0 and target.read_bytes() == before + b" ", r.stderr


def test_upstreams_ignored_paths_are_left_out_of_the_signed_files(folder, keys):
    """.git, .gitattributes, .github, .gitignore and the signature itself: present or not, the folder verifies, and
    none of them has a signed digest (the runner refuses to read a file without one)."""
    (folder / ".gitattributes").write_text("* binary\n")
    (folder / ".github").mkdir()
    (folder / ".github" / "ci.yml").write_text("on: push\n")
    digests = _native.verify_folder(str(folder), [keys["p256"][1].read_bytes()])
    assert not {".gitattributes", ".github/ci.yml", "model.sig"} & set(digests)
    (folder / ".githubx").write_text("")  # a sibling with the prefix is not ignored
    assert _refusal(folder, keys["p256"][1]).startswith(f"{folder}: files the signature does not list: .githubx")


def test_a_certificate_bundle_verifies_with_the_leafs_public_key_pinned(folder, keys, tmp_path):
    """docs/deploy.md: the leaf's public key as trust accepts a certificate signature; the certificate itself as
    trust is refused with the command that extracts its key."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    def cert(subject, issuer, public, signer, ca: bool) -> x509.Certificate:
        now = datetime.datetime.now(datetime.timezone.utc)
        b = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
             .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)])).public_key(public)
             .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(hours=1))
             .not_valid_after(now + datetime.timedelta(days=1))
             .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if not ca:
            b = b.add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CODE_SIGNING]), critical=False)
        return b.sign(signer, hashes.SHA256())

    ca_key, leaf_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    pem = serialization.Encoding.PEM
    (tmp_path / "ca.pem").write_bytes(cert("ca", "ca", ca_key.public_key(), ca_key, True).public_bytes(pem))
    (tmp_path / "leaf.pem").write_bytes(cert("leaf", "ca", leaf_key.public_key(), ca_key, False).public_bytes(pem))
    (tmp_path / "leaf.key").write_bytes(leaf_key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                                               serialization.NoEncryption()))
    (tmp_path / "leaf.pub.pem").write_bytes(leaf_key.public_key().public_bytes(
        pem, serialization.PublicFormat.SubjectPublicKeyInfo))
    from model_signing import hashing, signing

    config = signing.Config().use_certificate_signer(private_key=tmp_path / "leaf.key",
                                                     signing_certificate=tmp_path / "leaf.pem",
                                                     certificate_chain=[tmp_path / "ca.pem"])
    config.set_hashing_config(hashing.Config().set_ignored_paths(paths=["model.sig"]))
    config.sign(folder, folder / "model.sig")
    assert "x509CertificateChain" in _bundle(folder)["verificationMaterial"]
    assert _run(folder, "--check", "--trust", tmp_path / "leaf.pub.pem").returncode == 0
    assert _refusal(folder, keys["p256"][1]).endswith("signed by a key not in the trust list (1 key trusted)")
    r = _run(folder, "--check", "--trust", tmp_path / "leaf.pem")
    assert r.returncode == 1 and "a certificate; trust takes its public key (openssl x509 -pubkey" in r.stderr
