"""The examples in examples/ run as users run them: a fresh process, `--out` a temporary folder.

Without a GPU they stop after the export (the CPU variants check that export
and that leapp.load opens it); on a GPU they validate, reload and print the
largest difference from eager, which must be within the example's tolerance.
"""

from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path

import pytest

import leapp
from leapp.cli import inspect_path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
TIMEOUT_S = 300


STATUSES = ("passed", "failed", "error", "skipped", "needs-cuda")


def _cpu_path_runs_here() -> bool:
    """The examples take their CPU path only without a GPU, and CPU Warp kernels need warp-clang.so
    (the GPU test machine's Warp has none)."""
    import warp

    from leapp import _native

    return not _native.driver_status()["available"] and (Path(warp.__file__).parent / "bin" / "warp-clang.so").is_file()


cpu_only = pytest.mark.skipif(
    not _cpu_path_runs_here(),
    reason="a CUDA device is present (the examples take their GPU path, tested below) or Warp cannot build CPU kernels",
)


def run_example(script: str, *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args],
        capture_output=True, text=True, timeout=TIMEOUT_S, cwd=str(ROOT),
    )
    assert proc.returncode == 0, (
        f"{script} exited {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"
    )
    return proc


def report_statuses(stdout: str, nodes: list[str]) -> dict[str, str]:
    """{node: validation status} from the printed report table (a node's first row names it)."""
    found: dict[str, str] = {}
    for line in stdout.splitlines():
        cells = line.split()
        if len(cells) >= 5 and cells[0] in nodes and cells[1] in ("pt2", "onnx", "torchscript"):
            found[cells[0]] = next((c for c in cells[3:] if c in STATUSES), "?")
    assert list(found) == nodes, f"report rows for {list(found)}, expected {nodes}, in:\n{stdout}"
    return found


def max_error(stdout: str, prefix: str) -> float:
    match = re.search(re.escape(prefix) + r"[^:]*:\s*([0-9.eE+-]+|nan|inf)", stdout)
    assert match, f"no '{prefix}' line in:\n{stdout}"
    return float(match.group(1))


def check_cpu_export(folder: Path, files: list[str]) -> None:
    assert sorted(p.name for p in folder.iterdir()) == sorted(files + ["pipeline.json", "pipeline.yaml"])
    text = io.StringIO()
    assert inspect_path(folder, out=text) == 0, f"leapp inspect found problems:\n{text.getvalue()}"
    pipeline = leapp.load(folder)  # opens every artifact with its runtime (replay itself needs CUDA)
    assert list(pipeline.nodes) == [f.rsplit(".", 1)[0] for f in files]


@cpu_only
def test_go2_pipeline_validates_every_node_on_cpu(tmp_path):
    """Issue 36: without a GPU the Warp nodes run from their CPU code, so every node validates and the loaded
    export is compared with eager (before: obs and action were "needs-cuda")."""
    proc = run_example("go2_pipeline.py", "--out", str(tmp_path), "--envs", "5")
    out = proc.stdout
    assert report_statuses(out, ["obs", "policy", "action"]) == {"obs": "passed", "policy": "passed",
                                                                  "action": "passed"}
    assert max_error(out, "max |exported - eager| over 5 robots") <= 1e-5
    check_cpu_export(tmp_path / "go2", ["obs.pt2", "policy.onnx", "action.onnx"])
    pipeline = leapp.load(tmp_path / "go2")
    assert pipeline.inputs["quat"].metadata["kind"] == "base_quat"
    assert pipeline.outputs["action"].metadata["control_rate_hz"] == 50
    graphed = leapp.load(tmp_path / "go2", cuda_graphs=True)
    assert graphed.graph is None and "not all on one CUDA device" in graphed.graph_reason


def test_cpu_policy_validates_every_node_without_a_gpu(tmp_path):
    """The C++ controller's CPU example (issue 34): no Warp, so every node validates on the CPU."""
    proc = run_example("cpu_policy.py", "--out", str(tmp_path), "--envs", "3")
    assert report_statuses(proc.stdout, ["obs", "policy", "action"]) == {"obs": "passed", "policy": "passed",
                                                                          "action": "passed"}
    assert "max |exported - eager| over 3 robot(s)" in proc.stdout
    assert leapp.load(tmp_path / "go2_cpu").outputs["action"].metadata["joints"][0] == "FL_hip"


@cpu_only
def test_decorator_only_validates_every_node_on_cpu(tmp_path):
    proc = run_example("decorator_only.py", "--out", str(tmp_path))
    out = proc.stdout
    assert report_statuses(out, ["contacts", "gait"]) == {"contacts": "passed", "gait": "passed"}
    assert max_error(out, "max |exported - eager|") <= 1e-5
    check_cpu_export(tmp_path / "quadruped_contacts", ["contacts.pt2", "gait.onnx"])


@cpu_only
def test_readme_quick_start_runs_on_cpu(tmp_path):
    """The README's Quick start as a user pastes it, on a machine without a GPU: it exports, validates and
    loads (its Warp segment from its CPU code)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Quick start"):]
    code = section[section.index("```python") + len("```python"):]
    code = code[:code.index("```")]
    (tmp_path / "quick_start.py").write_text(code)  # Warp reads a kernel's source from its file
    proc = subprocess.run([sys.executable, "quick_start.py"], capture_output=True, text=True, timeout=TIMEOUT_S,
                          cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert report_statuses(proc.stdout, ["obs"]) == {"obs": "passed"}


@pytest.mark.cuda
def test_go2_pipeline_on_gpu(tmp_path):
    proc = run_example("go2_pipeline.py", "--out", str(tmp_path), "--envs", "300")  # > 256, not a multiple
    nodes = ["obs", "policy", "action"]
    assert report_statuses(proc.stdout, nodes) == dict.fromkeys(nodes, "passed"), proc.stdout
    assert max_error(proc.stdout, "max |exported - eager| over 300 robots") <= 1e-4, proc.stdout
    check_whole_pipeline_graph(tmp_path / "go2")


def check_whole_pipeline_graph(folder: Path) -> None:
    """leapp.load(..., cuda_graphs=True) replays the whole step as one graph (where ONNX Runtime has its
    CUDA EP) and gives the plain pipeline's results: new values in the same tensors, another stream."""
    import onnxruntime as ort
    import torch

    plain = leapp.load(folder)
    graphed = leapp.load(folder, cuda_graphs=True)
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        assert graphed.graph is None and "cpu-ep" in graphed.graph_reason, graphed.graph_reason
        return
    assert graphed.graph is not None, graphed.graph_reason
    gen = torch.Generator(device="cuda").manual_seed(0)
    inputs = {name: torch.empty(spec.shape, dtype=spec.dtype, device="cuda") for name, spec in plain.inputs.items()}

    def step():
        for t in inputs.values():
            t.copy_(torch.randn(t.shape, generator=gen, device="cuda"))
        got = {k: v.clone() for k, v in graphed(**inputs).items()}  # the next replay overwrites the graph's outputs
        want = plain(**inputs)
        for key in want:
            torch.testing.assert_close(got[key], want[key], rtol=1e-5, atol=1e-5)

    for _ in range(5):
        step()
    assert graphed.graph.captures == 1  # first call direct, second captured, then replays
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.synchronize()
    assert graphed.graph.captures == 1  # one graph serves every calling stream (it replays on its own stream)


@pytest.mark.cuda
def test_decorator_only_on_gpu(tmp_path):
    proc = run_example("decorator_only.py", "--out", str(tmp_path))
    nodes = ["contacts", "gait"]
    assert report_statuses(proc.stdout, nodes) == dict.fromkeys(nodes, "passed"), proc.stdout
    assert max_error(proc.stdout, "max |exported - eager|") <= 1e-5, proc.stdout


NOISE = ("Warp 1.19", "initialized:", "torchvision is not installed", "FutureWarning", "Skipping constant folding")


@cpu_only
@pytest.mark.parametrize("script", ["decorator_only.py", "cpu_policy.py"])
def test_examples_print_only_what_they_report(script, tmp_path):
    """Warp's banner, torch's ONNX exporter notes and torch's own FutureWarning stay out of an example's output
    (examples/quiet_output.py); --verbose lets them through."""
    proc = run_example(script, "--out", str(tmp_path / "quiet"))
    noise = [line for line in (proc.stdout + proc.stderr).splitlines() if any(n in line for n in NOISE)]
    assert not noise, noise
    verbose = run_example(script, "--out", str(tmp_path / "verbose"), "--verbose")
    assert any(n in verbose.stdout + verbose.stderr for n in NOISE), verbose.stdout + verbose.stderr


@cpu_only
def test_go2_dynamic_batch_is_compared_at_every_checked_batch_on_cpu(tmp_path):
    """One export for 1..64 robots, compared with eager at 1, 7 and 64 robots on the CPU (the README's
    dynamic-batch command, without a GPU)."""
    proc = run_example("go2_pipeline.py", "--out", str(tmp_path), "--envs", "5", "--dynamic-batch", "1,64",
                       "--check-batches", "1,7,64")
    for n in (1, 7, 64):
        assert max_error(proc.stdout, f"max |exported - eager| over {n} robots (same export)") <= 1e-5
