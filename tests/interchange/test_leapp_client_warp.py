"""Warp in a LEAPP bundle: lowered segments run in the client on the CPU; replayed ones are warned about by node."""

from __future__ import annotations

import warnings

import pytest
import torch

wp = pytest.importorskip("warp")

import leapp  # noqa: E402
from leapp import annotate  # noqa: E402
from leapp.interchange import LeappBundleWarning  # noqa: E402
from leapp_client import require_client, run_client  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")
N = 5


@wp.kernel
def projected_gravity(q: wp.array(dtype=wp.quat), g: float, out: wp.array(dtype=wp.vec3)):
    i = wp.tid()
    out[i] = wp.quat_rotate_inv(q[i], wp.vec3(0.0, 0.0, -g))


def obs(quat: torch.Tensor, joints: torch.Tensor) -> torch.Tensor:
    """A Warp kernel between torch ops in one ONNX node, then a torch-only node."""
    with leapp.node("obs", export_with="onnx"):
        quat, joints = annotate.input_tensors("obs", {"quat": quat, "joints": joints})
        grav = torch.empty(quat.shape[0], 3)
        with annotate.warp_op():
            wp.launch(projected_gravity, dim=quat.shape[0], inputs=[wp.from_torch(quat, dtype=wp.quat), 9.81],
                      outputs=[wp.from_torch(grav, dtype=wp.vec3)], device="cpu")
        out = annotate.output_tensors("obs", {"obs": torch.cat([torch.tanh(grav), joints], dim=-1)})
    with leapp.node("act", export_with="onnx"):
        o = annotate.input_tensors("act", {"obs": out})
        action = annotate.output_tensors("act", {"action": o[:, :3] * 0.5 - o[:, 3:]})
    return action


def _inputs(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.nn.functional.normalize(torch.randn(N, 4, generator=g), dim=-1), torch.randn(N, 3, generator=g)


def _export(tmp_path, warp: str):
    with leapp.trace("grav", save_path=str(tmp_path)) as session:
        for seed in range(3):
            obs(*_inputs(seed))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", LeappBundleWarning)
        session.compile(validate=False, warp=warp, leapp_bundle=True)
    return tmp_path / "grav", [str(w.message) for w in caught if issubclass(w.category, LeappBundleWarning)]


def test_a_lowered_warp_pipeline_runs_in_the_client_on_the_cpu(tmp_path):
    require_client()
    folder, warned = _export(tmp_path, "lower")
    assert warned == []  # every node is plain ONNX: nothing for other tools to trip on
    steps = [dict(zip(("obs/quat", "obs/joints"), _inputs(seed))) for seed in range(10, 14)]
    got = run_client(folder / "grav.yaml", steps, tmp_path)
    pipeline = leapp.load(folder)
    for step, result in zip(steps, got["results"]):
        eager = obs(step["obs/quat"], step["obs/joints"])
        torch.testing.assert_close(result["act/action"], eager, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(result["act/action"], pipeline.run(quat=step["obs/quat"],
                                                                      joints=step["obs/joints"])["action"],
                                   rtol=1e-5, atol=1e-5)


def test_a_replayed_segment_is_warned_about_by_node(tmp_path):
    folder, warned = _export(tmp_path, "replay")
    assert len(warned) == 1 and warned[0].startswith("node 'obs' holds leapp custom ops (Warp segments not lowered: "
                                                     "obs/warp_segment_0)")
    assert "warp=\"lower\"" in warned[0] and (folder / "grav.yaml").is_file()
