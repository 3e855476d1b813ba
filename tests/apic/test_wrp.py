"""The shared .wrp parser (exporter and recorder) against real CPU captures (Warp 1.19) and corrupted files."""

from __future__ import annotations

import os
import struct
import tempfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

wp = pytest.importorskip("warp")
torch = pytest.importorskip("torch")

from leapp._apic import wrp as W  # noqa: E402
from leapp._apic.wrp import WrpError, parse_wrp, read_ops  # noqa: E402
from leapp.errors import ExportError  # noqa: E402


@wp.struct
class Params:
    scale: float
    offset: wp.vec3
    arr: wp.array(dtype=float)


@wp.kernel
def k_scalars(a: wp.array(dtype=float), s: float, n: wp.int64, flag: wp.bool, m: wp.mat22,
              out: wp.array(dtype=float)):
    i = wp.tid()
    out[i] = a[i] * s + float(n) + m[0, 1]


@wp.kernel
def k_vec_quat(q: wp.array(dtype=wp.quat), g: wp.vec3, out: wp.array(dtype=wp.vec3)):
    i = wp.tid()
    out[i] = wp.quat_rotate_inv(q[i], g)


@wp.kernel
def k_2d(a: wp.array2d(dtype=float), out: wp.array2d(dtype=float)):
    i, j = wp.tid()
    out[i, j] = a[i, j] + 1.0


@wp.kernel
def k_struct(p: Params, out: wp.array(dtype=float)):
    i = wp.tid()
    out[i] = p.arr[i] * p.scale + p.offset[0]


@wp.kernel
def scale(src: wp.array(dtype=float), s: float, dst: wp.array(dtype=float)):
    i = wp.tid()
    dst[i] = src[i] * s


@wp.kernel
def k_handle(m: wp.handle, out: wp.array(dtype=float)):
    i = wp.tid()
    out[i] = 1.0


def capture(tmp_path, fn, inputs=None, outputs=None) -> W.WrpFile:
    """Record ``fn`` in a CPU APIC capture, save it and parse the .wrp."""
    with wp.ScopedCapture(device="cpu", apic=True) as cap:
        fn()
    path = os.path.join(tmp_path, "seg")
    wp.capture_save(cap.graph, path, inputs=inputs, outputs=outputs)
    with open(path + ".wrp", "rb") as f:
        data = f.read()
    return parse_wrp(data), data


def arr(values, dtype=float):
    return wp.array(np.asarray(values), dtype=dtype, device="cpu")


def test_scalars_and_view_relocation(tmp_path):
    a = arr(np.arange(10, dtype=np.float32))
    out = wp.zeros(6, dtype=float, device="cpu")
    m = wp.mat22(1.0, 2.0, 3.0, 4.0)
    w, _ = capture(tmp_path, lambda: wp.launch(k_scalars, dim=6, inputs=[a[3:9], 1.5, 7, True, m, out], device="cpu"),
                   inputs={"a": a}, outputs={"out": out})
    assert w.producer == wp.__version__ and w.version == 18 and w.device == "cpu" and w.target_arch == 0
    assert set(w.bindings) == {"a", "out"}
    assert w.regions[w.bindings["a"]].size == 40 and w.regions[w.bindings["a"]].snapshot == a.numpy().tobytes()
    assert not w.regions[w.bindings["a"]].transient
    (launch,) = w.ops
    assert isinstance(launch, W.WrpLaunch) and launch.kernel_key == "k_scalars" and launch.is_forward
    assert (launch.shape, launch.ndim, launch.size, launch.coord_mult) == ((6,), 1, 6, 1)
    assert [len(p.value) for p in launch.params] == [56, 4, 8, 1, 16, 56]
    assert [p.align for p in launch.params] == [8, 4, 8, 1, 4, 8]
    assert [p.index for p in launch.params] == [1, 2, 3, 4, 5, 6]
    assert launch.params[1].value == struct.pack("<f", 1.5)
    assert launch.params[2].value == struct.pack("<q", 7)
    assert launch.params[3].value == b"\x01"
    assert launch.params[4].value == struct.pack("<4f", 1, 2, 3, 4)
    # the view a[3:9] is region "a" at byte offset 12; grad slots are explicit NULLs
    view = launch.params[0]
    assert [(r.offset, r.kind_name, r.region_id, r.region_offset) for r in view.relocs] == [
        (0, "DATA_PTR", w.bindings["a"], 12), (8, "NULL", -1, 0)]
    shape, strides = struct.unpack_from("<4i", view.value, 16), struct.unpack_from("<4i", view.value, 32)
    assert shape == (6, 0, 0, 0) and strides == (4, 0, 0, 0)
    assert launch.params[5].relocs[0].region_id == w.bindings["out"]
    assert launch.params[1].relocs == ()
    kernel = w.kernel(launch.module_hash, "k_scalars")
    assert kernel.forward_name.startswith("k_scalars_") and kernel.forward_name.endswith("_cpu_forward")
    assert kernel.block_dim == 1 and w.modules[launch.module_hash].target_arch == 0


def test_vec3_quat_and_2d_arrays(tmp_path):
    q = arr(np.tile([0.0, 0.0, 0.0, 1.0], (5, 1)).astype(np.float32), dtype=wp.quat)
    out = wp.zeros(5, dtype=wp.vec3, device="cpu")
    a2 = arr(np.ones((3, 4), dtype=np.float32))
    o2 = wp.zeros((3, 4), dtype=float, device="cpu")

    def run():
        wp.launch(k_vec_quat, dim=5, inputs=[q, wp.vec3(0.0, 0.0, -1.0)], outputs=[out], device="cpu")
        wp.launch(k_2d, dim=(3, 4), inputs=[a2[:, 1:]], outputs=[o2[:, :3]], device="cpu")

    w, _ = capture(tmp_path, run, inputs={"q": q, "a2": a2}, outputs={"out": out, "o2": o2})
    vq, k2 = w.ops
    assert [len(p.value) for p in vq.params] == [56, 12, 56]
    assert vq.params[1].value == struct.pack("<3f", 0, 0, -1)
    assert struct.unpack_from("<i", vq.params[0].value, 32)[0] == 16  # quat stride in bytes
    assert struct.unpack_from("<i", vq.params[2].value, 32)[0] == 12  # vec3 stride
    assert w.regions[w.bindings["q"]].size == 5 * 16 and w.regions[w.bindings["out"]].size == 5 * 12
    assert (k2.shape, k2.ndim, k2.size) == ((3, 4), 2, 12)
    src, dst = k2.params
    assert struct.unpack_from("<4i", src.value, 16) == (3, 3, 0, 0)
    assert struct.unpack_from("<4i", src.value, 32) == (16, 4, 0, 0)
    assert struct.unpack_from("<H", src.value, 48)[0] == 2
    assert (src.relocs[0].region_id, src.relocs[0].region_offset) == (w.bindings["a2"], 4)
    assert (dst.relocs[0].region_id, dst.relocs[0].region_offset) == (w.bindings["o2"], 0)


def test_struct_argument_relocation_inside_the_struct(tmp_path):
    b = arr(np.arange(4, dtype=np.float32))
    out = wp.zeros(4, dtype=float, device="cpu")
    p = Params()
    p.scale, p.offset, p.arr = 2.0, wp.vec3(1.0, 2.0, 3.0), b
    w, _ = capture(tmp_path, lambda: wp.launch(k_struct, dim=4, inputs=[p, out], device="cpu"), inputs={"b": b})
    param = w.ops[0].params[0]
    assert len(param.value) == 72 and param.align == 8
    assert struct.unpack_from("<f3f", param.value, 0) == (2.0, 1.0, 2.0, 3.0)
    assert [(r.offset, r.kind) for r in param.relocs] == [(16, W.RELOC_DATA_PTR), (24, W.RELOC_NULL)]
    assert param.relocs[0].region_id == w.bindings["b"]


def test_copy_zero_fill_and_extra_launch_dims(tmp_path):
    a = arr(np.arange(8, dtype=np.float32))
    b = wp.zeros(8, dtype=float, device="cpu")
    c = wp.zeros(8, dtype=wp.int32, device="cpu")

    def run():
        wp.copy(b, a, dest_offset=2, src_offset=1, count=5)
        b.zero_()
        b.fill_(1.5)
        c.fill_(-1)
        wp.launch(k_scalars, dim=(4, 2), inputs=[a, 1.0, 0, False, wp.mat22(), b], device="cpu")

    w, _ = capture(tmp_path, run, inputs={"a": a}, outputs={"b": b, "c": c})
    copy, zero, fill, fill_c, launch = w.ops
    assert copy == W.WrpMemcpy(0, w.bindings["b"], 8, w.bindings["a"], 4, 20)
    assert (zero.region, zero.offset, zero.size, zero.value) == (w.bindings["b"], 0, 32, 0)
    assert isinstance(fill, W.WrpMemtile) and fill.pattern == struct.pack("<f", 1.5) and fill.count == 8
    assert fill_c.pattern == b"\xff\xff\xff\xff" and fill_c.region == w.bindings["c"]
    # a 2-D launch of a 1-D kernel folds the extra extent into coord_mult
    assert (launch.shape, launch.size, launch.coord_mult) == ((4,), 8, 2)


def test_handle_relocation_and_mesh_count(tmp_path):
    pts = arr(np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0]], dtype=np.float32), dtype=wp.vec3)
    mesh = wp.Mesh(points=pts, indices=arr(np.array([0, 1, 2], dtype=np.int32), dtype=wp.int32))
    out = wp.zeros(2, dtype=float, device="cpu")
    w, _ = capture(tmp_path, lambda: wp.launch(k_handle, dim=2, inputs=[mesh.id, out], device="cpu"))
    (rel,) = w.ops[0].params[0].relocs
    assert rel.kind_name == "HANDLE" and rel.region_offset == mesh.id and w.mesh_count == 1


@pytest.mark.parametrize("name, fn_name, op_name", [
    ("array_sum", "sum", "REDUCTION"),
    ("radix_sort_pairs", "sort", "RADIX_SORT"),
])
def test_other_ops_are_recognised_by_name(tmp_path, name, fn_name, op_name):
    a = arr(np.arange(16, dtype=np.float32))
    s = wp.zeros(1, dtype=float, device="cpu")
    keys = arr(np.arange(32, dtype=np.int32)[::-1].copy(), dtype=wp.int32)
    vals = wp.zeros(32, dtype=wp.int32, device="cpu")
    fn = {"sum": lambda: wp.utils.array_sum(a, out=s), "sort": lambda: wp.utils.radix_sort_pairs(keys, vals, 16)}
    w, _ = capture(tmp_path, fn[fn_name])
    (op,) = w.ops
    assert isinstance(op, W.WrpOtherOp) and op.op_name.startswith(op_name) and name in op.op_name


# --------------------------------------------------------------------------- corrupt files


@pytest.fixture(scope="module")
def good_wrp(tmp_path_factory):
    a = arr(np.arange(4, dtype=np.float32))
    out = wp.zeros(4, dtype=float, device="cpu")

    def run():
        wp.launch(k_scalars, dim=4, inputs=[a, 2.0, 1, True, wp.mat22(), out], device="cpu")
        wp.copy(out, a)

    return capture(str(tmp_path_factory.mktemp("wrp")), run, inputs={"a": a})[1]


def sections(data: bytes) -> dict[int, tuple[int, int]]:
    count, table = struct.unpack_from("<IQ", data, 12)
    out = {}
    for i in range(count):
        stype, _, off, size, _ = struct.unpack_from("<IIQQQ", data, table + 32 * i)
        out[stype] = (off, size)
    return out


def patch(data: bytes, offset: int, fmt: str, *values) -> bytes:
    buf = bytearray(data)
    struct.pack_into(fmt, buf, offset, *values)
    return bytes(buf)


def test_good_file_parses(good_wrp):
    w = parse_wrp(good_wrp)
    assert [op.op_name for op in w.ops] == ["launch", "copy"]


def test_truncations_name_the_section(good_wrp):
    with pytest.raises(WrpError, match="shorter than the 64-byte header"):
        parse_wrp(good_wrp[:40])
    ops_off, ops_size = sections(good_wrp)[3]
    with pytest.raises(WrpError, match="operations section.*outside the"):
        parse_wrp(good_wrp[: ops_off + ops_size - 1])
    for cut in range(64, len(good_wrp), 7):
        with pytest.raises(WrpError):
            parse_wrp(good_wrp[:cut])


def test_bad_magic_and_versions(good_wrp):
    with pytest.raises(WrpError, match="bad magic"):
        parse_wrp(b"XXXX" + good_wrp[4:])
    with pytest.raises(WrpError, match="format version 17.*APIC format version 18"):
        parse_wrp(patch(good_wrp, 4, "<I", 17))
    meta_off, _ = sections(good_wrp)[1]
    producer_len = struct.unpack_from("<I", good_wrp, meta_off + 4)[0]
    assert good_wrp[meta_off + 8 : meta_off + 8 + producer_len] == b"1.19.0"
    old = good_wrp[: meta_off + 8] + b"1.18.0" + good_wrp[meta_off + 8 + producer_len :]
    with pytest.raises(WrpError, match=r"written by Warp '1.18.0'.*exactly warp-lang 1.19.x"):
        parse_wrp(old)
    assert issubclass(WrpError, ExportError)


def test_unknown_op_type_and_reloc_kind(good_wrp):
    ops_off, _ = sections(good_wrp)[3]
    first_op = ops_off + 4
    with pytest.raises(WrpError, match="unknown op type 99 at operation 0"):
        parse_wrp(patch(good_wrp, first_op, "<I", 99))
    rec = good_wrp[first_op:]
    key_len, hash_len, num_params = struct.unpack_from("<HHH", rec, 64)
    reloc0 = first_op + 80 + key_len + hash_len + 16 * num_params
    with pytest.raises(WrpError, match="relocation 0 of parameter 1 has unknown kind 7"):
        parse_wrp(patch(good_wrp, reloc0 + 16, "<B", 7))
    with pytest.raises(WrpError, match="refers to region 999"):
        parse_wrp(patch(good_wrp, reloc0 + 4, "<i", 999))
    with pytest.raises(WrpError, match="kernel dimensionality 9"):
        parse_wrp(patch(good_wrp, first_op + 24, "<i", 9))


def test_copy_out_of_region_range(good_wrp):
    ops_off, _ = sections(good_wrp)[3]
    first_total = struct.unpack_from("<I", good_wrp, ops_off + 8)[0]
    copy = ops_off + 4 + first_total
    assert struct.unpack_from("<I", good_wrp, copy)[0] == 4
    with pytest.raises(WrpError, match=r"copy destination \(operation 1\) touches bytes \[0, 0\+4096\)"):
        parse_wrp(patch(good_wrp, copy + 32, "<Q", 4096))


# --------------------------------------------------------------------------- the recorder's view (read_ops)


@pytest.fixture(scope="module")
def recorder_wrp() -> bytes:
    """A capture as the recorder makes it: torch-backed arrays, a launch, a copy and a zero_."""
    x, y = torch.arange(4.0), torch.zeros(4)
    with wp.ScopedCapture(device="cpu", apic=True) as cap:
        wp.launch(scale, dim=4, inputs=[wp.from_torch(x), 2.0], outputs=[wp.from_torch(y)], device="cpu")
        wp.copy(wp.from_torch(x), wp.from_torch(y))
        wp.from_torch(y).zero_()
    with tempfile.TemporaryDirectory() as folder:
        wp.capture_save(cap.graph, os.path.join(folder, "g"))
        with open(os.path.join(folder, "g.wrp"), "rb") as f:
            return f.read()


def test_reads_ops_and_regions(recorder_wrp):
    ops = read_ops(recorder_wrp)
    assert [op.kind for op in ops] == ["launch", "copy", "memset"]
    assert ops[0].kernel_key == "scale" and ops[0].dst_region is None
    regions = parse_wrp(recorder_wrp).regions
    assert sorted(r.size for r in regions.values()) == [16, 16]
    assert ops[1].dst_region in regions


def test_read_ops_names_the_region_a_reduction_writes(tmp_path):
    a = arr(np.arange(16, dtype=np.float32))
    s = wp.zeros(1, dtype=float, device="cpu")
    w, data = capture(tmp_path, lambda: wp.utils.array_sum(a, out=s), inputs={"a": a}, outputs={"s": s})
    assert read_ops(data) == [W.OpSummary("reduction", None, w.bindings["s"])]


@settings(max_examples=200)
@given(st.data())
def test_damaged_bytes_raise_a_wrp_error_or_parse(recorder_wrp, data):
    blob = bytearray(recorder_wrp)
    cut = data.draw(st.integers(0, len(blob)))
    for _ in range(data.draw(st.integers(0, 4))):
        blob[data.draw(st.integers(0, len(blob) - 1))] = data.draw(st.integers(0, 255))
    damaged = bytes(blob[:cut])
    for reader in (parse_wrp, read_ops):
        try:
            reader(damaged)
        except WrpError:
            pass
