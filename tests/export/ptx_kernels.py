"""Two Warp kernels whose PTX the PTX tests compile: a quaternion rotation and a tile reduction (the kind
whose vector loads carry `used_bytes_mask`)."""

from __future__ import annotations

import warp as wp


@wp.kernel
def k_rotate(q: wp.array(dtype=wp.quat), g: wp.vec3, out: wp.array(dtype=wp.vec3)):
    i = wp.tid()
    out[i] = wp.quat_rotate_inv(q[i], g)


@wp.kernel
def k_tile_sum(a: wp.array2d(dtype=float), out: wp.array(dtype=float)):
    i = wp.tid()
    t = wp.tile_load(a[i], shape=64)
    wp.tile_store(out, wp.tile_sum(t), offset=i)
