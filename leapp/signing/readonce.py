"""leapp/signing/readonce.py: the bytes a loader reads are the bytes whose signature was checked.

``verify_folder`` hashes every file of a signed folder; a loader then reads each file it needs once more. Between
the two a file can be swapped (the folder stays writable on a robot), so while ``leapp.load`` reads a verified
folder it holds a ``SignedFolder`` here (``reading``), and every read path (pipeline.yaml, pipeline.json, each
artifact and extra file, initial_values.safetensors) calls ``check_read`` with the bytes it read. Without a
signed folder ``check_read`` returns at once: loads without trust are unchanged. A context variable, not a
global, so that loads in other threads neither see nor need another load's folder.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from leapp.errors import SignatureError

__all__ = ["CHANGED_AFTER_CHECK", "NOT_SIGNED", "SignedFolder", "check_read", "reading"]

# the C++ reader's texts (ext/pipeline/src/signed_files.cpp); ``where`` is the reader's context, else the file
CHANGED_AFTER_CHECK = "{where}: {file} changed after its signature was checked (sha256 {actual}, signed {signed})"
NOT_SIGNED = "{where}: {file} is not covered by the export's signature ({signature} does not list it)"


@dataclass(frozen=True)
class SignedFolder:
    """A folder whose signature was checked: ``digests`` maps each signed file's path (relative, '/') to its
    sha256; ``signature`` is the signature file's path."""

    folder: Path
    digests: Mapping[str, str]
    signature: Path

    def check(self, path: str | os.PathLike, data: bytes | memoryview, digest: str | None = None,
              where: str | None = None) -> None:
        """Refuses ``data`` read from ``path`` unless its sha256 (``digest`` when the caller has it) is the
        signed one. ``path`` is resolved: a reader may name a file through the folder's own spelling."""
        where = str(path) if where is None else where
        file = Path(path)
        try:
            rel = Path(os.path.realpath(file)).relative_to(self.folder).as_posix()
        except ValueError:
            rel = None
        signed = self.digests.get(rel) if rel is not None else None
        if signed is None:
            raise SignatureError(NOT_SIGNED.format(where=where, file=file, signature=self.signature.name))
        actual = digest if digest is not None else hashlib.sha256(data).hexdigest()
        if actual != signed:
            raise SignatureError(CHANGED_AFTER_CHECK.format(where=where, file=file, actual=actual, signed=signed))


_ACTIVE: contextvars.ContextVar[SignedFolder | None] = contextvars.ContextVar("leapp_signed_folder", default=None)


@contextlib.contextmanager
def reading(signed: SignedFolder | None) -> Iterator[None]:
    """Every ``check_read`` inside compares against ``signed`` (None: no check, as without trust)."""
    token = _ACTIVE.set(signed)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def check_read(path: str | os.PathLike, data: bytes | memoryview, digest: str | None = None,
               where: str | None = None) -> None:
    """The read-once check of a loader's read (module docstring); nothing unless a signed folder is being read."""
    signed = _ACTIVE.get()
    if signed is not None:
        signed.check(path, data, digest, where)
