"""Artifact sizes do not grow with N: the same nodes exported at N = 64 and N = 262,144 differ by < 1 KB per file.

What used to grow: ``torch.export.save`` stored the program's example inputs (the first recorded
sample, 4 bytes per element here) in every ``.pt2``. Bundles (scratch and outputs carry no
initial data unless it is a real constant), ONNX models and pipeline.yaml did not; this checks all of
them on real traces: the Warp segments are captured on the CPU here and compiled with NVRTC, so the
bundles inside the artifacts are the real ones (cubin sm_90 only, to keep it fast). The CUDA variant
(GPU) also validates the export and loads it.
"""

from __future__ import annotations

import zipfile

import pytest
import size_pipeline
import torch

import leapp
from leapp.runtime.runners import load_pt2

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")

SMALL, LARGE = 64, 262_144
LIMIT = 1024  # bytes: the bound on the size difference of one artifact between the two N


def _sizes(folder) -> dict[str, int]:
    return {f.name: f.stat().st_size for f in sorted(folder.iterdir()) if f.is_file()}


def _assert_same_size(small, large) -> None:
    a, b = _sizes(small), _sizes(large)
    assert set(a) == set(b) and {"seg_pt2.pt2", "seg_onnx.onnx", "t_pt2.pt2", "t_onnx.onnx", "pipeline.yaml"} <= set(a)
    grown = {name: (a[name], b[name]) for name in a if abs(b[name] - a[name]) >= LIMIT}
    assert not grown, f"files whose size depends on N ({SMALL} -> {LARGE} bytes): {grown}"


def _sample_inputs_entries(pt2) -> dict[str, int]:
    with zipfile.ZipFile(pt2) as z:
        return {i.filename: i.file_size for i in z.infolist() if "sample_inputs" in i.filename}


@pytest.fixture(scope="module")
def cpu_exports(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LEAPP_CUDA_ARCHS", "90")
        return {n: size_pipeline.export(tmp_path_factory.mktemp(f"n{n}"), n) for n in (SMALL, LARGE)}


def test_artifact_sizes_do_not_depend_on_n(cpu_exports):
    _assert_same_size(cpu_exports[SMALL], cpu_exports[LARGE])


def test_pt2_archives_hold_no_example_inputs(cpu_exports):
    for name in ("seg_pt2.pt2", "t_pt2.pt2"):
        entries = _sample_inputs_entries(cpu_exports[LARGE] / name)
        assert entries and all(size == 0 for size in entries.values()), entries
        assert load_pt2(cpu_exports[LARGE] / name).example_inputs is None


def test_exports_without_example_inputs_load_and_run(cpu_exports):
    """leapp.load runs the pure-torch nodes (a CPU-captured segment replays on CUDA only)."""
    pipe = leapp.load(str(cpu_exports[LARGE]))
    x = torch.randn(LARGE)
    expected = size_pipeline.eager(x)
    for name in ("t_pt2", "t_onnx"):
        (out,) = pipe.run_node(name, x=x).values()
        torch.testing.assert_close(out, expected[name], rtol=1e-5, atol=1e-6)


def test_zero_example_inputs_rebuild_what_aoti_needs(cpu_exports):
    """``zero_example_inputs``: zeros of each input placeholder, accepted by the program (AOTI's ``example_inputs``)."""
    from leapp._export.pt2_export import zero_example_inputs

    program = load_pt2(cpu_exports[SMALL] / "t_pt2.pt2")
    args, kwargs = zero_example_inputs(program)
    assert kwargs == {} and [(a.shape, a.dtype, a.device) for a in args] == [((SMALL,), torch.float32, torch.device("cpu"))]
    assert not any(a.any() for a in args)
    program.example_inputs = (args, kwargs)  # torch checks them against the program's input spec
    (out,) = program.module()(*args)
    torch.testing.assert_close(out, torch.tanh(torch.ones(SMALL)))


def test_validation_still_uses_the_recorded_samples(tmp_path):
    """Validation runs each node on its recorded samples, which the artifact no longer carries."""
    folder = size_pipeline.export(tmp_path, LARGE, validate=True, names=("t_pt2", "t_onnx"))
    assert _sample_inputs_entries(folder / "t_pt2.pt2") and all(
        size == 0 for size in _sample_inputs_entries(folder / "t_pt2.pt2").values())


@pytest.mark.cuda
def test_cuda_artifact_sizes_do_not_depend_on_n(tmp_path):
    """GPU: CUDA captures, every cubin target, validation in a fresh process, and leapp.load of the large one."""
    folders = {n: size_pipeline.export(tmp_path / f"n{n}", n, device="cuda", validate=True) for n in (SMALL, LARGE)}
    _assert_same_size(folders[SMALL], folders[LARGE])
    pipe = leapp.load(str(folders[LARGE]))
    x = torch.randn(LARGE, device="cuda")
    expected = size_pipeline.eager(x)
    for name in size_pipeline.NODES:
        (out,) = pipe.run_node(name, x=x).values()
        torch.testing.assert_close(out.to(x.device), expected[name], rtol=1e-5, atol=1e-6)
