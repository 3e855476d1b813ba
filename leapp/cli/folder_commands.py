"""leapp/cli/folder_commands.py: the commands that write into an export folder: ``aoti`` and ``write-json``."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import TextIO

from leapp.pipeline_format import PipelineError, write_twin

__all__ = ["aoti", "write_json"]


def aoti(export_dir: str, node: str, out: str | None = None, err: TextIO | None = None) -> int:
    """``leapp aoti``: writes the AOTInductor package of a PT2 node (``leapp.aoti.package``); prints its path.

    Returns 0, or 1 after printing the reason (bad folder, node, artifact, output path or compile).
    """
    from leapp import aoti as _aoti  # its package() imports torch; other commands need none
    from leapp.errors import LeappError

    err = err if err is not None else sys.stderr
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", RuntimeWarning)
            path = _aoti.package(export_dir, node, out)
    except ImportError as e:
        print(f"leapp aoti: error: AOTInductor packages need torch with Inductor ({type(e).__name__}: {e})", file=err)
        return 1
    except (LeappError, FileNotFoundError) as e:
        print(f"leapp aoti: error: {e}", file=err)
        return 1
    for warning in caught:  # leapp's own, as the command's lines; any other as Python shows it
        if warning.filename == _aoti.__file__ or "Warp segment" in str(warning.message):
            print(f"leapp aoti: warning: {warning.message}", file=err)
        else:
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    print(path)
    folder = Path(export_dir) if Path(export_dir).is_dir() else Path(export_dir).parent
    if _aoti.recorded_path(folder, path) is None:
        print(f"leapp aoti: note: {path} is outside {export_dir}, so pipeline.yaml does not record it and "
              "leapp's C++ runner will not use it (docs/aoti.md)", file=err)
    return 0


def write_json(export_dir: str) -> int:
    """``leapp write-json``: writes pipeline.json next to pipeline.yaml; prints its path. Returns 0, or 1."""
    try:
        print(write_twin(export_dir))
    except (PipelineError, FileNotFoundError) as e:
        print(f"leapp write-json: {e}", file=sys.stderr)
        return 1
    return 0


