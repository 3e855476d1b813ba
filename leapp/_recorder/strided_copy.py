"""leapp/_recorder/strided_copy.py: ``wp.copy`` between non-contiguous arrays, made by a copy kernel of leapp's.

Warp 1.19's capture refuses a ``wp.copy`` whose source or destination is not contiguous (Isaac Lab's column
views of a group buffer, a transposed view, a strided source), on the CPU and on CUDA alike: its native strided
copy does not record into the capture. Inside an open segment leapp makes such a copy itself: it launches a
kernel that copies every element over the same shapes and strides, as unsigned words (bit for bit, whatever the
dtype), and Warp's own call then does nothing. The capture records that launch like any other, so the export
carries it as CUDA and CPU code and every runtime replays it as a launch; the bundle format is unchanged.

NOTE: no ``from __future__ import annotations`` here: Warp reads the kernels' annotations as type objects.
"""

import threading

import numpy as np
import warp as wp

from leapp.errors import TraceError

__all__ = ["copy_plan", "launch_copy", "copy_kernel"]

_WORDS = {8: wp.uint64, 4: wp.uint32, 2: wp.uint16, 1: wp.uint8}
_KERNELS: dict = {}
_LOCK = threading.Lock()
_MAX_EXACT_OVERLAP_CHECK = 1 << 22  # elements: above this a copy whose extents overlap is refused unchecked


def _copy_1d(t):
    def copy(src: wp.array(dtype=t, ndim=1), dst: wp.array(dtype=t, ndim=1)):
        i = wp.tid()
        dst[i] = src[i]

    return copy


def _copy_2d(t):
    def copy(src: wp.array(dtype=t, ndim=2), dst: wp.array(dtype=t, ndim=2)):
        i, j = wp.tid()
        dst[i, j] = src[i, j]

    return copy


def _copy_3d(t):
    def copy(src: wp.array(dtype=t, ndim=3), dst: wp.array(dtype=t, ndim=3)):
        i, j, k = wp.tid()
        dst[i, j, k] = src[i, j, k]

    return copy


def _copy_4d(t):
    def copy(src: wp.array(dtype=t, ndim=4), dst: wp.array(dtype=t, ndim=4)):
        i, j, k, m = wp.tid()
        dst[i, j, k, m] = src[i, j, k, m]

    return copy


_BODIES = {1: _copy_1d, 2: _copy_2d, 3: _copy_3d, 4: _copy_4d}


def copy_kernel(ndim: int, word_bytes: int, words: int):
    """(kernel, word dtype): the copy kernel for ``ndim``-d arrays whose elements are ``words`` unsigned words of ``word_bytes``.

    Each is a kernel in a module of its own (``module="unique"``): an overload added to a shared module would
    change its hash, and with it the entry names of segments captured before.
    """
    key = (ndim, word_bytes, words)
    with _LOCK:
        entry = _KERNELS.get(key)
        if entry is None:
            word = _WORDS[word_bytes]
            dtype = word if words == 1 else wp.types.vector(length=words, dtype=word)
            name = f"leapp_strided_copy_{ndim}d_{words}x{word_bytes * 8}"
            entry = _KERNELS[key] = (wp.kernel(_BODIES[ndim](dtype), module="unique", enable_backward=False,
                                               name=name), dtype)
        return entry


def copy_plan(dest, src, dest_offset, src_offset, count, stream):
    """``(dst, src)`` views for leapp's copy kernel when this ``wp.copy`` is one leapp makes itself (both plain
    ``wp.array``s on one device, at least one non-contiguous, at most 4-d, equal shapes and element sizes, no
    explicit stream other than the device's), else None: Warp's own copy then runs (and its capture refuses
    what it cannot record)."""
    if type(dest) is not wp.array or type(src) is not wp.array or dest.device != src.device:
        return None
    if dest.is_contiguous and src.is_contiguous:
        return None
    if stream is not None and (not dest.device.is_cuda or stream != dest.device.stream):
        return None
    if not all(isinstance(v, (int, np.integer)) and v >= 0 for v in (dest_offset, src_offset, count)):
        return None
    size = wp.types.type_size_in_bytes
    if size(dest.dtype) != size(src.dtype) or not dest.ptr or not src.ptr:
        return None
    count = int(count) or src.size
    if dest_offset or src_offset or count != src.size or count != dest.size:
        if dest.ndim != 1 or src.ndim != 1 or src_offset + count > src.size or dest_offset + count > dest.size:
            return None
        src = src[src_offset:src_offset + count]
        dest = dest[dest_offset:dest_offset + count]
    if dest.shape != src.shape or dest.ndim > 4 or src.size == 0:
        return None
    return dest, src


def _word_bytes(element: int, arrays) -> int:
    """The widest unsigned word (8, 4, 2, 1 bytes) that divides the element size, every stride and both
    addresses: each word the kernel moves is then aligned on every device."""
    values = [element] + [a.ptr for a in arrays] + [s for a in arrays for s in a.strides]
    return next(w for w in (8, 4, 2, 1) if all(v % w == 0 for v in values))


def _byte_starts(arr) -> np.ndarray:
    index = np.indices(arr.shape).reshape(arr.ndim, -1)
    return arr.ptr + (np.asarray(arr.strides, dtype=np.int64)[:, None] * index).sum(axis=0)


def _overlaps(dest, src, element: int) -> bool:
    """Whether an element of ``dest`` shares a byte with one of ``src`` (a copy kernel's threads would then race,
    and the result would depend on their order)."""
    def extent(arr):
        ends = [(n - 1) * s for n, s in zip(arr.shape, arr.strides)]
        low = arr.ptr + sum(e for e in ends if e < 0)
        return low, arr.ptr + sum(e for e in ends if e > 0) + element

    (a0, a1), (b0, b1) = extent(dest), extent(src)
    if a1 <= b0 or b1 <= a0:
        return False
    if dest.size + src.size > _MAX_EXACT_OVERLAP_CHECK:
        return True
    starts = np.concatenate([_byte_starts(dest), _byte_starts(src)])
    order = np.sort(starts)
    return bool(np.any(np.diff(order) < element))


def launch_copy(dest, src, where: str):
    """Launch leapp's copy kernel for ``dest <- src`` (views from ``copy_plan``) on their device; returns the
    kernel and its (src, dst) argument views. ``where`` names the call in errors."""
    element = wp.types.type_size_in_bytes(dest.dtype)
    if _overlaps(dest, src, element):
        raise TraceError(f"{where}: wp.copy between non-contiguous arrays whose elements overlap in memory: the "
                         "result would depend on the order the elements are copied in. Copy through a separate "
                         "array.")
    word = _word_bytes(element, (dest, src))
    kernel, dtype = copy_kernel(dest.ndim, word, element // word)
    args = [src.view(dtype), dest.view(dtype)]
    wp.launch(kernel, dim=dest.shape, inputs=args[:1], outputs=args[1:], device=dest.device, record_tape=False)
    return kernel, args
