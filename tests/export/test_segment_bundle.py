"""Captured Warp segments (real CPU APIC captures) -> segment bundles, read back with leapp.bundle."""

from __future__ import annotations

import os
import struct
from typing import Any

import numpy as np
import pytest

wp = pytest.importorskip("warp")
torch = pytest.importorskip("torch")

from leapp._apic.wrp import parse_wrp  # noqa: E402
from leapp._export.segment_bundle import build_bundle_from_wrp, build_segment_bundle  # noqa: E402
from leapp.bundle.manifest import grid_for  # noqa: E402
from leapp._contract.records import KernelRef, SegmentIO, SegmentRecord, TensorSpec  # noqa: E402
from leapp.bundle import read_bundle  # noqa: E402
from leapp.bundle.format import this_machine  # noqa: E402
from leapp.errors import ExportError  # noqa: E402

ARCHS = (90,)  # cubins per test: one (test_cuda_code checks the full default set)
SEG = "obs/warp_segment_0"


@wp.struct
class Gains:
    k: float
    bias: wp.array(dtype=float)


@wp.kernel
def k_gravity(q: wp.array(dtype=wp.quat), g: wp.vec3, gains: Gains, out: wp.array(dtype=wp.vec3)):
    i = wp.tid()
    out[i] = wp.quat_rotate_inv(q[i], g) * gains.k + wp.vec3(gains.bias[i], 0.0, 0.0)


@wp.kernel
def k_axpy(x: wp.array(dtype=float), a: float, y: wp.array(dtype=float)):
    i = wp.tid()
    y[i] = y[i] + a * x[i]


@wp.kernel
def k_grid2d(a: wp.array2d(dtype=float), out: wp.array2d(dtype=float)):
    i, j = wp.tid()
    out[i, j] = a[i, j] * 3.0


@wp.kernel(grid_stride=False)
def k_lean(x: wp.array(dtype=wp.int32), y: wp.array(dtype=wp.int32)):
    i = wp.tid()
    y[i] = x[i] + 1


@wp.kernel
def k_generic(x: wp.array(dtype=Any), y: wp.array(dtype=Any)):
    i = wp.tid()
    y[i] = x[i] + x[i]


@wp.kernel
def k_handle(m: wp.handle, out: wp.array(dtype=float)):
    i = wp.tid()
    out[i] = 1.0


@wp.kernel
def k_tile(a: wp.array2d(dtype=float), out: wp.array2d(dtype=float)):
    i = wp.tid()
    t = wp.tile_load(a, shape=(1, 8), offset=(i, 0))
    wp.tile_store(out, t * 2.0, offset=(i, 0))


def spec(name, arr: "wp.array", torch_dtype=torch.float32) -> TensorSpec:
    """The expanded scalar layout of a contiguous Warp array."""
    inner = tuple(getattr(arr.dtype, "_shape_", ()))
    wdtype = {wp.vec3: "vec3f", wp.quat: "quatf", wp.float32: "float32", wp.int32: "int32"}.get(arr.dtype)
    return TensorSpec(name, torch_dtype, tuple(arr.shape) + inner, wdtype, tuple(arr.shape))


class Capture:
    """A CPU APIC capture of ``fn``; ``io(name, arr)`` makes SegmentIOs of its regions."""

    def __init__(self, tmp_path, fn, **named):
        with wp.ScopedCapture(device="cpu", apic=True) as cap:
            fn()
        path = os.path.join(tmp_path, "seg")
        wp.capture_save(cap.graph, path, inputs=named)
        with open(path + ".wrp", "rb") as f:
            self.data = f.read()
        self.wrp = parse_wrp(self.data)
        self.named = named

    def rid(self, name: str) -> int:
        return self.wrp.bindings[name]

    def io(self, name: str, torch_dtype=torch.float32) -> SegmentIO:
        arr = self.named[name]
        return SegmentIO(spec(name, arr, torch_dtype), self.rid(name), arr.capacity)

    def bundle(self, kernels, inputs=(), outputs=(), constants=None, scratch=None, **kw):
        data = build_bundle_from_wrp(self.wrp, segment_id=SEG, source="pipe.py:7", kernels=kernels,
                                     inputs=[self.io(n) if isinstance(n, str) else n for n in inputs],
                                     outputs=[self.io(n) if isinstance(n, str) else n for n in outputs],
                                     constants=constants, scratch=scratch, archs=ARCHS, **kw)
        self.data = data
        return read_bundle(data)

    def replay_on_cpu(self, inputs, outputs) -> list[np.ndarray]:
        """The last bundle's CPU code run on copies of the named input arrays; new arrays shaped like the named
        outputs (docs/export-cpu.md)."""
        from leapp import _native

        ins = [np.ascontiguousarray(self.named[n].numpy()) for n in inputs]
        outs = [np.zeros_like(self.named[n].numpy()) for n in outputs]
        _native.run_segment_cpu(_native.Bundle(self.data), [a.ctypes.data for a in ins], [a.ctypes.data for a in outs],
                                [a.nbytes for a in ins], [a.nbytes for a in outs])
        return outs


def eager_outputs(run, *arrays) -> list[np.ndarray]:
    """What Warp itself computes: ``run()`` executed now (a CPU capture records without running)."""
    run()
    return [a.numpy().copy() for a in arrays]


def array(values, dtype=float):
    return wp.array(np.asarray(values), dtype=dtype, device="cpu")


def param(bundle, op, i: int) -> bytes:
    blob = bundle.blob(op["params"]["blob"])
    off, size = op["params"]["offsets"][i], op["params"]["sizes"][i]
    return blob[off : off + size]


def bounds1d(n: int, coord_mult: int = 1) -> bytes:
    return struct.pack("<I4xQQ", n, n * coord_mult, coord_mult)


# --------------------------------------------------------------------------- the main path


def test_full_segment_bundle(tmp_path):
    n = 5
    quat = array(np.tile([0.0, 0.0, 0.0, 1.0], (n + 2, 1)).astype(np.float32), dtype=wp.quat)
    bias = array(np.arange(n, dtype=np.float32))
    grav = wp.zeros(n, dtype=wp.vec3, device="cpu")
    grav_copy = wp.empty(n, dtype=wp.vec3, device="cpu")
    grav_copy.fill_(wp.vec3(7.0, 7.0, 7.0))  # non-zero before the segment: init "none"
    counts = wp.zeros(4, dtype=wp.int32, device="cpu")
    gains = Gains()
    gains.k, gains.bias = 2.0, bias

    def run():
        wp.launch(k_gravity, dim=n, inputs=[quat[2:], wp.vec3(0.0, 0.0, -1.0), gains], outputs=[grav], device="cpu")
        wp.copy(grav_copy, grav)
        counts.zero_()
        counts.fill_(-1)

    cap = Capture(tmp_path, run, quat=quat, bias=bias, grav=grav, grav_copy=grav_copy, counts=counts)
    counts_io = SegmentIO(spec("counts", counts, torch.int32), cap.rid("counts"), 16)
    b = cap.bundle([KernelRef(k_gravity, 1, "k_gravity")], inputs=["quat", "bias"],
                   outputs=["grav", "grav_copy", counts_io])
    m = b.manifest
    assert (b.segment, b.source) == (SEG, "pipe.py:7")
    assert m["producer"] == {"leapp": m["producer"]["leapp"], "warp": wp.__version__, "param_abi": "warp-1.19",
                             "cuda_toolkit": m["producer"]["cuda_toolkit"], "ptx_isa": m["producer"]["ptx_isa"],
                             "ptx_isa_check": m["producer"]["ptx_isa_check"], "cpu_code": m["producer"]["cpu_code"]}
    assert m["producer"]["cpu_code"].split(", ")[0] == this_machine()  # then aarch64 where a cross compiler is
    assert m["producer"]["cuda_toolkit"] == "13.4" and m["producer"]["ptx_isa"] == "8.0"

    # buffers: inputs, then outputs (zero-initialised when their content before the segment was all zero)
    roles = [(buf["role"], buf.get("io"), buf["init"], buf["bytes"]) for buf in b.buffers]
    assert roles == [("input", 0, "none", (n + 2) * 16), ("input", 1, "none", n * 4),
                     ("output", 0, "zero", n * 12), ("output", 1, "none", n * 12), ("output", 2, "zero", 16)]
    assert b.inputs[0] == {"name": "quat", "buffer": 0, "dtype": "float32", "shape": [n + 2, 4],
                           "warp_dtype": "quatf", "logical_shape": [n + 2]}
    assert [o["name"] for o in b.outputs] == ["grav", "grav_copy", "counts"] and b.outputs[2]["dtype"] == "int32"

    # module and kernel: sm_75 PTX + the requested cubin, the CUDA entry at the default block_dim 256
    (module,) = b.modules
    assert [(x["kind"], x["arch"]) for x in module["binaries"]] == [("ptx", 75), ("cubin", 90)]
    (kernel,) = b.kernels
    assert kernel["key"] == "k_gravity" and kernel["block_dim"] == 256 and kernel["smem_bytes"] == 0
    assert kernel["entry"].startswith("k_gravity_") and kernel["entry"].endswith("_cuda_kernel_forward")
    assert f".entry {kernel['entry']}(".encode() in b.binary(0, 0)  # the PTX, decoded (binaries are compressed)

    launch, copy, zero, fill = b.ops
    assert launch["op"] == "launch" and launch["grid"] == [1, 1, 1] and launch["block"] == [256, 1, 1]
    assert launch["params"]["sizes"] == [24, 56, 12, 64, 56]
    assert param(b, launch, 0) == bounds1d(n)
    assert param(b, launch, 2) == struct.pack("<3f", 0.0, 0.0, -1.0)
    assert struct.unpack_from("<f", param(b, launch, 3))[0] == 2.0
    # relocations: the quat view at byte 32, the struct's array field at byte 8 of param 3, the output
    relocs = {(r["param"], r["offset"]): (r["buffer"], r["buffer_offset"]) for r in launch["relocs"]}
    assert relocs == {(1, 0): (0, 32), (3, 8): (1, 0), (4, 0): (2, 0)}
    # no captured host pointer is shipped: relocated slots (and NULL grads) are zero
    for (p, off) in [(1, 0), (1, 8), (3, 8), (3, 16), (4, 0), (4, 8)]:
        assert param(b, launch, p)[off : off + 8] == bytes(8), (p, off)
    assert struct.unpack_from("<4i", param(b, launch, 1), 16) == (n, 0, 0, 0)  # view shape kept
    assert copy == {"op": "copy", "dst": 3, "dst_offset": 0, "src": 2, "src_offset": 0, "bytes": n * 12}
    assert zero == {"op": "memset", "buffer": 4, "offset": 0, "bytes": 16, "value": 0}
    assert fill == {"op": "memset", "buffer": 4, "offset": 0, "bytes": 16, "value": 255}

    # CPU code: the same ops on the CPU (a struct argument holding an array, a view at an offset, copy, fills)
    assert kernel["cpu_entry"].startswith("k_gravity_") and kernel["cpu_entry"].endswith("_cpu_forward")
    got = cap.replay_on_cpu(["quat", "bias"], ["grav", "grav_copy", "counts"])
    for g, want in zip(got, eager_outputs(run, grav, grav_copy, counts)):
        np.testing.assert_array_equal(g, want)


def test_in_place_output_is_initialised_from_its_input(tmp_path):
    x = array(np.arange(6, dtype=np.float32))
    y = array(np.ones(6, dtype=np.float32))
    cap = Capture(tmp_path, lambda: wp.launch(k_axpy, dim=6, inputs=[x, 0.5, y], device="cpu"), x=x, y=y)
    b = cap.bundle([k_axpy], inputs=["x", "y"], outputs=["y"])
    assert [(buf["role"], buf["init"]) for buf in b.buffers] == [("input", "none"), ("input", "none"),
                                                                 ("output", {"input": 1})]
    (launch,) = b.ops
    assert {r["param"]: r["buffer"] for r in launch["relocs"]} == {1: 0, 3: 2}  # writes the output, never y


def test_constants_scratch_and_constant_outputs(tmp_path):
    x = array(np.arange(4, dtype=np.float32))
    table = array(np.full(4, 3.0, dtype=np.float32))  # untraced, read: a constant
    acc = array(np.full(4, 10.0, dtype=np.float32))  # untraced, read and written: output seeded by a constant
    tmp = wp.zeros(4, dtype=float, device="cpu")  # allocated for the segment only: scratch

    def run():
        wp.copy(tmp, x)
        wp.launch(k_axpy, dim=4, inputs=[table, 2.0, tmp], device="cpu")
        wp.launch(k_axpy, dim=4, inputs=[tmp, 1.0, acc], device="cpu")

    cap = Capture(tmp_path, run, x=x, table=table, acc=acc, tmp=tmp)
    consts = {cap.rid("table"): table.numpy().tobytes(), cap.rid("acc"): acc.numpy().tobytes()}
    b = cap.bundle([k_axpy], inputs=["x"], outputs=["acc"], constants=consts, scratch={cap.rid("tmp"): 16})
    roles = [(buf["role"], buf["init"] if buf["role"] != "constant" else "blob") for buf in b.buffers]
    assert roles == [("input", "none"), ("output", "none"), ("constant", "blob"), ("scratch", "none"),
                     ("constant", "blob")]
    assert b.blob(b.buffers[2]["init"]["blob"]) == acc.numpy().tobytes()
    assert b.blob(b.buffers[4]["init"]["blob"]) == table.numpy().tobytes()
    seed, copy, l1, l2 = b.ops
    assert seed == {"op": "copy", "dst": 1, "dst_offset": 0, "src": 2, "src_offset": 0, "bytes": 16}
    assert (copy["dst"], copy["src"]) == (3, 0)
    assert {r["param"]: r["buffer"] for r in l1["relocs"]} == {1: 4, 3: 3}
    assert {r["param"]: r["buffer"] for r in l2["relocs"]} == {1: 3, 3: 1}
    assert l1["kernel"] == l2["kernel"] == 0 and len(b.kernels) == 1 and len(b.modules) == 1
    (got,) = cap.replay_on_cpu(["x"], ["acc"])  # constants and scratch on the CPU
    np.testing.assert_array_equal(got, eager_outputs(run, acc)[0])


def test_2d_and_lean_launches(tmp_path):
    a = array(np.ones((300, 7), dtype=np.float32))
    out = wp.zeros((300, 7), dtype=float, device="cpu")
    xi = array(np.arange(1000, dtype=np.int32), dtype=wp.int32)
    yi = wp.zeros(1000, dtype=wp.int32, device="cpu")

    def run():
        wp.launch(k_grid2d, dim=(300, 7), inputs=[a], outputs=[out], device="cpu")
        wp.launch(k_lean, dim=1000, inputs=[xi], outputs=[yi], device="cpu")
        wp.launch(k_lean, dim=(250, 4), inputs=[xi], outputs=[yi], device="cpu")

    cap = Capture(tmp_path, run, a=a, out=out, xi=xi, yi=yi)
    b = cap.bundle([k_grid2d, k_lean], inputs=["a", "xi"], outputs=["out", "yi"], cuda_block_dim=128)
    l2d, lean, folded = b.ops
    assert param(b, l2d, 0) == struct.pack("<IIQQ", 300, 7, 2100, 1)
    assert l2d["grid"] == [17, 1, 1] and l2d["block"] == [128, 1, 1]  # ceil(2100 / 128)
    assert lean["grid"] == list(grid_for(1000, 128, grid_stride=False)) == [8, 1, 1]
    assert param(b, folded, 0) == bounds1d(250, coord_mult=4)
    assert {k["key"]: k["block_dim"] for k in b.kernels} == {"k_grid2d": 128, "k_lean": 128}
    got = cap.replay_on_cpu(["a", "xi"], ["out", "yi"])  # 2-D bounds and a folded launch on the CPU
    for g, want in zip(got, eager_outputs(run, out, yi)):
        np.testing.assert_array_equal(g, want)


def test_cuda_grid_follows_warp():
    assert grid_for(1000, 256, True) == (4, 1, 1)
    assert grid_for(1000, 256, True, max_blocks=2) == (2, 1, 1)
    assert grid_for(1, 256, True) == (1, 1, 1)
    assert grid_for(2**40, 256, True) == (2**31 - 1, 1, 1)
    # lean: grid.x capped at 2**24 / block_dim, the rest spills into y then z
    assert grid_for(2**24 * 3, 256, False) == (65536, 3, 1)
    total_blocks = 65536 * 65535 * 2
    assert grid_for(total_blocks * 256, 256, False) == (65536, 65535, 2)


def test_build_segment_bundle_from_a_segment_record(tmp_path):
    x = array(np.arange(3, dtype=np.float32))
    y = wp.zeros(3, dtype=float, device="cpu")
    cap = Capture(tmp_path, lambda: wp.launch(k_axpy, dim=3, inputs=[x, 1.0, y], device="cpu"), x=x, y=y)
    record = SegmentRecord(id=SEG, node="obs", index=0, source="pipe.py:9", device="cpu", ops=["launch:k_axpy"],
                           wrp=cap.data, kernels=[KernelRef(k_axpy, 1, "k_axpy")], inputs=[cap.io("x")],
                           outputs=[cap.io("y")], constants={}, scratch={})
    b = read_bundle(build_segment_bundle(record, archs=ARCHS))
    assert b.source == "pipe.py:9" and [o["name"] for o in b.outputs] == ["y"]
    assert read_bundle(build_segment_bundle(record, archs=ARCHS)).digest == b.digest  # deterministic
    record.wrp = cap.data[:100]
    with pytest.raises(ExportError, match=rf"segment {SEG} \(pipe.py:9\): invalid .wrp"):
        build_segment_bundle(record, archs=ARCHS)


# --------------------------------------------------------------------------- what cannot be exported


def test_unsupported_ops_name_the_op_and_the_segment(tmp_path):
    a = array(np.arange(8, dtype=np.float32))
    s = wp.zeros(1, dtype=float, device="cpu")
    cap = Capture(tmp_path, lambda: wp.utils.array_sum(a, out=s), a=a, s=s)
    with pytest.raises(ExportError, match=rf"segment {SEG} \(pipe.py:7\): Warp operation REDUCTION "
                                          r"\(wp.utils.array_sum / array_inner\) \(operation 0\) is not exportable"):
        cap.bundle([], inputs=["a"], outputs=["s"])

    keys = array(np.arange(16, dtype=np.int32)[::-1].copy(), dtype=wp.int32)
    vals = wp.zeros(16, dtype=wp.int32, device="cpu")
    cap = Capture(tmp_path, lambda: wp.utils.radix_sort_pairs(keys, vals, 8), keys=keys, vals=vals)
    with pytest.raises(ExportError, match=rf"segment {SEG} .*RADIX_SORT \(wp.utils.radix_sort_pairs\)"):
        cap.bundle([], outputs=["keys", "vals"])


def test_multibyte_fill_is_refused(tmp_path):
    y = wp.zeros(4, dtype=float, device="cpu")
    cap = Capture(tmp_path, lambda: y.fill_(1.5), y=y)
    with pytest.raises(ExportError, match=r"fill_ with the 4-byte value 0x0000c03f is not exportable"):
        cap.bundle([], outputs=["y"])


def test_handles_are_refused(tmp_path):
    pts = array(np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0]], dtype=np.float32), dtype=wp.vec3)
    mesh = wp.Mesh(points=pts, indices=array(np.array([0, 1, 2], dtype=np.int32), dtype=wp.int32))
    out = wp.zeros(2, dtype=float, device="cpu")
    cap = Capture(tmp_path, lambda: wp.launch(k_handle, dim=2, inputs=[mesh.id, out], device="cpu"), out=out)
    with pytest.raises(ExportError, match="argument 'm' holds a wp.Mesh.*meshes/volumes are not exportable"):
        cap.bundle([k_handle], outputs=["out"])


def test_unclassified_region_and_written_input(tmp_path):
    x = array(np.arange(3, dtype=np.float32))
    y = wp.zeros(3, dtype=float, device="cpu")
    cap = Capture(tmp_path, lambda: wp.launch(k_axpy, dim=3, inputs=[x, 1.0, y], device="cpu"), x=x, y=y)
    with pytest.raises(ExportError, match=rf"argument 'y' .* uses region {cap.rid('y')} .*neither an input"):
        cap.bundle([k_axpy], inputs=["x"])
    cap = Capture(tmp_path, lambda: wp.copy(y, x), x=x, y=y)
    with pytest.raises(ExportError, match=r"copy \(operation 0\) writes region .* a segment input that is not"):
        cap.bundle([], inputs=["x", "y"])


def test_kernel_must_be_given_and_shapes_must_match(tmp_path):
    x = array(np.arange(3, dtype=np.float32))
    y = wp.zeros(3, dtype=float, device="cpu")
    cap = Capture(tmp_path, lambda: wp.launch(k_axpy, dim=3, inputs=[x, 1.0, y], device="cpu"), x=x, y=y)
    with pytest.raises(ExportError, match=r"launch of kernel 'k_axpy' \(operation 0\) matches no"):
        cap.bundle([k_lean], inputs=["x"], outputs=["y"])
    bad = SegmentIO(TensorSpec("x", torch.float32, (4,)), cap.rid("x"), 12)
    with pytest.raises(ExportError, match=r"input 'x' is float32 \[4\] = 16 bytes .* region \d+ has 12 bytes"):
        cap.bundle([k_axpy], inputs=[bad], outputs=["y"])
    unsigned = SegmentIO(TensorSpec("x", torch.uint32, (3,), "uint32"), cap.rid("x"), 12)
    b = cap.bundle([k_axpy], inputs=[unsigned], outputs=["y"])
    assert b.inputs[0]["dtype"] == "int32"  # Warp's uint32 travels as torch int32


def test_backward_launch_is_refused(tmp_path):
    x = array(np.arange(3, dtype=np.float32))
    y = wp.zeros(3, dtype=float, device="cpu")
    gx, gy = wp.zeros_like(x), wp.ones_like(y)
    cap = Capture(tmp_path, lambda: wp.launch(k_axpy, dim=3, inputs=[x, 1.0, y], adj_inputs=[gx, 0.0, gy],
                                              adjoint=True, device="cpu"), x=x, y=y)
    with pytest.raises(ExportError, match="backward \\(adjoint\\) launch"):
        cap.bundle([k_axpy], inputs=["x"], outputs=["y"])


def test_tile_kernel_captured_on_cpu_with_block_dim_1_is_refused(tmp_path):
    a = array(np.ones((2, 8), dtype=np.float32))
    out = wp.zeros((2, 8), dtype=float, device="cpu")
    cap = Capture(tmp_path, lambda: wp.launch_tiled(k_tile, dim=[2], inputs=[a, out], block_dim=64, device="cpu"),
                  a=a, out=out)
    with pytest.raises(ExportError, match="uses tiles and was captured on CPU with block_dim=1"):
        cap.bundle([k_tile], inputs=["a"], outputs=["out"])


def test_generic_kernels(tmp_path):
    xf, yf = array(np.arange(3, dtype=np.float32)), wp.zeros(3, dtype=float, device="cpu")
    xi, yi = array(np.arange(3, dtype=np.int32), dtype=wp.int32), wp.zeros(3, dtype=wp.int32, device="cpu")
    cap = Capture(tmp_path, lambda: wp.launch(k_generic, dim=3, inputs=[xf, yf], device="cpu"), xf=xf, yf=yf)
    b = cap.bundle([k_generic], inputs=["xf"], outputs=["yf"])  # the generic parent stands for its overload
    (kernel,) = b.kernels
    assert kernel["key"] == "k_generic" and f".entry {kernel['entry']}(" in b.binary(0, 0).decode()

    def both():
        wp.launch(k_generic, dim=3, inputs=[xf, yf], device="cpu")
        wp.launch(k_generic, dim=3, inputs=[xi, yi], device="cpu")

    cap = Capture(tmp_path, both, xf=xf, yf=yf, xi=xi, yi=yi)
    overloads = list(k_generic.overloads.values())
    assert len(overloads) == 2
    with pytest.raises(ExportError, match="matches 2 overloads of one module"):
        cap.bundle(overloads, inputs=["xf", "xi"], outputs=["yf", "yi"])
    # given the generic parent, the overload APIC recorded (the float one) is used
    cap = Capture(tmp_path, lambda: wp.launch(k_generic, dim=3, inputs=[xf, yf], device="cpu"), xf=xf, yf=yf)
    assert cap.bundle([k_generic], inputs=["xf"], outputs=["yf"]).kernels[0]["entry"] == kernel["entry"]


def test_constant_written_by_a_copy_is_replayed_on_a_seeded_scratch(tmp_path):
    x = array(np.arange(4, dtype=np.float32))
    state = array(np.full(4, 5.0, dtype=np.float32))  # untraced: a constant, overwritten by the segment
    y = wp.zeros(4, dtype=float, device="cpu")

    def run():
        wp.launch(k_axpy, dim=4, inputs=[state, 1.0, y], device="cpu")
        wp.copy(state, x)

    cap = Capture(tmp_path, run, x=x, state=state, y=y)
    b = cap.bundle([k_axpy], inputs=["x"], outputs=["y"], constants={cap.rid("state"): state.numpy().tobytes()})
    assert [buf["role"] for buf in b.buffers] == ["input", "output", "constant", "scratch"]
    seed, launch, copy = b.ops
    assert seed == {"op": "copy", "dst": 3, "dst_offset": 0, "src": 2, "src_offset": 0, "bytes": 16}
    assert {r["param"]: r["buffer"] for r in launch["relocs"]} == {1: 3, 3: 1}
    assert (copy["dst"], copy["src"]) == (3, 0)


def test_copy_only_segment_has_no_module(tmp_path):
    x = array(np.arange(4, dtype=np.float32))
    y = wp.zeros(4, dtype=float, device="cpu")
    cap = Capture(tmp_path, lambda: wp.copy(y, x), x=x, y=y)
    b = cap.bundle([], inputs=["x"], outputs=["y"])
    assert b.modules == [] and b.kernels == [] and "ptx_isa" not in b.producer
    assert b.ops == [{"op": "copy", "dst": 1, "dst_offset": 0, "src": 0, "src_offset": 0, "bytes": 16}]


@pytest.mark.parametrize("dim", [(7,), (3, 5), (2, 3, 4), (2, 3, 4, 5)])
def test_launch_bounds_match_warps_own_ctypes(dim):
    import ctypes

    import warp._src.types as wt

    from leapp._export.warp_abi import abi_for_version

    abi = abi_for_version(wp.__version__)
    ours = abi.launch_bounds(dim, int(np.prod(dim)) * 3, coord_mult=3)
    theirs = wt.launch_bounds_t(dim)
    theirs.size *= 3
    theirs.coord_mult = 3
    assert ours == ctypes.string_at(ctypes.addressof(theirs), ctypes.sizeof(theirs))
    assert abi.array_t_size == ctypes.sizeof(wt.array_t)
    assert abi.array_t_offsets == {name: getattr(wt.array_t, name).offset for name, _ in wt.array_t._fields_}


def test_unsupported_warp_versions():
    from leapp._export.warp_abi import abi_for_version

    assert abi_for_version("1.19.3").name == "warp-1.19"
    with pytest.raises(ExportError, match="unsupported Warp version 1.20.0: .* warp-lang 1.19.x only"):
        abi_for_version("1.20.0")
