"""End to end on the CPU: trace a small Torch + Warp pipeline, compile it, inspect and load the export."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import onnx
import pytest
import torch
import yaml

wp = pytest.importorskip("warp")

import leapp  # noqa: E402
from leapp import annotate  # noqa: E402
from leapp.bundle import read_bundle  # noqa: E402
from leapp.errors import ValidationError  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")

N = 6


@wp.kernel
def scale_shift(x: wp.array(dtype=float), s: float, y: wp.array(dtype=float)):
    i = wp.tid()
    y[i] = x[i] * s + 1.0


@wp.kernel
def clamp_unit(a: wp.array(dtype=float), out: wp.array(dtype=float)):
    i = wp.tid()
    out[i] = wp.clamp(a[i], -1.0, 1.0)


def pre(x: torch.Tensor) -> torch.Tensor:
    with leapp.node("pre", export_with="pt2"):
        x = annotate.input_tensors("pre", {"x": x})
        y = torch.empty_like(x)
        with annotate.warp_op():
            wp.launch(scale_shift, dim=x.shape[0], inputs=[wp.from_torch(x), 2.0], outputs=[wp.from_torch(y)], device=str(x.device))
        z = torch.relu(y) + x
        annotate.output_tensors("pre", {"z": z})
    return z


@leapp.node("policy", export_with="onnx")
def policy(z: torch.Tensor) -> torch.Tensor:
    return torch.tanh(z * 0.5) * 3.0


def act(raw: torch.Tensor) -> torch.Tensor:
    with leapp.node("act", export_with="onnx"):
        raw = annotate.input_tensors("act", {"raw": raw})
        out = torch.empty_like(raw)
        with annotate.warp_op():
            wp.launch(clamp_unit, dim=raw.shape[0], inputs=[wp.from_torch(raw)], outputs=[wp.from_torch(out)], device=str(raw.device))
        annotate.output_tensors("act", {"action": out})
    return out


def step(x: torch.Tensor) -> torch.Tensor:
    return act(policy(pre(x)))


def eager(x: torch.Tensor) -> torch.Tensor:
    z = torch.relu(x * 2.0 + 1.0) + x
    return torch.clamp(torch.tanh(z * 0.5) * 3.0, -1.0, 1.0)


def _trace(tmp_path, name, device="cpu"):
    inputs = [torch.linspace(-2.0, 2.0 + i, N, device=device) for i in range(3)]
    with leapp.trace(name, save_path=str(tmp_path)) as session:
        outs = [step(x) for x in inputs]
    for x, out in zip(inputs, outs):
        torch.testing.assert_close(out, eager(x))  # the traced run keeps eager values
    return session


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    wp.init()
    folder = tmp_path_factory.mktemp("e2e")
    session = _trace(folder, "small")
    report = session.compile(validate=False)
    return folder / "small", report


def test_files_and_report(exported):
    folder, report = exported
    assert sorted(p.name for p in folder.iterdir()) == ["act.onnx", "pipeline.json", "pipeline.yaml", "policy.onnx", "pre.pt2"]
    assert [(n.node, n.backend, n.artifact, n.segments, n.status) for n in report] == [
        ("pre", "pt2", "pre.pt2", ["pre/warp_segment_0"], "skipped"),
        ("policy", "onnx", "policy.onnx", [], "skipped"),
        ("act", "onnx", "act.onnx", ["act/warp_segment_0"], "skipped"),
    ]


def test_pipeline_yaml_describes_the_trace(exported):
    folder, _ = exported
    desc = yaml.safe_load((folder / "pipeline.yaml").read_text())
    assert [n["name"] for n in desc["nodes"]] == ["pre", "policy", "act"]
    assert desc["edges"] == [
        {"from_node": "pre", "from_output": "z", "to_node": "policy", "to_input": "z"},
        {"from_node": "policy", "from_output": "output", "to_node": "act", "to_input": "raw"},
    ]
    assert [i["name"] for i in desc["inputs"]] == ["x"]
    assert [o["node"] for o in desc["outputs"]] == ["act"]
    pre_entry = desc["nodes"][0]
    (seg,) = pre_entry["segments"]
    assert seg["id"] == "pre/warp_segment_0" and seg["kernels"] == ["scale_shift"]
    assert seg["source"].endswith(f"test_compile_e2e.py:{_line_of('with annotate.warp_op():', 1)}")
    assert desc["producer"]["cuda_toolkit"] and desc["producer"]["warp"] == wp.config.version


def _line_of(text: str, occurrence: int) -> int:
    lines = Path(__file__).read_text(encoding="utf-8").splitlines()
    hits = [i + 1 for i, line in enumerate(lines) if text in line]
    return hits[occurrence - 1]


def test_onnx_segment_node_structure(exported):
    folder, _ = exported
    model = onnx.load(str(folder / "act.onnx"))
    onnx.checker.check_model(model, full_check=True)
    (node,) = [n for n in model.graph.node if n.domain == "leapp.warp"]
    assert node.op_type == "WarpSegment"
    signature = json.loads(next(a.s for a in node.attribute if a.name == "signature"))
    init = next(i for i in model.graph.initializer if i.name == node.input[-1])
    bundle = read_bundle(onnx.numpy_helper.to_array(init).tobytes())
    assert signature["digest"] == bundle.digest and signature["segment"] == "act/warp_segment_0"
    assert [o["shape"] for o in signature["outputs"]] == [[N]]
    desc = yaml.safe_load((folder / "pipeline.yaml").read_text())
    assert desc["nodes"][2]["segments"][0]["digest"] == bundle.digest


_LOAD = textwrap.dedent(
    """
    import sys, torch
    import leapp
    from leapp.runtime.runners import load_pt2
    program = load_pt2(sys.argv[1] + "/pre.pt2")
    print(sum(n.target is torch.ops.leapp.warp_segment.default for n in program.graph.nodes))
    """
)


def test_pt2_loads_in_a_fresh_process(exported):
    folder, _ = exported
    out = subprocess.run([sys.executable, "-c", _LOAD, str(folder)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "1"


_LOAD_WITHOUT_WARP = textwrap.dedent(
    """
    import sys
    import leapp
    pipeline = leapp.load(sys.argv[1])
    print(sorted(pipeline.nodes), "warp" in sys.modules)
    """
)


def test_loading_an_export_never_imports_warp(exported):
    """Deployment needs neither Warp nor the recorder: `import leapp` + `leapp.load` stay Warp-free."""
    folder, _ = exported
    out = subprocess.run([sys.executable, "-c", _LOAD_WITHOUT_WARP, str(folder)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("False"), out.stdout


def test_cpu_captured_segments_validate_and_load_on_the_cpu(tmp_path):
    """Segments captured on the CPU carry CPU code (docs/export-cpu.md): every node validates here, the PT2 one
    through the torch op and the ONNX one through ONNX Runtime's CPU EP, and the loaded pipeline equals eager."""
    session = _trace(tmp_path, "checked")
    report = session.compile(validate=True)
    assert [n.status for n in report] == ["passed"] * 3, str(report)
    x = torch.randn(N)
    torch.testing.assert_close(leapp.load(str(tmp_path / "checked"))(x=x)["action"], eager(x), rtol=1e-5, atol=1e-5)


def test_validation_fails_by_name_for_cpu_captured_segments_without_cpu_code(tmp_path, monkeypatch):
    monkeypatch.setenv("LEAPP_CPU_CODE", "0")
    session = _trace(tmp_path, "checked")
    with pytest.raises(ValidationError) as info:
        session.compile(validate=True)
    text = str(info.value)
    assert text.startswith("Model validation failed for 2 node(s): ['pre', 'act']"), text
    assert "pre/warp_segment_0" in text and "act/warp_segment_0" in text and "captured on the CPU hold no CPU code" in text
    assert info.value.report["policy"].status == "passed"  # the pure-torch node validates on the CPU


@pytest.mark.cuda
def test_cuda_trace_validates_and_loads(tmp_path):
    """On a GPU: the same pipeline traced with CUDA Warp arrays validates and runs == eager after leapp.load."""
    wp.init()
    if not wp.is_cuda_available() or not torch.cuda.is_available():
        pytest.skip("Warp or torch sees no CUDA device")
    session = _trace(tmp_path, "gpu", device="cuda:0")
    report = session.compile(validate=True)
    assert all(n.status == "passed" for n in report), str(report)
    pipeline = leapp.load(str(tmp_path / "gpu"))
    x = torch.randn(N, device="cuda:0")
    torch.testing.assert_close(pipeline(x=x)["action"].to(x.device), eager(x), rtol=1e-5, atol=1e-5)
