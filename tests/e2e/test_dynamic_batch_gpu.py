"""Dynamic batch end to end (docs/recorder.md section 1.0): one export, replayed at any batch of its range.

A pipeline of three dynamic nodes covers 1-D launches on compound types (quat -> vec3), 2-D launches, a
constant (the rest pose), scratch arrays made in the block, a @wp.struct parameter holding an array, and
both artifact kinds (PT2 and ONNX with its WarpSegment on the CUDA EP). The exported nodes are compared with
eager at random batches (hypothesis; 1 and sizes that are not multiples of the 256-thread block included)
on a GPU, or on the CPU from the segments' CPU code where there is none. The GPU tests (marked ``cuda``)
check that a steady batch allocates nothing, that a torch.cuda.graph
captured at one batch replays at its size, and run the go2 example exported once with dynamic_batch at
N = 1, 7 and 4096. The CPU test checks the recording and the rules here.

    pytest -m cuda tests/e2e/test_dynamic_batch_gpu.py      # on a GPU machine
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import warp as wp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from warp_devices import warp_device

import leapp
from leapp import annotate
from leapp.bundle import read_bundle

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import go2_pipeline as go2  # the go2 observation's Warp kernels

LO, HI = 1, 2048
REST = [0.1, 0.8, -1.5, 0.2]


@wp.struct
class Gain:
    k: float
    bias: wp.array(dtype=float)  # an array inside a struct: its shape sits inside parameter 1


@wp.kernel
def gain(p: Gain, x: wp.array(dtype=float), y: wp.array(dtype=float)):
    i = wp.tid()
    y[i] = x[i] * p.k + p.bias[i]


class Pipe:
    """Two dynamic nodes (decorator form: the probes at LO and HI run by themselves)."""

    def __init__(self, device: str):
        self.device = device
        self.rest = wp.array(REST, dtype=float, device=device)  # a constant of the segment (never batch-sized)

        @leapp.node("obs", export_with="pt2", dynamic_batch=(LO, HI))
        def obs(quat, joints):
            n = quat.shape[0]
            grav = torch.empty(n, 3, device=quat.device)
            joint_obs = torch.empty(n, 4, device=quat.device)
            with annotate.warp_op():
                tmp = wp.empty((n, 4), dtype=float, device=device)  # scratch
                wp.launch(go2.projected_gravity, dim=n,
                          inputs=[wp.from_torch(quat, dtype=wp.quat), wp.vec3(0.0, 0.0, -1.0)],
                          outputs=[wp.from_torch(grav, dtype=wp.vec3)], device=device)
                wp.launch(go2.joint_offsets, dim=(n, 4), inputs=[wp.from_torch(joints), self.rest], outputs=[tmp],
                          device=device)
                wp.launch(go2.scale, dim=(n, 4), inputs=[tmp, 0.5], outputs=[wp.from_torch(joint_obs)], device=device)
            return torch.cat([grav, joint_obs], dim=-1)

        @leapp.node("act", export_with="onnx", dynamic_batch=(LO, HI))
        def act(raw, bias):
            y = torch.empty(raw.shape[0], device=raw.device)
            with annotate.warp_op():
                p = Gain()
                p.k = 3.0
                p.bias = wp.from_torch(bias)
                wp.launch(gain, dim=raw.shape[0], inputs=[p, wp.from_torch(raw)], outputs=[wp.from_torch(y)],
                          device=device)
            return y

        self.obs, self.act = obs, act


def _inputs(n: int, device: str, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    quat = torch.nn.functional.normalize(torch.randn(n, 4, generator=g), dim=-1)
    return quat.to(device), torch.randn(n, 4, generator=g).to(device), torch.randn(n, generator=g).to(device)


def _eager(quat, joints, bias):
    x, y, z, w = quat.unbind(-1)
    g = torch.tensor([0.0, 0.0, -1.0], device=quat.device)
    v = torch.stack([x, y, z], -1)
    # rotate g by the inverse of q: g' = g*(w^2 - |v|^2) + 2 v (v.g) - 2 w (v x g)
    grav = g * (w * w - (v * v).sum(-1))[:, None] + 2 * v * (v @ g)[:, None] - 2 * w[:, None] * torch.cross(
        v, g.expand_as(v), dim=-1)
    obs = torch.cat([grav, (joints - torch.tensor(REST, device=quat.device)) * 0.5], dim=-1)
    return obs, obs[:, 0] * 3.0 + bias


def _trace(tmp_path, device: str, name: str):
    wp.init()
    pipe = Pipe(device)
    with leapp.trace(name, save_path=str(tmp_path)) as session:
        for seed in range(2):  # discovery, capture (+ the decorator's probes at LO and HI)
            quat, joints, bias = _inputs(300, device, seed)
            obs = pipe.obs(quat, joints)
            pipe.act(obs[:, 0].contiguous(), bias)
    return session


def test_recording_and_rules_on_cpu(tmp_path):
    session = _trace(tmp_path, "cpu", "dyn_cpu")
    session.compile(validate=False)
    for name in ("obs", "act"):
        record = session.record.nodes[name]
        assert [p.batch for p in record.probes] == [LO, HI]
    program = torch.export.load(str(tmp_path / "dyn_cpu" / "obs.pt2"))
    bundle = read_bundle(next(v for k, v in program.state_dict.items() if k.endswith("_bundle")).numpy().tobytes())
    m = bundle.manifest
    assert m["batch"] == {"traced": 300, "min": LO, "max": HI}
    roles = [(b["role"], b.get("bytes_rule")) for b in m["buffers"]]
    assert ("scratch", [16, 0]) in roles and ("constant", None) in roles, roles
    launches = [op for op in m["ops"] if op["op"] == "launch"]
    assert [op["size_rule"] for op in launches] == [[1, 0], [4, 0], [4, 0]]
    import onnx

    model = onnx.load(str(tmp_path / "dyn_cpu" / "act.onnx"))
    dims = [[d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in model.graph.input]
    assert dims == [["batch"], ["batch"]]
    seg = next(n for n in model.graph.node if n.op_type == "WarpSegment")
    struct_patch = [p for op in read_bundle(_initializer(model, seg.input[-1])).manifest["ops"]
                    if op["op"] == "launch" for p in op["patches"] if p["param"] == 1]
    assert struct_patch, "the struct's array shape follows the batch"


def _initializer(model, name: str) -> bytes:
    import onnx.numpy_helper

    return next(onnx.numpy_helper.to_array(t).tobytes() for t in model.graph.initializer if t.name == name)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """The pipeline traced on the device, validated, loaded; ``.device`` set to that device."""
    device = warp_device()
    tmp = tmp_path_factory.mktemp("dyn")
    session = _trace(tmp, device, "dyn_gpu")
    report = session.compile(validate=True)  # validates at 300 (traced), LO and HI (the probes) against eager
    assert all(n.status == "passed" for n in report), str(report)
    pipeline = leapp.load(str(tmp / "dyn_gpu"))
    pipeline.device = device
    return pipeline


@pytest.fixture
def on_gpu(exported):
    if exported.device == "cpu":
        pytest.skip("no CUDA device: what this checks is the CUDA replay's")
    return exported


@pytest.mark.cuda
@pytest.mark.cpu_fallback
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.one_of(st.sampled_from([1, 2, 255, 256, 257, 511, 1023, HI]), st.integers(LO, HI)))
def test_exported_equals_eager_at_any_batch(exported, n):
    quat, joints, bias = _inputs(n, exported.device, seed=n)
    obs_ref, act_ref = _eager(quat, joints, bias)
    obs = exported.run_node("obs", quat=quat, joints=joints)["output"]
    torch.testing.assert_close(obs, obs_ref, rtol=1e-5, atol=1e-5)
    act = exported.run_node("act", raw=obs[:, 0].contiguous(), bias=bias)["output"]  # ONNX, CUDA or CPU EP
    torch.testing.assert_close(act.to(act_ref.device), act_ref, rtol=1e-5, atol=1e-5)


@pytest.mark.cuda
@pytest.mark.cpu_fallback
def test_out_of_range_batch_and_wrong_dims_name_node_and_input(exported):
    quat, joints, _ = _inputs(HI + 1, exported.device)
    with pytest.raises(Exception, match=rf"node 'obs'.*input 'quat'.*batch {HI + 1} is outside"):
        exported.run_node("obs", quat=quat, joints=joints)
    quat, joints, _ = _inputs(8, exported.device)
    with pytest.raises(Exception, match=r"input 'joints' expects float32\[batch 1..2048, 4\]"):
        exported.run_node("obs", quat=quat, joints=joints[:, :3].contiguous())


@pytest.mark.cuda
def test_steady_batch_allocates_nothing_and_cuda_graph_replays_its_batch(on_gpu):
    exported = on_gpu
    from leapp import _native

    program = torch.export.load(str(exported.path / "obs.pt2"))
    data = next(v for k, v in program.state_dict.items() if k.endswith("_bundle")).numpy().tobytes()
    bundle = _native.Bundle(data)
    stream = torch.cuda.Stream()

    def run(n: int):
        quat, joints, _ = _inputs(n, "cuda:0", seed=n)
        grav = torch.empty(n, 3, device="cuda:0")
        joint_obs = torch.empty(n, 4, device="cuda:0")
        ins, outs = [quat, joints], [grav, joint_obs]
        _native.run_segment(bundle, [t.data_ptr() for t in ins], [t.data_ptr() for t in outs], stream.cuda_stream, 0,
                            input_nbytes=[t.numel() * 4 for t in ins], output_nbytes=[t.numel() * 4 for t in outs])
        stream.synchronize()
        return outs

    run(1000)
    before = _native.allocation_count()
    for n in (1000, 3, 999, 1000):  # within the scratch already allocated: nothing more
        run(n)
    assert _native.allocation_count() == before
    # a torch.cuda.graph captured at batch 7 replays at batch 7 with new input values
    q7, j7, _ = _inputs(7, "cuda:0", seed=1)
    module = program.module()
    module(q7, j7)  # warm: prepares the segment and this stream's scratch
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        out = module(q7, j7)
    out = out[0] if isinstance(out, (tuple, list)) else out  # the program's outputs: (obs,)
    q7.copy_(_inputs(7, "cuda:0", seed=2)[0])
    graph.replay()
    torch.cuda.synchronize()
    assert out.shape == (7, 7)
    torch.testing.assert_close(out, _eager(q7, j7, torch.zeros(7, device="cuda:0"))[0], rtol=1e-5, atol=1e-5)


@pytest.mark.cuda
def test_go2_example_exported_once_runs_at_1_7_and_4096(tmp_path):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "go2_pipeline.py"
    spec = importlib.util.spec_from_file_location("go2_pipeline_dyn", path)
    go2 = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(go2)
    assert go2.main(["--envs", "64", "--out", str(tmp_path), "--dynamic-batch", "1,4096",
                     "--check-batches", "1,7,4096"]) == 0


@pytest.mark.cuda
def test_cuda_graphs_runner_replays_each_batch_at_its_size(on_gpu):
    """leapp.load(..., cuda_graphs=True): one captured graph per input shape; batches alternate."""
    exported = on_gpu
    pipeline = leapp.load(str(exported.path), cuda_graphs=True)
    for n in (7, 7, 100, 7, 1, 100):
        quat, joints, bias = _inputs(n, "cuda:0", seed=n)
        got = pipeline.run_node("obs", quat=quat, joints=joints)["output"].clone()
        torch.testing.assert_close(got, _eager(quat, joints, bias)[0], rtol=1e-5, atol=1e-5)
