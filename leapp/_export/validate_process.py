"""leapp/_export/validate_process.py: run exported nodes in a fresh worker process, survive its crashes.

The parent side of ``leapp._export.validate_worker`` (its docstring has the
protocol). One worker runs every node; when it dies (a signal, a CUDA fault
that aborts, an exit before the node's result) or makes no progress for
``timeout`` seconds, the node it was on gets an error that names the step and
quotes the worker's last output, and a fresh worker goes on with the next node.

A worker whose job finished cleanly is kept (one per exporting process) and
given the next job whose worker would be started the same way (same
interpreter, same environment, same ``leapp``): starting one (importing torch,
ONNX Runtime, CUDA) costs seconds, and test suites compile dozens of times.
Any other worker is killed and never reused; the kept one is killed when this
interpreter exits.

A trace session starts the worker in the background when it begins
(``prestart``, where a CUDA device is present or ``LEAPP_VALIDATION_PRESTART=1``;
``=0`` turns it off): the worker's start (torch, torch.export's deserializer,
ONNX Runtime, the CUDA context: seconds, docs/performance.md) then overlaps with
tracing and export instead of following them, and the first ``compile()``
finds it kept and ready.

NOTE: the worker is ``sys.executable`` with the caller's environment, except
that the directory holding this ``leapp`` is put first on ``PYTHONPATH`` (the
worker checks it imported the same package). Its working directory is an
empty temporary folder and its ``sys.path`` does not have the caller's
additions, so nothing imported or registered only in the exporting process
is there. It runs each node on the device the node was recorded on.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

import leapp
from leapp._export.validate_worker import MARK, on_cpu
from leapp.pipeline_format import dtype_name

__all__ = ["PRESTART_ENV", "VALIDATION_TIMEOUT_S", "WORKER_KEY_IGNORES", "job_entry", "prestart", "run_in_fresh_process",
           "stop_kept_worker", "worker_env"]

PRESTART_ENV = "LEAPP_VALIDATION_PRESTART"  # "1": start the worker when a trace begins; "0": never

VALIDATION_TIMEOUT_S = 600.0  # per step (loading a node, running one sample) of the worker
_STARTUP_S = 300.0  # for the interpreter to import torch and leapp (at least the step timeout)
_TAIL_CHARS = 2000


def _spec(spec) -> dict:
    return {"name": spec.name, "dtype": dtype_name(spec.dtype), "shape": [int(d) for d in spec.shape]}


def job_entry(job) -> dict:
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


def worker_env() -> dict[str, str]:
    env = dict(os.environ)
    root = str(Path(leapp.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([root] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


class _Worker:
    """A ``validate_worker --serve`` process; its startup output goes to ``log`` (the first job's)."""

    def __init__(self, key: tuple, env: dict[str, str], log: Path) -> None:
        global _SPAWNED
        self.key = key
        self.owner = os.getpid()  # a forked child must not kill its parent's worker at its exit
        self.home = Path(tempfile.mkdtemp(prefix="leapp-validate-worker-"))  # empty working directory
        self.extra_dirs: list[Path] = []  # removed with the worker (a prestarted worker's log folder)
        cmd = [sys.executable, "-X", "faulthandler", "-m", "leapp._export.validate_worker", "--serve"]
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(cmd, cwd=self.home, env=env, stdin=subprocess.PIPE, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        with _LOCK:
            _SPAWNED += 1
            _LIVE.add(self)

    def send(self, job_dir: Path, first: int) -> bool:
        """Hands it a job; False when it has already exited."""
        try:
            self.proc.stdin.write((json.dumps([str(job_dir), first]) + "\n").encode())
            self.proc.stdin.flush()
            return True
        except OSError:
            return False

    def kill(self) -> None:
        if os.getpid() != self.owner:
            return
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        shutil.rmtree(self.home, ignore_errors=True)
        for folder in self.extra_dirs:
            shutil.rmtree(folder, ignore_errors=True)
        with _LOCK:
            _LIVE.discard(self)


_LOCK = threading.Lock()
_KEPT: _Worker | None = None  # idle, its last job finished cleanly; a job takes it out while it runs
_LIVE: set[_Worker] = set()  # every worker not yet killed, for the exit handler
_SPAWNED = 0  # workers started by this process (how the tests see reuse)


def _take(key: tuple) -> _Worker | None:
    """The kept worker when it was started with ``key`` and is alive; else None (and it is killed)."""
    global _KEPT
    with _LOCK:
        worker, _KEPT = _KEPT, None
    if worker is not None and (worker.key != key or worker.proc.poll() is not None):
        worker.kill()
        worker = None
    return worker


def _keep(worker: _Worker) -> None:
    global _KEPT
    with _LOCK:
        if _KEPT is None:
            _KEPT, worker = worker, None
    if worker is not None:  # another thread's worker is kept already
        worker.kill()


def stop_kept_worker() -> None:
    """Kills the kept worker, if any: the next validation starts a fresh one."""
    global _KEPT
    with _LOCK:
        worker, _KEPT = _KEPT, None
    if worker is not None:
        worker.kill()


@atexit.register
def _kill_all() -> None:
    with _LOCK:
        workers = list(_LIVE)
    for worker in workers:
        worker.kill()


# Variables that change without changing what a worker does: torch writes TORCHINDUCTOR_CACHE_DIR into
# os.environ on the export's first use (its own default, which a fresh worker computes alike), after a worker
# may have been started; pytest sets PYTEST_CURRENT_TEST to the running test's name, so in a test suite every
# test would otherwise start a worker of its own (seconds each) instead of taking the kept one.
WORKER_KEY_IGNORES = frozenset({"TORCHINDUCTOR_CACHE_DIR", "PYTEST_CURRENT_TEST"})


def _worker_key(env: dict[str, str]) -> tuple:
    """What a kept worker must have been started with to take a job: interpreter, environment, leapp."""
    kept = tuple(sorted((k, v) for k, v in env.items() if k not in WORKER_KEY_IGNORES))
    return (sys.executable, kept, str(Path(leapp.__file__).resolve().parent))


def prestart() -> bool:
    """Starts the validation worker in the background and keeps it, unless one is kept already or
    ``LEAPP_VALIDATION_PRESTART`` says no (default: yes where torch sees a CUDA device). True when started.

    Its start-up output goes to a file in its own folder; a worker that dies starting is found dead by
    the next job, which then starts a fresh one that reports with the job's log."""
    setting = os.environ.get(PRESTART_ENV, "").strip()
    if setting == "0" or (setting != "1" and not torch.cuda.is_available()):
        return False
    with _LOCK:
        if _KEPT is not None:
            return False
    env = worker_env()
    log = Path(tempfile.mkdtemp(prefix="leapp-validate-prestart-")) / "worker.log"
    worker = _Worker(_worker_key(env), env, log)
    worker.extra_dirs.append(log.parent)
    _keep(worker)
    return True


class _Run:
    """One job for a worker: the nodes from ``first`` on."""

    def __init__(self, job_dir: Path, first: int, timeout: float) -> None:
        self.job_dir = job_dir
        self.first = first
        self.timeout = timeout
        self.progress = job_dir / "progress"
        self.log = job_dir / f"worker-{first}.log"
        self.finished = job_dir / f"finished-{first}"
        self.returncode: int | None = None
        self.timed_out = False

    def run(self) -> None:
        env = worker_env()
        key = _worker_key(env)
        worker = _take(key)
        if worker is not None:
            self.log.write_bytes(b"")
            if self._attempt(worker) or self.steps() or self.timed_out:
                return
            # the kept worker exited before it took the job (killed while idle): not this job's doing
        self.log.write_bytes(b"")
        self._attempt(_Worker(key, env, self.log))

    def _attempt(self, worker: _Worker) -> bool:
        """Runs the job on ``worker``: True when it finished cleanly (then the worker is kept)."""
        self.progress.write_text("")
        self.returncode, self.timed_out = None, False
        done = False
        try:
            if worker.send(self.job_dir, self.first):
                done = self._wait(worker.proc)
            else:
                worker.proc.wait()
        finally:
            if done:
                _keep(worker)
            else:  # failed, timed out, or the caller was interrupted: the worker goes and is never reused
                worker.kill()
        self.returncode = worker.proc.returncode
        return done

    def _wait(self, proc: subprocess.Popen) -> bool:
        """Until the job finished (True), the worker exits, or its current step has taken ``timeout``
        (starting up: ``_STARTUP_S``)."""
        seen, deadline = 0, time.monotonic() + max(self.timeout, _STARTUP_S)
        while True:
            if self.finished.exists():
                return True
            try:
                proc.wait(timeout=0.2)
                return False
            except subprocess.TimeoutExpired:
                size = self.progress.stat().st_size if self.progress.exists() else 0
                if size != seen:
                    seen, deadline = size, time.monotonic() + self.timeout
                elif time.monotonic() >= deadline:
                    self.timed_out = True
                    return False

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
            "entry": None if folder is not None else job_entry(job),
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
