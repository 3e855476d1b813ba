"""Issue 46 item 7: one verdict on pipeline.yaml's segment entries from leapp.load and leapp-run.

An edited folder (every digest recomputed) could change a node's ``segments``: a ``producer.cpu_code`` claim
made leapp-run refuse a folder leapp.load ran, and an all-zero segment digest ran in both (only ``leapp
inspect`` compared it with the bundles). Both readers now check each node's entries against the bundles its
artifact holds (the count, each digest, each claim against the bundle's own CPU code) and give one verdict,
with one text (docs/pipeline-format.md, "Segments"). The differential property test edits those fields of a
CPU-traced ONNX export with a Warp segment; a PT2 export is checked by leapp.load (leapp-run runs a PT2 node
from its AOTInductor package, whose bundles it cannot read: it refuses a PT2 node without one anyway).
"""

from __future__ import annotations

import copy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import leapp
from leapp.pipeline_format import PipelineError, read_pipeline, sha256_file, twin_text, yaml_text

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
from cpu_observation import trace, warp_cpu

LEAPP_RUN = Path(sys.executable).with_name("leapp-run")
pytestmark = [
    warp_cpu,
    pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None,
                       reason="needs a C++ compiler: the export compiles Warp's CPU source"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning"),
]
needs_leapp_run = pytest.mark.skipif(not LEAPP_RUN.is_file(), reason="leapp-run was not built: ONNX Runtime's "
                                     "headers are missing (bash scripts/fetch-ort-headers.sh, then pip install -e .)")


@pytest.fixture(scope="module")
def onnx_export(tmp_path_factory) -> Path:
    return trace(tmp_path_factory.mktemp("verdict_onnx"), "onnx", validate=False)[1]


@pytest.fixture(scope="module")
def pt2_export(tmp_path_factory) -> Path:
    return trace(tmp_path_factory.mktemp("verdict_pt2"), "pt2", validate=False)[1]


def _write_both(folder: Path, description: dict) -> None:
    (folder / "pipeline.yaml").write_text(yaml_text(description), encoding="utf-8")
    (folder / "pipeline.json").write_text(twin_text(description, sha256_file(folder / "pipeline.yaml")),
                                          encoding="utf-8")


def _python_verdict(folder: Path) -> str | None:
    try:
        leapp.load(folder)
    except PipelineError as e:
        return str(e).replace(f"{folder}/pipeline.yaml", f"{folder}/pipeline.json")
    return None


def _cpp_verdict(folder: Path, mode: str = "--describe") -> str | None:
    r = subprocess.run([str(LEAPP_RUN), str(folder), mode], capture_output=True, text=True, timeout=120)
    assert r.returncode in (0, 1), r.stderr
    return r.stderr.strip().removeprefix("leapp-run: ") if r.returncode else None


HEX64 = st.text("0123456789abcdef", min_size=64, max_size=64)
CLAIMS = st.sampled_from(["x86_64", "aarch64", "x86_64, aarch64", "aarch64,x86_64", " x86_64 ", "none: edited",
                          "none", "", "x86_64, x86_64", "riscv64", "any: edited", "any"])


@st.composite
def segment_edits(draw):
    """A list of edits to the one node's ``segments`` (applied in order to a copy of the description)."""
    kinds = st.sampled_from(["digest", "zero digest", "claim", "drop claim", "add", "remove", "id"])
    return [(draw(kinds), draw(HEX64), draw(CLAIMS)) for _ in range(draw(st.integers(1, 3)))]


def _apply(desc: dict, edits) -> dict:
    bad = copy.deepcopy(desc)
    segments = bad["nodes"][0]["segments"]
    for kind, digest, claim in edits:
        if kind == "add":
            segments.append(copy.deepcopy(segments[-1]) if segments else copy.deepcopy(desc["nodes"][0]["segments"][0]))
            segments[-1]["id"] = f"obs/warp_segment_{len(segments) - 1}"
            continue
        if kind == "remove":
            if segments:
                segments.pop()
            continue
        if not segments:
            continue
        seg = segments[0]
        if kind == "digest":
            seg["digest"] = digest
        elif kind == "zero digest":
            seg["digest"] = "0" * 64
        elif kind == "claim":
            seg["producer"]["cpu_code"] = claim
        elif kind == "drop claim":
            seg["producer"].pop("cpu_code", None)
        else:
            seg["id"] = "obs/renamed"
    return bad


@needs_leapp_run
def test_the_export_itself_runs_in_both(onnx_export):
    assert _python_verdict(onnx_export) is None and _cpp_verdict(onnx_export) is None


@needs_leapp_run
@pytest.mark.parametrize("edit, message", [
    ([("zero digest", "", "")], ".digest: segment 'obs/warp_segment_0' of node 'obs' records digest " + "0" * 64),
    ([("claim", "", "none: edited")], ".producer.cpu_code: segment 'obs/warp_segment_0' of node 'obs' claims CPU "
                                      "code for 'none: edited', but its bundle holds CPU code for x86_64"),
    ([("drop claim", "", "")], "claims CPU code for 'none', but its bundle holds CPU code for x86_64"),
    ([("claim", "", "x86_64, riscv64")], "claims CPU code for 'x86_64, riscv64', but its bundle holds CPU code for"),
    ([("claim", "", "any: edited")], "claims it runs on any machine without CPU code ('any: edited'), but its "
                                     "bundle launches 2 kernel(s) and holds CPU code for x86_64"),
    ([("add", "", "")], ".segments: 2 Warp segment(s) listed, but obs.onnx holds 1 (leapp.warp WarpSegment nodes)"),
    ([("remove", "", "")], ".segments: 0 Warp segment(s) listed, but obs.onnx holds 1"),
])
def test_edited_segment_entries_are_refused_by_both_with_one_text(onnx_export, tmp_path, edit, message):
    _, desc = read_pipeline(onnx_export)
    folder = Path(shutil.copytree(onnx_export, tmp_path / "edited"))
    _write_both(folder, _apply(desc, edit))
    python, cpp = _python_verdict(folder), _cpp_verdict(folder)
    assert python is not None and message in python, python
    assert cpp == python
    assert _cpp_verdict(folder, "--check") == python  # checking opens nothing, and gives the same verdict


@needs_leapp_run
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=segment_edits())
def test_both_readers_give_one_verdict_on_segment_entries(onnx_export, tmp_path_factory, edits):
    _, desc = read_pipeline(onnx_export)
    folder = Path(shutil.copytree(onnx_export, tmp_path_factory.mktemp("case") / "cpu_obs"))
    _write_both(folder, _apply(desc, edits))
    python, cpp = _python_verdict(folder), _cpp_verdict(folder)
    assert cpp == python, (edits, cpp, python)


@pytest.mark.parametrize("edit, message", [
    ([("zero digest", "", "")], "records digest " + "0" * 64 + ", but obs.pt2 holds '"),
    ([("claim", "", "none: edited")], "claims CPU code for 'none: edited', but its bundle holds CPU code for x86_64"),
    ([("add", "", "")], ".segments: 2 Warp segment(s) listed, but obs.pt2 holds 1"),
])
def test_leapp_load_checks_a_pt2_nodes_segment_entries(pt2_export, tmp_path, edit, message):
    assert _python_verdict(pt2_export) is None
    _, desc = read_pipeline(pt2_export)
    folder = Path(shutil.copytree(pt2_export, tmp_path / "edited"))
    _write_both(folder, _apply(desc, edit))
    python = _python_verdict(folder)
    assert python is not None and message in python, python
