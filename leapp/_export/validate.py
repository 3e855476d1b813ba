"""leapp/_export/validate.py: exported artifacts, run by the real runtime, against the eager samples.

Each node's artifact is opened the way ``leapp.load`` opens it, in a fresh
Python process (``validate_process``, ``validate_worker``), and fed every
recorded sample's inputs; outputs must match the eager outputs within
``rtol``/``atol`` (``torch.isclose`` semantics, NaN equal to NaN). The fresh
process is the point: an artifact that works only next to the exporting
process's state (an op registered there, a Warp object's address baked in)
fails here as it would for a user.

NOTE: a node with Warp segments can only be checked where the native runtime
can replay them: a CUDA device, segments captured on CUDA, and the op
library. When any is missing validation cannot run, and that is a failure
(docs/export.md, step 6), never a silent pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

import yaml

from leapp._export import validation_cache
from leapp._export.validate_process import VALIDATION_TIMEOUT_S, run_in_fresh_process
from leapp._export.validate_process import job_entry
from leapp._contract.records import NodeRecord
from leapp.bundle.format import cpu_code_runs_here
from leapp.errors import VALIDATION_FAILED, LeappError, ValidationError

__all__ = [
    "OutputCheck",
    "NodeValidation",
    "compare",
    "NodeArtifactJob",
    "validate_node",
    "validate_nodes",
    "raise_for_failures",
    "validation_blocker",
    "NEEDS_CUDA",
    "cuda_problem",
]

_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

PASSED = "passed"
FAILED = "failed"  # ran, outputs differ
ERROR = "error"  # could not run
SKIPPED = "skipped"  # validate=False
NEEDS_CUDA = "needs-cuda"  # has Warp segments, and this machine (or the capture) gives no CUDA replay


@dataclass
class OutputCheck:
    """Worst-case error of one output over all samples."""

    name: str
    max_abs: float = 0.0
    max_rel: float = 0.0
    ok: bool = True
    note: str = ""


@dataclass
class NodeValidation:
    """What validation found for one node."""

    node: str
    status: str
    reason: str = ""
    source: str = ""
    samples: int = 0
    outputs: list[OutputCheck] = field(default_factory=list)
    cached: bool = False  # the outputs compared came from the validation cache (validation_cache)

    @property
    def ok(self) -> bool:
        return self.status in (PASSED, SKIPPED)


def compare(name: str, actual: torch.Tensor, expected: torch.Tensor, rtol: float, atol: float) -> OutputCheck:
    """Max abs and rel error of one output; rel is taken over elements whose expected value is non-zero."""
    check = OutputCheck(name)
    if tuple(actual.shape) != tuple(expected.shape) or actual.dtype != expected.dtype:
        check.ok = False
        check.max_abs = check.max_rel = math.inf
        check.note = (
            f"got {str(actual.dtype).removeprefix('torch.')}{list(actual.shape)}, "
            f"eager {str(expected.dtype).removeprefix('torch.')}{list(expected.shape)}"
        )
        return check
    a = actual.detach().cpu()
    e = expected.detach().cpu()
    if a.numel() == 0:
        return check
    if not (a.is_floating_point() or a.is_complex()):
        diff = (a.to(torch.float64) - e.to(torch.float64)).abs()
        check.ok = bool(torch.equal(a, e))
    else:
        a64, e64 = a.to(torch.float64), e.to(torch.float64)
        both_nan = torch.isnan(a64) & torch.isnan(e64)
        diff = torch.where(both_nan, torch.zeros_like(a64), (a64 - e64).abs())
        diff = torch.where(torch.isnan(diff), torch.full_like(diff, math.inf), diff)
        check.ok = bool(torch.isclose(a64, e64, rtol=rtol, atol=atol, equal_nan=True).all())
        e = e64
    check.max_abs = float(diff.max())
    nonzero = e.to(torch.float64).abs() > 0
    if bool(nonzero.any()):
        check.max_rel = float((diff[nonzero] / e.to(torch.float64).abs()[nonzero]).max())
    return check


def validation_blocker(record: NodeRecord, backend: str, cpu_code: dict[str, str] | None = None) -> str | None:
    """Why the node cannot be validated here, or None (``cpu_code``: as ``NodeArtifactJob.cpu_code``)."""
    blocked = _blocker(record, backend, cpu_code or {})
    return blocked[1] if blocked else None


def _blocker(record: NodeRecord, backend: str, cpu_code: dict[str, str],
             lowered: frozenset[str] = frozenset()) -> tuple[str, str] | None:
    """(status, reason) when the node cannot be validated here: NEEDS_CUDA when only a CUDA replay is
    missing (what a GPU machine would validate), ERROR otherwise. Segments captured on the CPU run from
    their CPU code (docs/export-cpu.md) when every one has code for this machine. Lowered segments
    (``lowered``) are standard ops and need neither."""
    if not record.samples:
        return ERROR, "no recorded samples to compare with (the node ran only in discovery/capture passes)"
    replayed = [s for s in record.segments if s.id not in lowered]
    if not replayed:
        return None
    cpu_segments = [s for s in replayed if not str(s.device).startswith("cuda")]
    if cpu_segments:
        missing = [f"{s.id} ({s.source}): {cpu_code.get(s.id) or 'none'}" for s in cpu_segments
                   if not cpu_code_runs_here(cpu_code.get(s.id, "none"))]
        if missing:
            return NEEDS_CUDA, (
                f"Warp segment(s) captured on the CPU hold no CPU code for this machine ({'; '.join(missing)}), "
                "so they replay on CUDA devices only and the export cannot run against these samples here "
                "(docs/export-cpu.md)"
            )
        return _library_blocker(backend)
    problem = cuda_problem()
    if problem:
        return NEEDS_CUDA, f"cannot replay Warp segment(s) {[s.id for s in replayed]}: {problem}"
    return _library_blocker(backend)


def _library_blocker(backend: str) -> tuple[str, str] | None:
    from leapp.runtime import libraries

    try:
        libraries.require_library("onnx" if backend == "onnx" else "pt2")
    except LeappError as e:
        return ERROR, str(e)
    return None


def cuda_problem() -> str | None:
    """Why leapp cannot replay on CUDA here (torch sees no device, or leapp's driver loader fails), or None.

    The one test of "is there CUDA for leapp" shared by validation and ``leapp.testing``'s routes.
    """
    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False)"
    try:
        from leapp import _native
    except ImportError as e:
        return f"leapp._native is not importable ({e})"
    status = _native.driver_status()
    if not status["available"]:
        return f"no CUDA driver/device ({status['error']})"
    return None


@dataclass
class NodeArtifactJob:
    """One node to validate: its record (samples, specs), backend and artifact file, and the notes of its
    segments' CPU code (segment id -> the bundle's ``producer.cpu_code``: its machines, or why there is none)."""

    record: NodeRecord
    backend: str
    artifact: Path
    cpu_code: dict[str, str] = field(default_factory=dict)
    lowered: frozenset[str] = frozenset()  # segments written as standard ops (docs/lowering.md)


def validate_node(record: NodeRecord, backend: str, artifact: Path, rtol: float, atol: float,
                  *, timeout: float = VALIDATION_TIMEOUT_S) -> NodeValidation:
    """Runs ``artifact`` on every sample of ``record`` in a fresh process and compares with the eager outputs.

    The artifact needs no pipeline.yaml: its entry is made from the record.
    """
    return validate_nodes([NodeArtifactJob(record, backend, Path(artifact))], rtol, atol, timeout=timeout)[0]


def validate_nodes(jobs: list[NodeArtifactJob], rtol: float, atol: float, *, folder: Path | None = None,
                   timeout: float = VALIDATION_TIMEOUT_S) -> list[NodeValidation]:
    """Validates every node in one fresh worker process (more only after a node crashed it).

    Args:
        jobs: the nodes, in pipeline order.
        folder: the export folder; its pipeline.yaml gives each node's entry (as ``leapp.load`` reads
            it, digests checked). None: entries are made from the records (artifacts not in a pipeline).
        timeout: seconds the worker may spend on one step (loading a node, running a sample) before it
            is stopped and that node fails.
    """
    results = [NodeValidation(j.record.name, PASSED, source=j.record.source, samples=len(j.record.samples))
               for j in jobs]
    runnable = []
    for job, result in zip(jobs, results):
        blocker = _blocker(job.record, job.backend, job.cpu_code, job.lowered)
        if blocker:
            result.status, result.reason = blocker
        else:
            runnable.append(job)
    if not runnable:
        return results
    by_job = {id(job): result for job, result in zip(jobs, results)}
    cache = validation_cache.default_cache()
    keys = _cache_keys(cache, runnable, folder) if cache is not None else {}
    fresh = []
    for job in runnable:
        key = keys.get(id(job))
        outputs = cache.get(key) if key is not None else None
        if outputs is None:
            fresh.append(job)
            continue
        result = by_job[id(job)]
        result.cached = True
        _compare_samples(job.record, outputs, result, rtol, atol)
    if not fresh:
        return results
    for job, outcome in zip(fresh, run_in_fresh_process(fresh, folder, timeout)):
        result = by_job[id(job)]
        if isinstance(outcome, str):
            result.status, result.reason = ERROR, outcome
        else:
            _compare_samples(job.record, outcome, result, rtol, atol)
            if result.status == PASSED and keys.get(id(job)) is not None:  # a failure is always run again
                cache.put(keys[id(job)], outcome)
    return results


def _cache_keys(cache, jobs: list[NodeArtifactJob], folder: Path | None) -> dict[int, object]:
    """id(job) -> its validation cache key, for the jobs whose entry and files can be read here."""
    if folder is not None:
        try:
            description = yaml.load((Path(folder) / "pipeline.yaml").read_bytes(), Loader=_YAML_LOADER)
            entries = {str(e.get("name")): e for e in description.get("nodes") or [] if isinstance(e, dict)}
        except (OSError, yaml.YAMLError, AttributeError):
            return {}
    keys = {}
    for job in jobs:
        entry = entries.get(job.record.name) if folder is not None else job_entry(job)
        key = cache.key(job, entry, folder) if entry is not None else None
        if key is not None:
            keys[id(job)] = key
    return keys


def _compare_samples(record: NodeRecord, outputs: list[list[torch.Tensor]], result: NodeValidation,
                     rtol: float, atol: float) -> None:
    checks = {s.name: OutputCheck(s.name) for s in record.outputs}
    for sample, outs in zip(record.samples, outputs):
        for spec, got, want in zip(record.outputs, outs, sample.outputs):
            _merge(checks[spec.name], compare(spec.name, got, want, rtol, atol))
    result.outputs = list(checks.values())
    bad = [c for c in result.outputs if not c.ok]
    if bad:
        result.status = FAILED
        result.reason = "; ".join(
            f"output '{c.name}' differs from eager (max abs {c.max_abs:.3g}, max rel {c.max_rel:.3g}, "
            f"rtol={rtol:g}, atol={atol:g})" + (f": {c.note}" if c.note else "")
            for c in bad
        )


def _merge(total: OutputCheck, one: OutputCheck) -> None:
    total.max_abs = max(total.max_abs, one.max_abs)
    total.max_rel = max(total.max_rel, one.max_rel)
    total.ok = total.ok and one.ok
    total.note = total.note or one.note


def raise_for_failures(results: list[NodeValidation], report=None) -> None:
    """``ValidationError`` with one reason line per failed node; None if all passed."""
    failed = [r for r in results if not r.ok]
    if not failed:
        return
    lines = [VALIDATION_FAILED.format(count=len(failed), names=[r.node for r in failed])]
    lines += [f"  {r.node}" + (f" ({r.source})" if r.source else "") + f": {r.reason}" for r in failed]
    error = ValidationError("\n".join(lines))
    error.report = report
    error.results = failed
    raise error
