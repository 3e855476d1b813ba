"""The real-world Warp kernels lowered (issue 48) and run, without leapp, on every route.

Isaac Lab's policy and locomotion observation groups, its JointPositionAction, and MuJoCo Warp's kinematics
and com_pos are traced over three passes and compiled with ``warp="lower"``, once as ONNX and once as PT2.
The ONNX must be standard ONNX only (default domain, one opset, no bundle) and the PT2 graph must hold no
``leapp::warp_segment``. Each export then runs in a fresh process where ``import leapp`` fails
(tests/realworld/lowering_routes.py), on inputs the trace never saw: ONNX Runtime's CPU EP and
``onnx.reference.ReferenceEvaluator`` for the ONNX; ``torch.export.load`` and AOTInductor for the PT2; on a
GPU also ONNX Runtime's CUDA EP and AOTInductor on CUDA. Each result equals the eager node (Isaac Lab's
terms, MuJoCo Warp's kernels, run by Warp in this process) within rtol = atol = 1e-5.

Where Warp sees a CUDA device the cases are traced there (TRACE_DEVICE), as simulators run them, and the same
lowered exports then run on every route, CPU ones too; otherwise they are traced on the CPU. A machine with a
GPU need not have Warp's CPU compiler at all.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest

pytestmark = [
    pytest.mark.realworld,
    pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning", "ignore::UserWarning"),
]
pytest.importorskip("isaaclab_experimental", reason="Isaac Lab 3.0 is not installed (bash scripts/install-realworld.sh)")
pytest.importorskip("mujoco_warp", reason="mujoco-warp 4.0.0 is not installed (bash scripts/install-realworld.sh)")
onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import torch  # noqa: E402
import warp as wp  # noqa: E402
from lowering_routes import ONNX_ROUTES, Job, RouteRun  # noqa: E402
from test_isaaclab_actions import _actions, make_apply  # noqa: E402
from test_isaaclab_observations import _inputs as _observation_inputs  # noqa: E402
from test_isaaclab_observations import make_observe  # noqa: E402
from test_mujoco_warp import _qpos, make_forward  # noqa: E402

import leapp  # noqa: E402

TRACE_SEEDS = (1, 2, 3)
NEW_SEED = 1009  # inputs no trace pass saw
RTOL = ATOL = 1e-5
CASES = ("policy", "locomotion", "action", "fk")
BACKENDS = ("onnx", "pt2")
TRACE_DEVICE = "cuda:0" if wp.is_cuda_available() else "cpu"


def _on_device(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    return [t.to(TRACE_DEVICE) for t in inputs]


def _policy(backend: str):
    node = make_observe(device=TRACE_DEVICE, backend=backend)[0]
    return node, lambda seed: _on_device(_observation_inputs(seed))


def _locomotion(backend: str):
    node = make_observe(locomotion=True, device=TRACE_DEVICE, backend=backend)[0]
    return node, lambda seed: _on_device(_observation_inputs(seed, True))


def _action(backend: str):
    """make_apply's node has no backend parameter: its eager function (``__wrapped__``) as a node of ours."""
    apply, _, _ = make_apply(device=TRACE_DEVICE)
    node = leapp.node("joint_targets", export_with=backend)(apply.__wrapped__)
    return node, lambda seed: _on_device([_actions(seed)])


def _fk(backend: str):
    forward, mjm = make_forward(device=TRACE_DEVICE)
    return leapp.node("fk", export_with=backend)(forward.__wrapped__), lambda seed: _on_device([_qpos(mjm, seed)])


BUILDERS: dict[str, Callable] = {"policy": _policy, "locomotion": _locomotion, "action": _action, "fk": _fk}


@dataclass
class Export:
    """One case compiled with warp="lower" for one backend, and its eager node's result on new inputs."""

    case: str
    backend: str
    report: object
    artifact: Path
    seconds: float
    new_inputs: list[torch.Tensor] = field(default_factory=list)
    expected: list[torch.Tensor] = field(default_factory=list)

    @property
    def routes(self) -> dict[str, str]:
        (entry,) = self.report.nodes
        return entry.routes


def _as_list(out) -> list[torch.Tensor]:
    """The node's outputs, copied to the CPU (where the fresh processes' results are compared)."""
    return [t.detach().cpu().clone() for t in (out if isinstance(out, (tuple, list)) else [out])]


def _export(case: str, backend: str, folder: Path) -> Export:
    """Trace three passes, compile with warp="lower" (the routes below check the export on new inputs, so
    leapp's own validation on the trace's samples is left out), then run the node eagerly on new inputs."""
    node, inputs = BUILDERS[case](backend)
    start = time.perf_counter()
    with leapp.trace(f"{case}_{backend}", save_path=str(folder)) as session:
        for seed in TRACE_SEEDS:
            node(*inputs(seed))
    report = session.compile(warp="lower", validate=False)
    seconds = time.perf_counter() - start
    (entry,) = report.nodes
    new = inputs(NEW_SEED)
    expected = _as_list(node(*new))  # outside the session: eager Warp
    for seed in TRACE_SEEDS:  # a graph that baked a trace pass's result cannot pass
        traced = _as_list(node(*inputs(seed)))
        assert any(not torch.equal(e, t) for e, t in zip(expected, traced)), f"{case}: new inputs change nothing"
    return Export(case, backend, report, report.path / entry.artifact, seconds, [t.cpu() for t in new], expected)


# Routes run in one fresh process per group, so a big program is loaded once for its pt2 and AOTI jobs.
GROUPS = {"pt2": ("pt2", "aoti-cpu"), "onnx": ("ort-cpu", "reference"), "cuda-pt2": ("aoti-cuda",),
          "cuda-onnx": ("ort-cuda",)}
JOB_ORDER = ("action", "locomotion", "policy", "fk")  # the cheap ones first: their tests need not wait for fk


def _selected_routes(request) -> set[str]:
    """The routes of this module's selected tests that will run (the cuda ones skip without a GPU): a run of
    the cuda tests alone starts no CPU process, and a CPU machine starts no CUDA process."""
    routes = set()
    for item in request.session.items:
        callspec = getattr(item, "callspec", None)
        if item.module is request.module and callspec and "route" in callspec.params \
                and item.get_closest_marker("skip") is None:
            routes.add(callspec.params["route"])
    return routes


@dataclass
class Lowered:
    exports: dict[tuple[str, str], Export]
    runs: dict[tuple[str, str], tuple[RouteRun, Job]]


def _start(exports, backend: str, routes: set[str], folder: Path, runs: dict) -> None:
    for group, members in GROUPS.items():
        members = [r for r in members if r in routes and (r in ONNX_ROUTES) == (backend == "onnx")]
        if not members:
            continue
        jobs = [(route, case, Job(route, exports[case, backend].artifact,
                                  [t.numpy() for t in exports[case, backend].new_inputs], folder / route / case,
                                  traced_on=TRACE_DEVICE))
                for case in JOB_ORDER for route in members]
        if not jobs:
            continue
        run = RouteRun([job for _, _, job in jobs], folder / group)
        runs.update({(route, case): (run, job) for route, case, job in jobs})


@pytest.fixture(scope="module")
def lowered(request, tmp_path_factory):
    """Each case exported once per backend; as soon as a backend's exports are written, the fresh processes
    of its selected routes start (PT2 first: AOTInductor compiles while the ONNX exports are made)."""
    folder = tmp_path_factory.mktemp("lowered")
    routes = _selected_routes(request)
    exports, runs = {}, {}
    try:
        for backend in ("pt2", "onnx"):
            for case in JOB_ORDER:
                exports[case, backend] = _export(case, backend, folder / "exports")
                print(f"\nexport {case}/{backend} (trace and compile): {exports[case, backend].seconds:.1f} s")
            _start(exports, backend, routes, folder / "routes", runs)
        yield Lowered(exports, runs)
    finally:
        for run in {id(run): run for run, _ in runs.values()}.values():
            run.stop()


def _check_route(lowered: Lowered, route: str, case: str) -> None:
    run, job = lowered.runs[route, case]
    status, got, seconds = run.result(job)
    print(f"\n{route}/{case} in the fresh process: {seconds:.1f} s")
    if status.startswith("unavailable: "):
        pytest.skip(f"{route}: {status}")
    assert status == "ok", f"{case} on {route}:\n{status}"
    expected = lowered.exports[case, "onnx" if route in ONNX_ROUTES else "pt2"].expected
    assert len(got) == len(expected), f"{case} on {route}: {len(got)} outputs, eager gives {len(expected)}"
    for i, (g, e) in enumerate(zip(got, expected)):
        torch.testing.assert_close(torch.from_numpy(g), e, rtol=RTOL, atol=ATOL,
                                   msg=lambda m, i=i: f"{case} on {route}, output {i}: {m}")


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("route", ["ort-cpu", "reference", "pt2", "aoti-cpu"])
def test_lowered_export_equals_eager_without_leapp(lowered, route, case):
    _check_route(lowered, route, case)


@pytest.mark.cuda
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("route", ["ort-cuda", "aoti-cuda"])
def test_lowered_export_equals_eager_on_cuda_without_leapp(lowered, route, case):
    """The lowered exports on a GPU: ORT's CUDA EP on the ONNX, AOTInductor on the PT2 (moved to CUDA by
    torch.export.passes.move_to_device_pass when it was traced on the CPU). Skips when that ORT build has no
    CUDA EP."""
    _check_route(lowered, route, case)


def _graphs(graph):
    """The graph and every subgraph an attribute holds (If/Loop/Scan bodies)."""
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            for sub in [attr.g] if attr.HasField("g") else list(attr.graphs):
                yield from _graphs(sub)


@pytest.mark.parametrize("case", CASES)
def test_lowered_onnx_is_standard_onnx(lowered, case):
    export = lowered.exports[case, "onnx"]
    assert export.routes and set(export.routes.values()) == {"lowered"}, str(export.report)
    model = onnx.load(str(export.artifact))
    onnx.checker.check_model(model, full_check=True)
    assert len(model.opset_import) == 1 and model.opset_import[0].domain in ("", "ai.onnx"), model.opset_import
    assert not model.functions, [f.name for f in model.functions]
    domains = {node.domain for g in _graphs(model.graph) for node in g.node}
    assert domains <= {"", "ai.onnx"}, domains
    assert all(t.data_type != onnx.TensorProto.UINT8 for g in _graphs(model.graph) for t in g.initializer)
    assert len(model.graph.input) == len(export.new_inputs), [i.name for i in model.graph.input]


def _pt2_graph(lowered: Lowered, export: Export) -> dict:
    """What the loaded PT2 graph calls: from the fresh process's ``pt2`` job when it ran (the FK program takes
    half a minute to load), else loaded here."""
    if ("pt2", export.case) in lowered.runs:
        run, job = lowered.runs["pt2", export.case]
        status, _, _ = run.result(job)
        assert status == "ok", status
        return json.loads((job.folder / "graph.json").read_text())
    program = torch.export.load(str(export.artifact))
    tensors = {**program.state_dict, **program.constants}
    return {"targets": sorted({str(n.target) for m in program.graph_module.modules() if hasattr(m, "graph")
                               for n in m.graph.nodes if n.op == "call_function"}),
            "uint8": sorted(k for k, t in tensors.items() if torch.is_tensor(t) and t.dtype == torch.uint8),
            "user_inputs": len(program.graph_signature.user_inputs)}


@pytest.mark.parametrize("case", CASES)
def test_lowered_pt2_holds_no_warp_segment(lowered, case):
    export = lowered.exports[case, "pt2"]
    assert export.routes and set(export.routes.values()) == {"lowered"}, str(export.report)
    graph = _pt2_graph(lowered, export)
    assert not [t for t in graph["targets"] if "warp_segment" in t or t.startswith("leapp.")], graph["targets"]
    assert any(t.startswith("aten.") for t in graph["targets"]), graph["targets"]
    assert not graph["uint8"], graph["uint8"]  # no bundle bytes
    assert graph["user_inputs"] == len(export.new_inputs)
