"""leapp/pipeline_format/paths.py: the containment rule for paths that pipeline.yaml names.

A path in pipeline.yaml is untrusted text. Before anything opens, hashes or
even tests for the existence of such a file, the path must be relative,
'/'-separated, free of '..' and NUL, and resolve (symlinks followed) to a
file strictly inside the export folder. Lexical refusals come first, so a
path written to point outside is refused without the file system being asked
about it; a symlink inside the folder that leads outside is refused whether
or not its target exists.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from leapp.signing.readonce import check_read

from .format import PipelineError

__all__ = ["MAX_ARTIFACT_BYTES_ENV", "DEFAULT_MAX_ARTIFACT_BYTES", "CheckedFile", "contained_path", "is_regular_file",
           "max_artifact_bytes", "read_bounded", "read_checked"]

MAX_ARTIFACT_BYTES_ENV = "LEAPP_MAX_ARTIFACT_BYTES"
DEFAULT_MAX_ARTIFACT_BYTES = 4 << 30  # per file a node names; a PT2 node briefly holds it twice (canonical copy)


def contained_path(folder: str | Path, rel: str, where: str) -> Path:
    """The resolved ``folder/rel`` after checking that it stays inside ``folder``.

    ``where`` names the file and field (``.../pipeline.yaml: nodes[0].artifact``).
    Raises PipelineError when the path leaves the folder or cannot be resolved.
    """
    folder = Path(folder)
    if not isinstance(rel, str) or not rel:
        raise PipelineError(f"{where}: expected a non-empty relative path, got {rel!r}")
    pure = PurePosixPath(rel)
    if "\0" in rel or pure.is_absolute() or ".." in pure.parts:
        raise PipelineError(
            f"{where}: path {rel!r} leaves the pipeline folder {folder} (paths are relative, without '..')"
        )
    try:
        base = folder.resolve()
        path = (folder / rel).resolve()
    except (OSError, RuntimeError, ValueError) as e:  # symlink loops: RuntimeError before Python 3.13
        raise PipelineError(f"{where}: path {rel!r} cannot be resolved in {folder}: {e}") from e
    if base not in path.parents:
        raise PipelineError(f"{where}: path {rel!r} leaves the pipeline folder {folder} (it resolves to {path})")
    return path


def is_regular_file(path: Path) -> bool:
    """Whether ``path`` is a regular file; False, not an exception, when it cannot be looked at (a name
    too long for the file system, a loop, no permission), as the C++ reader's ``stat`` check answers.
    ``Path.is_file`` raises for some of these (ENAMETOOLONG), and a hostile pipeline.yaml names the path."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def max_artifact_bytes() -> int:
    """The largest file a node may name (``LEAPP_MAX_ARTIFACT_BYTES``, default 4 GiB)."""
    raw = os.environ.get(MAX_ARTIFACT_BYTES_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_ARTIFACT_BYTES
    if not raw.isdigit() or int(raw) <= 0:
        raise PipelineError(f"{MAX_ARTIFACT_BYTES_ENV}={raw!r} is not a positive number of bytes")
    return int(raw)


def read_bounded(path: Path, where: str, limit: int | None = None, follow_symlinks: bool = True) -> bytes:
    """The bytes of the regular file ``path``, read once through one descriptor, refused (PipelineError naming
    ``where``) before reading when it holds more than ``limit`` (default ``max_artifact_bytes()``).
    ``follow_symlinks=False`` for a path already resolved: a symlink put there since is not followed."""
    limit = max_artifact_bytes() if limit is None else limit
    flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | (0 if follow_symlinks else getattr(os, "O_NOFOLLOW", 0))
    try:
        fd = os.open(path, flags)
    except OSError as e:
        raise PipelineError(f"{where}: cannot open {path}: {e.strerror or e}") from e
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise PipelineError(f"{where}: {path} is not a regular file")
        if st.st_size > limit:
            raise PipelineError(f"{where}: {path} has {st.st_size} bytes, more than the limit of {limit} "
                                f"({MAX_ARTIFACT_BYTES_ENV})")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise PipelineError(f"{where}: {path} grew past the limit of {limit} bytes ({MAX_ARTIFACT_BYTES_ENV}) "
                            "while it was read")
    return data


@dataclass(frozen=True)
class CheckedFile:
    """A file a node names, as read once: ``data`` is what was hashed and what the loaders get."""

    path: Path
    data: bytes


def read_checked(folder: Path, rel: str, expected: str, where: str, field: str = "artifact") -> CheckedFile:
    """``folder/rel`` after checking it stays in the folder (before any open), read once (bounded) and its
    bytes' sha256 compared with ``expected``. Loaders open ``data``, never the path again: what runs is what
    was hashed, whatever happens to the file afterwards."""
    path = contained_path(folder, rel, f"{field} ({where})")
    if not is_regular_file(path):
        raise PipelineError(f"{where}: artifact {path} is missing")
    data = read_bounded(path, where, follow_symlinks=False)  # contained_path resolved it: no link is left
    actual = hashlib.sha256(data).hexdigest()
    check_read(path, data, actual, where)  # a signed folder (leapp.signing.readonce): the signed bytes, first
    if actual != expected:
        raise PipelineError(
            f"{where}: artifact {path} has sha256 {actual} but pipeline.yaml records {expected}; "
            "the file changed after export"
        )
    return CheckedFile(path, data)
