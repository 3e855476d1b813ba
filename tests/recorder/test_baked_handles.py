"""Warp meshes, BVHs, hash grids, volumes, textures and raw addresses cannot travel in an export.

A kernel takes a ``wp.Mesh`` as its ``uint64`` id, a pointer of the tracing
process; APIC records it as plain bytes, so the export used to replay the old
pointer in another process (on CUDA: an illegal memory access). The capture
pass refuses such segments, naming the kernel, the argument and the launch's
file:line. On the CPU the ids are host pointers: the same refusal, testable here.
"""

from __future__ import annotations

import types

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import torch
import warp as wp
from recorder_helpers import assert_graphs_replay_samples, trace

import leapp
from leapp import annotate
from leapp._recorder.handles import BAKED_HANDLE, LiveObjects, check_launch_handles, integer_values
from leapp.errors import TraceError

wp.init()
THIS = "test_baked_handles.py:"
DEVICES = ["cpu", pytest.param("cuda:0", marks=pytest.mark.cuda)]
MAX_DIST = 1.0e6


@wp.kernel
def mesh_distance(mesh: wp.uint64, q: wp.array(dtype=wp.vec3), d: wp.array(dtype=float)):
    i = wp.tid()
    hit = wp.mesh_query_point_no_sign(mesh, q[i], MAX_DIST)
    if hit.result:
        d[i] = wp.length(q[i] - wp.mesh_eval_position(mesh, hit.face, hit.u, hit.v))


@wp.struct
class Scene:
    bvh: wp.uint64
    pad: float


@wp.kernel
def bvh_hits(scene: Scene, q: wp.array(dtype=wp.vec3), d: wp.array(dtype=float)):
    i = wp.tid()
    query = wp.bvh_query_aabb(scene.bvh, q[i] - wp.vec3(scene.pad), q[i] + wp.vec3(scene.pad))
    count = int(0)
    index = int(0)
    while wp.bvh_query_next(query, index):
        count += 1
    d[i] = float(count)


@wp.kernel
def grid_neighbours(grids: wp.array(dtype=wp.uint64), pts: wp.array(dtype=wp.vec3), q: wp.array(dtype=wp.vec3),
                    d: wp.array(dtype=float)):
    i = wp.tid()
    query = wp.hash_grid_query(grids[0], q[i], 1.0)
    count = int(0)
    index = int(0)
    while wp.hash_grid_query_next(query, index):
        count += 1
    d[i] = float(count) + float(pts.shape[0]) * 0.0


@wp.kernel
def seeded(seed: wp.uint64, offsets: wp.array(dtype=wp.int64), q: wp.array(dtype=wp.vec3), d: wp.array(dtype=float)):
    i = wp.tid()
    d[i] = q[i][0] + float(seed % wp.uint64(7)) + float(offsets[i % 2])


def _triangle(device):
    pts = wp.array([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]], dtype=wp.vec3, device=device)
    return pts, wp.array([0, 1, 2], dtype=int, device=device)


def _node(launch):
    """A node: x (n, 3) -> d (n,), whose one segment calls ``launch(q, d)``."""
    def step(x):
        with leapp.node("n", export_with="pt2"):
            x = annotate.input_tensors("n", {"x": x})
            d = torch.zeros(x.shape[0], device=x.device)
            with annotate.warp_op():
                launch(wp.from_torch(x, dtype=wp.vec3), wp.from_torch(d))
            annotate.output_tensors("n", {"d": d})
        return d

    return step


def _clean_state():
    runtime = wp._src.context.runtime
    assert runtime.tape is None and runtime._apic_capture is None and runtime._apic_graph is None
    assert torch._C._len_torch_dispatch_stack() == 0 and torch._C._len_torch_function_stack() == 0
    assert leapp._recorder.session.current_session() is None


def _refused(step, x, line: int) -> str:
    with pytest.raises(TraceError, match=BAKED_HANDLE) as info:
        trace(step, x)
    text = str(info.value)
    assert f"{THIS}{line} in segment n/warp_segment_0" in text, text
    assert "of node 'n'" in text and "Keep that query outside the exported node" in text
    _clean_state()
    return text


@pytest.mark.parametrize("device", DEVICES)
def test_a_mesh_id_argument_is_refused_at_capture(device):
    mesh = wp.Mesh(*_triangle(device))
    launched = []

    def launch(q, d):
        launched.append(1)
        wp.launch(mesh_distance, dim=q.shape[0], inputs=[mesh.id, q], outputs=[d], device=device)

    line = launch.__code__.co_firstlineno + 2
    text = _refused(_node(launch), torch.ones(4, 3, device=device), line)
    assert "wp.launch('mesh_distance') at " in text
    assert f"argument 'mesh' = 0x{mesh.id:x} is the id of a live wp.Mesh on {wp.get_device(device)}" in text
    assert len(launched) == 2, "discovery ran eagerly; the capture pass refused at the block's exit"


def test_a_bvh_id_in_a_struct_field_is_refused():
    lowers = wp.array([[0.0, 0.0, 0.0]], dtype=wp.vec3, device="cpu")
    bvh = wp.Bvh(lowers, wp.array([[1.0, 1.0, 1.0]], dtype=wp.vec3, device="cpu"))
    scene = Scene()
    scene.bvh, scene.pad = bvh.id, 0.5

    def launch(q, d):
        wp.launch(bvh_hits, dim=q.shape[0], inputs=[scene, q], outputs=[d], device="cpu")

    text = _refused(_node(launch), torch.full((3, 3), 0.5), launch.__code__.co_firstlineno + 1)
    assert f"argument 'scene.bvh' = 0x{bvh.id:x} is the id of a live wp.Bvh on cpu" in text


def test_hash_grid_ids_in_a_constant_array_are_refused():
    pts = wp.array(np.random.default_rng(0).random((8, 3)), dtype=wp.vec3, device="cpu")
    grid = wp.HashGrid(4, 4, 4, device="cpu")
    grid.build(pts, 1.0)
    grids = wp.array([grid.id], dtype=wp.uint64, device="cpu")  # not traced: snapshotted as a constant

    def launch(q, d):
        wp.launch(grid_neighbours, dim=q.shape[0], inputs=[grids, pts, q], outputs=[d], device="cpu")

    text = _refused(_node(launch), torch.zeros(3, 3), launch.__code__.co_firstlineno + 1)
    assert "the array 'grids' (wp.array uint64 (1,) (8 bytes)), snapshotted as a constant, holds the id of a live " \
           "wp.HashGrid on cpu at element 0" in text, text


def test_an_address_passed_as_an_integer_is_refused():
    table = wp.zeros(16, dtype=float, device="cpu")
    offsets = wp.array([0, 1], dtype=wp.int64, device="cpu")

    def launch(q, d):
        wp.launch(seeded, dim=q.shape[0], inputs=[table.ptr + 8, offsets, q], outputs=[d], device="cpu")

    text = _refused(_node(launch), torch.zeros(2, 3), launch.__code__.co_firstlineno + 1)
    assert f"argument 'seed' = 0x{table.ptr + 8:x} is an address inside a live wp.array float32 (16,) on cpu " \
           "(offset 8)" in text, text


def test_plain_64_bit_integers_are_not_handles():
    offsets = wp.array([3, -2], dtype=wp.int64, device="cpu")  # a constant int64 array of plain values

    def launch(q, d):
        for seed in (7, 0x9E3779B97F4A7C15):
            wp.launch(seeded, dim=q.shape[0], inputs=[seed, offsets, q], outputs=[d], device="cpu")

    record, _ = trace(_node(launch), torch.arange(6.0).reshape(2, 3), passes=3)
    (seg,) = record.nodes["n"].segments
    assert seg.captured_ops == ["launch:seeded", "launch:seeded"] and len(seg.constants) == 1
    assert_graphs_replay_samples(record)


def test_a_texture_argument_is_refused_without_a_heap_scan():
    """Texture descriptors hold a texture object handle; found by the parameter type (kernel not compiled)."""

    @wp.kernel(module="unique")
    def sample(tex: wp.Texture2D, out: wp.array(dtype=float)):
        out[wp.tid()] = wp.texture_sample(tex, wp.vec2(0.5, 0.5), dtype=float)

    launch = types.SimpleNamespace(kernel=sample, args=[object(), None], caller="f.py:3")
    live = LiveObjects()
    with pytest.raises(TraceError, match=r"at f\.py:3 passes a process-local handle .*'tex' is a Warp texture"):
        check_launch_handles([launch], lambda l: f"launch at {l.caller}", live)
    assert live._ids is None, "no heap scan was needed"


def test_integer_values_reads_64_bit_scalars_and_struct_fields_only():
    scene = Scene()
    scene.bvh, scene.pad = 12345, 1.0
    assert list(integer_values("scene", Scene, scene)) == [("scene.bvh", 12345)]
    assert list(integer_values("k", wp.int64, -1)) == [("k", 2**64 - 1)]
    assert list(integer_values("k", wp.uint64, wp.uint64(9))) == [("k", 9)]
    assert list(integer_values("k", wp.int32, 12345)) == []  # too narrow to hold a pointer
    assert list(integer_values("k", wp.uint64, 0)) == [] and list(integer_values("k", wp.uint64, True)) == []


@pytest.mark.cuda
def test_fresh_process_validation_catches_a_baked_mesh_id(tmp_path, monkeypatch):
    """With the capture check bypassed the export bakes the mesh's device pointer. Run in this process,
    where the mesh lives, the artifact matches eager (what in-process validation saw); the fresh
    validation process must fail the node, and this process's CUDA context must stay usable."""
    import leapp._recorder.capture as capture
    from leapp._export.compile import compile_session
    from leapp.errors import ValidationError
    from leapp.runtime.io import IOSpec
    from leapp.runtime.open_artifact import make_runner

    monkeypatch.setattr(capture, "check_launch_handles", lambda *args, **kwargs: None)
    device = "cuda:0"
    mesh = wp.Mesh(*_triangle(device))

    def launch(q, d):
        wp.launch(mesh_distance, dim=q.shape[0], inputs=[mesh.id, q], outputs=[d], device=device)

    x = torch.rand(64, 3, device=device, generator=torch.Generator(device).manual_seed(0))
    with leapp.trace("baked", save_path=str(tmp_path)) as session:
        for _ in range(3):
            _node(launch)(x)
    record = session.record
    with pytest.raises(ValidationError) as info:
        compile_session(record, validation_timeout=120.0)
    report = info.value.report
    assert report["n"].status in ("error", "failed"), str(info.value)
    assert str(info.value).startswith("Model validation failed for 1 node(s): ['n']")
    node = record.nodes["n"]
    specs = [[IOSpec(s.name, s.dtype, tuple(s.shape)) for s in side] for side in (node.inputs, node.outputs)]
    runner = make_runner("pt2", tmp_path / "baked" / "n.pt2", *specs, device, has_segments=True)
    (got,) = runner(list(node.samples[0].inputs))
    torch.testing.assert_close(got, node.samples[0].outputs[0])  # in-process, the baked pointer still works
    torch.cuda.synchronize()
    assert torch.ones(4, device=device).sum().item() == 4.0


@settings(max_examples=10)  # each example scans the heap (about 0.15 s)
@given(st.integers(1, 64), st.data())
def test_every_address_inside_a_live_array_is_found(n, data):
    arr = wp.zeros(n, dtype=float, device="cpu")
    tensor = torch.zeros(n, dtype=torch.int64)
    live = LiveObjects()
    k = data.draw(st.integers(0, 4 * n - 1))
    assert live.describe(arr.ptr + k) == f"an address inside a live wp.array float32 ({n},) on cpu (offset {k})"
    j = data.draw(st.integers(0, 8 * n - 1))
    assert live.describe(tensor.data_ptr() + j) == f"an address inside a live torch storage ({8 * n} bytes) on cpu " \
                                                   f"(offset {j})"
