"""Exported == eager for kernel kinds the scenario suite does not cover: a @wp.struct
parameter (with an array field, so a relocation sits inside the struct) and a tile
kernel (shared memory, launched with wp.launch_tiled).

The struct case also exports on the CPU so CI checks its recording, and runs there from the
segment's CPU code on a machine without a GPU (docs/export-cpu.md).
"""

from __future__ import annotations

import pytest
import torch
import warp as wp

import leapp
from leapp import annotate
from leapp.bundle import read_bundle

TILE = 32


@wp.struct
class Affine:
    scale: float
    offset: wp.vec3
    bias: wp.array(dtype=float)  # an array inside the struct: relocated at replay


@wp.kernel
def apply_affine(p: Affine, x: wp.array(dtype=wp.vec3), y: wp.array(dtype=wp.vec3)):
    i = wp.tid()
    y[i] = x[i] * p.scale + p.offset + wp.vec3(p.bias[i], p.bias[i], p.bias[i])


@wp.kernel
def row_sums(a: wp.array2d(dtype=float), out: wp.array(dtype=float)):
    i = wp.tid()
    t = wp.tile_load(a[i], shape=TILE)
    s = wp.tile_sum(t)
    wp.tile_store(out, s, offset=i)


def struct_step(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    dev = str(x.device)
    with leapp.node("affine", export_with="pt2"):
        x, bias = annotate.input_tensors("affine", {"x": x, "bias": bias})
        y = torch.empty_like(x)
        with annotate.warp_op():
            p = Affine()
            p.scale = 2.5
            p.offset = wp.vec3(1.0, -2.0, 0.5)
            p.bias = wp.from_torch(bias)
            wp.launch(apply_affine, dim=x.shape[0], inputs=[p, wp.from_torch(x, dtype=wp.vec3)],
                      outputs=[wp.from_torch(y, dtype=wp.vec3)], device=dev)
        annotate.output_tensors("affine", {"y": y})
    return y


def tile_step(a: torch.Tensor) -> torch.Tensor:
    with leapp.node("rows", export_with="onnx"):
        a = annotate.input_tensors("rows", {"a": a})
        out = torch.empty(a.shape[0], device=a.device)
        with annotate.warp_op():
            wp.launch_tiled(row_sums, dim=[a.shape[0]], inputs=[wp.from_torch(a)], outputs=[wp.from_torch(out)],
                            block_dim=64, device=str(a.device))
        annotate.output_tensors("rows", {"out": out})
    return out


def _struct_inputs(n: int, seed: int, device: str):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, generator=g).to(device), torch.randn(n, generator=g).to(device)


def _expected_affine(x, bias):
    return x * 2.5 + torch.tensor([1.0, -2.0, 0.5], device=x.device) + bias[:, None]


def test_struct_parameter_records_and_exports_on_cpu(tmp_path):
    with leapp.trace("struct_cpu", save_path=str(tmp_path)) as session:
        for seed in range(3):
            x, bias = _struct_inputs(37, seed, "cpu")
            torch.testing.assert_close(struct_step(x, bias), _expected_affine(x, bias))
    session.compile(validate=False)
    (seg,) = session.record.nodes["affine"].segments
    assert len(seg.inputs) >= 2  # x and the struct's array field are both traced inputs
    program = torch.export.load(str(tmp_path / "struct_cpu" / "affine.pt2"))
    bundle = read_bundle(next(v for k, v in program.state_dict.items() if k.endswith("_bundle")).numpy().tobytes())
    (launch,) = [op for op in bundle.manifest["ops"] if op["op"] == "launch"]
    # parameter 0 is the launch bounds, parameter 1 the struct: its array field is relocated inside it
    assert any(r["param"] == 1 and r["offset"] > 0 for r in launch["relocs"]), launch["relocs"]


@pytest.mark.cuda
@pytest.mark.cpu_fallback
def test_struct_parameter_exported_equals_eager(tmp_path):
    """On a GPU, or without one on the CPU (the relocation inside the struct then patched to a host address)."""
    from warp_devices import warp_device

    device = warp_device()
    with leapp.trace("struct_gpu", save_path=str(tmp_path)) as session:
        for seed in range(3):
            struct_step(*_struct_inputs(300, seed, device))
    report = session.compile(validate=True)
    assert all(n.status == "passed" for n in report), str(report)
    pipeline = leapp.load(str(tmp_path / "struct_gpu"))
    x, bias = _struct_inputs(300, 99, device)
    got = pipeline(x=x, bias=bias)["y"]
    torch.testing.assert_close(got, _expected_affine(x, bias))


@pytest.mark.cuda
def test_tile_kernel_exported_equals_eager_on_gpu(tmp_path):
    wp.init()
    with leapp.trace("tiles", save_path=str(tmp_path)) as session:
        for seed in range(3):
            a = torch.randn(45, TILE, generator=torch.Generator().manual_seed(seed)).to("cuda:0")
            torch.testing.assert_close(tile_step(a), a.sum(dim=1), rtol=1e-5, atol=1e-5)
    report = session.compile(validate=True)
    assert all(n.status == "passed" for n in report), str(report)
    (seg,) = session.record.nodes["rows"].segments
    assert seg.kernels[0].block_dim == 64
    pipeline = leapp.load(str(tmp_path / "tiles"))
    a = torch.randn(45, TILE, device="cuda:0")
    got = pipeline(a=a)["out"].to(a.device)
    torch.testing.assert_close(got, a.sum(dim=1), rtol=1e-5, atol=1e-5)
