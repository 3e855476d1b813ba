"""leapp/_export/paths.py: where the exporter may write: only inside ``<save_path>/<session>/``.

The recorder refuses bad names when they are declared (``leapp._contract.names``);
this is the second line, for records built without it: the name is checked
again, and the path is resolved (symbolic links included) and must stay
directly inside its folder before anything is written. (Reading is the other
side: ``leapp.pipeline_format.contained_path`` checks the relative paths an
untrusted pipeline.yaml names.)
"""

from __future__ import annotations

from pathlib import Path

from leapp._contract.names import NAME_RULE, name_problem, shown
from leapp.errors import ExportError

__all__ = ["artifact_path"]


def artifact_path(folder: Path | str, name: str, suffix: str, what: str) -> Path:
    """``folder/<name><suffix>`` (as given, not resolved), or ExportError if it could land elsewhere.

    ``what`` names the owner in the error (``"node 'obs' (f.py:3)"``, ``"session 'go2'"``).
    """
    problem = name_problem(name)
    if problem is not None:
        raise ExportError(f"{what}: invalid name {shown(name)} ({problem}); names must be {NAME_RULE}")
    path = Path(folder) / f"{name}{suffix}"
    parent = Path(folder).resolve()
    resolved = path.resolve()
    if resolved.parent != parent:
        raise ExportError(
            f"{what}: {path} resolves to {resolved}, outside {parent}; leapp writes only inside that folder "
            "(is the path a symbolic link?)"
        )
    return path
