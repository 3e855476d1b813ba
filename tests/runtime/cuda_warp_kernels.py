"""Warp kernels compiled (by NVRTC, no GPU needed) for the replay tests; see cuda_bundles.compile_warp_module.

Kept in their own module: Warp compiles per Python module, and a module's hash
(hence its entry names) depends only on what is defined here.
"""

import warp as wp


@wp.kernel
def affine_vec3(x: wp.array(dtype=wp.vec3), scale: wp.float32, offset: wp.vec3, y: wp.array(dtype=wp.vec3),
                hits: wp.array(dtype=wp.int32)):
    i = wp.tid()
    y[i] = scale * x[i] + offset
    wp.atomic_add(hits, 0, 1)


@wp.kernel
def add_rows(a: wp.array2d(dtype=wp.float32), bias: wp.array(dtype=wp.float32), k: wp.int32,
             out: wp.array2d(dtype=wp.float32)):
    i, j = wp.tid()
    out[i, j] = a[i, j] + bias[j] * float(k)
