"""leapp/_export/report.py: what ``compile`` returns, one row per node output when printed."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from leapp._export.validate import NodeValidation

__all__ = ["NodeReport", "CompileReport"]


@dataclass
class NodeReport:
    """One exported node: backend, artifact (relative to the export folder), segments, validation."""

    node: str
    backend: str
    artifact: str
    segments: list[str]
    validation: NodeValidation
    routes: dict[str, str] = field(default_factory=dict)  # segment id -> "lowered" / "replayed: <why>" (warp=)

    @property
    def status(self) -> str:
        return self.validation.status


@dataclass
class CompileReport:
    """Per-node results of ``compile_session``; ``str()`` renders a table."""

    session: str
    path: Path
    nodes: list[NodeReport] = field(default_factory=list)

    @property
    def pipeline_yaml(self) -> Path:
        return self.path / "pipeline.yaml"

    @property
    def ok(self) -> bool:
        return all(n.validation.ok for n in self.nodes)

    def __getitem__(self, node: str) -> NodeReport:
        for n in self.nodes:
            if n.node == node:
                return n
        raise KeyError(f"no node {node!r} in the report of session '{self.session}' (nodes: {[n.node for n in self.nodes]})")

    def __iter__(self):
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    def rows(self) -> list[list[str]]:
        """Table rows (header first): one per output, node columns only on a node's first row."""
        rows = [["node", "backend", "artifact", "segments", "validation", "output", "max abs", "max rel"]]
        for n in self.nodes:
            status = n.status + (" (cached)" if n.validation.cached else "")
            head = [n.node, n.backend, n.artifact, ", ".join(n.segments) or "-", status]
            outputs = n.validation.outputs
            if not outputs:
                rows.append(head + ["-", "-", "-"])
                continue
            for i, o in enumerate(outputs):
                rows.append((head if i == 0 else [""] * len(head)) + [o.name, f"{o.max_abs:.3g}", f"{o.max_rel:.3g}"])
        return rows

    def __str__(self) -> str:
        rows = self.rows()
        widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
        lines = [f"leapp export '{self.session}' -> {self.path}"]
        for i, row in enumerate(rows):
            lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
            if i == 0:
                lines.append("  ".join("-" * w for w in widths))
        for n in self.nodes:
            if n.validation.reason:
                lines.append(f"{n.node}: {n.validation.reason}")
            for seg, route in n.routes.items():
                lines.append(f"{n.node} segment '{seg}': {route}")
        return "\n".join(lines)
