"""Issue 47: segments of copies on the CPU. A segment made only of copies and memsets needs no compiled code: traced
on the CPU it exports with ``producer.cpu_code`` "any: ..." and no CPU code, validates ``passed``, and runs on every
CPU route (leapp.load / the torch op, ONNX Runtime's CPU EP, leapp-run). A segment that mixes kernels, contiguous
copies and a strided copy into a column view (leapp's copy kernel) runs the same way from its CPU code.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import leapp
from leapp import annotate
from leapp.bundle import read_bundle
from leapp.bundle.format import COPY_ONLY_NOTE
from leapp.pipeline_format import PipelineError, read_pipeline, sha256_file, twin_text, yaml_text
from cpu_observation import warp_cpu

wp = pytest.importorskip("warp")
pytestmark = [warp_cpu, pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning"),
              pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None,
                                 reason="needs a C++ compiler: the mixed export compiles Warp's CPU source")]
LEAPP_RUN = Path(sys.executable).with_name("leapp-run")
N = 5


@wp.kernel
def doubled(x: wp.array(dtype=wp.float32, ndim=2), out: wp.array(dtype=wp.float32, ndim=2)):
    i, j = wp.tid()
    out[i, j] = 2.0 * x[i, j]


def copies(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Copies and memsets only: x copied twice, a zeroed and a filled buffer."""
    y = torch.empty_like(x)
    z = torch.ones(x.shape[0], 2)
    with annotate.warp_op():
        xs = wp.from_torch(x)
        wp.copy(wp.from_torch(y), xs)
        wp.from_torch(z).zero_()
    return y, z


def _mixed_state():
    """Isaac Lab's manager in miniature: a persistent group buffer whose columns a kernel and two copies fill."""
    group = wp.zeros((N, 8), dtype=wp.float32, device="cpu")

    def column(start: int, cols: int):
        return wp.array(ptr=group.ptr + 4 * start, dtype=wp.float32, shape=(N, cols), strides=group.strides,
                        device="cpu")

    action = wp.zeros((N, 3), dtype=wp.float32, device="cpu")
    return group, column(0, 3), column(3, 3), column(6, 2), action


def make_mixed():
    group, a, b, _, action = _mixed_state()

    def mixed(x: torch.Tensor, act: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        wp.to_torch(action).copy_(act)
        plain = torch.empty_like(x)
        with annotate.warp_op():
            xs = wp.from_torch(x)
            wp.launch(doubled, dim=(N, 3), inputs=[xs], outputs=[a], device="cpu")
            wp.copy(b, action)  # strided: leapp's copy kernel
            wp.copy(wp.from_torch(plain), xs)  # contiguous: a copy op
        return wp.to_torch(group).clone(), plain

    return mixed


def _trace(folder: Path, name: str, fn, inputs, backend: str):
    node = leapp.node(name, export_with=backend)(fn)
    with leapp.trace(name, save_path=str(folder)) as session:
        for args in inputs:
            node(*args)
    return session.compile(validate=True), folder / name


def _inputs(seed: int, mixed: bool):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, 3, generator=g)
    return (x, torch.randn(N, 3, generator=g)) if mixed else (x,)


@pytest.fixture(scope="module", params=["onnx", "pt2"])
def copy_export(request, tmp_path_factory):
    report, folder = _trace(tmp_path_factory.mktemp("copies"), "copies", copies,
                            [_inputs(s, False) for s in range(3)], request.param)
    return request.param, report, folder


@pytest.fixture(scope="module", params=["onnx", "pt2"])
def mixed_export(request, tmp_path_factory):
    fn = make_mixed()
    report, folder = _trace(tmp_path_factory.mktemp("mixed"), "mixed", fn, [_inputs(s, True) for s in range(3)],
                            request.param)
    return request.param, report, folder, fn


def _segment_entries(folder: Path) -> list[dict]:
    _, desc = read_pipeline(folder)
    return [s for node in desc["nodes"] for s in node.get("segments", [])]


def test_a_copy_only_segment_carries_no_code_and_says_it_runs_anywhere(copy_export):
    backend, report, folder = copy_export
    (segment,) = _segment_entries(folder)
    assert segment["producer"]["cpu_code"] == COPY_ONLY_NOTE
    from leapp.runtime.binary_choice import bundles_in_artifact

    node = leapp.load(folder).nodes["copies"]
    (data,) = bundles_in_artifact(node.backend, node.artifact, node.runner)
    manifest = read_bundle(data).manifest
    assert not manifest["kernels"] and "cpu_code" not in manifest
    assert {op["op"] for op in manifest["ops"]} <= {"copy", "memset"}, manifest["ops"]


def test_a_copy_only_segment_validates_and_runs_on_every_cpu_route(copy_export):
    from leapp.testing import assert_equivalent, input_strategy

    backend, report, folder = copy_export
    assert report["copies"].status == "passed", str(report)
    result = assert_equivalent(copies, folder, input_strategy(folder), max_examples=8, rtol=0, atol=0)
    _check_routes(backend, result)


def test_a_segment_mixing_kernels_and_copies_runs_on_every_cpu_route(mixed_export):
    from leapp.testing import assert_equivalent, input_strategy

    backend, report, folder, fn = mixed_export
    assert report["mixed"].status == "passed", str(report)
    (segment,) = _segment_entries(folder)
    assert segment["producer"]["cpu_code"] in ("x86_64", "aarch64", "x86_64, aarch64"), segment["producer"]
    result = assert_equivalent(fn, folder, input_strategy(folder), max_examples=8, rtol=0, atol=0)
    _check_routes(backend, result)


def _check_routes(backend: str, result) -> None:
    """load ran; for ONNX the CPU EP ran (on a CPU-only machine route 'load' is that EP, and says so) and so did
    leapp-run where it was built."""
    assert "load" in result.ran, result
    if backend == "onnx":
        assert "onnx-cpu-ep" in result.ran or "runs exactly what route 'load' runs" in result.skipped.get(
            "onnx-cpu-ep", ""), result
        if LEAPP_RUN.is_file():
            assert "cpp-runner" in result.ran, result


def _claim(folder: Path, tmp_path: Path, note: str) -> Path:
    edited = Path(shutil.copytree(folder, tmp_path / folder.name))
    _, desc = read_pipeline(edited)
    desc["nodes"][0]["segments"][0]["producer"]["cpu_code"] = note
    (edited / "pipeline.yaml").write_text(yaml_text(desc), encoding="utf-8")
    (edited / "pipeline.json").write_text(twin_text(desc, sha256_file(edited / "pipeline.yaml")), encoding="utf-8")
    return edited


def _verdicts(folder: Path) -> tuple[str | None, str | None]:
    try:
        leapp.load(folder)
        python = None
    except PipelineError as e:
        python = str(e).replace(f"{folder}/pipeline.yaml", f"{folder}/pipeline.json")
    if not LEAPP_RUN.is_file():
        return python, python
    r = subprocess.run([str(LEAPP_RUN), str(folder), "--describe"], capture_output=True, text=True, timeout=120)
    assert r.returncode in (0, 1), r.stderr
    return python, (r.stderr.strip().removeprefix("leapp-run: ") if r.returncode else None)


def test_both_readers_check_an_any_machine_claim_alike(copy_export, mixed_export, tmp_path):
    """ "any: ..." is accepted only on a bundle without kernels and CPU code, by leapp.load and leapp-run alike; a
    copy-only bundle claiming a machine's CPU code is refused by both with one text."""
    if copy_export[0] != "onnx" or mixed_export[0] != "onnx":
        pytest.skip("leapp-run reads the bundles of ONNX nodes (a PT2 node's are inside its AOTInductor package)")
    assert _verdicts(copy_export[2]) == (None, None)
    python, cpp = _verdicts(_claim(mixed_export[2], tmp_path / "a", "any: edited"))
    assert python is not None and "claims it runs on any machine without CPU code ('any: edited'), but its bundle " \
        "launches 2 kernel(s) and holds CPU code for" in python, python
    assert cpp == python
    python, cpp = _verdicts(_claim(copy_export[2], tmp_path / "b", "x86_64"))
    assert python is not None and "claims CPU code for 'x86_64', but its bundle holds CPU code for no machine" in python
    assert cpp == python
