"""The CPU-traced observation node the CPU-code tests share (test_cpu_code*.py, tests/export): two Warp
launches, a scratch array, a zeroed output and a copy, what a simulator's observation term does; how to trace
and export it, find its segment bundle, and rewrite that bundle as a hostile writer would."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import leapp
from leapp import annotate
from leapp.bundle import read_bundle
from leapp.bundle.writer import pack
from warp_devices import warp_builds_cpu_kernels

wp = pytest.importorskip("warp")

# Tracing on the CPU runs the kernels eagerly with Warp's own CPU build, which needs its warp-clang library
# (the GPU test machine's Warp has none: test_cpu_code's CUDA test compares with Warp on CUDA instead).
warp_cpu = pytest.mark.skipif(not warp_builds_cpu_kernels(), reason="this Warp cannot build CPU kernels (no warp-clang.so)")

BATCH = 16


@wp.kernel
def gravity_scaled(q: wp.array(dtype=wp.quat), g: wp.vec3, s: float, out: wp.array(dtype=wp.vec3)):
    i = wp.tid()
    out[i] = wp.quat_rotate_inv(q[i], g) * s


@wp.kernel
def add_rows(a: wp.array(dtype=wp.vec3), b: wp.array(dtype=wp.vec3), out: wp.array(dtype=float)):
    i = wp.tid()
    out[i] = wp.length(a[i] + b[i])


def observe(quat: torch.Tensor) -> torch.Tensor:
    """Two launches, a Warp scratch array, a zeroed output, a copy: what a simulator's observation term does."""
    grav = torch.empty(quat.shape[0], 3)
    norm = torch.empty(quat.shape[0])
    with annotate.warp_op():
        q = wp.from_torch(quat, dtype=wp.quat)
        tmp = wp.empty(quat.shape[0], dtype=wp.vec3, device="cpu")
        out = wp.from_torch(grav, dtype=wp.vec3)
        n = wp.from_torch(norm)
        n.zero_()
        wp.launch(gravity_scaled, dim=quat.shape[0], inputs=[q, wp.vec3(0.0, 0.0, -1.0), 2.0], outputs=[tmp],
                  device="cpu")
        wp.copy(out, tmp)
        wp.launch(add_rows, dim=quat.shape[0], inputs=[tmp, out], outputs=[n], device="cpu")
    return torch.cat([grav, norm[:, None]], dim=1) * 0.5


def quats(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.nn.functional.normalize(torch.randn(n, 4, generator=g), dim=1)


def trace(folder: Path, backend: str, dynamic=None, validate: bool = True):
    node = leapp.node("obs", export_with=backend, dynamic_batch=dynamic)(observe)
    with leapp.trace("cpu_obs", save_path=str(folder)) as session:
        for seed in range(3):
            node(quats(BATCH, seed))
    return session.compile(validate=validate), folder / "cpu_obs"


def bundle_of(folder: Path) -> bytes:
    """The bytes of the obs node's one segment bundle, found in its artifact as leapp inspect finds them."""
    from leapp.runtime.binary_choice import bundles_in_artifact

    pipeline = leapp.load(folder)
    node = pipeline.nodes["obs"]
    (found,) = bundles_in_artifact(node.backend, node.artifact, node.runner)
    return found


def rewritten(data: bytes, edit) -> bytes:
    """The bundle with its manifest (a dict) and stored blobs (a list of bytes) edited by ``edit``, resealed and
    not checked (as a hostile writer would)."""
    bundle = read_bundle(data)
    manifest = json.loads(json.dumps(bundle.manifest))
    blobs = [bytes(b) for b in bundle.blobs]
    edit(manifest, blobs)
    return pack(json.dumps(manifest).encode(), blobs, min_reader_version=bundle.min_reader_version)
