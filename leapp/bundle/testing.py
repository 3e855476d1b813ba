"""leapp/bundle/testing.py: a complete example bundle and helpers to build broken ones (for tests).

NOTE: the C++ reader's tests use these too, so they stay small and stable.
The example PTX is real (ptxas accepts it for sm_75 and sm_90) and uses
Warp 1.19's parameter ABI: ``launch_bounds_t<1>`` (24 B: ``uint32 shape[1]``,
``size_t size`` at 8, ``size_t coord_mult`` at 16), then ``array_t`` (56 B:
``data`` at 0, ``int32 shape[4]`` at 16, byte ``strides[4]`` at 32, ``uint16
ndim`` at 48). Replayed on a GPU it computes ``y = x * c`` with ``c = [1, 2, ..., n]``.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping, Sequence

from leapp.bundle.format import BLOB_ENTRY, BLOB_ENTRY_SIZE, HASH_SIZE, HEADER, HEADER_SIZE, min_reader_version_of
from leapp.bundle.writer import encode_manifest, pack

__all__ = [
    "LONE_SURROGATE_CASES",
    "EXAMPLE_ENTRY",
    "EXAMPLE_PTX",
    "example_manifest_and_blobs",
    "example_bundle",
    "dynamic_example_manifest_and_blobs",
    "dynamic_example_bundle",
    "reseal",
    "reseal_blob",
    "set_header_field",
    "write_unchecked",
]

EXAMPLE_ENTRY = "leapp_example_scale_cuda_kernel_forward"

# out[i] = x[i] * c[i] for i < dim.size, grid-stride like Warp's kernels. PTX ISA 7.5 loads on CUDA >= 11.5 drivers.
EXAMPLE_PTX = f"""//
// leapp example kernel (leapp/bundle/testing.py): out[i] = x[i] * c[i]
//
.version 7.5
.target sm_75
.address_size 64

.visible .entry {EXAMPLE_ENTRY}(
\t.param .align 8 .b8 dim[24],
\t.param .align 8 .b8 x[56],
\t.param .align 8 .b8 c[56],
\t.param .align 8 .b8 out[56]
)
{{
\t.reg .pred %p<2>;
\t.reg .b32 %r<5>;
\t.reg .f32 %f<4>;
\t.reg .b64 %rd<12>;

\tld.param.u64 %rd1, [dim+8];
\tld.param.u64 %rd2, [x+0];
\tld.param.u64 %rd3, [c+0];
\tld.param.u64 %rd4, [out+0];
\tcvta.to.global.u64 %rd2, %rd2;
\tcvta.to.global.u64 %rd3, %rd3;
\tcvta.to.global.u64 %rd4, %rd4;
\tmov.u32 %r1, %ctaid.x;
\tmov.u32 %r2, %ntid.x;
\tmov.u32 %r3, %tid.x;
\tmov.u32 %r4, %nctaid.x;
\tmul.wide.u32 %rd5, %r1, %r2;
\tcvt.u64.u32 %rd6, %r3;
\tadd.u64 %rd5, %rd5, %rd6;
\tmul.wide.u32 %rd7, %r4, %r2;
LOOP:
\tsetp.ge.u64 %p1, %rd5, %rd1;
\t@%p1 bra DONE;
\tshl.b64 %rd8, %rd5, 2;
\tadd.u64 %rd9, %rd2, %rd8;
\tld.global.f32 %f1, [%rd9];
\tadd.u64 %rd10, %rd3, %rd8;
\tld.global.f32 %f2, [%rd10];
\tmul.rn.f32 %f3, %f1, %f2;
\tadd.u64 %rd11, %rd4, %rd8;
\tst.global.f32 [%rd11], %f3;
\tadd.u64 %rd5, %rd5, %rd7;
\tbra LOOP;
DONE:
\tret;
}}
"""

_LAUNCH_BOUNDS = struct.Struct("<I4xQQ")  # Warp 1.19 launch_bounds_t<1>: shape[1], size, coord_mult
_ARRAY_T = struct.Struct("<QQ4i4iHH4x")  # data, grad, shape[4], strides[4] (bytes), ndim, flags
assert _LAUNCH_BOUNDS.size == 24 and _ARRAY_T.size == 56


def _array_1d(n: int, itemsize: int) -> bytes:
    return _ARRAY_T.pack(0, 0, n, 0, 0, 0, itemsize, 0, 0, 0, 1, 0)  # data patched by a relocation


def example_manifest_and_blobs(
    n: int = 4,
    *,
    segment: str = "example/warp_segment_0",
    block_dim: int = 256,
    cubins: Mapping[int, bytes] | None = None,
) -> tuple[dict, list[bytes]]:
    """A small, complete, valid manifest and its blobs: ``y = x * c`` over ``n`` float32s.

    Every role and op kind appears: input ``x`` (buffer 0), output ``y``
    (buffer 1, init "zero"), a scratch (buffer 2), a constant ``c = [1..n]``
    (buffer 3, blob 1); ops: memset scratch, launch (scratch = x * c), copy
    scratch -> y. Blobs: 0 = PTX (sm_75, NUL-terminated), 1 = constant bytes,
    2 = launch parameters, then one per ``cubins`` entry (arch -> cubin bytes).
    """
    nbytes = 4 * n
    params = _LAUNCH_BOUNDS.pack(n, n, 1) + _array_1d(n, 4) * 3
    constant = struct.pack(f"<{n}f", *range(1, n + 1))
    blobs = [EXAMPLE_PTX.encode("ascii") + b"\0", constant, params]
    binaries = [{"kind": "ptx", "arch": 75, "blob": 0}]
    for arch, cubin in sorted((cubins or {}).items()):
        binaries.append({"kind": "cubin", "arch": arch, "blob": len(blobs)})
        blobs.append(bytes(cubin))
    grid = max(1, -(-n // block_dim))
    manifest = {
        "format": "leapp.warp.bundle",
        "segment": segment,
        "source": "leapp/bundle/testing.py:1",
        "producer": {"leapp": "0.1.0", "warp": "1.19.0", "cuda_toolkit": "none", "ptx_isa": "7.5",
                     "param_abi": "warp-1.19"},
        "modules": [{"name": "leapp_example_module", "binaries": binaries}],
        "kernels": [{"module": 0, "entry": EXAMPLE_ENTRY, "key": "example_scale", "block_dim": block_dim,
                     "smem_bytes": 0}],
        "buffers": [
            {"id": 0, "bytes": nbytes, "role": "input", "io": 0, "init": "none"},
            {"id": 1, "bytes": nbytes, "role": "output", "io": 0, "init": "zero"},
            {"id": 2, "bytes": nbytes, "role": "scratch", "init": "none"},
            {"id": 3, "bytes": nbytes, "role": "constant", "init": {"blob": 1}},
        ],
        "ops": [
            {"op": "memset", "buffer": 2, "offset": 0, "bytes": nbytes, "value": 0},
            {"op": "launch", "kernel": 0, "grid": [grid, 1, 1], "block": [block_dim, 1, 1], "smem": 0,
             "params": {"blob": 2, "offsets": [0, 24, 80, 136], "sizes": [24, 56, 56, 56]},
             "relocs": [{"param": 1, "offset": 0, "buffer": 0, "buffer_offset": 0},
                        {"param": 2, "offset": 0, "buffer": 3, "buffer_offset": 0},
                        {"param": 3, "offset": 0, "buffer": 2, "buffer_offset": 0}]},
            {"op": "copy", "dst": 1, "dst_offset": 0, "src": 2, "src_offset": 0, "bytes": nbytes},
        ],
        "signature": {
            "inputs": [{"name": "x", "buffer": 0, "dtype": "float32", "shape": [n],
                        "warp_dtype": "float32", "logical_shape": [n]}],
            "outputs": [{"name": "y", "buffer": 1, "dtype": "float32", "shape": [n],
                         "warp_dtype": "float32", "logical_shape": [n]}],
        },
    }
    return manifest, blobs


def dynamic_example_manifest_and_blobs(batch: int = 8, lo: int = 1, hi: int = 64,
                                       block_dim: int = 256) -> tuple[dict, list[bytes]]:
    """A valid dynamic-batch manifest (docs/bundle-format.md, "Dynamic batch") and its blobs: ``y = x * x`` over
    ``batch`` float32s, traced at ``batch``, for batches ``lo..hi``.

    Every rule kind appears: input/output/scratch ``bytes_rule``, signature ``batch_rule``, memset
    ``bytes_rule``, launch ``size_rule`` + ``patches`` (launch-bounds shape and size, each array's shape[0]),
    copy ``bytes_rule``. The launch computes the
    example kernel (``out = x * c``) with ``c`` relocated to the input, so the fake driver emulates it.
    """
    nbytes = 4 * batch
    params = _LAUNCH_BOUNDS.pack(batch, batch, 1) + _array_1d(batch, 4) * 3
    blobs = [EXAMPLE_PTX.encode("ascii") + b"\0", params]
    grid = max(1, -(-batch // block_dim))
    rule4 = [4, 0]
    manifest = {
        "format": "leapp.warp.bundle",
        "segment": "example/warp_segment_0",
        "source": "leapp/bundle/testing.py:1",
        "producer": {"leapp": "0.1.0", "warp": "1.19.0", "cuda_toolkit": "none", "ptx_isa": "7.5",
                     "param_abi": "warp-1.19"},
        "modules": [{"name": "leapp_example_module", "binaries": [{"kind": "ptx", "arch": 75, "blob": 0}]}],
        "kernels": [{"module": 0, "entry": EXAMPLE_ENTRY, "key": "example_scale", "block_dim": block_dim,
                     "smem_bytes": 0}],
        "batch": {"traced": batch, "min": lo, "max": hi},
        "buffers": [
            {"id": 0, "bytes": nbytes, "bytes_rule": rule4, "role": "input", "io": 0, "init": "none"},
            {"id": 1, "bytes": nbytes, "bytes_rule": rule4, "role": "output", "io": 0, "init": "zero"},
            {"id": 2, "bytes": nbytes, "bytes_rule": rule4, "role": "scratch", "init": "none"},
        ],
        "ops": [
            {"op": "memset", "buffer": 2, "offset": 0, "bytes": nbytes, "bytes_rule": rule4, "value": 0},
            {"op": "launch", "kernel": 0, "grid": [grid, 1, 1], "block": [block_dim, 1, 1], "smem": 0,
             "params": {"blob": 1, "offsets": [0, 24, 80, 136], "sizes": [24, 56, 56, 56]},
             "relocs": [{"param": 1, "offset": 0, "buffer": 0, "buffer_offset": 0},
                        {"param": 2, "offset": 0, "buffer": 0, "buffer_offset": 0},
                        {"param": 3, "offset": 0, "buffer": 2, "buffer_offset": 0}],
             "size_rule": [1, 0], "grid_stride": True, "max_blocks": 0,
             "patches": [{"param": 0, "offset": 0, "width": 4, "rule": [1, 0]},
                         {"param": 0, "offset": 8, "width": 8, "rule": [1, 0]}]
                        + [{"param": p, "offset": 16, "width": 4, "rule": [1, 0]} for p in (1, 2, 3)]},
            {"op": "copy", "dst": 1, "dst_offset": 0, "src": 2, "src_offset": 0, "bytes": nbytes,
             "bytes_rule": rule4},
        ],
        "signature": {
            "inputs": [{"name": "x", "buffer": 0, "dtype": "float32", "shape": [batch], "batch_rule": [1, 0]}],
            "outputs": [{"name": "y", "buffer": 1, "dtype": "float32", "shape": [batch], "batch_rule": [1, 0]}],
        },
    }
    return manifest, blobs


def dynamic_example_bundle(batch: int = 8, **kwargs) -> bytes:
    """``write_bundle(*dynamic_example_manifest_and_blobs(batch, **kwargs))``."""
    from leapp.bundle.writer import write_bundle

    return write_bundle(*dynamic_example_manifest_and_blobs(batch, **kwargs))


def example_bundle(n: int = 4, **kwargs) -> bytes:
    """``write_bundle(*example_manifest_and_blobs(n, **kwargs))``."""
    from leapp.bundle.writer import write_bundle

    return write_bundle(*example_manifest_and_blobs(n, **kwargs))


def reseal(data: bytes | bytearray) -> bytes:
    """``data`` with its trailing whole-file sha256 recomputed, so a deliberate mutation reaches the deeper checks.

    Data shorter than the hash is returned unchanged.
    """
    data = bytes(data)
    if len(data) < HASH_SIZE:
        return data
    body = data[:-HASH_SIZE]
    return body + hashlib.sha256(body).digest()


def reseal_blob(data: bytes | bytearray, index: int) -> bytes:
    """Recomputes blob ``index``'s table sha256 from its current bytes, then the whole-file hash."""
    out = bytearray(data)
    entry = HEADER_SIZE + index * BLOB_ENTRY_SIZE
    offset, length, _ = BLOB_ENTRY.unpack_from(out, entry)
    BLOB_ENTRY.pack_into(out, entry, offset, length, hashlib.sha256(out[offset:offset + length]).digest())
    return reseal(out)


_HEADER_FIELDS = ("magic", "format_version", "min_reader_version", "file_size", "blob_table_offset",
                  "blob_count", "flags", "manifest_offset", "manifest_size", "reserved")


def set_header_field(data: bytes | bytearray, **fields: int | bytes) -> bytes:
    """``data`` with header fields replaced by name (e.g. ``flags=1``) and resealed."""
    values = dict(zip(_HEADER_FIELDS, HEADER.unpack_from(data, 0)))
    unknown = set(fields) - set(values)
    if unknown:
        raise KeyError(f"set_header_field: unknown header fields {sorted(unknown)}; known: {_HEADER_FIELDS}")
    values.update(fields)
    out = bytearray(data)
    HEADER.pack_into(out, 0, *(values[name] for name in _HEADER_FIELDS))
    return reseal(out)


def write_unchecked(manifest: dict | bytes, blobs: Sequence[bytes], min_reader_version: int | None = None) -> bytes:
    """A well-formed file around ``manifest`` (a dict, encoded as the writer does, or raw bytes) WITHOUT validating it.

    For tests of the reader's manifest rules: the header, table and hashes are
    right, so the reader gets as far as the manifest. ``min_reader_version``:
    the header's (default: what the writer would write, 2 when a binary has an
    ``encoding``, else 1).
    """
    if isinstance(manifest, (bytes, bytearray)):
        raw = bytes(manifest)
        derived = 1
    else:
        raw = encode_manifest(manifest)
        derived = min_reader_version_of(manifest)
    return pack(raw, [bytes(b) for b in blobs],
                min_reader_version=derived if min_reader_version is None else min_reader_version)


# (old, new, escape, where): manifest edits that leave one lone UTF-16 surrogate escape, the
# escape both readers name and the field they name it in (tests of the two readers share them).
LONE_SURROGATE_CASES = {
    "segment": (b'"segment":"example/warp_segment_0"', b'"segment":"\\ud800"', "\\ud800", "segment"),
    "low-alone": (b'"segment":"example/warp_segment_0"', b'"segment":"ab\\udc00"', "\\udc00", "segment"),
    "high-then-char": (b'"segment":"example/warp_segment_0"', b'"segment":"\\ud800\\u0041"', "\\ud800", "segment"),
    "two-highs": (b'"segment":"example/warp_segment_0"', b'"segment":"\\ud83d\\ud83d"', "\\ud83d", "segment"),
    "tensor-name": (b'"name":"x"', b'"name":"x\\udfff"', "\\udfff", "signature.inputs[0].name"),
    "array-element": (b'"shape":[4]', b'"shape":[4,"\\ud800"]', "\\ud800", "signature.inputs[0].shape[1]"),
    "producer-key": (b'"warp":"1.19.0"', b'"w\\ud800":"1.19.0"', "\\ud800", "a key of producer"),
    "top-key": (b'{"buffers"', b'{"\\udbff":0,"buffers"', "\\udbff", "a key of the top-level object"),
}
