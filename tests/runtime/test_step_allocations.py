"""A step of leapp's C++ pipeline makes no host allocation of its own after warm-up (issue 34).

leapp-run and ONNX Runtime alone (benchmarks/native/ort_alone.cpp: the same ONNX models, one session each,
each IoBinding bound once) run the same number of steps under a malloc/calloc/realloc counter
(benchmarks/step_allocations.py); the per-step counts must agree: every allocation left in a step is
ONNX Runtime's own ``Run`` (it has no allocation-free Run), none is leapp's. Checked on
examples/cpu_policy.py's export (three ONNX nodes, CPU EP), by count and by call site. The GPU counterpart
(host and device allocations of a CUDA step, graphed and not) is tests/e2e/test_cpp_runner_gpu.py's.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import leapp

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import step_allocations  # noqa: E402

STEPS = (50, 550)


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("alloc")
    subprocess.run([sys.executable, str(ROOT / "examples" / "cpu_policy.py"), "--out", str(out)], check=True,
                   capture_output=True, timeout=600)
    return out / "go2_cpu"


@pytest.mark.parametrize("node", [None, "policy"], ids=["run", "run_node"])
def test_leapp_adds_no_host_allocation_to_a_step(export, tmp_path, node):
    """The whole step (Pipeline::run), and one node alone (run_node: leapp-run --node) against that node's
    model alone in ONNX Runtime."""
    pipeline = leapp.load(export)
    try:
        library = step_allocations.counter(tmp_path)
        inputs = step_allocations.write_inputs(pipeline, tmp_path / "in", node)
        leapp_run = step_allocations.leapp_run_command(export, inputs, tmp_path / "out", node)
        floor_run = step_allocations.ort_alone_command(step_allocations.ort_alone(tmp_path), pipeline, node)
    except step_allocations.Unavailable as e:
        pytest.skip(str(e))
    # ONNX Runtime now and then makes a few hundred allocations more in a process (measured: 0.7 to 1.4 per
    # step over 500 to 1,000 steps, either way): each count is the least of three processes. One allocation
    # per step by leapp would show as a difference of at least 1.
    leapp_step = step_allocations.per_step(leapp_run, library, STEPS, repeats=3)
    floor = step_allocations.per_step(floor_run, library, STEPS, repeats=3)
    assert floor > 0  # the counter sees ONNX Runtime's own allocations: it would see leapp's too
    assert abs(leapp_step - floor) < 0.5, f"leapp-run allocates {leapp_step:.3f} per step, ONNX Runtime alone {floor:.3f}"


def test_every_allocation_of_a_step_is_made_inside_onnx_runtime(export, tmp_path):
    """By call stack (step_allocations.per_step_sites, the tool that finds a step's allocations on the GPU
    machine): each allocation that grows with the steps is made by ONNX Runtime, the innermost frame outside
    the C and C++ runtimes in libonnxruntime, never in a leapp library."""
    try:
        library = step_allocations.counter(tmp_path)
    except step_allocations.Unavailable as e:
        pytest.skip(str(e))
    inputs = step_allocations.write_inputs(leapp.load(export), tmp_path / "in")
    leapp_run = step_allocations.leapp_run_command(export, inputs, tmp_path / "out")
    driver, other, sites = step_allocations.per_step_sites(leapp_run, library, STEPS)
    assert driver == 0 and other > 100 and sites, (driver, other, sites)  # no libcuda here; ORT's Run allocates
    assert abs(sum(sites.values()) - other) < 2, (other, sites)  # every one of them has a site

    def maker(site: str) -> str:
        frames = site.split()
        return next((f for f in frames if not f.startswith(("libstdc++", "libc.so", "libgcc"))), frames[0])

    made = {maker(site).split("+")[0] for site in sites}
    assert all(name.startswith("libonnxruntime") for name in made), sites
