"""Properties of verification over drawn tampering and drawn hostile model.sig documents.

Tampering (which file, which byte, which edit: flip, truncate, append, add, remove, rename, symlink): no tamper is
accepted except adding a path the format ignores (git's), the readers agree (leapp.load's text is leapp verify's
and, where it takes --trust, leapp-run's), and the upstream CLI's verdict is the same (on a few examples: each
call starts a Python process). Hostile documents (one mutation anywhere in a valid model.sig: random JSON, a null,
a value of another type, a member deleted or added, bad base64, a wrong payload type, huge, deep, cut): the readers
agree, what leapp accepts upstream's verifier accepts (run in this process, itself checked against the CLI on a
few documents), and what upstream accepts leapp refuses only for the documented reasons.
"""

from __future__ import annotations

import base64
import contextlib
import io
import itertools
import json
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from signing_helpers import copy, leapp_run_refusal, native_verifier, run_trust_supported, upstream_verify

import leapp
from leapp.cli import main
from leapp.errors import SignatureError
from leapp.signing import TRUST_ENV

pytestmark = pytest.mark.skipif(not native_verifier(), reason="leapp._native has no verify_folder: rebuild leapp")

FILES = ["pipeline.json", "pipeline.yaml", "policy.onnx", "post.onnx"]
IGNORED = [".gitignore", ".gitattributes", ".git/config", ".github/workflows/ci.yml"]
NAMES = st.sampled_from(["extra.bin", "a/b.onnx", "policy.onnx.bak", "Post.onnx", "model.sig.old", "zz"])
_counter = itertools.count()


@st.composite
def tampers(draw):
    edit = draw(st.sampled_from(["flip", "truncate", "append", "add", "remove", "rename", "symlink", "add ignored"]))
    name = draw(st.sampled_from(FILES))
    return {"edit": edit, "file": name, "at": draw(st.floats(0, 1, exclude_max=True)), "bit": draw(st.integers(0, 7)),
            "bytes": draw(st.binary(min_size=1, max_size=64)), "new": draw(NAMES),
            "ignored": draw(st.sampled_from(IGNORED))}


def apply_tamper(folder: Path, t: dict) -> bool:
    """Edits ``folder`` as ``t`` says; returns whether the result must still verify (only an ignored path added)."""
    path = folder / t["file"]
    data = path.read_bytes()
    edit = t["edit"]
    if edit == "flip":
        i = int(t["at"] * len(data))
        path.write_bytes(data[:i] + bytes([data[i] ^ (1 << t["bit"])]) + data[i + 1:])
    elif edit == "truncate":
        path.write_bytes(data[:int(t["at"] * len(data))])
    elif edit == "append":
        path.write_bytes(data + t["bytes"])
    elif edit == "add":
        (folder / t["new"]).parent.mkdir(parents=True, exist_ok=True)
        (folder / t["new"]).write_bytes(t["bytes"])
    elif edit == "remove":
        path.unlink()
    elif edit == "rename":
        (folder / t["new"]).parent.mkdir(parents=True, exist_ok=True)
        path.rename(folder / t["new"])
    elif edit == "symlink":
        (folder / t["new"]).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(path, folder / t["new"])
    else:
        (folder / t["ignored"]).parent.mkdir(parents=True, exist_ok=True)
        (folder / t["ignored"]).write_bytes(t["bytes"])
        return True
    return False


def verdicts(folder: Path, public: Path, capsys) -> str | None:
    """leapp.load's refusal text (None: it loaded), after checking that leapp verify and leapp-run say the same."""
    try:
        leapp.load(folder, trust=str(public))
        text = None
    except SignatureError as e:
        text = str(e)
    status = main(["verify", str(folder), "--trust", str(public)])
    err = capsys.readouterr().err.strip()
    assert (status, err or None) == ((0, None) if text is None else (1, f"leapp verify: {text}"))
    if text is not None and run_trust_supported():
        assert leapp_run_refusal(folder, public) == text
    return text


def _fresh(signed: Path, tmp_path: Path) -> Path:
    return copy(signed, tmp_path / f"case{next(_counter)}" / "mlp")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(t=tampers())
def test_no_tamper_is_accepted_and_the_readers_agree(signed, keys, tmp_path, capsys, monkeypatch, t):
    monkeypatch.delenv(TRUST_ENV, raising=False)
    folder = _fresh(signed, tmp_path)
    accepted = apply_tamper(folder, t)
    text = verdicts(folder, keys["a"][1], capsys)
    assert (text is None) == accepted, (t, text)
    if text is not None and t["edit"] in ("flip", "truncate", "append"):
        assert t["file"] in text, text  # the changed file is named
    shutil.rmtree(folder.parent)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(t=tampers())
def test_the_upstream_cli_agrees_on_tampering(signed, keys, tmp_path, capsys, monkeypatch, t):
    monkeypatch.delenv(TRUST_ENV, raising=False)
    folder = _fresh(signed, tmp_path)
    apply_tamper(folder, t)
    assert (verdicts(folder, keys["a"][1], capsys) is None) == upstream_verify(folder, keys["a"][1]), t
    shutil.rmtree(folder.parent)


JSON = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                    max_leaves=8)
# a value of each JSON type, for a field given the wrong one
OTHER_TYPES = st.sampled_from([None, True, 0, -1, 1.5, "", "x", [], [None], {}, {"x": None}])
# names a model.sig field could carry: the bundle's own (in the wrong place), their snake_case spellings, the other
# verification materials, and random ones
KEYS = st.sampled_from(["0", "mediaType", "media_type", "verificationMaterial", "verification_material",
                        "dsseEnvelope", "messageSignature", "publicKey", "public_key", "x509CertificateChain",
                        "certificate", "certificates", "tlogEntries", "timestampVerificationData", "hint", "rawBytes",
                        "keyDetails", "payload", "payloadType", "payload_type", "signatures", "sig", "keyid",
                        "extensions"]) | st.text(min_size=1, max_size=8)


def _paths(doc, at=()):
    yield at
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, (*at, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _paths(v, (*at, i))


MUTATIONS = ("mutate", "null", "retype", "delete", "add key", "base64", "payload type", "huge", "deep", "cut")


@st.composite
def hostile_documents(draw, valid: bytes, kinds=MUTATIONS):
    """A model.sig made from ``valid`` by one mutation anywhere in the document: a value replaced by random JSON,
    by null or by a value of another type, a member deleted, a member added to any object (or an element to any
    array), bad base64, a wrong payload type, huge, deep or cut."""
    kind = draw(st.sampled_from(kinds))
    if kind == "huge":
        return b"{" + b" " * draw(st.integers(16 << 20, (16 << 20) + 8)) + b"}"
    if kind == "deep":
        n = draw(st.integers(17, 100000))
        return b"[" * n + b"]" * n
    if kind == "cut":
        return valid[:draw(st.integers(0, len(valid) - 1))]
    doc = json.loads(valid)
    envelope = doc["dsseEnvelope"]
    if kind == "base64":
        field = draw(st.sampled_from(["payload", "sig"]))
        holder = envelope if field == "payload" else envelope["signatures"][0]
        i = draw(st.integers(0, len(holder[field]) - 1))
        holder[field] = holder[field][:i] + draw(st.sampled_from(["*", "-", "_", " ", "\n", "=", "é"])) + holder[field][i + 1:]
        return json.dumps(doc).encode()
    if kind == "payload type":
        envelope["payloadType"] = draw(st.sampled_from(["", "application/json", "application/vnd.in-toto+json ",
                                                        "APPLICATION/VND.IN-TOTO+JSON"]))
        return json.dumps(doc).encode()
    containers = kind == "add key"
    paths = [p for p in _paths(doc) if (p or containers) and (not containers or isinstance(_at(doc, p), (dict, list)))]
    path = draw(st.sampled_from(paths))
    if kind == "add key":
        target = _at(doc, path)
        if isinstance(target, dict):
            target[draw(KEYS)] = draw(JSON | OTHER_TYPES)
        else:
            target.append(draw(JSON | OTHER_TYPES))
        return json.dumps(doc).encode()
    parent = _at(doc, path[:-1])
    if kind == "delete":
        del parent[path[-1]]
    else:
        parent[path[-1]] = draw({"mutate": JSON, "null": st.none(), "retype": OTHER_TYPES}[kind])
    return json.dumps(doc).encode()


def _at(doc, path):
    for part in path:
        doc = doc[part]
    return doc


def upstream_accepts(folder: Path, public: Path) -> bool:
    """The upstream CLI's verdict without its process: what ``model_signing verify key`` runs, with its defaults
    (the signature and git's paths ignored, no symbolic links, unsigned files refused). The CLI itself checks this
    function on a few documents (``test_the_upstream_cli_agrees_on_hostile_documents``)."""
    from model_signing import hashing, verifying

    hashing_config = hashing.Config().set_ignored_paths(paths=[Path("model.sig")], ignore_git_paths=True)
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # its warning about a bundle without a key hint
            (verifying.Config().use_elliptic_key_verifier(public_key=public)
             .set_hashing_config(hashing_config.set_allow_symlinks(False)).verify(folder, folder / "model.sig"))
    except Exception:  # noqa: BLE001 - the CLI, too, reports any exception as a failed verification
        return False
    return True


# Where leapp is deliberately stricter than upstream's reader (docs/deploy.md, "Signed exports in the C++ runner"):
# a document upstream accepts may be refused by leapp for these reasons only.
STRICTER = ("null, expected", "unknown field", "invalid base64", "expected a string", "messageSignature:",
            "signatures; model signing writes exactly one", "invalid JSON", "tlogEntries:",
            "timestampVerificationData:")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_hostile_signature_documents(signed, keys, tmp_path, capsys, monkeypatch, data):
    """Any one mutation of any part of model.sig: the readers agree; what leapp accepts upstream accepts, with the
    signed digests; what upstream accepts leapp refuses only where docs/deploy.md says it is stricter."""
    monkeypatch.delenv(TRUST_ENV, raising=False)
    folder = _fresh(signed, tmp_path)
    expected = leapp.load(signed, trust=keys["a"][1]).signature.digests
    document = data.draw(hostile_documents((folder / "model.sig").read_bytes()))
    (folder / "model.sig").write_bytes(document)
    text = verdicts(folder, keys["a"][1], capsys)
    upstream = upstream_accepts(folder, keys["a"][1])
    if text is None:  # leapp is never laxer than upstream
        assert upstream, document[:400]
        assert dict(leapp.load(folder, trust=keys["a"][1]).signature.digests) == dict(expected)
    else:
        assert "model.sig" in text, text
        assert not upstream or any(reason in text for reason in STRICTER), (text, document[:400])
    shutil.rmtree(folder.parent)


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_the_upstream_cli_agrees_on_hostile_documents(signed, keys, tmp_path, capsys, monkeypatch, data):
    """The in-process oracle above is the CLI's verdict, and leapp accepts nothing the CLI refuses."""
    monkeypatch.delenv(TRUST_ENV, raising=False)
    folder = _fresh(signed, tmp_path)
    (folder / "model.sig").write_bytes(data.draw(hostile_documents((folder / "model.sig").read_bytes(),
                                                                   kinds=("mutate", "null", "retype", "delete",
                                                                          "add key"))))
    cli = upstream_verify(folder, keys["a"][1])
    assert upstream_accepts(folder, keys["a"][1]) == cli
    assert verdicts(folder, keys["a"][1], capsys) is not None or cli  # accepted by leapp: by the CLI too
    shutil.rmtree(folder.parent)


@pytest.mark.parametrize("edit, reason", [
    (lambda d: d.update({"0": None}), "the bundle: unknown field '0'"),
    (lambda d: d["verificationMaterial"].update({"publicKey": None}), "verificationMaterial.publicKey: null"),
    (lambda d: d["verificationMaterial"]["publicKey"].update({"x": 1}), "verificationMaterial.publicKey: unknown"),
    (lambda d: d["verificationMaterial"]["publicKey"].update({"hint": "0" * 64}), "signed by a key not in the trust"),
    (lambda d: d["verificationMaterial"].update({"certificate": {"rawBytes": "AA=="}}), "more than one of publicKey"),
    (lambda d: d["verificationMaterial"].update({"tlogEntries": [{}]}), "verificationMaterial.tlogEntries: 1 "),
    (lambda d: d["dsseEnvelope"].update({"x": 1}), "dsseEnvelope: unknown field 'x'"),
    (lambda d: d["dsseEnvelope"]["signatures"][0].update({"x": 1}), "dsseEnvelope.signatures[0]: unknown field"),
    (lambda d: d["dsseEnvelope"]["signatures"].clear(), "dsseEnvelope.signatures: 0 signatures"),
    (lambda d: d.update({"verificationMaterial": {"x509CertificateChain": {"certificates": [{"rawBytes": "AAAA"}]}}}),
     "verificationMaterial.x509CertificateChain.certificates[0]: not a DER X.509 certificate"),
    (lambda d: d.update({"verificationMaterial": {"certificate": {"rawBytes": "AAAA"}}}),
     "verificationMaterial.certificate: a single certificate (a keyless Sigstore signature"),
])
def test_what_upstream_refuses_leapp_refuses_naming_the_field(signed, keys, tmp_path, capsys, edit, reason):
    """The disagreements hypothesis found (an unknown key, a null verification material) and their kin at each
    level of the bundle: upstream's reader refuses them, and so does leapp, naming the field."""
    folder = _fresh(signed, tmp_path)
    doc = json.loads((folder / "model.sig").read_text())
    edit(doc)
    (folder / "model.sig").write_text(json.dumps(doc))
    assert not upstream_accepts(folder, keys["a"][1])
    text = verdicts(folder, keys["a"][1], capsys)
    assert text is not None and text.startswith(f"{folder}/model.sig: ") and reason in text, text


@pytest.mark.parametrize("edit, reason", [
    (lambda d: d["verificationMaterial"]["publicKey"].update({"hint": None}), "publicKey.hint: null, expected a string"),
    (lambda d: d["dsseEnvelope"]["signatures"][0].update({"keyid": None}), "keyid: null, expected a string"),
    (lambda d: d.update({"messageSignature": None}), "messageSignature: a signature over a single message"),
    (lambda d: d.update({"media_type": d.pop("mediaType")}), "the bundle: unknown field 'media_type'"),
    (lambda d: d["verificationMaterial"].update({"timestampVerificationData": {}}),
     "verificationMaterial.timestampVerificationData: signed timestamps; leapp does not check them"),
])
def test_leapp_is_stricter_than_upstream_only_where_documented(signed, keys, tmp_path, capsys, edit, reason):
    """docs/deploy.md's differences: upstream's reader takes a null as absent and snake_case names, and passes over
    timestamps it does not check; leapp refuses them, naming the field."""
    folder = _fresh(signed, tmp_path)
    doc = json.loads((folder / "model.sig").read_text())
    edit(doc)
    (folder / "model.sig").write_text(json.dumps(doc))
    assert upstream_accepts(folder, keys["a"][1])
    text = verdicts(folder, keys["a"][1], capsys)
    assert text is not None and reason in text and any(r in text for r in STRICTER), text


def test_the_hostile_documents_can_be_valid_ones(signed, keys, tmp_path, capsys):
    """The generator's baseline: the untouched document verifies (upstream too), and a statement re-encoded with
    padding characters removed does not (strict base64)."""
    assert verdicts(signed, keys["a"][1], capsys) is None and upstream_accepts(signed, keys["a"][1])
    doc = json.loads((signed / "model.sig").read_text())
    payload = base64.b64decode(doc["dsseEnvelope"]["payload"])
    doc["dsseEnvelope"]["payload"] = base64.b64encode(payload).decode().rstrip("=") or "A"
    if doc["dsseEnvelope"]["payload"] != base64.b64encode(payload).decode():
        folder = _fresh(signed, tmp_path)
        (folder / "model.sig").write_text(json.dumps(doc))
        assert verdicts(folder, keys["a"][1], capsys) is not None
