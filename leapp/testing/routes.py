"""leapp/testing/routes.py: the ways an export can be run, and which of them can run here.

A route is one concrete way of running the export folder; ``assert_equivalent``
compares the eager code with each route that can run on this machine. Which
runner serves a node under a route follows ``leapp.load``'s own rules, so a
route that would run exactly what another selected route runs is skipped as
a duplicate, with the reason. An export with state (docs/testing.md, "Exports
with state") is run as sequences of steps: ``OpenRoute.reset`` restores its
initial state before each sequence.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from leapp.bundle.format import segment_runs_on_this_cpu

from leapp._export.validate import cuda_problem  # the shared test: is there CUDA for leapp here

__all__ = ["ROUTES", "Route", "OpenRoute", "plan_routes", "open_route", "state_keys"]


@dataclass(frozen=True)
class Route:
    """One way of running an export: ``leapp.runtime.pipeline.load`` options, or the C++ runner."""

    name: str
    description: str
    cuda_graphs: bool = False
    onnx_ep: str | None = None
    native: bool = False  # leapp-run, the C++ runner (leapp.testing.cpp_runner)


ROUTES: dict[str, Route] = {
    r.name: r
    for r in (
        Route("load", "leapp.load(folder): every node on its recorded device; an ONNX node recorded on CUDA on "
                      "ONNX Runtime's CUDA EP when it has one"),
        Route("load-cuda-graphs", "leapp.load(folder, cuda_graphs=True): CUDA PT2 nodes replayed from captured "
                                  "CUDA graphs (inputs copied into fixed tensors, as a control loop does)",
              cuda_graphs=True),
        Route("onnx-cpu-ep", "ONNX nodes on ONNX Runtime's CPU EP (load(..., onnx_ep='cpu')); other nodes as 'load'",
              onnx_ep="cpu"),
        Route("onnx-cuda-ep", "ONNX nodes on ONNX Runtime's CUDA EP (load(..., onnx_ep='cuda')); other nodes as "
                              "'load'", onnx_ep="cuda"),
        Route("cpp-runner", "leapp-run, leapp's C++ pipeline runner, in a child process without Python: device "
                            "buffers and ONNX Runtime's CUDA EP when a node was exported on CUDA, else host buffers "
                            "and the CPU EP; PT2 nodes from their AOTInductor packages", native=True),
    )
}


def state_keys(desc: Mapping) -> list[str]:
    """The export's state as ``"node/input"`` keys (its ``state: true`` edges), in pipeline.yaml order."""
    return [f"{e['to_node']}/{e['to_input']}" for e in desc["edges"] if e.get("state", False)]


def _ort_providers() -> list[str]:
    import onnxruntime as ort

    return list(ort.get_available_providers())


def _is_cuda(device: str) -> bool:
    return torch.device(device).type == "cuda"


def _node_plan(route: Route, node: Mapping, providers: list[str]) -> tuple:
    """What serves ``node`` under ``route`` (backend, device, execution provider, CUDA graphs)."""
    if route.native:
        return ("leapp-run", node["name"])  # another program: never a duplicate of a leapp.load route
    device = node["device"]
    if node["backend"] == "onnx":
        from leapp.runtime.open_artifact import onnx_ep_device

        device = onnx_ep_device(device, route.onnx_ep)
        ep = "cuda" if _is_cuda(device) and "CUDAExecutionProvider" in providers else "cpu"
        return ("onnx", node["name"], ep)
    return (node["backend"], node["name"], device, route.cuda_graphs and _is_cuda(device))


def _blocker(route: Route, desc: Mapping, cuda: str | None, providers: list[str]) -> str | None:
    """Why ``route`` cannot run this export here (every reason, joined), or None."""
    nodes = desc["nodes"]
    reasons = []
    if route.native:
        from .cpp_runner import leapp_run_blockers, leapp_run_device

        reasons.extend(leapp_run_blockers(desc))
        if reasons:
            return "; ".join(reasons)
    if route.onnx_ep and not any(n["backend"] == "onnx" for n in nodes):
        return "the export has no ONNX node"
    if route.cuda_graphs and not any(n["backend"] == "pt2" and _is_cuda(n["device"]) for n in nodes):
        return "no PT2 node was exported on CUDA, so cuda_graphs=True changes nothing"
    cpu_segments = [f"{s['id']} ({s['source']})" for n in nodes for s in n["segments"]
                    if not _is_cuda(s["device"]) and not segment_runs_on_this_cpu(s)]
    if cpu_segments:
        reasons.append(f"Warp segment(s) {cpu_segments} were captured on the CPU and hold no CPU code for this "
                       "machine, so they replay on CUDA devices only (docs/export-cpu.md)")
    if cuda:
        needs = []
        # a segment needs CUDA where its node runs on CUDA, or where it has no CPU code for this machine
        segments = [s["id"] for n in nodes for s in n["segments"] if _node_on_cuda(route, n, desc, providers)
                    or not segment_runs_on_this_cpu(s)]
        if segments:
            needs.append(f"Warp segment(s) {segments}")
        needs.extend(f"node '{n['name']}' ({n['backend']}, exported on {n['device']})" for n in nodes
                     if n["backend"] != "onnx" and _is_cuda(n["device"]))
        needs.extend(f"ONNX node '{n['name']}' on ONNX Runtime's CUDA EP" for n in nodes
                     if n["backend"] == "onnx" and _onnx_on_cuda(route, n, desc, providers))
        if route.cuda_graphs:
            needs.append("CUDA graphs")
        if route.onnx_ep == "cuda" and not any("CUDA EP" in x for x in needs):
            needs.append("ONNX Runtime's CUDA EP")
        if needs:
            reasons.append(f"CUDA is needed for {', '.join(needs)}, and here there is {cuda}")
    if route.onnx_ep == "cuda" and "CUDAExecutionProvider" not in providers:
        reasons.append(f"ONNX Runtime has no CUDAExecutionProvider here (available: {providers})")
    if (route.native and leapp_run_device(desc) == "cuda" and any(n["backend"] == "onnx" for n in nodes)
            and "CUDAExecutionProvider" not in providers):
        reasons.append("leapp-run runs ONNX nodes on ONNX Runtime's CUDA EP with device buffers, and this "
                       f"onnxruntime has no CUDAExecutionProvider (available: {providers}; install onnxruntime-gpu)")
    return "; ".join(reasons) or None


def _node_on_cuda(route: Route, node: Mapping, desc: Mapping, providers: list[str]) -> bool:
    """Whether ``route`` runs ``node`` on a CUDA device."""
    if node["backend"] == "onnx":
        return _onnx_on_cuda(route, node, desc, providers)
    if route.native:
        from .cpp_runner import leapp_run_device

        return leapp_run_device(desc) == "cuda"
    return _is_cuda(node["device"])


def _onnx_on_cuda(route: Route, node: Mapping, desc: Mapping, providers: list[str]) -> bool:
    """Whether ``route`` runs ONNX ``node`` on ONNX Runtime's CUDA EP."""
    if route.native:
        from .cpp_runner import leapp_run_device

        return leapp_run_device(desc) == "cuda"
    return _node_plan(route, node, providers)[2] == "cuda"


_SAME_BECAUSE = {
    "load-cuda-graphs": " (no PT2 node would be replayed from CUDA graphs)",
    "onnx-cpu-ep": " (its ONNX nodes run on the CPU EP there too)",
    "onnx-cuda-ep": " (its ONNX nodes run on the CUDA EP there too)",
}


def plan_routes(desc: Mapping, names: list[str]) -> tuple[list[Route], dict[str, str]]:
    """(the routes of ``names`` that can run here, in order; {route: why not} for the others)."""
    cuda = cuda_problem()
    providers = _ort_providers()
    runnable: list[Route] = []
    skipped: dict[str, str] = {}
    plans: dict[tuple, str] = {}
    for name in names:
        route = ROUTES[name]
        reason = _blocker(route, desc, cuda, providers)
        if reason is None:
            plan = tuple(_node_plan(route, n, providers) for n in desc["nodes"])
            if plan in plans:
                reason = f"runs exactly what route '{plans[plan]}' runs for this export{_SAME_BECAUSE.get(name, '')}"
            else:
                plans[plan] = name
        if reason is None:
            runnable.append(route)
        else:
            skipped[name] = reason
    return runnable, skipped


class OpenRoute:
    """A loaded export under one route; ``run(inputs)`` / ``run_node(node, inputs)`` return output copies.

    With CUDA graphs the inputs are copied into fixed tensors first, and the first call runs three times
    (a direct call, a capture, a replay), so that graph replay is what gets compared, not direct calls;
    with state, each of the three starts from the state before the step, so the step advances it once.
    """

    def __init__(self, route: Route, pipeline: Any, stateful: bool = False) -> None:
        self.route = route
        self.pipeline = pipeline
        self.stateful = stateful  # the pipeline carries state between run() calls
        self._fixed: dict[str, torch.Tensor] = {}

    def reset(self) -> None:
        """The export's initial state (``Pipeline.reset()``); nothing to do without state."""
        if self.stateful:
            self.pipeline.reset()

    def _fixed_inputs(self, key: str, inputs: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], int]:
        calls = 1
        fixed = {}
        for name, value in inputs.items():
            slot = f"{key}/{name}"
            held = self._fixed.get(slot)
            if held is None or held.shape != value.shape or held.dtype != value.dtype or held.device != value.device:
                held = self._fixed[slot] = value.detach().clone(memory_format=torch.contiguous_format)
                calls = 3
            else:
                held.copy_(value)
            fixed[name] = held
        return fixed, calls

    def _call(self, key: str, call, inputs: Mapping[str, torch.Tensor], carries_state: bool = False
              ) -> dict[str, torch.Tensor]:
        calls = 1
        if self.route.cuda_graphs:
            inputs, calls = self._fixed_inputs(key, inputs)
        before = self.pipeline.state if carries_state and calls > 1 else None
        for _ in range(calls):
            if before is not None:
                self.pipeline.reset(before)
            outs = call(**inputs)
        return {k: v.detach().clone() for k, v in outs.items()}  # graph outputs are overwritten by the next call

    def run(self, inputs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return self._call("", self.pipeline.run, inputs, carries_state=self.stateful)

    @property
    def whole_sequence(self) -> bool:
        """A sequence runs in one call (leapp-run ``--steps K``): an error belongs to the sequence, not a step."""
        return self.stateful and hasattr(self.pipeline, "run_steps")

    def run_steps(self, steps: Sequence[Mapping[str, torch.Tensor]]) -> Iterator[dict[str, torch.Tensor]]:
        """Each step's outputs in order, the state carried from one step to the next (call ``reset`` first)."""
        if self.whole_sequence:
            yield from self.pipeline.run_steps(steps)
            return
        for inputs in steps:
            yield self.run(inputs)

    def run_node(self, node: str, inputs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return self._call(node, lambda **kw: self.pipeline.run_node(node, **kw), inputs)


def open_route(route: Route, folder: Path) -> tuple[OpenRoute | None, str | None]:
    """(the export loaded for ``route``, None), or (None, why it cannot run after all)."""
    from leapp.runtime.pipeline import load

    try:
        if route.native:
            from leapp.pipeline_format import read_pipeline

            from .cpp_runner import LeappRunPipeline

            runner = LeappRunPipeline(*read_pipeline(folder))
            return OpenRoute(route, runner, bool(state_keys(runner.description))), None
        pipeline = load(folder, cuda_graphs=route.cuda_graphs, onnx_ep=route.onnx_ep)
    except Exception as e:
        if hasattr(e, "add_note"):  # Python >= 3.11
            e.add_note(f"(leapp.testing was opening the export for route '{route.name}': {route.description})")
        raise
    if route.onnx_ep == "cuda":
        for node in pipeline.nodes.values():
            session = getattr(node.runner, "session", None)
            if session is not None and "CUDAExecutionProvider" not in session.get_providers():
                return None, (f"ONNX Runtime opened node '{node.name}' on {session.get_providers()} instead of "
                              "the CUDA EP (its warning says why; CUDA or cuDNN libraries are often missing)")
    return OpenRoute(route, pipeline, bool(state_keys(pipeline.description))), None
