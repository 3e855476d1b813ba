"""leapp/_export/validate_worker.py: runs exported nodes in a fresh interpreter, as ``leapp.load`` does.

``leapp._export.validate_process`` starts ``python -m leapp._export.validate_worker --serve``
and keeps it for later jobs: one line per job on stdin, ``["<job dir>", <first>]``
(JSON); the worker runs it as ``main`` (below) does and then creates
``<job dir>/finished-<first>``; EOF on stdin ends it. For each job its fds 1
and 2 (so native output too) go to ``<job dir>/worker-<first>.log``, between
jobs to /dev/null. A job that does not end cleanly ends the worker (see
``STOPPED``), so only a worker whose last job finished is given another.
``python -m leapp._export.validate_worker <job dir> <first>`` runs one job.
The worker opens each node the way ``leapp.load`` does (pipeline.yaml, the sha256
of every file, ``make_runner``), feeds it the recorded sample inputs and saves
the outputs; the parent compares them with the eager outputs. It imports
neither Warp nor the recorder, so nothing that lives only in the exporting
process (a registered op, a live Warp object, an address that is valid there)
can make a node pass.

Files in <job dir>:

- ``job.pt`` (from the parent): ``{"leapp": <package dir>, "folder": <export folder>,
  "nodes": [{"name", "entry", "samples"}]}``; ``entry`` is the node's
  pipeline.yaml entry, or None to read it from ``<folder>/pipeline.yaml``;
  ``samples`` are lists of CPU input tensors.
- ``progress``: one flushed line per step (``start``, ``load <k>``,
  ``sample <k> <i>``, ``done <k>``), so the parent can name the node and sample
  a crash or a hang happened in; the same lines, prefixed with ``MARK``, go
  to stderr, so the parent can quote what a node printed.
- ``result-<k>.pt``: ``{"outputs": [[tensor, ...] per sample]}`` or
  ``{"error": text, "sample": i or None}``.

Exit status 0 when every node from ``<first>`` on ran; ``STOPPED`` right after
a node raised (without interpreter teardown): a CUDA fault leaves the context
unusable, so the parent goes on with a fresh worker.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

import leapp
from leapp.pipeline_format import CheckedFile, read_checked
from leapp.runtime.io import IOSpec, check_inputs
from leapp.runtime.open_artifact import make_runner
from leapp.runtime.pipeline import read_description

__all__ = ["MARK", "STOPPED", "WRONG_LEAPP", "main", "on_cpu"]

STOPPED = 3  # a node raised; the nodes after it were not run
WRONG_LEAPP = 4  # this interpreter imports another leapp than the exporting process


MARK = "[leapp-validate]"  # prefixes the step lines also written to stderr, where they delimit each node's output


def on_cpu(t: torch.Tensor) -> torch.Tensor:
    """``t`` on the CPU owning just its bytes (``torch.save`` writes a view's whole storage)."""
    t = t.detach().to("cpu")
    if t.is_contiguous() and t.storage_offset() == 0 and t.untyped_storage().nbytes() == t.nbytes:
        return t
    return t.clone(memory_format=torch.contiguous_format)


class _Progress:
    def __init__(self, path: Path) -> None:
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - open for the worker's lifetime

    def close(self) -> None:
        self._file.close()

    def __call__(self, line: str) -> None:
        self._file.write(line + "\n")
        self._file.flush()
        print(f"{MARK} {line}", file=sys.stderr, flush=True)


def _entry(node: dict, folder: Path, description: dict | None) -> tuple[dict, Path | CheckedFile, list]:
    """The node's pipeline.yaml entry, its artifact and its extra files, read and digests checked as ``leapp.load``
    reads and checks them (an artifact outside a pipeline, whose entry the parent made, as paths)."""
    if node["entry"] is not None:
        entry = node["entry"]
        return entry, folder / entry["artifact"], [folder / f["path"] for f in entry.get("files") or []]
    name = node["name"]
    entries = [e for e in description.get("nodes") or [] if str(e.get("name")) == name]
    if not entries:
        raise LookupError(f"pipeline.yaml in {folder} has no node {name!r}")
    entry = entries[0]
    where = f"pipeline '{description.get('name', folder.name)}' node '{name}'"
    artifact = read_checked(folder, entry["artifact"], entry["sha256"], where)
    files = [read_checked(folder, extra["path"], extra["sha256"], where) for extra in entry.get("files") or []]
    return entry, artifact, files


def _run_node(k: int, node: dict, folder: Path, description: dict | None, progress: _Progress) -> dict:
    progress(f"load {k}")
    entry, artifact, files = _entry(node, folder, description)
    where = f"node '{node['name']}'"
    inputs = [IOSpec.from_yaml(e, where) for e in entry.get("inputs") or []]
    outputs = [IOSpec.from_yaml(e, where) for e in entry.get("outputs") or []]
    device = str(entry.get("device", "cpu"))
    runner = make_runner(entry["backend"], artifact, inputs, outputs, device,
                         has_segments=bool(entry.get("segments")), files=files)
    results = []
    for i, sample in enumerate(node["samples"]):
        progress(f"sample {k} {i}")
        try:
            args = check_inputs(inputs, {s.name: t for s, t in zip(inputs, sample)}, where)
            outs = runner(args)
            if device.startswith("cuda"):
                torch.cuda.synchronize(device)  # a fault of this sample surfaces here, not in the next node
            results.append([on_cpu(t) for t in outs])
        except Exception as e:  # noqa: BLE001 - reported to the parent with the sample's index
            return {"error": f"{type(e).__name__}: {e}", "sample": i}
    return {"outputs": results}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    job_dir, first = Path(argv[0]), int(argv[1]) if len(argv) > 1 else 0
    job = torch.load(job_dir / "job.pt", weights_only=True)
    here = str(Path(leapp.__file__).resolve().parent)
    if here != job["leapp"]:
        print(f"leapp validation worker: imported leapp from {here}, the exporting process uses {job['leapp']}",
              file=sys.stderr)
        return WRONG_LEAPP
    progress = _Progress(job_dir / "progress")
    try:
        return _run_job(job, job_dir, first, progress)
    finally:
        progress.close()


def _run_job(job: dict, job_dir: Path, first: int, progress: _Progress) -> int:
    progress("start")
    folder = Path(job["folder"])
    description = None
    if any(node["entry"] is None for node in job["nodes"]):
        try:
            _, description = read_description(folder)
        except Exception as e:  # noqa: BLE001 - every node needs it: each gets the same error
            for k in range(first, len(job["nodes"])):
                torch.save({"error": f"{type(e).__name__}: {e}", "sample": None}, job_dir / f"result-{k}.pt")
            return 0
    for k in range(first, len(job["nodes"])):
        try:
            result = _run_node(k, job["nodes"][k], folder, description, progress)
        except Exception as e:  # noqa: BLE001 - a node that cannot be loaded
            result = {"error": f"{type(e).__name__}: {e}", "sample": None}
        torch.save(result, job_dir / f"result-{k}.pt")
        progress(f"done {k}")
        if "error" in result:
            return STOPPED
    return 0


def _point_output_at(path: str) -> None:
    """Sends fds 1 and 2 (Python's and native code's output alike) to ``path``, appending."""
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    finally:
        os.close(fd)


def warm_up() -> None:
    """What every job would pay first, paid before the first job arrives (the worker may start while the
    exporting process still traces): torch.export's deserializer (seconds of imports), ONNX Runtime, where
    there is a CUDA device the CUDA context, and pipeline.yaml's schema validator (a large part of the
    validation of a small node; figures: benchmarks/results/performance-history.md)."""
    import torch._export.serde.serialize  # the first torch.export.load imports it

    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        pass
    if torch.cuda.is_available():
        torch.cuda.init()
    try:
        from leapp.pipeline_format import reader

        reader.prepare()
    except Exception:  # noqa: BLE001 - the job's own read reports whatever is wrong, with its context
        pass


def serve() -> int:
    """Runs the jobs named on stdin, one at a time, until EOF or a job that did not end cleanly."""
    warm_up()
    for line in sys.stdin:
        job_dir, first = json.loads(line)
        _point_output_at(os.path.join(job_dir, f"worker-{first}.log"))
        status = main([job_dir, str(first)])
        if status != 0:
            return status
        _point_output_at(os.devnull)  # the job's folder is the parent's to delete once it sees the mark
        marker = Path(job_dir) / f"finished-{first}"
        marker.with_suffix(".tmp").touch()
        os.replace(marker.with_suffix(".tmp"), marker)
    return 0


if __name__ == "__main__":
    status = serve() if sys.argv[1:] == ["--serve"] else main()
    if status == STOPPED:
        os._exit(status)  # no interpreter teardown: after a CUDA fault it can crash or hang
    sys.exit(status)
