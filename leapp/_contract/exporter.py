"""leapp/_contract/exporter.py: what a recording session calls to export itself.

The recorder never imports the exporter (tests/foundation/test_layering.py): ``leapp.trace`` hands a
``Session`` an object of this shape, made in the API layer (``leapp/__init__.py``). ``prepare`` runs when
the session begins, so the exporter's slow start (a validation worker process) overlaps with tracing;
``__call__`` exports the record and returns the exporter's report (``CompileReport``), which
``session.compile`` returns.
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

from leapp._contract.records import SessionRecord

__all__ = ["Exporter", "Report"]

Report = TypeVar("Report", covariant=True)


class Exporter(Protocol[Report]):
    def prepare(self) -> None:
        """Start what the export will need, in the background; called when a session begins."""

    def __call__(self, record: SessionRecord, **options: Any) -> Report:
        """Export ``record`` (options: ``validate``, ``rtol``, ``atol``) and return the report."""
