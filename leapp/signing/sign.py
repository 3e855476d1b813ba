"""leapp/signing/sign.py: ``leapp sign``: an export folder signed with the OpenSSF model-signing library.

The signature is what upstream's ``model_signing sign key`` (or ``sign certificate``) writes, made by the same
library with the same settings: every file of the folder by sha256 ("files" serialization), the signature file
and git's paths left out, symbolic links refused. So upstream's ``model_signing verify`` accepts it and leapp
accepts upstream's (docs/signing.md). The library (``pip install 'leapp[signing]'``) is imported here only.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from leapp.errors import SignatureError
from leapp.signing.trust import SIGNATURE_FILE

__all__ = ["EXTRA_HINT", "model_signing_modules", "sign_folder"]

EXTRA_HINT = "pip install 'leapp[signing]' (model-signing 1.1.1 and pyOpenSSL)"


def model_signing_modules():
    """(model_signing.signing, model_signing.hashing), or SignatureError naming the extra that provides them."""
    try:
        from model_signing import hashing, signing
    except ImportError as e:  # model-signing itself, or OpenSSL (pyOpenSSL), which it imports undeclared
        raise SignatureError(f"signing needs the model-signing library, which cannot be imported ({e}): "
                             f"{EXTRA_HINT}") from None
    return signing, hashing


def sign_folder(folder: str | os.PathLike, private_key: str | os.PathLike, *, password: str | bytes | None = None,
                certificate: str | os.PathLike | None = None, certificate_chain: Sequence[str | os.PathLike] = (),
                signature: str = SIGNATURE_FILE) -> Path:
    """Signs every file of the export ``folder`` with ``private_key`` (PEM, elliptic curve P-256/P-384/P-521) and
    writes ``folder/signature``; with ``certificate`` (the key's PEM certificate, ``certificate_chain`` the
    certificates up to a root) the signature carries the certificates instead of the key's hint. Returns the
    signature's path.

    Raises:
        SignatureError: the folder is not an export (no pipeline.yaml), the library is missing, or the key,
            certificate or folder was refused by it (its reason, with the file).
    """
    from leapp.pipeline_format import PIPELINE_FILE

    folder = Path(folder)
    if not (folder / PIPELINE_FILE).is_file():
        raise SignatureError(f"{folder}: no {PIPELINE_FILE}: leapp sign signs an export folder")
    for what, path in [("private key", private_key), ("certificate", certificate),
                       *(("certificate chain", c) for c in certificate_chain)]:
        if path is not None and not Path(path).is_file():
            raise SignatureError(f"{what} {path}: no such file")
    if password is not None and certificate is not None:  # upstream's certificate signer reads unencrypted keys only
        raise SignatureError(f"{private_key}: a password cannot be used with a certificate: the model-signing "
                             "library signs with a certificate from an unencrypted private key only")
    signing, hashing = model_signing_modules()
    config = signing.Config()
    try:
        if certificate is None:
            # the library declares a str password, but hands it to cryptography, which takes bytes only
            secret = password.encode() if isinstance(password, str) else password
            config.use_elliptic_key_signer(private_key=Path(private_key), password=secret)
        else:
            config.use_certificate_signer(private_key=Path(private_key), signing_certificate=Path(certificate),
                                          certificate_chain=[Path(c) for c in certificate_chain])
    except (ValueError, TypeError, AttributeError) as e:  # not a key, a wrong password, another curve, an RSA key
        raise SignatureError(f"{certificate or private_key}: cannot sign with it (leapp signs with a PEM private key "
                             f"of curve P-256, P-384 or P-521): {type(e).__name__}: {e}") from None
    out = folder / signature
    # as upstream's CLI: the signature file and git's paths are left out; symbolic links are refused
    config.set_hashing_config(hashing.Config().set_ignored_paths(paths=[Path(signature)], ignore_git_paths=True))
    try:
        config.sign(folder, out)
    except (ValueError, OSError) as e:  # a symbolic link or special file in the folder, an unreadable file
        raise SignatureError(f"{folder}: cannot be signed: {e}") from None
    return out
