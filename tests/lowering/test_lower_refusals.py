"""What the lowering does not cover is refused by lower_wp_launch with an ExportError naming the kernel, the
construct and its file:line, never a wrong answer or another exception."""

from __future__ import annotations

import inspect
import os
import re

import pytest

wp = pytest.importorskip("warp")

from leapp.errors import ExportError  # noqa: E402
from leapp.lowering import lower_wp_launch  # noqa: E402
import refused_kernels as rk  # noqa: E402

N = 4


def _args(kernel):
    f = lambda dtype=float: wp.zeros(N, dtype=dtype, device="cpu")  # noqa: E731
    return {
        rk.k_atomic: lambda: [f(), f()],
        rk.k_data_loop: lambda: [f(), f(int), f()],
        rk.k_data_while: lambda: [f(), f()],
        rk.k_printf: lambda: [f(), f()],
        rk.k_tile: lambda: [f(), f()],
        rk.k_float64: lambda: [f(wp.float64), f(wp.float64)],
        rk.k_mesh: lambda: [wp.uint64(0), f(wp.vec3), f()],
    }[kernel]()


def _line_of(kernel, needle: str) -> int:
    lines, first = inspect.getsourcelines(kernel.func)
    return first + next(n for n, text in enumerate(lines) if needle in text)


NEEDLE = {rk.k_atomic: "atomic_add", rk.k_data_loop: "for ", rk.k_data_while: "while ", rk.k_printf: "wp.printf",
          rk.k_tile: "tile_load", rk.k_float64: "out[i]", rk.k_mesh: "mesh_query_point"}


@pytest.mark.parametrize("kernel", list(rk.REFUSED), ids=lambda k: k.key)
def test_refusal_names_kernel_construct_and_line(kernel):
    with pytest.raises(ExportError) as caught:
        lower_wp_launch(kernel, N, _args(kernel))
    message = str(caught.value)
    assert f"kernel `{kernel.key}`" in message, message
    assert re.search(rk.REFUSED[kernel], message), message
    assert f"{os.path.basename(kernel.adj.filename)}:{_line_of(kernel, NEEDLE[kernel])}" in message, message

