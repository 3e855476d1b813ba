"""leapp/_export/source_paths.py: the user's ``file:line`` as an export records it, the same from any checkout.

The recorder keeps absolute paths: its error messages point at the file the user can open. An export must not
record them: the same code exported from two checkouts would differ in every digest and artifact, and the folder
would carry the exporting machine's directory layout. A recorded source is relative to the working directory when
the file lies under it (``examples/go2_pipeline.py:89``), else to the ``sys.path`` entry that holds it, which for
an installed package is its module path (``isaaclab/envs/mdp/observations.py:89``), else the file's name alone.
"""

from __future__ import annotations

import os
import sys

__all__ = ["recorded_source"]


def recorded_source(location: str) -> str:
    """``location`` (``path:line`` as the recorder found it) in the portable form an export writes."""
    path, sep, line = location.rpartition(":")
    if not sep or not line.isdigit() or not path:
        return location  # "<unknown>", or no line number: nothing that names this machine's folders
    full = os.path.realpath(path)
    for root in _roots():
        if full.startswith(root + os.sep):
            return f"{os.path.relpath(full, root).replace(os.sep, '/')}:{line}"
    return f"{os.path.basename(full)}:{line}"


def _roots() -> list[str]:
    """The working directory, then sys.path's folders, deepest first among those (the most specific holder)."""
    cwd = os.path.realpath(os.getcwd())
    entries = {os.path.realpath(p or os.curdir) for p in sys.path if isinstance(p, str)}
    return [cwd, *sorted((e for e in entries if os.path.isdir(e) and e != cwd), key=len, reverse=True)]
