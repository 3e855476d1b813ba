"""Run a lowered export on the routes issue 48 names, in a fresh process where ``import leapp`` fails.

A lowered export is meant to run where leapp is not installed, so each route runs in a child Python that sets
``sys.modules["leapp"] = None`` before any import and checks that ``import leapp`` then fails. The child is
handed a list of jobs (route, artifact, inputs as .npz, where to write outputs) and runs each one, writing its
outputs as .npz or the traceback as text, so that one job's failure is reported by that job's test only.

Routes: ``ort-cpu`` / ``ort-cuda`` (ONNX Runtime's CPU or CUDA execution provider), ``reference``
(``onnx.reference.ReferenceEvaluator``), ``pt2`` (``torch.export.load`` then ``module()``) and ``aoti-cpu`` /
``aoti-cuda`` (``torch._inductor.aoti_compile_and_package`` of the loaded ExportedProgram, then
``aoti_load_package``). The ``pt2`` job also writes what the loaded graph calls (``graph.json``). leapp's
``.pt2`` stores no example inputs (docs/aoti.md), so the AOTI routes set the job's inputs as the program's
example inputs, as a user compiling it would. A PT2 traced on one device and run on the other (a CUDA trace on
the CPU routes, a CPU trace on ``aoti-cuda``) is first moved with ``torch.export.passes.move_to_device_pass``,
as a user deploying it there would; a program run where it was traced is run as loaded.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

__all__ = ["ONNX_ROUTES", "PT2_ROUTES", "Job", "RouteRun"]

ONNX_ROUTES = ("ort-cpu", "reference", "ort-cuda")
PT2_ROUTES = ("pt2", "aoti-cpu", "aoti-cuda")

_CHILD = textwrap.dedent("""
    import sys
    sys.modules["leapp"] = None  # the export must run where leapp cannot be imported
    try:
        import leapp  # noqa: F401
    except ImportError:
        pass
    else:
        raise SystemExit("import leapp succeeded in the fresh process")
    import json, time, traceback
    from pathlib import Path
    import numpy as np

    class Unavailable(Exception):
        pass

    def onnx_route(route, artifact, arrays):
        import onnx
        model = onnx.load(artifact)
        names = [i.name for i in model.graph.input]
        assert len(names) == len(arrays), (names, len(arrays))
        feeds = dict(zip(names, arrays))
        if route == "reference":
            from onnx.reference import ReferenceEvaluator
            return ReferenceEvaluator(model).run(None, feeds)
        import onnxruntime as ort
        provider = {"ort-cpu": "CPUExecutionProvider", "ort-cuda": "CUDAExecutionProvider"}[route]
        if provider not in ort.get_available_providers():
            raise Unavailable(f"onnxruntime {ort.__version__} has no {provider}")
        session = ort.InferenceSession(artifact, providers=[provider])
        assert session.get_providers()[0] == provider, session.get_providers()
        return session.run(None, feeds)

    programs = {}  # (artifact, device) -> ExportedProgram: a big graph is loaded once for the pt2 and AOTI jobs

    def pt2_route(route, artifact, arrays, workdir, traced_on):
        import torch
        device = "cuda" if route == "aoti-cuda" else "cpu"
        if device == "cuda" and not torch.cuda.is_available():
            raise Unavailable("torch sees no CUDA device")
        if (artifact, device) not in programs:
            program = torch.export.load(artifact)
            if torch.device(traced_on).type != device:  # the pass moves the program in place
                from torch.export.passes import move_to_device_pass
                program = move_to_device_pass(program, device)
            programs[artifact, device] = program
        program = programs[artifact, device]
        args = tuple(torch.from_numpy(a).to(device) for a in arrays)
        if route == "pt2":
            graph = {"targets": sorted({str(n.target) for m in program.graph_module.modules() if hasattr(m, "graph")
                                        for n in m.graph.nodes if n.op == "call_function"}),
                     "uint8": sorted(k for k, t in {**program.state_dict, **program.constants}.items()
                                     if torch.is_tensor(t) and t.dtype == torch.uint8),
                     "user_inputs": len(program.graph_signature.user_inputs)}
            Path(workdir, "graph.json").write_text(json.dumps(graph))  # read by the structure test
            out = program.module()(*args)
        else:
            from torch._inductor import aoti_compile_and_package, aoti_load_package
            program.example_inputs = (args, {})  # leapp's .pt2 stores none (docs/aoti.md)
            package = aoti_compile_and_package(program, package_path=str(Path(workdir) / "model.pt2"))
            out = aoti_load_package(package)(*args)
        out = list(out) if isinstance(out, (tuple, list)) else [out]
        if device == "cuda":
            assert all(t.is_cuda for t in out), [t.device for t in out]
        return [t.detach().cpu().numpy() for t in out]

    for job in json.loads(Path(sys.argv[1]).read_text()):
        start = time.perf_counter()
        try:
            with np.load(job["inputs"]) as saved:
                arrays = [saved[f"arg{i}"] for i in range(len(saved.files))]
            if job["route"] in ("ort-cpu", "ort-cuda", "reference"):
                outs = onnx_route(job["route"], job["artifact"], arrays)
            else:
                outs = pt2_route(job["route"], job["artifact"], arrays, job["workdir"], job["traced_on"])
            np.savez(job["outputs"], *[np.asarray(o) for o in outs])
            status = "ok"
        except Unavailable as why:
            status = f"unavailable: {why}"
        except Exception:  # reported by this job's test
            status = traceback.format_exc()
        Path(job["status"]).write_text(json.dumps({"status": status, "seconds": time.perf_counter() - start}))
""")


@dataclass
class Job:
    """One export run on one route; ``folder`` holds its inputs, outputs, status and AOTI package;
    ``traced_on`` is the device the export was traced on."""

    route: str
    artifact: Path
    inputs: Sequence[np.ndarray]
    folder: Path
    traced_on: str = "cpu"

    def spec(self) -> dict:
        self.folder.mkdir(parents=True, exist_ok=True)
        np.savez(self.folder / "inputs.npz", **{f"arg{i}": np.ascontiguousarray(a) for i, a in enumerate(self.inputs)})
        return {"route": self.route, "artifact": str(self.artifact), "inputs": str(self.folder / "inputs.npz"),
                "outputs": str(self.folder / "outputs.npz"), "status": str(self.folder / "status.json"),
                "workdir": str(self.folder), "traced_on": self.traced_on}


class RouteRun:
    """A fresh process running jobs in order, in the background; ``result(job)`` waits for it and reads that
    job's end. Started early, AOTInductor compiles while this process exports and other tests run."""

    def __init__(self, jobs: Sequence[Job], folder: Path, timeout: float = 600.0) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "jobs.json").write_text(json.dumps([job.spec() for job in jobs]))
        self._log = open(folder / "child.log", "w")  # noqa: SIM115 - the child writes it until wait()
        self._folder, self._timeout, self._start = folder, timeout, time.perf_counter()
        self._process = subprocess.Popen([sys.executable, "-c", _CHILD, str(folder / "jobs.json")], cwd=folder,
                                         stdout=self._log, stderr=subprocess.STDOUT)
        self.returncode: int | None = None
        self.seconds: float | None = None

    def wait(self) -> None:
        if self.returncode is None:
            try:
                self.returncode = self._process.wait(timeout=max(1.0, self._timeout - self.elapsed()))
            except subprocess.TimeoutExpired:
                self._process.kill()
                self.returncode = self._process.wait()
            finally:
                self._log.close()
                self.seconds = self.elapsed()

    def stop(self) -> None:
        """End the child if it still runs (the session ended before its tests asked for it)."""
        if self.returncode is None and self._process.poll() is None:
            self._process.kill()
        self.wait()

    def elapsed(self) -> float:
        return time.perf_counter() - self._start

    def result(self, job: Job) -> tuple[str, list[np.ndarray], float]:
        """(status, outputs, seconds): status "ok", "unavailable: why", or the child's traceback."""
        self.wait()
        status_file = job.folder / "status.json"
        if not status_file.exists():
            log = (self._folder / "child.log").read_text()[-4000:]
            return f"the fresh process ended (rc {self.returncode}) before this job:\n{log}", [], 0.0
        status = json.loads(status_file.read_text())
        if status["status"] != "ok":
            return status["status"], [], status["seconds"]
        with np.load(job.folder / "outputs.npz") as saved:
            outputs = [saved[f"arr_{i}"] for i in range(len(saved.files))]
        return "ok", outputs, status["seconds"]

