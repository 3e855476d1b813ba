"""leapp/_recorder/handles.py: refuse process-local Warp handles and addresses baked into a segment.

A kernel takes a ``wp.Mesh`` (likewise ``wp.Bvh``, ``wp.HashGrid``,
``wp.Volume``) as its ``uint64`` id, and that id is a pointer of the tracing
process: host memory on the CPU, device memory on CUDA. APIC records such an
argument as plain bytes (only ``wp.array`` parameters get relocations), so an
export would hand the old pointer to a process where it means nothing: on
CUDA an illegal memory access that poisons the caller's context. The same
goes for an integer argument that is an address inside a live array, for ids
stored in a 64-bit integer array the segment snapshots as a constant, and for
texture arguments (their descriptor holds a texture object handle).

The check is by value, after the capture: the 64-bit integer arguments of
every launch (also inside ``@wp.struct`` arguments) and the constant 64-bit
integer arrays are compared with the ids of the live Warp objects of those
kinds and the address ranges of live Warp arrays and torch storages. Finding
those costs one heap scan (about 0.15 s with torch loaded), done only when a
segment has such a value.
"""

from __future__ import annotations

import bisect
import gc
import numbers
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
import warp as wp

from leapp._warp_private import is_struct_type, kernel_args
from leapp.errors import TraceError

__all__ = ["BAKED_HANDLE", "LiveObjects", "check_launch_handles", "check_constant_handles", "integer_values"]

BAKED_HANDLE = "passes a process-local handle that an export would bake in"

_HANDLE_KINDS = (wp.Mesh, wp.Bvh, wp.HashGrid, wp.Volume)
_INT64 = (wp.int64, wp.uint64)  # wp.handle is a wp.uint64


def _is_int64_type(arg_type) -> bool:
    return isinstance(arg_type, type) and issubclass(arg_type, _INT64)


def _is_texture(arg_type, value) -> bool:
    return isinstance(value, wp.Texture) or (isinstance(arg_type, type) and issubclass(arg_type, wp.Texture))


def _as_uint64(value) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, numbers.Integral):
        number = int(value)
    elif isinstance(value, _INT64):  # a Warp scalar instance, e.g. wp.uint64(mesh.id)
        number = int(value.value)
    elif isinstance(value, _HANDLE_KINDS):
        number = int(value.id)
    else:
        return None
    return number & 0xFFFF_FFFF_FFFF_FFFF


def integer_values(label: str, arg_type, value) -> Iterator[tuple[str, int | None]]:
    """(argument path, value as uint64) of every 64-bit integer in one launch argument; None marks a texture.

    ``arg_type`` is the launched kernel's parameter type (a generic kernel's launch is already the overload
    Warp resolved, so the type is concrete); narrower integers cannot carry a pointer.
    """
    if _is_texture(arg_type, value):
        yield label, None
        return
    if is_struct_type(arg_type):
        for name, var in arg_type.vars.items():
            yield from integer_values(f"{label}.{name}", var.type, getattr(value, name, None))
        return
    if _is_int64_type(arg_type):
        number = _as_uint64(value)
        if number:
            yield label, number


@dataclass
class _Range:
    start: int
    end: int
    what: str
    owner: object = None  # the array or tensor, when it owns the memory (not a view made from a pointer)


class LiveObjects:
    """The ids of live Meshes, BVHs, hash grids and volumes, and the memory of live arrays and storages.

    Built from one ``gc.get_objects()`` scan on first use.
    """

    def __init__(self) -> None:
        self._ids: dict[int, str] | None = None
        self._ranges: list[_Range] = []
        self._starts: list[int] = []

    def _scan(self) -> None:
        ids: dict[int, str] = {}
        ranges: dict[int, _Range] = {}
        for obj in gc.get_objects():
            cls = type(obj)  # not isinstance: some module proxies warn when their __class__ is read
            if issubclass(cls, _HANDLE_KINDS):
                handle = getattr(obj, "id", None)
                if handle:
                    ids[int(handle)] = f"wp.{cls.__name__} on {getattr(obj, 'device', '?')}"
            elif issubclass(cls, wp.array):
                ptr, nbytes = getattr(obj, "ptr", None), getattr(obj, "capacity", 0) or 0
                owns = getattr(obj, "deleter", None) is not None
                if ptr and nbytes and (ptr not in ranges or owns and ranges[ptr].owner is None):
                    ranges[ptr] = _Range(ptr, ptr + nbytes, f"wp.array {getattr(obj.dtype, '__name__', obj.dtype)} "
                                                           f"{tuple(obj.shape)} on {obj.device}", obj if owns else None)
            elif issubclass(cls, torch.Tensor):
                try:
                    storage = obj.untyped_storage()
                    ptr, nbytes = storage.data_ptr(), storage.nbytes()
                except Exception:  # noqa: BLE001 - meta, sparse, fake, ...: no memory of their own to point into
                    continue
                if ptr and nbytes and (ptr not in ranges or ranges[ptr].owner is None):
                    ranges[ptr] = _Range(ptr, ptr + nbytes, f"torch storage ({nbytes} bytes) on {obj.device}", obj)
        self._ids = ids
        self._ranges = sorted(ranges.values(), key=lambda r: r.start)
        self._starts = [r.start for r in self._ranges]

    def describe(self, value: int) -> str | None:
        """What live object ``value`` is the id of or points into, or None."""
        if self._ids is None:
            self._scan()
        what = self._ids.get(value)
        if what is not None:
            return f"the id of a live {what}"
        i = bisect.bisect_right(self._starts, value) - 1
        if i >= 0 and value < self._ranges[i].end:
            r = self._ranges[i]
            return f"an address inside a live {r.what} (offset {value - r.start})"
        return None

    def allocation_containing(self, ptr: int) -> tuple[int, int, object] | None:
        """(start, end, owner) of the live Warp array that owns, or torch storage that holds, ``ptr``; or None."""
        if self._ids is None:
            self._scan()
        i = bisect.bisect_right(self._starts, ptr) - 1
        for k in range(i, max(i - 64, -1), -1):  # owners never nest deeply: a few neighbours suffice
            r = self._ranges[k]
            if r.owner is not None and r.start <= ptr < r.end:
                return r.start, r.end, r.owner
        return None

    def ids(self) -> np.ndarray:
        if self._ids is None:
            self._scan()
        return np.fromiter(self._ids, dtype=np.uint64, count=len(self._ids))


def _refusal(where: str, detail: str) -> TraceError:
    return TraceError(
        f"{where} {BAKED_HANDLE}: {detail}. Warp meshes, BVHs, hash grids, volumes and textures (and raw "
        "addresses) live in the tracing process only; an exported segment cannot carry them. Keep that "
        "query outside the exported node and pass its results in as node inputs."
    )


def check_launch_handles(launches, where_of, live: LiveObjects) -> None:
    """Raise TraceError for the first launch argument that is a texture, a live handle id or an address.

    ``launches``: the segment's ``_Launch`` records; ``where_of(launch)``: the text that names it.
    """
    for launch in launches:
        args = kernel_args(launch.kernel)
        for i, value in enumerate(launch.args):
            arg = args[i] if i < len(args) else None
            label = arg.label if arg is not None else f"#{i}"
            for path, number in integer_values(label, arg.type if arg is not None else None, value):
                if number is None:
                    raise _refusal(where_of(launch), f"argument '{path}' is a Warp texture")
                what = live.describe(number)
                if what is not None:
                    raise _refusal(where_of(launch), f"argument '{path}' = 0x{number:x} is {what}")


def check_constant_handles(name: str, data: bytes, where: str, live: LiveObjects) -> None:
    """Raise TraceError when the snapshot of a 64-bit integer constant array holds a live handle id."""
    values = np.frombuffer(data, dtype=np.uint64, count=len(data) // 8)
    ids = live.ids()
    if not values.size or not ids.size:
        return
    hits = np.flatnonzero(np.isin(values, ids))
    if hits.size:
        k = int(hits[0])
        raise _refusal(
            where,
            f"the array {name}, snapshotted as a constant, holds {live.describe(int(values[k]))} "
            f"at element {k} ({hits.size} such element(s))",
        )
