"""Simulator-style Warp code: memory decided by address, persistent state, refusals by name.

Each scenario is a pattern of real simulator code (Isaac Lab's observation
manager, MuJoCo Warp's ``Data``, Isaac Lab's launch cache), written with plain
Warp here so it runs in every CI job; tests/realworld runs the real packages.
The equivalence checks replay the recorded graph on inputs the trace never
saw: a baked constant fails them.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import warp as wp
from hypothesis import given, settings
from hypothesis import strategies as st
from recorder_helpers import assert_graphs_replay_samples, trace
from warp_replay import run_node_graph

import leapp
from leapp import annotate
from leapp.errors import TraceError

wp.init()
DEVICES = ["cpu", pytest.param("cuda:0", marks=pytest.mark.cuda)]


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


@wp.kernel
def scaled_columns(src: wp.array(dtype=wp.float32, ndim=2), k: int, out: wp.array(dtype=wp.float32, ndim=2)):
    i, j = wp.tid()
    out[i, j] = src[i, j] * float(k + 1)


@wp.kernel
def gravity_in_body(q: wp.array(dtype=wp.quatf), out: wp.array(dtype=wp.vec3f)):
    i = wp.tid()
    out[i] = wp.quat_rotate_inv(q[i], wp.vec3f(0.0, 0.0, -1.0))


@wp.kernel
def accumulate(x: wp.array(dtype=wp.float32), total: wp.array(dtype=wp.float32)):
    i = wp.tid()
    total[i] = total[i] + x[i]


@wp.kernel
def double(x: wp.array(dtype=wp.float32), y: wp.array(dtype=wp.float32)):
    i = wp.tid()
    y[i] = x[i] * 2.0


@wp.kernel
def double_ignoring(unused: wp.array(dtype=wp.float32), x: wp.array(dtype=wp.float32), y: wp.array(dtype=wp.float32)):
    i = wp.tid()
    y[i] = x[i] * 2.0


def _column_views(group, widths):
    """Isaac Lab's observation-manager layout: one persistent (N, D) buffer, a view per term at a column offset."""
    views, start = [], 0
    for d in widths:
        views.append(wp.array(ptr=group.ptr + start * group.strides[1], dtype=wp.float32, shape=(group.shape[0], d),
                              strides=group.strides, device=group.device))
        start += d
    return views


def _group_node(device, n=6, widths=(3, 2, 4)):
    group = wp.zeros((n, sum(widths)), dtype=wp.float32, device=device)  # allocated once, outside the node
    views = _column_views(group, widths)
    group_t = wp.to_torch(group)

    @leapp.node("obs")
    def obs(x):
        with annotate.warp_op():
            for k, view in enumerate(views):
                wp.launch(scaled_columns, dim=view.shape, inputs=[wp.from_torch(x[:, : view.shape[1]]), k],
                          outputs=[view], device=device)
        return group_t.clone()

    def eager(x):
        return torch.cat([x[:, :d] * (k + 1) for k, d in enumerate(widths)], dim=1)

    return obs, eager


def test_column_views_of_a_persistent_group_buffer_are_one_output(device):
    obs, eager = _group_node(device)
    x = torch.randn(6, 4, device=device)
    record, results = trace(obs, x, passes=3)
    (segment,) = record.nodes["obs"].segments
    assert len(segment.outputs) == 1 and not segment.constants  # the three views are one piece of memory
    assert segment.outputs[0].nbytes == 6 * 9 * 4
    assert_graphs_replay_samples(record)
    fresh = torch.randn(6, 4, device=device)
    torch.testing.assert_close(run_node_graph(record.nodes["obs"], [fresh])[0], eager(fresh))


@settings(max_examples=8, deadline=None)
@given(widths=st.lists(st.integers(1, 4), min_size=1, max_size=4), n=st.integers(1, 9), seed=st.integers(0, 2**16))
def test_column_views_replay_like_eager_for_any_layout(widths, n, seed):
    obs, eager = _group_node("cpu", n=n, widths=tuple(widths))
    gen = torch.Generator().manual_seed(seed)
    record, _ = trace(obs, torch.randn(n, 4, generator=gen), passes=2)
    fresh = torch.randn(n, 4, generator=gen)
    torch.testing.assert_close(run_node_graph(record.nodes["obs"], [fresh])[0], eager(fresh))


def test_interior_view_of_a_traced_tensor_reads_it(device):
    """The quaternion view into a transform array: wp.array(ptr=pose.ptr + 12) over a traced (N, 7) tensor."""

    @leapp.node("g")
    def g(pose):
        out = torch.empty(pose.shape[0], 3, device=pose.device)
        base = wp.from_torch(pose)
        quat = wp.array(ptr=base.ptr + 3 * 4, dtype=wp.quatf, shape=(pose.shape[0],), strides=(7 * 4,),
                        device=device)
        with annotate.warp_op():
            wp.launch(gravity_in_body, dim=pose.shape[0], inputs=[quat], outputs=[wp.from_torch(out, dtype=wp.vec3f)],
                      device=device)
        return out

    def poses(k):
        q = torch.nn.functional.normalize(torch.randn(k, 4, device=device), dim=-1)
        return torch.cat([torch.randn(k, 3, device=device), q], dim=1)

    record, results = trace(g, poses(5), passes=3)
    (segment,) = record.nodes["g"].segments
    assert not segment.constants and len(segment.inputs) == 1 and segment.inputs[0].nbytes == 5 * 7 * 4
    fresh = poses(5)
    expected = g(fresh)  # outside a session: plain eager
    torch.testing.assert_close(run_node_graph(record.nodes["g"], [fresh])[0], expected)


def test_persistent_state_the_segment_writes_is_its_output(device):
    """MuJoCo Warp's Data: arrays made once, written by the step, read after it (site_xpos)."""
    state_in = wp.zeros(8, dtype=wp.float32, device=device)
    state_out = wp.zeros(8, dtype=wp.float32, device=device)

    @leapp.node("sim")
    def sim(q):
        wp.to_torch(state_in).copy_(q)  # copying the input in with torch makes the state a traced input
        with annotate.warp_op():
            wp.launch(double, dim=8, inputs=[state_in], outputs=[state_out], device=device)
        return wp.to_torch(state_out).clone()

    record, _ = trace(sim, torch.randn(8, device=device), passes=3)
    (segment,) = record.nodes["sim"].segments
    assert not segment.constants and len(segment.outputs) == 1
    fresh = torch.randn(8, device=device)
    torch.testing.assert_close(run_node_graph(record.nodes["sim"], [fresh])[0], fresh * 2)


@wp.kernel
def fill_tail_then_shift(x: wp.array(dtype=wp.float32), state: wp.array(dtype=wp.float32)):
    i = wp.tid()
    state[i + 1] = x[i] + state[0]  # state[0] is never written: MuJoCo Warp's world-body row


def test_bytes_the_segment_never_writes_keep_their_trace_values(device):
    state = wp.array(np.array([10.0, 0, 0, 0, 0], dtype=np.float32), device=device)

    @leapp.node("seeded")
    def seeded(x):
        with annotate.warp_op():
            wp.launch(fill_tail_then_shift, dim=4, inputs=[wp.from_torch(x)], outputs=[state], device=device)
        return wp.to_torch(state).clone()

    with leapp.trace("s") as session:
        for _ in range(3):
            seeded(torch.randn(4, device=device))
    assert any("never writes keep their trace values" in line for line in session.constants_report)
    fresh = torch.randn(4, device=device)
    expected = torch.cat([torch.tensor([10.0], device=device), fresh + 10.0])
    torch.testing.assert_close(run_node_graph(session.record.nodes["seeded"], [fresh])[0], expected)


def test_state_whose_old_bytes_matter_is_refused_by_name(device):
    total = wp.zeros(4, dtype=wp.float32, device=device)  # a running sum kept outside the node

    @leapp.node("acc")
    def acc(x):
        with annotate.warp_op():
            wp.launch(accumulate, dim=4, inputs=[wp.from_torch(x)], outputs=[total], device=device)
        return wp.to_torch(total).clone()

    with pytest.raises(TraceError) as info:
        trace(acc, torch.ones(4, device=device), passes=2)
    text = str(info.value)
    assert "wp.launch('accumulate')" in text and "argument 'total'" in text and "test_real_warp_patterns.py:" in text
    assert "depend on what that memory held" in text


def test_segment_whose_writes_nothing_reads_is_refused(device):
    scratch = wp.zeros(4, dtype=wp.float32, device=device)

    @leapp.node("dead")
    def dead(x):
        with annotate.warp_op():
            wp.launch(double, dim=4, inputs=[wp.from_torch(x)], outputs=[scratch], device=device)
        return x + 1

    with pytest.raises(TraceError, match=r"writes nothing the node uses after the block.*launch:double"):
        trace(dead, torch.ones(4, device=device), passes=2)


class _Proxy:
    """A wrapper in the manner of Isaac Lab's ProxyArray: the array interface of a wp.array, not a wp.array."""

    def __init__(self, arr):
        self.arr = arr

    @property
    def __array_interface__(self):
        return self.arr.numpy().__array_interface__

    @property
    def __cuda_array_interface__(self):
        return self.arr.__cuda_array_interface__


def test_array_interface_wrapper_is_refused_by_name(device):
    held = wp.zeros(4, dtype=wp.float32, device=device)

    @leapp.node("w")
    def w(x):
        y = torch.empty_like(x)
        with annotate.warp_op():
            wp.launch(double, dim=4, inputs=[_Proxy(held)], outputs=[wp.from_torch(y)], device=device)
        return y

    with pytest.raises(TraceError, match=r"argument 'x' is a .*_Proxy, not a wp.array.*ProxyArray.warp"):
        trace(w, torch.ones(4, device=device), passes=2)


class _LaunchCache:
    """Isaac Lab's _WarpLaunchCache in miniature: record a launch once, replay it with Launch.launch()."""

    def __init__(self):
        self.commands = {}

    def launch(self, key, kernel, dim, inputs, outputs, device):
        command = self.commands.get(key)
        if command is None:
            command = self.commands[key] = wp.launch(kernel, dim=dim, inputs=inputs, outputs=outputs, device=device,
                                                     record_cmd=True)
        command.launch()


def test_recorded_launches_are_captured_like_wp_launch():
    state_in = wp.zeros(4, dtype=wp.float32, device="cpu")
    state_out = wp.zeros(4, dtype=wp.float32, device="cpu")
    cache = _LaunchCache()

    @leapp.node("r")
    def r(x):
        wp.to_torch(state_in).copy_(x)
        with annotate.warp_op():
            cache.launch("double", double, 4, [state_in], [state_out], "cpu")
        return wp.to_torch(state_out).clone()

    record, _ = trace(r, torch.ones(4), passes=3)
    (segment,) = record.nodes["r"].segments
    assert segment.ops == ["launch:double"] and [k.key for k in segment.kernels] == ["double"]
    fresh = torch.randn(4)
    torch.testing.assert_close(run_node_graph(record.nodes["r"], [fresh])[0], fresh * 2)


def test_recorded_launch_without_its_arguments_is_refused_by_name():
    y = wp.zeros(4, dtype=wp.float32, device="cpu")

    @leapp.node("r")
    def r(x):
        command = wp.Launch(double, device=wp.get_device("cpu"))  # parameters set by index: Warp keeps no arguments
        command.set_dim(4)
        command.set_param_at_index(0, wp.from_torch(x))
        command.set_param_at_index(1, y)
        with annotate.warp_op():
            command.launch()
        return wp.to_torch(y).clone()

    with pytest.raises(TraceError, match=r"Launch.launch\(\) of kernel 'double' at .*test_real_warp_patterns.py:\d+"):
        trace(r, torch.ones(4), passes=2)


def test_warp_capture_refusal_names_node_and_line():
    """A copy from an indexed array, which Warp's capture refuses (leapp makes strided copies of plain arrays
    itself, tests/recorder/test_strided_copy.py, but not indexed ones)."""
    indices = wp.array([1, 0], dtype=wp.int32, device="cpu")

    @leapp.node("c")
    def c(x):
        y = torch.zeros_like(x)
        with annotate.warp_op():
            wp.copy(wp.from_torch(y.view(2, 2)), wp.indexedarray(wp.from_torch(x.view(2, 2)), [indices]))
        return y

    with pytest.raises(TraceError) as info:
        trace(c, torch.ones(4), passes=2)
    text = str(info.value)
    assert "Warp refused to capture" in text and "node 'c'" in text and "test_real_warp_patterns.py:" in text
    assert "contiguous" in text


def test_launches_without_device_under_scoped_device():
    @leapp.node("s")
    def s(x):
        y = torch.empty_like(x)
        with wp.ScopedDevice("cpu"), annotate.warp_op():
            wp.launch(double, dim=4, inputs=[wp.from_torch(x)], outputs=[wp.from_torch(y)])
        return y

    record, _ = trace(s, torch.arange(4.0), passes=3)
    assert_graphs_replay_samples(record)
    fresh = torch.randn(4)
    torch.testing.assert_close(run_node_graph(record.nodes["s"], [fresh])[0], fresh * 2)


def test_torch_cat_of_per_term_buffers():
    @leapp.node("cat")
    def cat(a, b):
        ya, yb = torch.empty_like(a), torch.empty_like(b)
        with annotate.warp_op():
            wp.launch(double, dim=a.shape[0], inputs=[wp.from_torch(a)], outputs=[wp.from_torch(ya)], device="cpu")
            wp.launch(double, dim=b.shape[0], inputs=[wp.from_torch(b)], outputs=[wp.from_torch(yb)], device="cpu")
        return torch.cat([ya, yb])

    record, _ = trace(cat, torch.randn(3), torch.randn(5), passes=3)
    a, b = torch.randn(3), torch.randn(5)
    torch.testing.assert_close(run_node_graph(record.nodes["cat"], [a, b])[0], torch.cat([a, b]) * 2)


def test_persistent_state_export_opens_as_leapp_load_does(tmp_path):
    """The zero-output PT2 of the old recorder could not be deserialized; compile() now opens what it wrote."""
    state_out = wp.zeros(8, dtype=wp.float32, device="cpu")

    @leapp.node("sim", export_with="pt2")
    def sim(q):
        with annotate.warp_op():
            wp.launch(double, dim=8, inputs=[wp.from_torch(q)], outputs=[state_out], device="cpu")
        return wp.to_torch(state_out).clone()

    with leapp.trace("p", save_path=str(tmp_path)) as session:
        for _ in range(3):
            sim(torch.randn(8))
    report = session.compile(validate=False)
    assert report.nodes[0].segments == ["sim/warp_segment_0"]
    program = torch.export.load(str(tmp_path / "p" / "sim.pt2"))
    calls = [n for n in program.graph.nodes if n.op == "call_function" and "warp_segment" in str(n.target)]
    assert len(calls) == 1


def test_compile_refuses_an_artifact_that_does_not_open(tmp_path, monkeypatch):
    from leapp._export import compile as compile_module
    from leapp.errors import ExportError

    @leapp.node("plain", export_with="pt2")
    def plain(x):
        return x * 3

    with leapp.trace("bad", save_path=str(tmp_path)) as session:
        for _ in range(3):
            plain(torch.randn(4))
    real = compile_module.export_node

    def broken(record, folder, bundles=None, **kwargs):
        art = real(record, folder, bundles, **kwargs)
        art.path.write_bytes(b"not a zip archive")
        return art

    monkeypatch.setattr(compile_module, "export_node", broken)
    with pytest.raises(ExportError, match=r"node 'plain': the pt2 artifact plain.pt2 was written but cannot be opened"):
        session.compile(validate=False)


def test_noise_check_restores_the_users_values():
    """The write-only check replays the segment on noise; what the user's code sees afterwards is eager's."""
    out = wp.zeros(8, dtype=wp.float32, device="cpu")

    @leapp.node("n")
    def n(x):
        with annotate.warp_op():
            wp.launch(double, dim=8, inputs=[wp.from_torch(x)], outputs=[out], device="cpu")
        return wp.to_torch(out).clone()

    x = torch.arange(8.0)
    _, results = trace(n, x, passes=2)
    for r in results:
        np.testing.assert_array_equal(r.numpy(), (x * 2).numpy())


@pytest.mark.cuda
def test_an_array_on_another_device_is_refused_by_name():
    """MuJoCo Warp launches on the current device: CPU arrays launched on cuda:0 are refused, not captured."""
    held = wp.zeros(4, dtype=wp.float32, device="cpu")

    @leapp.node("d")
    def d(x):
        y = torch.empty_like(x)
        with annotate.warp_op():  # the kernel never reads `unused`, so the eager launch does not fault
            wp.launch(double_ignoring, dim=4, inputs=[held, wp.from_torch(x)], outputs=[wp.from_torch(y)],
                      device="cuda:0")
        return y

    with pytest.raises(TraceError, match=r"runs on cuda:0, but its argument 'unused' is an array on cpu"):
        trace(d, torch.ones(4, device="cuda:0"), passes=2)


@pytest.mark.cuda
def test_device_to_host_copy_in_a_block_is_refused_with_the_line():
    host = wp.zeros(4, dtype=wp.float32, device="cpu")

    @leapp.node("h")
    def h(x):
        y = torch.empty_like(x)
        with annotate.warp_op():
            wp.launch(double, dim=4, inputs=[wp.from_torch(x)], outputs=[wp.from_torch(y)], device="cuda:0")
            wp.copy(host, wp.from_torch(y))  # a readback: Warp cannot capture it
        return y

    with pytest.raises(TraceError) as info:
        trace(h, torch.ones(4, device="cuda:0"), passes=2)
    text = str(info.value)
    assert "Warp refused to capture" in text and "node 'h'" in text and "test_real_warp_patterns.py:" in text
