"""leapp/testing/cpp_runner.py: the ``cpp-runner`` route: an export run by ``leapp-run``, leapp's C++ runner.

Each call writes its inputs as raw files, runs ``leapp-run`` in a child process (no Python there:
``libleapp_pipeline.so``, ONNX Runtime's C API, PT2 nodes from their AOTInductor packages) and reads
the outputs back, so the comparison sees exactly what a C++ deployment computes. One process per
call costs tens of milliseconds (ONNX Runtime and the packages are opened each time): fine for a
few hundred examples, and the price of testing the real program rather than a binding of it.

The child gets ``LEAPP_ONNXRUNTIME_LIBRARY`` = the onnxruntime this Python imports, unless the
caller set it: both sides then run the same ONNX Runtime build.

An export with state is run a sequence at a time: ``run_steps`` writes every step's inputs one
after another and runs ``leapp-run --steps K`` in one process, which carries the state from its
initial values through the steps (docs/deploy.md, "State").
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path

import torch

from leapp.pipeline_format import PipelineError
from leapp.runtime.io import IOSpec, check_inputs
from leapp.runtime.pipeline import NodeDescription

__all__ = ["LeappRunPipeline", "leapp_run_path", "leapp_run_blockers", "leapp_run_device", "leapp_run_env",
           "value_file"]

TIMEOUT_S = 600


def leapp_run_path() -> Path | None:
    """``leapp-run`` next to this Python (the install's scripts folder), else on ``PATH``; None if not built."""
    beside = Path(sys.executable).with_name("leapp-run")
    if beside.is_file():
        return beside
    found = shutil.which("leapp-run")
    return Path(found) if found else None


def leapp_run_env() -> dict[str, str]:
    """This process's environment with ``LEAPP_ONNXRUNTIME_LIBRARY`` = the onnxruntime Python imports, unless set."""
    from leapp.runtime.libraries import onnxruntime_library

    env = dict(os.environ)
    if not env.get("LEAPP_ONNXRUNTIME_LIBRARY"):
        try:
            env["LEAPP_ONNXRUNTIME_LIBRARY"] = str(onnxruntime_library())
        except (ImportError, FileNotFoundError):
            pass  # leapp-run searches on its own and says what it tried
    return env


def value_file(folder: Path, name: str) -> Path:
    """``folder/<name>.bin`` for a value named by the (untrusted) export; leapp-run's own rule and words
    (``file_for`` in ext/pipeline/tools/leapp_run.cpp): one plain name, never a path."""
    if name in ("", ".", "..") or "/" in name or "\0" in name:
        raise PipelineError(f"the export names a value '{name}', which cannot be a file name in {folder}")
    return folder / f"{name}.bin"


def _is_cuda(device: str) -> bool:
    return torch.device(device).type == "cuda"


def leapp_run_device(desc: Mapping) -> str:
    """``--device`` for the export: ``cuda`` (device buffers, ONNX Runtime's CUDA EP) when a node was
    exported on CUDA, else ``cpu`` (host buffers, the CPU EP)."""
    return "cuda" if any(_is_cuda(n["device"]) for n in desc["nodes"]) else "cpu"


@lru_cache(maxsize=4)
def _runs_sequences(binary: Path) -> bool:
    """Whether this ``leapp-run`` takes ``--steps K`` (a sequence in one process, state carried)."""
    try:
        r = subprocess.run([str(binary), "--help"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "--steps" in r.stdout


def leapp_run_blockers(desc: Mapping) -> list[str]:
    """Why ``leapp-run`` cannot run this export whatever the machine (it refuses these at open)."""
    reasons = []
    binary = leapp_run_path()
    if binary is None:
        reasons.append("leapp-run was not built (ONNX Runtime's headers were missing when leapp was built: "
                       "docs/deploy.md, 'The C++ pipeline runner')")
    state = [f"{e['to_node']}/{e['to_input']}" for e in desc["edges"] if e.get("state", False)]
    if state and binary is not None and not _runs_sequences(binary):
        reasons.append(f"the export carries state ({', '.join(state)}), and this leapp-run ({binary}) has no "
                       "--steps to run a sequence in one process, carrying the state: rebuild leapp")
    for node in desc["nodes"]:
        if node["backend"] == "torchscript":
            reasons.append(f"node '{node['name']}' is TorchScript, which the C++ runner does not run")
        elif node["backend"] == "pt2" and not node.get("aoti"):
            reasons.append(f"PT2 node '{node['name']}' has no AOTInductor package; the C++ runner runs PT2 nodes "
                           f"from one (`leapp aoti EXPORT_DIR {node['name']}` makes it)")
    return reasons


def _specs(entries, where: str) -> list[IOSpec]:
    return [IOSpec.from_yaml(e, where) for e in entries]


class LeappRunPipeline:
    """An export folder run by ``leapp-run``: ``run(**inputs)`` and ``run_node(node, **inputs)`` like ``leapp.load``'s."""

    def __init__(self, folder: Path, desc: Mapping) -> None:
        self.folder, self.description = Path(folder), desc
        self.name = desc["name"]
        self.device = leapp_run_device(desc)
        self.binary = leapp_run_path()
        if self.binary is None:
            raise PipelineError("; ".join(leapp_run_blockers(desc)))
        where = f"pipeline '{self.name}'"
        self.inputs = _specs(desc["inputs"], where)
        self.outputs = _specs(desc["outputs"], where)
        self.nodes = {
            n["name"]: NodeDescription(n["name"], n["backend"], self.folder / n["artifact"],
                                  _specs(n["inputs"], f"{where} node '{n['name']}'"),
                                  _specs(n["outputs"], f"{where} node '{n['name']}'"), list(n["segments"]))
            for n in desc["nodes"]
        }
        self._leapp_run("--check")  # the wiring and every artifact's sha256, as leapp-run reads them

    def _leapp_run(self, *args: str) -> str:
        cmd = [str(self.binary), str(self.folder), *args]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, env=leapp_run_env(), timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise PipelineError(f"leapp-run did not finish within {TIMEOUT_S} s: {' '.join(cmd)}") from None
        if r.returncode != 0:
            raise PipelineError(f"leapp-run exited with {r.returncode}: {r.stderr.strip() or r.stdout.strip()}")
        return r.stdout

    def _call(self, where: str, in_specs: list[IOSpec], out_specs: list[IOSpec], values: Mapping,
              *extra: str) -> dict[str, torch.Tensor]:
        return self._calls(where, in_specs, out_specs, [values], *extra)[0]

    def _calls(self, where: str, in_specs: list[IOSpec], out_specs: list[IOSpec], steps: Sequence[Mapping],
               *extra: str) -> list[dict[str, torch.Tensor]]:
        """One leapp-run process; more than one step: ``--steps K``, the files holding the steps one after another."""
        checked = [check_inputs(in_specs, values, where if len(steps) == 1 else f"{where} step {i}")
                   for i, values in enumerate(steps, 1)]  # leapp.load's checks and texts: leapp-run sees bytes only
        device = next((t.device for t in checked[0] if t.device.type == "cuda"), torch.device("cpu"))
        with tempfile.TemporaryDirectory(prefix="leapp-run-") as work:
            in_dir, out_dir = Path(work, "in"), Path(work, "out")
            in_dir.mkdir()
            for i, spec in enumerate(in_specs):
                value_file(in_dir, spec.name).write_bytes(b"".join(_raw(tensors[i]) for tensors in checked))
            # dynamic batch: the call's batch (check_inputs made every batched input agree)
            batch = next((int(t.shape[0]) for s, t in zip(in_specs, checked[0]) if s.batch is not None), None)
            if batch is not None:
                extra = (*extra, "--batch", str(batch))
            if len(steps) > 1:
                extra = (*extra, "--steps", str(len(steps)))
            self._leapp_run("--in", str(in_dir), "--out", str(out_dir), "--device", self.device, *extra)
            data = {spec.name: value_file(out_dir, spec.name).read_bytes() for spec in out_specs}
        outs = []
        for k in range(len(steps)):
            outs.append({spec.name: _tensor(_step_bytes(data[spec.name], len(steps), k, spec), spec, batch).to(device)
                         for spec in out_specs})
        return outs

    def run(self, **inputs) -> dict[str, torch.Tensor]:
        """One step in a new process: an export with state runs it from its initial values (``run_steps``
        carries the state through a sequence)."""
        return self._call(f"pipeline '{self.name}'", self.inputs, self.outputs, inputs)

    def run_steps(self, steps: Sequence[Mapping]) -> list[dict[str, torch.Tensor]]:
        """The steps in order in one ``leapp-run --steps K`` process, from the initial state; each step's outputs."""
        if not steps:
            return []
        return self._calls(f"pipeline '{self.name}'", self.inputs, self.outputs, steps)

    def reset(self) -> None:
        """Nothing to do: every ``run`` / ``run_steps`` is a new process, which starts from the initial state."""

    def run_node(self, node: str, **inputs) -> dict[str, torch.Tensor]:
        if node not in self.nodes:
            raise PipelineError(f"pipeline '{self.name}': no node '{node}' (nodes: {list(self.nodes)})")
        spec = self.nodes[node]
        return self._call(f"pipeline '{self.name}' node '{node}'", spec.inputs, spec.outputs, inputs, "--node", node)


def _raw(t: torch.Tensor) -> bytes:
    """C-order bytes of ``t`` (little-endian, as leapp-run reads them; every dtype incl. bfloat16)."""
    flat = t.detach().to("cpu").contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""


def _step_bytes(data: bytes, steps: int, k: int, spec: IOSpec) -> bytes:
    """Step ``k``'s bytes of an output file holding ``steps`` steps one after another."""
    if len(data) % steps:
        raise PipelineError(f"leapp-run wrote {len(data)} bytes for output '{spec.name}' over {steps} steps, not a "
                            f"whole number per step ({spec.describe()})")
    size = len(data) // steps
    return data[k * size:(k + 1) * size]


def _tensor(data: bytes, spec: IOSpec, batch: int | None = None) -> torch.Tensor:
    shape = tuple(spec.shape)
    if batch is not None and spec.batch is not None and shape:
        shape = (batch,) + shape[1:]
    expected = spec.dtype.itemsize * int(torch.Size(shape).numel())
    if len(data) != expected:
        raise PipelineError(f"leapp-run wrote {len(data)} bytes for output '{spec.name}', expected {expected} "
                            f"({spec.describe()})")
    if not data:
        return torch.empty(shape, dtype=spec.dtype)
    return torch.frombuffer(bytearray(data), dtype=spec.dtype).reshape(shape)
