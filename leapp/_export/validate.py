"""leapp/_export/validate.py: exported artifacts, run by the real runtime, against the eager samples.

Each node's artifact is opened with the runner ``leapp.load`` uses
(``leapp.runtime.pipeline.make_runner``) and fed every recorded sample's
inputs; outputs must match the eager outputs within ``rtol``/``atol``
(``torch.isclose`` semantics, NaN equal to NaN).

NOTE: a node with Warp segments can only be checked where the native runtime
can replay them: a CUDA device, segments captured on CUDA, and the op
library. When any is missing validation cannot run, and that is a failure
(DESIGN.md section 2), never a silent pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

from leapp._recorder.model import NodeRecord
from leapp.errors import VALIDATION_FAILED, LeappError, ValidationError

__all__ = [
    "OutputCheck",
    "NodeValidation",
    "compare",
    "validate_node",
    "raise_for_failures",
    "validation_blocker",
]

PASSED = "passed"
FAILED = "failed"  # ran, outputs differ
ERROR = "error"  # could not run
SKIPPED = "skipped"  # validate=False


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


def validation_blocker(record: NodeRecord, backend: str) -> str | None:
    """Why the node cannot be validated here, or None."""
    if not record.samples:
        return "no recorded samples to compare with (the node ran only in discovery/capture passes)"
    if not record.segments:
        return None
    cpu_segments = [f"{s.id} ({s.source})" for s in record.segments if not str(s.device).startswith("cuda")]
    if cpu_segments:
        return (
            f"Warp segment(s) {cpu_segments} were captured on the CPU; leapp's runtime replays segments "
            "on CUDA devices only, so the export cannot run against these samples"
        )
    if not _cuda_usable():
        return f"no CUDA device/driver to replay Warp segment(s) {[s.id for s in record.segments]}: {_driver_error()}"
    from leapp.runtime import libraries

    try:
        libraries.require_library("onnx" if backend == "onnx" else "pt2")
    except LeappError as e:
        return str(e)
    return None


def _cuda_usable() -> bool:
    if not torch.cuda.is_available():
        return False
    try:
        from leapp import _native

        return bool(_native.driver_status()["available"])
    except ImportError:
        return False


def _driver_error() -> str:
    try:
        from leapp import _native

        status = _native.driver_status()
        if not status["available"]:
            return str(status["error"])
    except ImportError as e:
        return f"leapp._native is not importable ({e})"
    return "torch.cuda.is_available() is False"


def validate_node(record: NodeRecord, backend: str, artifact: Path, rtol: float, atol: float) -> NodeValidation:
    """Runs ``artifact`` on every sample of ``record`` and compares with the eager outputs."""
    from leapp.runtime.pipeline import IOSpec, make_runner

    result = NodeValidation(record.name, PASSED, source=record.source, samples=len(record.samples))
    blocker = validation_blocker(record, backend)
    if blocker:
        result.status, result.reason = ERROR, blocker
        return result
    device = str(record.samples[0].inputs[0].device) if record.samples[0].inputs else "cpu"
    try:
        runner = make_runner(
            backend,
            artifact,
            [IOSpec(s.name, s.dtype, tuple(s.shape)) for s in record.inputs],
            [IOSpec(s.name, s.dtype, tuple(s.shape)) for s in record.outputs],
            device,
            has_segments=bool(record.segments),
        )
    except Exception as e:  # any load failure means the artifact is not usable
        result.status, result.reason = ERROR, f"could not load {artifact.name}: {type(e).__name__}: {e}"
        return result
    checks = {s.name: OutputCheck(s.name) for s in record.outputs}
    for i, sample in enumerate(record.samples):
        try:
            outs = runner(list(sample.inputs))
        except Exception as e:
            result.status, result.reason = ERROR, f"running {artifact.name} on sample {i} failed: {type(e).__name__}: {e}"
            return result
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
    return result


def _merge(total: OutputCheck, one: OutputCheck) -> None:
    total.max_abs = max(total.max_abs, one.max_abs)
    total.max_rel = max(total.max_rel, one.max_rel)
    total.ok = total.ok and one.ok
    total.note = total.note or one.note


def raise_for_failures(results: list[NodeValidation], report=None) -> None:
    """``ValidationError`` with DESIGN.md's text and one reason line per failed node; None if all passed."""
    failed = [r for r in results if not r.ok]
    if not failed:
        return
    lines = [VALIDATION_FAILED.format(count=len(failed), names=[r.node for r in failed])]
    lines += [f"  {r.node}" + (f" ({r.source})" if r.source else "") + f": {r.reason}" for r in failed]
    error = ValidationError("\n".join(lines))
    error.report = report
    error.results = failed
    raise error
