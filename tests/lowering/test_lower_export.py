"""session.compile(warp=...) on the CPU: a projected-gravity node written as standard ONNX ops (docs/lowering.md)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
import yaml

wp = pytest.importorskip("warp")
ort = pytest.importorskip("onnxruntime")

import leapp  # noqa: E402
from leapp import annotate  # noqa: E402
from leapp.errors import ExportError  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")

N = 5


@wp.kernel
def projected_gravity(q: wp.array(dtype=wp.quat), g: float, out: wp.array(dtype=wp.vec3)):
    i = wp.tid()
    out[i] = wp.quat_rotate_inv(q[i], wp.vec3(0.0, 0.0, -g))


@wp.kernel
def scaled(v: wp.array(dtype=wp.vec3), out: wp.array(dtype=wp.vec3)):
    i = wp.tid()
    out[i] = wp.normalize(v[i]) * 2.0 + v[i]


@wp.kernel
def atomic_kernel(a: wp.array(dtype=float), out: wp.array(dtype=float)):
    i = wp.tid()
    wp.atomic_add(out, 0, a[i])  # an atomic: the lowering refuses it


def obs(quat: torch.Tensor) -> torch.Tensor:
    with leapp.node("obs", export_with="onnx"):
        quat = annotate.input_tensors("obs", {"quat": quat})
        grav = torch.empty(quat.shape[0], 3)
        both = torch.empty(quat.shape[0], 3)
        with annotate.warp_op():
            wp.launch(projected_gravity, dim=quat.shape[0], inputs=[wp.from_torch(quat, dtype=wp.quat), 9.81],
                      outputs=[wp.from_torch(grav, dtype=wp.vec3)], device="cpu")
            wp.launch(scaled, dim=quat.shape[0], inputs=[wp.from_torch(grav, dtype=wp.vec3)],
                      outputs=[wp.from_torch(both, dtype=wp.vec3)], device="cpu")
        annotate.output_tensors("obs", {"grav": torch.tanh(both)})
    return both


def act(raw: torch.Tensor) -> torch.Tensor:
    with leapp.node("act", export_with="onnx"):
        raw = annotate.input_tensors("act", {"raw": raw})
        out = torch.zeros_like(raw)
        with annotate.warp_op():
            wp.launch(atomic_kernel, dim=raw.shape[0], inputs=[wp.from_torch(raw)], outputs=[wp.from_torch(out)],
                      device="cpu")
        annotate.output_tensors("act", {"action": out})
    return out


def _quats(seed: int) -> torch.Tensor:
    q = torch.randn(N, 4, generator=torch.Generator().manual_seed(seed)) * 3.0  # non-unit quaternions
    q[0] = 0.0
    return q


def _trace(tmp_path, name, with_act=False):
    with leapp.trace(name, save_path=str(tmp_path)) as session:
        for seed in range(3):
            both = obs(_quats(seed))
            if with_act:
                act(both[:, 0].contiguous())
    return session


def _eager(q: np.ndarray) -> np.ndarray:
    grav = wp.zeros(N, dtype=wp.vec3, device="cpu")
    both = wp.zeros(N, dtype=wp.vec3, device="cpu")
    wp.launch(projected_gravity, dim=N, inputs=[wp.array(q, dtype=wp.quat, device="cpu"), 9.81], outputs=[grav],
              device="cpu")
    wp.launch(scaled, dim=N, inputs=[grav], outputs=[both], device="cpu")
    return np.tanh(both.numpy())


def test_lowered_node_is_standard_onnx_and_equals_eager(tmp_path):
    report = _trace(tmp_path, "low").compile(warp="lower")
    path = report.path / "obs.onnx"
    model = onnx.load(str(path))
    onnx.checker.check_model(model, full_check=True)
    assert {o.domain for o in model.opset_import} <= {"", "ai.onnx"}
    assert all(n.domain in ("", "ai.onnx") for n in model.graph.node)
    assert all(t.data_type != onnx.TensorProto.UINT8 for t in model.graph.initializer)  # no bundle
    assert report["obs"].routes == {"obs/warp_segment_0": "lowered"}
    assert "obs segment 'obs/warp_segment_0': lowered" in str(report)
    description = yaml.safe_load((report.path / "pipeline.yaml").read_text())
    node = description["nodes"][0]
    assert node["segments"] == []
    assert node["lowered_segments"][0]["producer"]["route"] == "lowered"
    leapp.load(report.path)  # the Python reader accepts the folder
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for seed in (7, 8):
        q = _quats(seed).numpy()
        (got,) = sess.run(None, {"quat": q})
        np.testing.assert_allclose(got, _eager(q), rtol=8e-5, atol=1e-5)


def test_lowered_node_runs_where_leapp_cannot_be_imported(tmp_path):
    report = _trace(tmp_path, "fresh").compile(warp="lower", validate=False)
    q = _quats(11).numpy()
    np.save(tmp_path / "q.npy", q)
    script = textwrap.dedent(f"""
        import sys
        sys.modules["leapp"] = None  # import leapp fails
        try:
            import leapp
        except ImportError:
            pass
        else:
            raise SystemExit("leapp imported")
        import numpy as np, onnxruntime as ort
        sess = ort.InferenceSession({str(report.path / "obs.onnx")!r}, providers=["CPUExecutionProvider"])
        out = sess.run(None, {{"quat": np.load({str(tmp_path / "q.npy")!r})}})[0]
        np.save({str(tmp_path / "out.npy")!r}, out)
    """)
    subprocess.run([sys.executable, "-c", script], check=True, cwd=tmp_path)
    np.testing.assert_allclose(np.load(tmp_path / "out.npy"), _eager(q), rtol=8e-5, atol=1e-5)


def test_lower_names_the_segment_that_cannot_lower(tmp_path):
    session = _trace(tmp_path, "refuse", with_act=True)
    with pytest.raises(ExportError) as info:
        session.compile(warp="lower", validate=False)
    text = str(info.value)
    assert "act/warp_segment_0" in text and "atomic_kernel" in text and "atomic_add" in text and "test_lower_export.py:" in text
    assert "obs/warp_segment_0" not in text
    assert not (tmp_path / "refuse").exists()  # refused before anything is written


def test_auto_lowers_what_it_can_and_replays_the_rest(tmp_path):
    report = _trace(tmp_path, "mix", with_act=True).compile(warp="auto")
    assert report["obs"].routes == {"obs/warp_segment_0": "lowered"}
    assert report["act"].routes["act/warp_segment_0"].startswith("replayed: ")
    act_model = onnx.load(str(report.path / "act.onnx"))
    assert any(n.domain == "leapp.warp" for n in act_model.graph.node)
    description = yaml.safe_load((report.path / "pipeline.yaml").read_text())
    act_entry = description["nodes"][1]
    assert act_entry["segments"][0]["producer"]["route"].startswith("replayed: ")
    assert "atomic_add" in act_entry["segments"][0]["producer"]["route"]
    leapp.load(report.path)
    shown = subprocess.run([sys.executable, "-m", "leapp.cli", "inspect", str(report.path)], capture_output=True,
                           text=True)
    assert "segment obs/warp_segment_0: kernels" in shown.stdout and "route lowered" in shown.stdout, shown.stdout
    assert "route replayed: " in shown.stdout, shown.stdout


def test_default_replays_and_writes_no_route(tmp_path):
    report = _trace(tmp_path, "default").compile(validate=False)
    model = onnx.load(str(report.path / "obs.onnx"))
    assert any(n.domain == "leapp.warp" for n in model.graph.node)
    assert report["obs"].routes == {}
    text = (report.path / "pipeline.yaml").read_text()
    assert "route" not in text and "lowered_segments" not in text


def test_unknown_route_is_refused(tmp_path):
    with pytest.raises(ExportError, match="warp='fast'"):
        _trace(tmp_path, "bad").compile(warp="fast")


def test_leapp_testing_finds_the_lowered_export_equal_to_eager_on_every_route(tmp_path):
    """leapp.testing's property check over the lowered export: leapp.load, ONNX Runtime's CPU EP and leapp-run
    (where built) all run it and equal the eager node on random quaternions, non-unit and zero included."""
    from leapp.testing import assert_equivalent, input_strategy

    def node_output(quat):  # what the node exports: tanh of the Warp result
        return torch.tanh(obs(quat))

    report = _trace(tmp_path, "routes").compile(warp="lower")
    result = assert_equivalent(node_output, report.path, input_strategy(report.path), max_examples=6, rtol=1e-5,
                               atol=1e-5)
    assert "load" in result.ran, result
    leapp_run = Path(sys.executable).with_name("leapp-run")
    if leapp_run.is_file():
        assert "cpp-runner" in result.ran, result


def test_lowered_export_is_byte_reproducible(tmp_path):
    """Two traces and lowered exports of the same node write the same bytes (no order or name from a dict or a
    counter that differs between runs)."""
    digests = []
    for run in ("a", "b"):
        report = _trace(tmp_path / run, "repro").compile(warp="lower", validate=False)
        digests.append({p.name: p.read_bytes() for p in sorted(report.path.iterdir())})
    assert digests[0].keys() == digests[1].keys()
    assert [k for k in digests[0] if digests[0][k] != digests[1][k]] == []
