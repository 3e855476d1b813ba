"""The README's robot example (examples/go2_pipeline.py) against its export, through every route that runs here.

The example's own functions are used (its module is loaded from the file): ``Go2.step`` is the eager
code, traced once on cuda:0 and exported, or on the CPU on a machine without a GPU (its Warp segments then
run from their CPU code, docs/export-cpu.md). A mismatch is provoked by changing the robot's default pose
after the export (a Warp array the export baked in as a constant), which localisation must pin on
node 'obs' and name its Warp segment as the suspect.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
import warp as wp

import leapp
from leapp._export.cuda_code import KNOWN_CUBIN_ARCHS
from warp_devices import warp_device

from leapp.testing import ROUTES, assert_equivalent, input_strategy, replay_counterexample, unit_norm

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.cpu_fallback,
    pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning", "ignore::UserWarning"),
]

ENVS = 64
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "go2_pipeline.py"
CUBIN_ARCHS = set(KNOWN_CUBIN_ARCHS)  # LEAPP_CUDA_ARCHS may name any of them


def _example_module():
    """examples/go2_pipeline.py as a module (examples are scripts, not a package)."""
    module = sys.modules.get("go2_pipeline")
    if module is None:
        spec = importlib.util.spec_from_file_location("go2_pipeline", EXAMPLE)
        module = importlib.util.module_from_spec(spec)
        sys.modules["go2_pipeline"] = module  # Warp finds a kernel's module by name
        spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def go2(tmp_path_factory):
    """(example module, robot, export folder): Go2.step traced on the device (3 passes) and exported."""
    device = warp_device()
    module = _example_module()
    robot = module.Go2(device)
    folder = tmp_path_factory.mktemp("go2")
    with leapp.trace("go2", save_path=str(folder)) as session:
        for seed in range(3):
            robot.step(*module.random_state(ENVS, device, seed))
    with pytest.MonkeyPatch.context() as mp:
        if device != "cpu":
            major, minor = torch.cuda.get_device_capability(0)
            if major * 10 + minor in CUBIN_ARCHS:
                mp.setenv("LEAPP_CUDA_ARCHS", str(major * 10 + minor))  # cubins for this GPU only: a faster export
        session.compile(validate=False)  # assert_equivalent is the check
    return module, robot, folder / "go2"


def _inputs(export):
    return input_strategy(export, quat=unit_norm())  # the robot's base orientation is a unit quaternion


def test_go2_matches_its_export_on_every_route(go2):
    _, robot, export = go2
    result = assert_equivalent(robot.step, export, _inputs(export), max_examples=20)
    import onnxruntime as ort

    if robot.device == "cpu":  # every node on the CPU: 'load' is the CPU EP route; no CUDA graph changes anything
        assert result.ran == ("load",), result
        assert result.skipped["onnx-cpu-ep"].startswith("runs exactly what route 'load' runs"), result
        assert "cuda_graphs=True changes nothing" in result.skipped["load-cuda-graphs"], result
        return
    has_cuda_ep = "CUDAExecutionProvider" in ort.get_available_providers()
    assert {"load", "load-cuda-graphs"} <= set(result.ran), result
    assert "PT2 node 'obs' has no AOTInductor package" in result.skipped["cpp-runner"], result
    for route in ("onnx-cpu-ep", "onnx-cuda-ep"):
        why = result.skipped.get(route, "")
        # Only one of them differs from 'load' (which uses the CUDA EP when ONNX Runtime has it); the other is
        # skipped as a duplicate, or, without a CUDA EP, for that reason.
        assert (route in result.ran or why.startswith("runs exactly what route 'load' runs")
                or (route == "onnx-cuda-ep" and not has_cuda_ep and "no CUDAExecutionProvider" in why)
                or (route == "onnx-cuda-ep" and "instead of the CUDA EP" in why)), result
    if has_cuda_ep:  # 'load' runs the ONNX nodes on the CUDA EP, so the CPU EP is a route of its own
        assert "onnx-cpu-ep" in result.ran, result
    assert set(result.ran) | set(result.skipped) == set(ROUTES)
    assert result.examples == 20


def test_a_changed_default_pose_is_localised_to_obs_and_its_segment(go2, tmp_path):
    _, robot, export = go2
    exported_pose = robot.default_pose
    robot.default_pose = wp.array([0.1, 0.8, -1.45] * 4, dtype=float, device=robot.device)  # the export has -1.5
    try:
        with pytest.raises(AssertionError) as caught:
            assert_equivalent(robot.step, export, _inputs(export), max_examples=20, routes=["load"],
                              counterexample_dir=tmp_path)
        text = str(caught.value)
        assert "differs from eager Go2.step on route 'load'" in text and "output 'action'" in text
        assert "obs (pt2, obs.pt2): FIRST DIVERGING NODE" in text
        assert "policy (onnx, policy.onnx): matches" in text and "action (onnx, action.onnx): matches" in text
        assert "Warp segments of 'obs', the suspects: obs/warp_segment_0" in text
        assert "kernels projected_gravity, joint_offsets, scale" in text
        (path,) = tmp_path.iterdir()
        with pytest.raises(AssertionError) as replayed:
            replay_counterexample(path, robot.step, export)
        assert str(replayed.value) == text
    finally:
        robot.default_pose = exported_pose


def test_go2_matches_its_export_in_the_cpp_runner(go2, tmp_path):
    """With obs's AOTInductor package (leapp aoti), leapp-run runs the whole export: on a GPU on device buffers (obs
    from the package, policy and action on ONNX Runtime's CUDA EP), without one on host buffers (the package for
    the CPU, the segments from their CPU code, ONNX Runtime's CPU EP); localisation runs each node alone."""
    import shutil

    from leapp.testing.cpp_runner import leapp_run_path

    if leapp_run_path() is None:
        pytest.skip("leapp-run was not built (ONNX Runtime's headers were missing when leapp was built)")
    import onnxruntime as ort

    _, robot, export = go2
    if robot.device != "cpu" and "CUDAExecutionProvider" not in ort.get_available_providers():
        pytest.skip("leapp-run runs a CUDA export's ONNX nodes on the CUDA EP: install onnxruntime-gpu")
    export = Path(shutil.copytree(export, tmp_path / "go2"))  # the module's export stays without a package
    import leapp.aoti

    leapp.aoti.package(export, "obs")
    result = assert_equivalent(robot.step, export, _inputs(export), max_examples=10, routes=["cpp-runner"])
    assert result.ran == ("cpp-runner",) and result.examples == 10
