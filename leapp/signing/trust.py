"""leapp/signing/trust.py: which keys an export must be signed by, and the check of its signature.

The policy (docs/signing.md, docs/deploy.md "Signed exports: policy"): an explicit trust list (``leapp.load(path,
trust=...)``, ``--trust PUB.pem``) is used alone; without one, ``LEAPP_TRUST`` (PEM public key paths separated by
``:``) is; with neither, nothing is checked and nothing of this module's crypto is loaded. The check itself is
the one native verifier (``leapp._native.verify_folder``, the code leapp-run runs too), so both readers refuse a
folder with the same text.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from leapp.errors import SignatureError

__all__ = ["MAX_KEY_BYTES", "SIGNATURE_FILE", "TRUST_ENV", "TrustSpec", "check_export", "read_keys", "trusted_keys",
           "verify_folder"]

SIGNATURE_FILE = "model.sig"  # the model-signing tools' default name, inside the export folder
TRUST_ENV = "LEAPP_TRUST"
MAX_KEY_BYTES = 1 << 20  # a PEM public key is a few hundred bytes; a certificate a few KiB

TrustSpec = str | os.PathLike | bytes | Sequence[str | os.PathLike | bytes] | None


def trusted_keys(trust: TrustSpec = None, environ: dict | None = None) -> list[str | bytes] | None:
    """The keys a load must be signed by: ``trust`` when given (a path, PEM bytes, or a list of them), else the
    paths in ``LEAPP_TRUST``; None when neither names a key (an unset or empty ``LEAPP_TRUST``).

    Raises:
        SignatureError: ``trust`` is an empty list (it would check nothing: say None for no check), or holds
            something that is neither a path nor PEM bytes.
    """
    if trust is None:
        value = (os.environ if environ is None else environ).get(TRUST_ENV, "")
        paths = [p for p in value.split(":") if p.strip()]
        return paths or None
    items = [trust] if isinstance(trust, (str, bytes, os.PathLike)) else list(trust)
    if not items:
        raise SignatureError("trust=[] names no key: give one or more PEM public keys, or None for no check "
                             f"(then {TRUST_ENV} decides)")
    for item in items:
        if not isinstance(item, (str, bytes, os.PathLike)):
            raise SignatureError(f"trust: {type(item).__name__} {item!r:.60} is not a path or PEM bytes of a public key")
    return [os.fspath(item) if isinstance(item, os.PathLike) else item for item in items]


def read_keys(keys: Sequence[str | bytes]) -> list[bytes]:
    """The PEM texts of ``keys`` (paths are read, bytes are taken as they are); SignatureError naming a key file
    that cannot be read or is larger than MAX_KEY_BYTES. The native verifier parses them (EC keys only)."""
    out = []
    for key in keys:
        if isinstance(key, bytes):
            out.append(key)
            continue
        path = Path(key)
        try:
            with open(path, "rb") as f:
                data = f.read(MAX_KEY_BYTES + 1)
        except OSError as e:
            raise SignatureError(f"trusted key {path}: cannot be read ({e.strerror or e})") from None
        if len(data) > MAX_KEY_BYTES:
            raise SignatureError(f"trusted key {path}: larger than {MAX_KEY_BYTES} bytes (not a PEM public key)")
        out.append(data)
    return out


def verify_folder(folder: str | Path, keys: Sequence[str | bytes], signature: str = SIGNATURE_FILE) -> dict[str, str]:
    """{path relative to ``folder``: sha256 hex} of every file ``signature`` covers, after the native verifier has
    checked it against one of ``keys`` (paths or PEM bytes) and every file of the folder against it.

    Raises:
        SignatureError: the text of the refusal: the file or the signature problem (docs/signing.md lists them).
    """
    pems = read_keys(keys)
    from leapp import _native  # the extension, built with the verifier (libcrypto is opened only now)

    try:
        return dict(_native.verify_folder(os.fspath(folder), pems, signature))
    except SignatureError:
        raise
    except (RuntimeError, ValueError, OSError) as e:  # the binding's own error type: its text is the reason
        raise SignatureError(str(e)) from None


def check_export(path: str | Path, trust: TrustSpec = None, signature: str = SIGNATURE_FILE):
    """The ``SignedFolder`` (leapp.signing.readonce) of the export at ``path`` (its folder, or a file in it such as
    pipeline.yaml) once its signature is checked against the keys of the policy (``trusted_keys``); None when no
    key is configured, without importing anything."""
    keys = trusted_keys(trust)
    if keys is None:
        return None
    from leapp.signing.readonce import SignedFolder

    path = Path(path)
    folder = path.parent if path.is_file() else path
    digests = verify_folder(folder, keys, signature)
    return SignedFolder(Path(os.path.realpath(folder)), digests, folder / signature)
