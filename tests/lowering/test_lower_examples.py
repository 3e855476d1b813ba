"""examples/decorator_only.py's Warp node (contact norms and mask) lowered, on every route without leapp.

Its ``contacts`` node exports as PT2; the same function is also wrapped as an ONNX node. In one fresh process
where ``import leapp`` fails, the ONNX model runs on ONNX Runtime's CPU EP and ``onnx.reference``, the PT2
through ``torch.export.load`` and through AOTInductor; each equals the eager node on forces it never saw.
(examples/go2_pipeline.py has its own chained test in tests/examples/test_go2_lowered.py.)
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

wp = pytest.importorskip("warp")
pytest.importorskip("onnxruntime")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

import decorator_only as example  # noqa: E402

import leapp  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")

_ROUTES = textwrap.dedent("""
    import sys
    sys.modules["leapp"] = None  # import leapp fails in this process
    import onnx, onnxruntime as ort, torch
    from onnx.reference import ReferenceEvaluator
    onnx_path, pt2_path, forces_path, out_path = sys.argv[1:5]
    forces = torch.load(forces_path)
    feed = {"forces": forces.numpy()}
    model = onnx.load(onnx_path)
    onnx.checker.check_model(model, full_check=True)
    assert {n.domain for n in model.graph.node} <= {""}, {n.domain for n in model.graph.node}
    results = {"ort": ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"]).run(None, feed)[0],
               "reference": ReferenceEvaluator(model).run(None, feed)[0]}
    program = torch.export.load(pt2_path)
    assert not any("leapp" in str(n.target) for n in program.graph.nodes)
    results["pt2"] = program.module()(forces)[0]
    import torch._inductor
    program.example_inputs = ((forces,), {})
    package = torch._inductor.aoti_compile_and_package(program, package_path=out_path + ".aoti.pt2")
    results["aoti"] = torch._inductor.aoti_load_package(package)(forces)[0]
    torch.save({k: torch.as_tensor(v) for k, v in results.items()}, out_path)
""")


def test_decorator_example_node_runs_lowered_on_every_route_without_leapp(tmp_path):
    onnx_node = leapp.node("contacts_onnx", export_with="onnx")(example.contacts.__wrapped__)
    samples = [torch.randn(16, 4, 3, generator=torch.Generator().manual_seed(s)).mul(8) for s in range(3)]
    with leapp.trace("lowered_contacts", save_path=str(tmp_path)) as session:
        for forces in samples:
            example.contacts(forces)
            onnx_node(forces)
    report = session.compile(warp="lower")
    assert set(report["contacts"].routes.values()) == {"lowered"}, str(report)
    assert set(report["contacts_onnx"].routes.values()) == {"lowered"}, str(report)
    forces = torch.randn(16, 4, 3, generator=torch.Generator().manual_seed(99)).mul(8)
    forces[0] = 0.0  # zero force: length 0, below the threshold
    torch.save(forces, tmp_path / "forces.pt")
    run = subprocess.run([sys.executable, "-c", _ROUTES, str(report.path / "contacts_onnx.onnx"),
                          str(report.path / "contacts.pt2"), str(tmp_path / "forces.pt"), str(tmp_path / "out.pt")],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    expected = example.contacts.__wrapped__(forces)["norms"]
    for route, got in torch.load(tmp_path / "out.pt").items():
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6, msg=lambda m, r=route: f"{r}: {m}")
