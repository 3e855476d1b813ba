"""leapp/_export/validate_process.py: run exported nodes in a fresh worker process, survive its crashes.

The parent side of ``leapp._export.validate_worker`` (its docstring has the
protocol). One worker runs every node; when it dies (a signal, a CUDA fault
that aborts, an exit before the node's result) or makes no progress for
``timeout`` seconds, the node it was on gets an error that names the step and
quotes the worker's last output, and a fresh worker goes on with the next node.

NOTE: the worker is ``sys.executable`` with the caller's environment, except
that the directory holding this ``leapp`` is put first on ``PYTHONPATH`` (the
worker checks it imported the same package). Its working directory is an
empty temporary folder and its ``sys.path`` does not have the caller's
additions, so nothing imported or registered only in the exporting process
is there. It runs each node on the device the node was recorded on.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import leapp
from leapp._export.validate_worker import MARK, on_cpu
from leapp.runtime.pipeline import dtype_name

__all__ = ["VALIDATION_TIMEOUT_S", "run_in_fresh_process"]

VALIDATION_TIMEOUT_S = 600.0  # per step (loading a node, running one sample) of the worker
_STARTUP_S = 300.0  # for the interpreter to import torch and leapp (at least the step timeout)
_TAIL_CHARS = 2000


def _spec(spec) -> dict:
    return {"name": spec.name, "dtype": dtype_name(spec.dtype), "shape": [int(d) for d in spec.shape]}


def _entry(job) -> dict:
    """A pipeline.yaml-like entry for an artifact outside a pipeline folder."""
    record = job.record
    first = record.samples[0].inputs if record.samples else []
    return {
        "name": record.name,
        "backend": job.backend,
        "artifact": str(Path(job.artifact).resolve()),
        "inputs": [_spec(s) for s in record.inputs],
        "outputs": [_spec(s) for s in record.outputs],
        "device": str(first[0].device) if first else "cpu",
        "segments": [s.id for s in record.segments],
    }


def _worker_env() -> dict[str, str]:
    env = dict(os.environ)
    root = str(Path(leapp.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([root] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


class _Run:
    """One worker process, from node ``first`` on."""

    def __init__(self, job_dir: Path, first: int, timeout: float) -> None:
        self.job_dir = job_dir
        self.first = first
        self.timeout = timeout
        self.progress = job_dir / "progress"
        self.log = job_dir / f"worker-{first}.log"
        self.returncode: int | None = None
        self.timed_out = False

    def run(self) -> None:
        self.progress.write_text("")
        cmd = [sys.executable, "-X", "faulthandler", "-m", "leapp._export.validate_worker",
               str(self.job_dir), str(self.first)]
        with open(self.log, "wb") as log:
            proc = subprocess.Popen(cmd, cwd=self.job_dir, env=_worker_env(), stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                self._wait(proc)
            finally:
                if proc.poll() is None:  # timed out, or the caller was interrupted: the worker goes too
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        self.returncode = proc.returncode

    def _wait(self, proc: subprocess.Popen) -> None:
        """Until the worker exits, or its current step has taken ``timeout`` (starting up: ``_STARTUP_S``)."""
        seen, deadline = 0, time.monotonic() + max(self.timeout, _STARTUP_S)
        while True:
            try:
                proc.wait(timeout=0.2)
                return
            except subprocess.TimeoutExpired:
                size = self.progress.stat().st_size if self.progress.exists() else 0
                if size != seen:
                    seen, deadline = size, time.monotonic() + self.timeout
                elif time.monotonic() >= deadline:
                    self.timed_out = True
                    return

    def steps(self) -> list[str]:
        if not self.progress.exists():
            return []
        return self.progress.read_text(encoding="utf-8", errors="replace").splitlines()

    def ending(self) -> str:
        if self.timed_out and not self.steps():
            return f"did not start within {max(self.timeout, _STARTUP_S):g} s and was stopped"
        if self.timed_out:
            return f"made no progress for {self.timeout:g} s and was stopped"
        code = self.returncode
        if code is not None and code < 0:
            try:
                return f"was killed by signal {signal.Signals(-code).name}"
            except ValueError:
                return f"was killed by signal {-code}"
        return f"exited with status {code}"

    def output(self, k: int | None = None) -> str:
        """The worker's output (from node ``k`` on, when given), indented, its last ``_TAIL_CHARS`` only."""
        text = self.log.read_text(encoding="utf-8", errors="replace") if self.log.exists() else ""
        if k is not None:
            start = text.rfind(f"{MARK} load {k}\n")
            text = text[start:] if start >= 0 else text
        lines = [line for line in text.splitlines() if line.strip() and not line.startswith(MARK)]
        kept, size = [], 0
        for line in reversed(lines):  # whole lines, the last ones, about _TAIL_CHARS in all
            if kept and size + len(line) > _TAIL_CHARS:
                break
            kept.append("    " + line[-_TAIL_CHARS:])
            size += len(line)
        return "\n".join(reversed(kept)) if kept else "    (nothing)"


_WORKER = ("the fresh validation process (python -m leapp._export.validate_worker, "
           "which loads the export as leapp.load does)")


def _step_text(step: str, artifact: Path) -> str:
    parts = step.split()
    if parts and parts[0] == "sample":
        return f"while running {artifact.name} on sample {parts[2]}"
    return f"while loading {artifact.name}"


def _outcome(result: dict, job, output: str) -> list[list[torch.Tensor]] | str:
    name = Path(job.artifact).name
    if "error" in result:
        if result.get("sample") is None:
            what = f"could not load {name} in a fresh process: {result['error']}"
        else:
            what = f"running {name} on sample {result['sample']} in a fresh process failed: {result['error']}"
        return f"{what}\n  output of the validation process for this node:\n{output}"
    outputs = result.get("outputs")
    if not isinstance(outputs, list) or len(outputs) != len(job.record.samples):
        return f"{_WORKER} returned {len(outputs or [])} result(s) for {len(job.record.samples)} sample(s) of {name}"
    return outputs


def run_in_fresh_process(jobs: list, folder: Path | None, timeout: float = VALIDATION_TIMEOUT_S
                         ) -> list[list[list[torch.Tensor]] | str]:
    """Per job (``validate.NodeArtifactJob``): the outputs of every sample (CPU tensors), or why there are none.

    ``folder``: the export folder whose pipeline.yaml describes every job's node, or None.
    """
    outcomes: list[list[list[torch.Tensor]] | str | None] = [None] * len(jobs)
    with tempfile.TemporaryDirectory(prefix="leapp-validate-") as tmp:
        job_dir = Path(tmp)
        nodes = [{
            "name": job.record.name,
            "entry": None if folder is not None else _entry(job),
            "samples": [[on_cpu(t) for t in sample.inputs] for sample in job.record.samples],
        } for job in jobs]
        torch.save({"leapp": str(Path(leapp.__file__).resolve().parent),
                    "folder": str(Path(folder).resolve()) if folder is not None else "/",
                    "nodes": nodes}, job_dir / "job.pt")
        first = 0
        while first < len(jobs):
            run = _Run(job_dir, first, timeout)
            run.run()
            for k in range(first, len(jobs)):
                path = job_dir / f"result-{k}.pt"
                if outcomes[k] is None and path.is_file():
                    outcomes[k] = _outcome(torch.load(path, weights_only=True), jobs[k], run.output(k))
            pending = [k for k in range(first, len(jobs)) if outcomes[k] is None]
            if not pending:
                break
            steps = run.steps()
            if not steps:  # it never got to the first node: the same would happen to every node
                reason = f"{_WORKER} {run.ending()} before running any node; its output:\n{run.output()}"
                for k in pending:
                    outcomes[k] = reason
                break
            stuck = pending[0]  # the worker runs nodes in order: the first without a result is where it ended
            mine = [s for s in steps if s.split()[1:2] == [str(stuck)]]
            if not mine and stuck > first:
                # it ended between two nodes: stopped on purpose after a node's error (STOPPED, that error is
                # recorded) or died while exiting; the next node was not started and gets a fresh worker
                first = stuck
                continue
            step = _step_text(mine[-1], Path(jobs[stuck].artifact)) if mine else "before loading it"
            outcomes[stuck] = f"{_WORKER} {run.ending()} {step}; its last output:\n{run.output(stuck)}"
            first = stuck + 1
    return outcomes
