"""GPU: a segment traced on CUDA and lowered runs on ONNX Runtime's CUDA EP, as a PT2 and through AOTInductor.

The node is test_lower_export's two-kernel observation (projected gravity, then a normalise-and-scale) traced
on cuda:0. Every route runs in a fresh process where ``import leapp`` fails, on inputs the trace never saw,
and is compared with Warp eager on CUDA in this process.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

wp = pytest.importorskip("warp")

import leapp  # noqa: E402
from leapp import annotate  # noqa: E402

pytestmark = [pytest.mark.cuda, pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")]

DEVICE = "cuda:0"
N = 64


@wp.kernel
def gravity(q: wp.array(dtype=wp.quat), g: float, out: wp.array(dtype=wp.vec3)):
    i = wp.tid()
    out[i] = wp.quat_rotate_inv(q[i], wp.vec3(0.0, 0.0, -g))


@wp.kernel
def scaled(v: wp.array(dtype=wp.vec3), out: wp.array(dtype=wp.vec3)):
    i = wp.tid()
    if wp.length(v[i]) > 5.0:
        out[i] = wp.normalize(v[i]) * 2.0
    else:
        out[i] = v[i]


def observe(quat: torch.Tensor) -> torch.Tensor:
    grav = torch.empty(quat.shape[0], 3, device=quat.device)
    both = torch.empty(quat.shape[0], 3, device=quat.device)
    with annotate.warp_op():
        wp.launch(gravity, dim=quat.shape[0], inputs=[wp.from_torch(quat, dtype=wp.quat), 9.81],
                  outputs=[wp.from_torch(grav, dtype=wp.vec3)], device=DEVICE)
        wp.launch(scaled, dim=quat.shape[0], inputs=[wp.from_torch(grav, dtype=wp.vec3)],
                  outputs=[wp.from_torch(both, dtype=wp.vec3)], device=DEVICE)
    return both * 0.5


def _quats(n: int, seed: int) -> torch.Tensor:
    return (torch.randn(n, 4, generator=torch.Generator().manual_seed(seed)) * 3.0).to(DEVICE)


@pytest.fixture(scope="module", autouse=True)
def _gpu():
    wp.init()
    if not wp.is_cuda_available() or not torch.cuda.is_available():
        pytest.skip("Warp or torch sees no CUDA device")


@pytest.fixture(scope="module", params=["onnx", "pt2"])
def export(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    node = leapp.node("obs", export_with=request.param)(observe)
    with leapp.trace("cuda_low", save_path=str(folder)) as session:
        for seed in range(3):
            node(_quats(N, seed))
    report = session.compile(warp="lower", validate=True)
    assert report["obs"].routes == {"obs/warp_segment_0": "lowered"}, str(report)
    assert all(n.validation.status == "passed" for n in report.nodes), str(report)
    return request.param, report.path


_RUN = textwrap.dedent("""
    import sys
    sys.modules["leapp"] = None
    import torch
    route, path, src, dst = sys.argv[1:5]
    q = torch.load(src)
    if route == "ort-cuda":
        import onnxruntime as ort
        sess = ort.InferenceSession(path, providers=["CUDAExecutionProvider"])
        if sess.get_providers()[0] != "CUDAExecutionProvider":
            raise SystemExit("77: ONNX Runtime has no CUDA EP here: " + repr(ort.get_available_providers()))
        out = torch.from_numpy(sess.run(None, {sess.get_inputs()[0].name: q.numpy()})[0])
    elif route == "pt2":
        out = torch.export.load(path).module()(q.cuda())
    else:
        import torch._inductor
        program = torch.export.load(path)
        program.example_inputs = ((q.cuda(),), {})  # leapp's .pt2 stores none (docs/aoti.md)
        package = torch._inductor.aoti_compile_and_package(program, package_path=dst + ".pt2")
        out = torch._inductor.aoti_load_package(package)(q.cuda())
    out = out[0] if isinstance(out, (tuple, list)) else out
    torch.save(out.cpu(), dst)
""")


@pytest.mark.parametrize("route", ["ort-cuda", "pt2", "aoti"])
def test_lowered_cuda_segment_runs_without_leapp(export, route, tmp_path):
    backend, folder = export
    if (backend == "onnx") != (route == "ort-cuda"):
        pytest.skip(f"route {route} reads {'ONNX' if route == 'ort-cuda' else 'PT2'} exports")
    q = _quats(N, 77)
    torch.save(q.cpu(), tmp_path / "q.pt")
    path = folder / f"obs.{backend}"
    run = subprocess.run([sys.executable, "-c", _RUN, route, str(path), str(tmp_path / "q.pt"),
                          str(tmp_path / "out.pt")], capture_output=True, text=True, timeout=600)
    if run.returncode and "77: " in run.stderr + run.stdout:
        pytest.skip((run.stderr + run.stdout).split("77: ", 1)[1][:200])
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    torch.testing.assert_close(torch.load(tmp_path / "out.pt"), observe(q).cpu(), rtol=1e-5, atol=1e-5)
