"""leapp/cli/leapp_bundle.py: ``leapp write-leapp-bundle``: an export folder's LEAPP bundle for other tools."""

from __future__ import annotations

import sys
import warnings
from typing import TextIO

__all__ = ["write_leapp_bundle_command"]


def write_leapp_bundle_command(export_dir: str, err: TextIO | None = None) -> int:
    """Writes ``EXPORT_DIR/<name>.yaml`` (``leapp.interchange.write_leapp_bundle``) and prints its path; each node
    other tools cannot run is a ``warning:`` line. Returns 0, or 1 after printing why nothing was written."""
    from leapp.errors import LeappError
    from leapp.interchange import LeappBundleWarning, write_leapp_bundle

    err = err if err is not None else sys.stderr
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", LeappBundleWarning)
            path = write_leapp_bundle(export_dir)
    except (LeappError, FileNotFoundError) as e:
        print(f"leapp write-leapp-bundle: error: {e}", file=err)
        return 1
    for warning in caught:
        if issubclass(warning.category, LeappBundleWarning):
            print(f"leapp write-leapp-bundle: warning: {warning.message}", file=err)
        else:
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    print(path)
    return 0
