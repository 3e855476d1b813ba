"""MuJoCo Warp forward kinematics and centre-of-mass positions, traced by leapp on the CPU.

``hopper.xml`` is a floating base with a three-hinge leg and two sites. ``put_model`` / ``put_data`` make
the model and a 4-world Data on device "cpu"; the node copies qpos into ``d.qpos`` with torch
(``wp.to_torch(d.qpos).copy_(qpos)``) and runs ``kinematics`` and ``com_pos`` in one segment.
``kinematics`` never writes the world body's row (body 0) of ``d.xpos`` / ``d.xquat`` but its later kernels
read it: those bytes keep their trace values in the export (put_data's, which nothing changes), while every
byte kinematics writes is the segment's own. The node is traced as MuJoCo Warp users write it, and also with
the world rows copied in with torch (state that is then part of the node).
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.realworld
mujoco = pytest.importorskip("mujoco", reason="mujoco 4.0.0 is not installed (bash scripts/install-realworld.sh)")
mjw = pytest.importorskip("mujoco_warp",
                          reason="mujoco-warp 4.0.0 is not installed (bash scripts/install-realworld.sh)")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import warp as wp  # noqa: E402
from aarch64_emulation import build_runners, needs_emulation, run_on_both  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from realworld_helpers import assert_graph_matches_eager, check_recording, trace_passes  # noqa: E402
from warp_replay import run_node_graph  # noqa: E402

import leapp  # noqa: E402
from leapp import annotate  # noqa: E402

NWORLD = 4
MJCF = Path(__file__).with_name("hopper.xml")


def _model(device: str = "cpu"):
    mjm = mujoco.MjModel.from_xml_path(str(MJCF))
    with wp.ScopedDevice(device):
        m = mjw.put_model(mjm)
        d = mjw.put_data(mjm, mujoco.MjData(mjm), nworld=NWORLD)
    assert d.qpos.device == wp.get_device(device) and d.qpos.shape == (NWORLD, mjm.nq)
    return mjm, m, d


def make_forward(world_rows: bool = True, device: str = "cpu"):
    """A fresh model and Data on ``device``, and the FK node; ``world_rows=False`` leaves out the copy of body
    0's rows."""
    mjm, m, d = _model(device)
    world_xpos, world_xquat = wp.to_torch(d.xpos).clone(), wp.to_torch(d.xquat).clone()

    @leapp.node("fk")
    def forward(qpos):
        wp.to_torch(d.qpos).copy_(qpos)
        if world_rows:
            wp.to_torch(d.xpos).copy_(world_xpos)
            wp.to_torch(d.xquat).copy_(world_xquat)
        with wp.ScopedDevice(device), annotate.warp_op():  # MJWarp launches on the current device
            mjw.kinematics(m, d)
            mjw.com_pos(m, d)
        return wp.to_torch(d.site_xpos).clone(), wp.to_torch(d.subtree_com).clone()

    return forward, mjm


def _qpos(mjm, seed: int) -> torch.Tensor:
    """Random configurations around qpos0: base position and orientation, joint angles within +-1 rad."""
    g = torch.Generator().manual_seed(seed)
    qpos = torch.as_tensor(mjm.qpos0, dtype=torch.float32).repeat(NWORLD, 1)
    qpos[:, :3] += 0.5 * torch.randn(NWORLD, 3, generator=g)
    qpos[:, 3:7] = torch.nn.functional.normalize(torch.randn(NWORLD, 4, generator=g), dim=-1)
    qpos[:, 7:] = 2.0 * torch.rand(NWORLD, mjm.nq - 7, generator=g) - 1.0
    return qpos


def _mujoco_c(mjm, qpos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """site_xpos and subtree_com per world from MuJoCo's C library (mj_kinematics + mj_comPos)."""
    data = mujoco.MjData(mjm)
    sites, coms = [], []
    for world in qpos.double().numpy():
        data.qpos[:] = world
        mujoco.mj_kinematics(mjm, data)
        mujoco.mj_comPos(mjm, data)
        sites.append(data.site_xpos.copy())
        coms.append(data.subtree_com.copy())
    return torch.as_tensor(np.stack(sites), dtype=torch.float32), torch.as_tensor(np.stack(coms), dtype=torch.float32)


@pytest.fixture(scope="module")
def traced():
    forward, mjm = make_forward()
    return trace_passes(forward, [[_qpos(mjm, seed)] for seed in (1, 2, 3)]), forward, mjm


def test_fk_follows_new_qpos(traced):
    """The recorded graph replays its samples and equals eager MuJoCo Warp, and MuJoCo's C library, on a qpos
    it was not traced with."""
    record, forward, mjm = traced
    qpos = _qpos(mjm, 7)
    check_recording(record, "fk", forward, [qpos])
    for got, expected in zip(forward(qpos), _mujoco_c(mjm, qpos)):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_graph_equals_eager_on_random_qpos(traced, seed):
    record, forward, mjm = traced
    assert_graph_matches_eager(record, "fk", forward, [_qpos(mjm, seed)], atol=1e-5)


def test_fk_as_written_keeps_the_world_rows_of_the_trace():
    """Without the world body's rows as node state: the bytes kinematics never writes keep put_data's values
    (listed in the constants report), everything it writes follows the new qpos."""
    forward, mjm = make_forward(world_rows=False)
    with leapp.trace("fk_as_written") as session:
        for seed in (1, 2, 3):
            forward(_qpos(mjm, seed))
    record = session.record
    assert any("bytes it never writes keep their trace values" in line for line in session.constants_report)
    qpos = _qpos(mjm, 11)
    check_recording(record, "fk", forward, [qpos])
    sites, coms = _mujoco_c(mjm, qpos)
    got_sites, got_coms = run_node_graph(record.nodes["fk"], [qpos])
    torch.testing.assert_close(got_sites, sites, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_coms, coms, atol=1e-5, rtol=1e-5)


def test_exported_fk_runs_on_the_cpu_from_its_cpu_code(tmp_path):
    """The FK node exported (ONNX) as traced on the CPU: its segment carries MuJoCo Warp's kernels as CPU code
    (docs/export-cpu.md), validates on the CPU, and leapp.load equals eager MuJoCo Warp on new qpos, with no GPU."""
    import shutil

    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("needs a C++ compiler: the export compiles Warp's CPU source")
    forward, mjm = make_forward()
    with leapp.trace("mjw", save_path=str(tmp_path)) as session:
        for seed in (1, 2, 3):
            forward(_qpos(mjm, seed))
    report = session.compile(validate=True)
    assert report["fk"].status == "passed", str(report)
    pipeline = leapp.load(tmp_path / "mjw")
    for seed in (7, 8):
        qpos = _qpos(mjm, seed)
        for got, want in zip(pipeline(qpos=qpos).values(), forward(qpos)):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@needs_emulation
def test_the_fk_segment_s_aarch64_code_runs_and_matches_x86_64_under_emulation(tmp_path):
    """MuJoCo Warp's kinematics and com_pos exported from this x86_64 machine carry aarch64 code too (an ARM
    robot without a GPU); run through leapp's runtime built for aarch64 under qemu (tests/aarch64_emulation.py),
    it equals the x86_64 code and eager MuJoCo Warp on new qpos. Not bit for bit: the two machines' C libraries
    may round sin and cos differently in the last place."""
    from leapp.bundle import read_bundle
    from leapp.runtime.binary_choice import bundles_in_artifact

    forward, mjm = make_forward()
    with leapp.trace("mjw", save_path=str(tmp_path)) as session:
        for seed in (1, 2, 3):
            forward(_qpos(mjm, seed))
    session.compile(validate=False)
    node = leapp.load(tmp_path / "mjw").nodes["fk"]
    (bundle,) = bundles_in_artifact(node.backend, node.artifact, node.runner)
    manifest = read_bundle(bundle).manifest
    assert [c["machine"] for c in manifest["cpu_code"]] == ["x86_64", "aarch64"]
    _, _, d = _model()  # the rows kinematics never writes, as the node copies them in
    world = [wp.to_torch(d.xpos).numpy(), wp.to_torch(d.xquat).numpy()]
    runners = build_runners(tmp_path)
    for seed in (7, 8):
        qpos = _qpos(mjm, seed)
        results = run_on_both(runners, bundle, [qpos.numpy(), *world], tmp_path / f"seed{seed}", manifest["signature"])
        for x86, arm in zip(results["x86_64"], results["aarch64"]):
            np.testing.assert_allclose(arm, x86, rtol=1e-6, atol=1e-6)
        sites, coms = forward(qpos)  # the segment's outputs: xpos, xquat, site_xpos, subtree_com
        torch.testing.assert_close(torch.from_numpy(results["aarch64"][2]), sites, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(torch.from_numpy(results["aarch64"][3]), coms, rtol=1e-5, atol=1e-6)
