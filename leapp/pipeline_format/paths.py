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

from pathlib import Path, PurePosixPath

from .format import PipelineError

__all__ = ["contained_path", "is_regular_file"]


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
