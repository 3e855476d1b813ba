"""leapp/_export/compile.py: a recorded session -> ``<save_path>/<session>/`` (artifacts + pipeline.yaml).

Steps: check every node's backend first (nothing is written when one is
unsupported), build each node's exportable module (segments -> bundles ->
``leapp::warp_segment``), export it, write ``pipeline.yaml``, then validate
every artifact in a fresh process that loads it as ``leapp.load`` does; an artifact that no
validation process opened is opened here (``load_check``), so a file that cannot load is never
reported as written.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from leapp._contract.backends import BACKENDS, SEGMENT_BACKENDS
from leapp._contract.records import NodeRecord, SessionRecord
from leapp._export.exportable import BundleProvider, build_exportable
from leapp._export.load_check import check_artifact_loads
from leapp._export.paths import artifact_path
from leapp._export.pipeline_yaml import NodeArtifact, describe_pipeline, write_pipeline_yaml
from leapp._export.report import CompileReport, NodeReport
from leapp._export.validate_process import VALIDATION_TIMEOUT_S
from leapp._export.warp_route import plan_routes
from leapp._export.validate import (
    NEEDS_CUDA,
    SKIPPED,
    NodeArtifactJob,
    NodeValidation,
    raise_for_failures,
    validate_nodes,
)
from leapp.errors import ExportError, UnsupportedBackend

__all__ = ["check_backends", "compile_session"]

log = logging.getLogger(__name__)


def check_backends(record: SessionRecord) -> None:
    """Raises before anything is written: UnsupportedBackend (a NotImplementedError) for a segment node on another
    backend."""
    for node in record.nodes.values():
        backend = node.export_with
        if node.segments and backend not in SEGMENT_BACKENDS:
            raise UnsupportedBackend(
                f"node '{node.name}' ({node.source}) has Warp segment(s) {[s.id for s in node.segments]} and "
                f"export_with={backend!r}; nodes with Warp segments export only with 'onnx' or 'pt2'"
            )
        if backend not in BACKENDS:
            raise ExportError(
                f"node '{node.name}' ({node.source}): unknown export_with={backend!r}; "
                f"leapp exports with {list(BACKENDS)} ('torchscript' only for nodes without Warp segments)"
            )


def export_node(record: NodeRecord, folder: Path, bundles: BundleProvider | None = None,
                routes: dict[str, str] | None = None, lowerings: dict | None = None) -> NodeArtifact:
    """Writes one node's artifact into ``folder``; ``routes`` (segment id -> route) says which segments lower,
    ``lowerings`` holds their lowering (``plan_routes``)."""
    start = time.perf_counter()
    node = build_exportable(record, bundles, lowered=lowerings or {})
    built = time.perf_counter()
    extra: list[Path] = []
    if record.export_with == "onnx":
        from leapp._export.onnx_export import export_onnx

        path, extra = export_onnx(node, folder)
    elif record.export_with == "pt2":
        from leapp._export.pt2_export import export_pt2

        path = export_pt2(node, folder)
    else:
        from leapp._export.torchscript_export import export_torchscript

        path = export_torchscript(node, folder)
    log.info("node '%s': %d Warp segment(s) built in %.2f s, %s written in %.2f s", record.name, len(node.segments),
             built - start, path.name, time.perf_counter() - built)
    return NodeArtifact(record, record.export_with, path, extra, node.segments, dict(routes or {}), node.lowered)


def compile_session(
    record: SessionRecord,
    validate: bool = True,
    rtol: float = 1e-3,
    atol: float = 1e-5,
    *,
    bundles: BundleProvider | None = None,
    validation_timeout: float = VALIDATION_TIMEOUT_S,
    warp: str = "replay",
    leapp_bundle: bool = False,
) -> CompileReport:
    """Exports every node of ``record`` and writes ``<save_path>/<name>/pipeline.yaml``.

    Args:
        record: the traced session.
        validate: load the export in a fresh process as ``leapp.load`` does, run
            each node on the recorded samples and compare with the eager outputs.
        rtol, atol: tolerances of that comparison (``torch.isclose``).
        bundles: segment -> bundle bytes; defaults to compiling the Warp capture.
        validation_timeout: seconds the validation process may spend loading one
            node or running one sample before it is stopped (that node fails).
        warp: "replay" (every segment replays through leapp's runtime), "lower" (every segment is written as
            standard ops, else ExportError naming each one that cannot be) or "auto" (lower what can be);
            docs/lowering.md.
        leapp_bundle: also write ``<name>.yaml``, the existing LEAPP tool's layout, once every node validated
            (``leapp.interchange.write_leapp_bundle``, docs/leapp-bundle.md).

    Returns:
        The per-node report (``str()`` prints a table).

    Raises:
        NotImplementedError: a node with Warp segments asks for a backend other than onnx/pt2.
        ExportError: a node cannot be exported.
        ValidationError: validation could not run or found a mismatch
            (``Model validation failed for N node(s): [...]``); the files are
            written and the report is the exception's ``report`` attribute.
    """
    if not record.nodes:
        raise ExportError(f"session '{record.name}': no leapp.node was recorded, nothing to export")
    check_backends(record)
    routes, lowerings = plan_routes(record, warp)
    folder = artifact_path(record.save_path, record.name, "", f"session '{record.name}'")
    for node in record.nodes.values():  # names of hand-made records, before anything is written
        artifact_path(folder, node.name, "", f"node '{node.name}' ({node.source})")
    folder.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    log.info("session '%s': exporting %d node(s) into %s", record.name, len(record.nodes), folder)
    artifacts = [export_node(node, folder, bundles, routes=routes[node.name], lowerings=lowerings[node.name])
                 for node in record.nodes.values()]
    write_pipeline_yaml(describe_pipeline(record, artifacts, folder), folder)
    log.info("session '%s': artifacts and pipeline.yaml written in %.2f s", record.name, time.perf_counter() - start)
    report = CompileReport(record.name, folder)
    if validate:
        jobs = [NodeArtifactJob(art.record, art.backend, art.path,
                                {seg.id: seg.manifest.get("producer", {}).get("cpu_code", "") for seg in art.segments},
                                frozenset(s.id for s in art.lowered))
                for art in artifacts]
        checked = time.perf_counter()
        results = validate_nodes(jobs, rtol, atol, folder=folder, timeout=validation_timeout)
        log.info("session '%s': validation of %d node(s) in %.2f s: %s", record.name, len(jobs),
                 time.perf_counter() - checked, ", ".join(f"{r.node} {r.status}" for r in results))
    else:
        results = [NodeValidation(art.record.name, SKIPPED, samples=len(art.record.samples)) for art in artifacts]
    for art, result in zip(artifacts, results):
        if result.status in (SKIPPED, NEEDS_CUDA):  # not loaded by a validation process: open it here
            check_artifact_loads(art.record.name, art.backend, art.path)
    for art, result in zip(artifacts, results):
        report.nodes.append(
            NodeReport(
                node=art.record.name,
                backend=art.backend,
                artifact=art.path.relative_to(folder).as_posix(),
                segments=[s.id for s in art.segments] + [s.id for s in art.lowered],
                validation=result,
                routes=dict(art.routes),
            )
        )
    raise_for_failures(results, report)
    if leapp_bundle:
        from leapp.interchange import write_leapp_bundle

        write_leapp_bundle(folder)
    return report
