"""The C++ runner (leapp-run, libleapp_pipeline.so) on a dynamic-batch export: one export, any batch of its range
(Pipeline::set_batch / --batch N), bit for bit what leapp.load gives; a batch outside the range is refused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import leapp

LEAPP_RUN = Path(sys.executable).with_name("leapp-run")
pytestmark = pytest.mark.skipif(not LEAPP_RUN.is_file(), reason="leapp-run was not built (ONNX Runtime's headers)")


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> Path:
    save = tmp_path_factory.mktemp("cppdyn")
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ELU(), torch.nn.Linear(16, 3))

    @leapp.node("policy", export_with="onnx", dynamic_batch=(1, 512))
    def policy(obs):
        return mlp(obs)

    @leapp.node("post", export_with="onnx", dynamic_batch=(1, 512))
    def post(actions, default_pos):
        n = actions.shape[0]
        return torch.clamp(actions, -1.0, 1.0) * 0.25 + default_pos + torch.zeros(n, 3)

    with leapp.trace("mlpdyn", save_path=save) as session, torch.no_grad():
        for _ in range(2):
            post(policy(torch.randn(16, 8)), torch.randn(16, 3))
    session.compile(validate=True)  # CPU: validated at 16, 1 and 512
    return save / "mlpdyn"


def _run(*args) -> subprocess.CompletedProcess:
    return subprocess.run([str(LEAPP_RUN), *map(str, args)], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("n", [1, 7, 16, 512])
def test_leapp_run_at_any_batch_equals_leapp_load(export, tmp_path, n):
    pipeline = leapp.load(export)
    g = torch.Generator().manual_seed(n)
    inputs = {"obs": torch.randn(n, 8, generator=g), "default_pos": torch.randn(n, 3, generator=g)}
    (tmp_path / "in").mkdir()
    for name, t in inputs.items():
        (tmp_path / "in" / f"{name}.bin").write_bytes(t.numpy().tobytes())
    r = _run(export, "--in", tmp_path / "in", "--out", tmp_path / "out", "--batch", n)
    assert r.returncode == 0, r.stderr
    expected = pipeline(**inputs)
    for name, t in expected.items():
        assert t.shape[0] == n
        assert (tmp_path / "out" / f"{name}.bin").read_bytes() == t.contiguous().numpy().tobytes(), name


def test_batch_outside_the_range_and_wrong_file_sizes_are_refused(export, tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "obs.bin").write_bytes(torch.zeros(7, 8).numpy().tobytes())
    (tmp_path / "in" / "default_pos.bin").write_bytes(torch.zeros(7, 3).numpy().tobytes())
    r = _run(export, "--in", tmp_path / "in", "--out", tmp_path / "out", "--batch", 513)
    assert r.returncode != 0 and "batch 513 is outside the exported range 1..512" in r.stderr, r.stderr
    r = _run(export, "--in", tmp_path / "in", "--out", tmp_path / "out", "--batch", 8)
    assert r.returncode != 0, r.stderr
    assert ("has 224 bytes, expected 256 (float32[8, 8] at batch 8 of 1..512 (--batch N), little-endian, C order)"
            in r.stderr), r.stderr
    r = _run(export, "--in", tmp_path / "in", "--out", tmp_path / "out", "--batch", 0)
    assert r.returncode == 2 and "--batch: a batch is at least 1, got '0'" in r.stderr, r.stderr
    r = _run(export, "--in", tmp_path / "in", "--out", tmp_path / "out")  # no --batch: the traced 16
    assert r.returncode != 0 and "expected 512" in r.stderr, r.stderr


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="AOTInductor packages are Linux .so files")
@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")
def test_aoti_package_of_a_dynamic_pt2_node_runs_at_any_batch(tmp_path):
    """`leapp aoti` of a dynamic PT2 node (its program keeps the batch Dim) and leapp-run --batch N through the
    AOTInductor plugin: the package's shapes follow the batch."""
    from leapp import cli
    from leapp.runtime.libraries import native_dir

    if not (native_dir() / "libleapp_pipeline_aoti.so").is_file():
        pytest.skip("libleapp_pipeline_aoti.so was not built (torch was not found when leapp was built)")

    @leapp.node("shapey", export_with="pt2", dynamic_batch=(1, 64))
    def shapey(x):
        n = x.shape[0]
        return torch.cat([x.reshape(n, 2, 3).sum(1) + torch.zeros(n, 3), torch.ones(n, 1)], dim=1)

    with leapp.trace("aotidyn", save_path=str(tmp_path)) as session:
        for _ in range(2):
            shapey(torch.randn(16, 6))
    session.compile(validate=False)
    export = tmp_path / "aotidyn"
    assert cli.main(["aoti", str(export), "shapey"]) == 0
    pipeline = leapp.load(export)
    for n in (1, 5, 64):
        x = torch.randn(n, 6, generator=torch.Generator().manual_seed(n))
        (tmp_path / f"in{n}").mkdir()
        (tmp_path / f"in{n}" / "x.bin").write_bytes(x.numpy().tobytes())
        r = _run(export, "--in", tmp_path / f"in{n}", "--out", tmp_path / f"out{n}", "--batch", n)
        assert r.returncode == 0, r.stderr
        got = torch.frombuffer(bytearray((tmp_path / f"out{n}" / "output.bin").read_bytes()), dtype=torch.float32)
        torch.testing.assert_close(got.reshape(n, 4), pipeline(x=x)["output"], rtol=1e-6, atol=1e-6)
