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


NEEDLE = {rk.k_atomic: "atomic_add", rk.k_data_loop: "for ", rk.k_data_while: "while ", rk.k_printf: "printf",
          rk.k_tile: "tile_load", rk.k_float64: "out[i]", rk.k_mesh: "mesh_query_point"}
KNOWN_GAPS = {
    rk.k_printf: "frontend names the format string (`constant '%f\\n' of type builtins.str`), not printf",
    rk.k_tile: "frontend names a constant 'register' of type builtins.str, not tile_load",
    rk.k_float64: "launch.py refuses the float64 array without the kernel's name or a file:line",
    rk.k_mesh: "launch.py raises KeyError('uint64') for a uint64 scalar argument instead of an ExportError",
}


def _params():
    for kernel in rk.REFUSED:
        marks = [pytest.mark.xfail(strict=True, reason=KNOWN_GAPS[kernel])] if kernel in KNOWN_GAPS else []
        yield pytest.param(kernel, marks=marks, id=kernel.key)


@pytest.mark.parametrize("kernel", list(_params()))
def test_refusal_names_kernel_construct_and_line(kernel):
    with pytest.raises(ExportError) as caught:
        lower_wp_launch(kernel, N, _args(kernel))
    message = str(caught.value)
    assert f"kernel `{kernel.key}`" in message, message
    assert re.search(rk.REFUSED[kernel], message), message
    assert f"{os.path.basename(kernel.adj.filename)}:{_line_of(kernel, NEEDLE[kernel])}" in message, message


@pytest.mark.parametrize("kernel", [rk.k_printf, rk.k_tile, rk.k_float64], ids=lambda k: k.key)
def test_known_gaps_still_refuse(kernel):
    """Where the message is not yet right (KNOWN_GAPS), the kernel is still refused, never lowered."""
    with pytest.raises(ExportError):
        lower_wp_launch(kernel, N, _args(kernel))
