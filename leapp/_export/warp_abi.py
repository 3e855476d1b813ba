"""leapp/_export/warp_abi.py: Warp's kernel parameter ABI, per Warp version.

A bundle carries the exact ``kernelParams`` bytes of each launch: parameter 0 is
Warp's ``launch_bounds_t<N>``, then one by-value blob per kernel argument. Their
layouts are Warp's, not ours, and they changed between releases
(docs/warp-internals.md, "Kernel parameters"), so they live here as data keyed
by version ("warp-1.19") and are recorded in the manifest as
``producer.param_abi``. The runtime never interprets these bytes. Which Warp is
installed, and the argument sizes Warp itself reports, are asked through
``leapp._warp_private``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from leapp.errors import ExportError

__all__ = ["WarpABI", "ABIS", "abi_for_version"]


@dataclass(frozen=True)
class WarpABI:
    """Parameter layout facts for one Warp release series."""

    name: str  # recorded as manifest producer.param_abi
    max_launch_dims: int  # LAUNCH_MAX_DIMS
    array_t_size: int  # wp::array_t<T>: data, grad, int32 shape[4], int32 strides[4] (bytes), u16 ndim, u16 flags
    array_t_align: int
    array_t_offsets: dict[str, int]

    def launch_bounds_layout(self, ndim: int) -> tuple[int, int, int]:
        """(offset of size, offset of coord_mult, total bytes) of ``launch_bounds_t<ndim>``.

        1.19: ``uint32_t shape[N]`` at 0, ``size_t size`` at align8(4N), ``size_t coord_mult``
        after it; 24 bytes for N <= 2, 32 bytes for N = 3, 4 (align 8).
        """
        if not 1 <= ndim <= self.max_launch_dims:
            raise ExportError(f"{self.name}: launch_bounds_t<{ndim}> is outside 1..{self.max_launch_dims}")
        size_off = (4 * ndim + 7) // 8 * 8
        return size_off, size_off + 8, size_off + 16

    def launch_bounds(self, shape: tuple[int, ...], size: int, coord_mult: int = 1) -> bytes:
        """The bytes of parameter 0 for a kernel of dimensionality ``len(shape)``."""
        size_off, mult_off, total = self.launch_bounds_layout(len(shape))
        buf = bytearray(total)
        for d, extent in enumerate(shape):
            if not 0 <= extent < 2**32:
                raise ExportError(f"{self.name}: launch extent {extent} does not fit launch_bounds_t (uint32)")
            struct.pack_into("<I", buf, 4 * d, extent)
        struct.pack_into("<QQ", buf, size_off, size, coord_mult)
        assert mult_off == size_off + 8
        return bytes(buf)


ABIS: dict[str, WarpABI] = {
    "warp-1.19": WarpABI(
        name="warp-1.19",
        max_launch_dims=4,
        array_t_size=56,
        array_t_align=8,
        array_t_offsets={"data": 0, "grad": 8, "shape": 16, "strides": 32, "ndim": 48, "flags": 50},
    ),
}


def abi_for_version(version: str) -> WarpABI:
    """The ABI of a Warp version string such as "1.19.0"; unsupported versions raise."""
    series = ".".join(str(version).split(".")[:2])
    abi = ABIS.get(f"warp-{series}")
    if abi is None:
        supported = ", ".join(sorted(a.removeprefix("warp-") + ".x" for a in ABIS))
        raise ExportError(
            f"unsupported Warp version {version}: leapp knows the kernel parameter ABI of warp-lang {supported} only"
        )
    return abi
