"""Fixtures of the signing tests: one small export and keys per test run, a signed private copy per test."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("model_signing", reason="the signing extra is not installed: pip install -e '.[signing]'")

from signing_helpers import copy, make_key, sign

_RUNTIME_TESTS = str(Path(__file__).resolve().parents[1] / "runtime")
if _RUNTIME_TESTS not in sys.path:  # runtime_helpers.record_mlp: the two-node export the C++ runner's tests sign too
    sys.path.insert(0, _RUNTIME_TESTS)
from runtime_helpers import record_mlp  # noqa: E402


@pytest.fixture(scope="session")
def export(tmp_path_factory) -> Path:
    return record_mlp(tmp_path_factory.mktemp("signing_export"))


@pytest.fixture(scope="session")
def keys(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """name -> (private, public): P-256 ("a", "other"), P-384, P-521 and an RSA key."""
    folder = tmp_path_factory.mktemp("keys")
    return {"a": make_key(folder, "a"), "other": make_key(folder, "other"),
            "p384": make_key(folder, "p384", "secp384r1"), "p521": make_key(folder, "p521", "secp521r1"),
            "rsa": make_key(folder, "rsa", "rsa")}


@pytest.fixture
def signed(export, keys, tmp_path) -> Path:
    """A private copy of the export signed with key "a" by leapp sign."""
    folder = copy(export, tmp_path / "mlp")
    sign(folder, keys["a"][0])
    return folder
