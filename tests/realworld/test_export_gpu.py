"""The real-world nodes exported on a GPU: PT2 and ONNX, validated, loaded in a fresh process, equal to eager.

Isaac Lab's observation manager and MuJoCo Warp's kinematics at two batch sizes (a trace each); with
``dynamic_batch`` MuJoCo Warp's per-world bytes that kinematics never writes are refused by name. A fresh process loads each export with
``leapp.load`` and runs it on inputs the trace never saw; this process runs the eager code on the same inputs.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = [pytest.mark.realworld, pytest.mark.cuda]
pytest.importorskip("isaaclab_experimental", reason="Isaac Lab 3.0 is not installed (bash scripts/install-realworld.sh)")
mujoco = pytest.importorskip("mujoco", reason="mujoco 4.0.0 is not installed (bash scripts/install-realworld.sh)")
mjw = pytest.importorskip("mujoco_warp", reason="mujoco-warp 4.0.0 is not installed (bash scripts/install-realworld.sh)")

import torch  # noqa: E402
import warp as wp  # noqa: E402
from isaaclab_standin import random_root_and_joints  # noqa: E402
from test_isaaclab_observations import JOINTS, make_observe  # noqa: E402
from test_mujoco_warp import MJCF, _qpos  # noqa: E402

import leapp  # noqa: E402
from leapp import annotate  # noqa: E402

DEVICE = "cuda:0"
_LOAD = textwrap.dedent("""
    import sys, torch, leapp
    inputs = torch.load(sys.argv[2])
    pipeline = leapp.load(sys.argv[1])
    out = pipeline(**{k: v.to("cuda:0") for k, v in inputs.items()})
    torch.save({k: v.cpu() for k, v in out.items()}, sys.argv[3])
""")


def _fresh_process_outputs(folder: Path, inputs: dict[str, torch.Tensor], tmp_path: Path) -> dict[str, torch.Tensor]:
    src, dst = tmp_path / "in.pt", tmp_path / "out.pt"
    torch.save({k: v.cpu() for k, v in inputs.items()}, src)
    run = subprocess.run([sys.executable, "-c", _LOAD, str(folder), str(src), str(dst)], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return torch.load(dst)


def _state(n: int, seed: int) -> list[torch.Tensor]:
    return [t.to(DEVICE) for t in random_root_and_joints(n, len(JOINTS), seed)]


@pytest.mark.parametrize("backend", ["pt2", "onnx"])
@pytest.mark.parametrize("n", [6, 64])
def test_isaaclab_observations_export(tmp_path, backend, n):
    observe, _ = make_observe(n=n, device=DEVICE, backend=backend)
    with leapp.trace("obs", save_path=str(tmp_path)) as session:
        for seed in (1, 2, 3):
            observe(*_state(n, seed))
    report = session.compile(validate=True)
    assert all(node.validation.status == "passed" for node in report.nodes), str(report)
    new = _state(n, 11)
    expected = observe(*new)
    names = ["root_pose", "root_vel", "joint_pos", "joint_vel"]
    got = _fresh_process_outputs(tmp_path / "obs", dict(zip(names, new)), tmp_path)
    (value,) = got.values()
    torch.testing.assert_close(value, expected.cpu(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", ["pt2", "onnx"])
def test_isaaclab_locomotion_group_export(tmp_path, backend):
    """Isaac Lab's velocity-locomotion policy group on CUDA: generated_commands and last_action are wp.copy into
    column views, which Warp's CUDA capture refuses too; leapp records them as its copy kernel (issue 47)."""
    n = 6
    observe, _ = make_observe(locomotion=True, n=n, device=DEVICE, backend=backend)

    def state(seed: int) -> list[torch.Tensor]:
        g = torch.Generator().manual_seed(seed + 7919)
        extra = [torch.randn(n, 3, generator=g), torch.randn(n, len(JOINTS), generator=g)]
        return [t.to(DEVICE) for t in [*random_root_and_joints(n, len(JOINTS), seed), *extra]]

    with leapp.trace("loco", save_path=str(tmp_path)) as session:
        for seed in (1, 2, 3):
            observe(*state(seed))
    report = session.compile(validate=True)
    assert all(node.validation.status == "passed" for node in report.nodes), str(report)
    new = state(11)
    expected = observe(*new)
    names = ["root_pose", "root_vel", "joint_pos", "joint_vel", "command", "action"]
    (value,) = _fresh_process_outputs(tmp_path / "loco", dict(zip(names, new)), tmp_path).values()
    torch.testing.assert_close(value, expected.cpu(), rtol=1e-5, atol=1e-5)
    assert torch.equal(value[:, 9:12], new[4].cpu()) and torch.equal(value[:, -len(JOINTS):], new[5].cpu())


def _fk_node(backend: str, nworld: int):
    mjm = mujoco.MjModel.from_xml_path(str(MJCF))
    with wp.ScopedDevice(DEVICE):
        m = mjw.put_model(mjm)
        d = mjw.put_data(mjm, mujoco.MjData(mjm), nworld=nworld)

    @leapp.node("fk", export_with=backend)
    def forward(qpos):
        wp.to_torch(d.qpos).copy_(qpos)
        with wp.ScopedDevice(DEVICE), annotate.warp_op():
            mjw.kinematics(m, d)
            mjw.com_pos(m, d)
        return wp.to_torch(d.site_xpos).clone(), wp.to_torch(d.subtree_com).clone()

    return forward, mjm


def _qpos_n(mjm, n: int, seed: int) -> torch.Tensor:
    q = _qpos(mjm, seed)
    return q.repeat((n + q.shape[0] - 1) // q.shape[0], 1)[:n].to(DEVICE)


@pytest.mark.parametrize("backend", ["pt2", "onnx"])
@pytest.mark.parametrize("nworld", [4, 16])
def test_mujoco_warp_kinematics_export(tmp_path, backend, nworld):
    forward, mjm = _fk_node(backend, nworld)
    with leapp.trace("fk", save_path=str(tmp_path)) as session:
        for seed in (1, 2, 3):
            forward(_qpos_n(mjm, nworld, seed))
    report = session.compile(validate=True)
    assert all(node.validation.status == "passed" for node in report.nodes), str(report)
    qpos = _qpos_n(mjm, nworld, 20)
    sites, coms = forward(qpos)
    values = list(_fresh_process_outputs(tmp_path / "fk", {"qpos": qpos}, tmp_path).values())
    torch.testing.assert_close(values[0], sites.cpu(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(values[1], coms.cpu(), rtol=1e-5, atol=1e-5)


def test_mujoco_warp_dynamic_batch_names_the_per_world_constant(tmp_path):
    """MJWarp's Data holds per-world bytes kinematics never writes (the world body's rows): with dynamic_batch
    they would be a constant whose size follows the batch, which an export cannot hold; the export says so."""
    from leapp.errors import ExportError

    mjm = mujoco.MjModel.from_xml_path(str(MJCF))
    with wp.ScopedDevice(DEVICE):
        m = mjw.put_model(mjm)
    datas = {}

    @leapp.node("fk", export_with="pt2", dynamic_batch=(1, 16))
    def forward(qpos):  # one Data per batch size, as the probes at batch 1 and 16 need
        n = qpos.shape[0]
        if n not in datas:
            with wp.ScopedDevice(DEVICE):
                datas[n] = mjw.put_data(mjm, mujoco.MjData(mjm), nworld=n)
        d = datas[n]
        wp.to_torch(d.qpos).copy_(qpos)
        with wp.ScopedDevice(DEVICE), annotate.warp_op():
            mjw.kinematics(m, d)
            mjw.com_pos(m, d)
        return wp.to_torch(d.site_xpos).clone(), wp.to_torch(d.subtree_com).clone()

    with leapp.trace("fkdyn", save_path=str(tmp_path)) as session:
        for seed in (1, 2, 3):
            forward(_qpos_n(mjm, 8, seed))
    with pytest.raises(ExportError, match="a constant would have to change size"):
        session.compile(validate=True)
