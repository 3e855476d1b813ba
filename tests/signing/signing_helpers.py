"""What the signing tests share: EC key pairs, the upstream CLI, leapp-run and refusal texts."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

__all__ = ["LEAPP_RUN", "MODEL_SIGNING", "copy", "leapp_load_refusal", "leapp_run_refusal", "make_key",
           "native_verifier", "run_trust_supported", "sign", "upstream_sign", "upstream_verify"]

BIN = Path(sys.executable).parent
MODEL_SIGNING = BIN / "model_signing"  # the upstream CLI of the model-signing package (the signing extra)
LEAPP_RUN = BIN / "leapp-run"


def make_key(folder: Path, name: str, curve: str = "secp256r1", password: str | None = None) -> tuple[Path, Path]:
    """(private, public) PEM files of a new EC key on ``curve`` (or ``"rsa"``), in ``folder``; the private key
    encrypted with ``password`` when one is given."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec, rsa

    if curve == "rsa":
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    else:
        key = ec.generate_private_key(getattr(ec, curve.upper())())
    private, public = folder / f"{name}.pem", folder / f"{name}.pub.pem"
    encryption = (serialization.NoEncryption() if password is None
                  else serialization.BestAvailableEncryption(password.encode()))
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


def copy(export: Path, dst: Path) -> Path:
    return Path(shutil.copytree(export, dst, symlinks=True))


def sign(folder: Path, key: Path) -> Path:
    """``leapp sign`` in this process (the library call the command makes)."""
    from leapp.signing.sign import sign_folder

    return sign_folder(folder, key)


def _cli(*args, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([str(MODEL_SIGNING), *map(str, args)], capture_output=True, text=True, timeout=timeout)


def upstream_sign(folder: Path, key: Path) -> subprocess.CompletedProcess:
    return _cli("sign", "key", folder, "--signature", folder / "model.sig", "--private_key", key)


def upstream_verify(folder: Path, public: Path) -> bool:
    """The upstream CLI's verdict: True when ``model_signing verify key`` accepts the folder."""
    r = _cli("verify", "key", folder, "--signature", folder / "model.sig", "--public_key", public)
    assert r.returncode in (0, 1), (r.returncode, r.stdout, r.stderr)
    return r.returncode == 0


def native_verifier() -> bool:
    from leapp import _native

    return hasattr(_native, "verify_folder")


def run_trust_supported() -> bool:
    """leapp-run is built and knows --trust."""
    if not LEAPP_RUN.is_file():
        return False
    r = subprocess.run([str(LEAPP_RUN), "--help"], capture_output=True, text=True, timeout=60)
    return "--trust" in r.stdout + r.stderr


def leapp_load_refusal(folder: Path, public: Path) -> str:
    """The SignatureError text of ``leapp.load(folder, trust=public)`` (fails the test when it loads)."""
    import leapp
    from leapp.errors import SignatureError

    with pytest.raises(SignatureError) as info:
        leapp.load(folder, trust=str(public))
    return str(info.value)


def leapp_run_refusal(folder: Path, public: Path) -> str:
    """leapp-run's refusal text for ``--trust public --check`` (its exit status checked)."""
    env = {k: v for k, v in os.environ.items() if k != "LEAPP_TRUST"}
    r = subprocess.run([str(LEAPP_RUN), str(folder), "--trust", str(public), "--check"], capture_output=True,
                       text=True, timeout=120, env=env)
    assert r.returncode in (1, 2), (r.returncode, r.stdout, r.stderr)
    return r.stderr.strip().removeprefix("leapp-run: ")
