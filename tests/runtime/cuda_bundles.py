"""Hand-assembled bundles for the GPU replay tests (tests/runtime/test_runtime_cuda.py).

Everything is built from text and packed bytes here, with ``leapp.bundle.write_bundle``:
  * ``smem_bundle``: hand-written PTX (ISA 7.5, checked with ptxas 13.0 for
    sm_75/sm_90) that needs 64 KiB of dynamic shared memory;
  * ``copy_memset_bundle``: no kernel at all, only memsets, copies and inits;
  * ``warp_bundle``: two real Warp kernels compiled by Warp's NVRTC (no GPU
    needed) into a cubin for sm_90 and PTX for sm_75, launched with parameters
    packed by hand per docs/warp-internals.md, "Kernel parameters" (Warp 1.19 ABI).
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

from leapp.bundle import write_bundle
from leapp.bundle.testing import example_manifest_and_blobs

LAUNCH_BOUNDS_1D = struct.Struct("<I4xQQ")  # uint32 shape[1]; size_t size @8; size_t coord_mult @16
LAUNCH_BOUNDS_2D = struct.Struct("<IIQQ")  # uint32 shape[2]; size_t size @8; size_t coord_mult @16
ARRAY_T = struct.Struct("<QQ4i4iHH4x")  # data, grad, int32 shape[4], int32 byte strides[4], uint16 ndim, flags


def launch_bounds(*shape: int) -> bytes:
    size = 1
    for s in shape:
        size *= s
    if len(shape) == 1:
        return LAUNCH_BOUNDS_1D.pack(shape[0], size, 1)
    return LAUNCH_BOUNDS_2D.pack(shape[0], shape[1], size, 1)


def array_t(shape: tuple[int, ...], strides: tuple[int, ...]) -> bytes:
    """An ``array_t`` with data = 0 (patched by a relocation) and unused dims 0."""
    dims = list(shape) + [0] * (4 - len(shape))
    steps = list(strides) + [0] * (4 - len(strides))
    return ARRAY_T.pack(0, 0, *dims, *steps, len(shape), 0)


def pack_params(params: list[bytes]) -> tuple[bytes, list[int], list[int]]:
    """Parameters laid out 8-aligned in one blob: (blob, offsets, sizes)."""
    blob = bytearray()
    offsets, sizes = [], []
    for p in params:
        blob += b"\0" * (-len(blob) % 8)
        offsets.append(len(blob))
        sizes.append(len(p))
        blob += p
    return bytes(blob), offsets, sizes


def tensor(name: str, buffer: int, dtype: str, shape: list[int], warp_dtype: str | None = None,
           logical: list[int] | None = None) -> dict:
    return {"name": name, "buffer": buffer, "dtype": dtype, "shape": shape,
            "warp_dtype": warp_dtype or dtype, "logical_shape": logical or shape}


def base_manifest(segment: str, ptx_isa: str = "7.5") -> dict:
    return {
        "format": "leapp.warp.bundle", "segment": segment, "source": "tests/runtime/cuda_bundles.py:1",
        "producer": {"leapp": "0.1.0", "warp": "1.19.0", "cuda_toolkit": "test", "ptx_isa": ptx_isa,
                     "param_abi": "warp-1.19"},
        "modules": [], "kernels": [], "buffers": [], "ops": [], "signature": {"inputs": [], "outputs": []},
    }


def fake_cubin(arch: int, *entries: str) -> bytes:
    """An ELF header claiming SM ``arch`` (e_flags bits 8..15) followed by entry names; real drivers reject it,
    tests/runtime/mock_cuda's fake driver loads it (e_shoff = the image length)."""
    body = b"\0".join(e.encode() for e in entries) + b"\0"
    header = bytearray(64)
    header[0:4] = b"\x7fELF"
    header[4], header[5], header[6] = 2, 1, 1  # 64-bit, little-endian, version 1
    struct.pack_into("<Q", header, 40, 64 + len(body))  # e_shoff: no section headers, just the end
    struct.pack_into("<I", header, 48, (arch << 8) | 4)  # e_flags
    struct.pack_into("<HHHH", header, 54, 0, 0, 64, 0)  # phentsize, phnum, shentsize, shnum
    return bytes(header) + body


def with_binaries(binaries: list[tuple[str, int, bytes]], n: int = 64, cuda_toolkit: str | None = None) -> bytes:
    """The leapp.bundle.testing example (y = x * [1..n]) with its module's binaries replaced (and
    ``producer.cuda_toolkit``, the CUDA of its cubins, when given)."""
    manifest, blobs = example_manifest_and_blobs(n)
    if cuda_toolkit is not None:
        manifest["producer"]["cuda_toolkit"] = cuda_toolkit
    entries = []
    for kind, arch, data in binaries:
        entries.append({"kind": kind, "arch": arch, "blob": len(blobs)})
        blobs.append(data)
    manifest["modules"][0]["binaries"] = entries
    return write_bundle(manifest, blobs)


def chained_bundle(n: int, segment: str = "test/chained_segment") -> bytes:
    """y = (x * c) * c, c = [1..n], through one scratch buffer: the example's launch x -> scratch, then the same
    kernel scratch -> y. Two threads sharing the scratch of one stream get wrong bytes when their calls interleave."""
    manifest, blobs = example_manifest_and_blobs(n, segment=segment)
    launch = manifest["ops"][1]
    second = {**launch, "relocs": [{"param": 1, "offset": 0, "buffer": 2, "buffer_offset": 0},
                                   {"param": 2, "offset": 0, "buffer": 3, "buffer_offset": 0},
                                   {"param": 3, "offset": 0, "buffer": 1, "buffer_offset": 0}]}
    manifest["ops"] = [manifest["ops"][0], launch, second]
    return write_bundle(manifest, blobs)


# --- dynamic shared memory -------------------------------------------------------------------------------

SMEM_ENTRY = "leapp_test_smem_mirror"
SMEM_PTX = f"""//
// leapp runtime test kernel: y[i] = x[mirror(i)] + 1 through the top of a dynamic shared memory window
//
.version 7.5
.target sm_75
.address_size 64

.extern .shared .align 16 .b8 leapp_dsmem[];

.visible .entry {SMEM_ENTRY}(
\t.param .align 8 .b8 dim[24],
\t.param .align 8 .b8 x[56],
\t.param .align 8 .b8 y[56],
\t.param .u32 smem_bytes
)
{{
\t.reg .pred %p<2>;
\t.reg .b32 %r<12>;
\t.reg .f32 %f<3>;
\t.reg .b64 %rd<9>;

\tld.param.u64 %rd1, [dim+8];
\tld.param.u64 %rd2, [x+0];
\tld.param.u64 %rd3, [y+0];
\tld.param.u32 %r9, [smem_bytes];
\tcvta.to.global.u64 %rd2, %rd2;
\tcvta.to.global.u64 %rd3, %rd3;
\tmov.u32 %r1, %ctaid.x;
\tmov.u32 %r2, %ntid.x;
\tmov.u32 %r3, %tid.x;
\tmad.lo.u32 %r4, %r1, %r2, %r3;
\tcvt.u64.u32 %rd4, %r4;
\tmul.wide.u32 %rd5, %r4, 4;
\tmov.u32 %r7, leapp_dsmem;
\tadd.u32 %r5, %r3, 1;
\tshl.b32 %r5, %r5, 2;
\tsub.u32 %r6, %r9, %r5;
\tadd.u32 %r8, %r7, %r6;
\tmov.f32 %f1, 0f00000000;
\tsetp.ge.u64 %p1, %rd4, %rd1;
\t@%p1 bra STORE;
\tadd.u64 %rd6, %rd2, %rd5;
\tld.global.f32 %f1, [%rd6];
STORE:
\tst.shared.f32 [%r8], %f1;
\tbar.sync 0;
\tsub.u32 %r10, %r2, %r3;
\tshl.b32 %r10, %r10, 2;
\tsub.u32 %r11, %r9, %r10;
\tadd.u32 %r11, %r7, %r11;
\tld.shared.f32 %f2, [%r11];
\t@%p1 bra DONE;
\tadd.f32 %f2, %f2, 0f3F800000;
\tadd.u64 %rd7, %rd3, %rd5;
\tst.global.f32 [%rd7], %f2;
DONE:
\tret;
}}
"""


def smem_bundle(n: int, block: int = 128, smem: int = 64 * 1024) -> bytes:
    """y[b*B + t] = x[b*B + (B-1-t)] + 1 (0 + 1 past the end), staged through bytes [smem - 4B, smem) of shared memory."""
    m = base_manifest("test/smem_segment")
    blobs = [SMEM_PTX.encode("ascii") + b"\0"]
    params, offsets, sizes = pack_params([launch_bounds(n), array_t((n,), (4,)), array_t((n,), (4,)),
                                          struct.pack("<I", smem)])
    blobs.append(params)
    m["modules"] = [{"name": "leapp_test_smem", "binaries": [{"kind": "ptx", "arch": 75, "blob": 0}]}]
    m["kernels"] = [{"module": 0, "entry": SMEM_ENTRY, "block_dim": block, "smem_bytes": smem}]
    m["buffers"] = [{"id": 0, "bytes": 4 * n, "role": "input", "io": 0, "init": "none"},
                    {"id": 1, "bytes": 4 * n, "role": "output", "io": 0, "init": "none"}]
    m["ops"] = [{"op": "launch", "kernel": 0, "grid": [-(-n // block), 1, 1], "block": [block, 1, 1], "smem": smem,
                 "params": {"blob": 1, "offsets": offsets, "sizes": sizes},
                 "relocs": [{"param": 1, "offset": 0, "buffer": 0, "buffer_offset": 0},
                            {"param": 2, "offset": 0, "buffer": 1, "buffer_offset": 0}]}]
    m["signature"] = {"inputs": [tensor("x", 0, "float32", [n])], "outputs": [tensor("y", 1, "float32", [n])]}
    return write_bundle(m, blobs)


# --- memsets, copies and inits only --------------------------------------------------------------------------


def copy_memset_bundle(n: int) -> tuple[bytes, bytes]:
    """(bundle, constant bytes). Input a (float32[n]); outputs:
    o1 = a, then its first 4 bytes set to 0xFF (init from input + memset);
    o2 = 8 bytes of 0x01 (memset scratch + copy), then constant bytes [0, 8), then zeros (init zero).
    """
    assert n >= 4
    constant = bytes(range(1, 4 * n + 1)) if 4 * n < 256 else bytes(i % 251 for i in range(4 * n))
    m = base_manifest("test/copy_segment")
    m["buffers"] = [
        {"id": 0, "bytes": 4 * n, "role": "input", "io": 0, "init": "none"},
        {"id": 1, "bytes": 4 * n, "role": "output", "io": 0, "init": {"input": 0}},
        {"id": 2, "bytes": 4 * n, "role": "output", "io": 1, "init": "zero"},
        {"id": 3, "bytes": 4 * n, "role": "scratch", "init": "none"},
        {"id": 4, "bytes": 4 * n, "role": "constant", "init": {"blob": 0}},
    ]
    m["ops"] = [
        {"op": "memset", "buffer": 3, "offset": 0, "bytes": 4 * n, "value": 1},
        {"op": "copy", "dst": 2, "dst_offset": 0, "src": 3, "src_offset": 0, "bytes": 8},
        {"op": "copy", "dst": 2, "dst_offset": 8, "src": 4, "src_offset": 0, "bytes": 8},
        {"op": "memset", "buffer": 1, "offset": 0, "bytes": 4, "value": 255},
    ]
    m["signature"] = {"inputs": [tensor("a", 0, "float32", [n])],
                      "outputs": [tensor("o1", 1, "float32", [n]), tensor("o2", 2, "uint8", [4 * n])]}
    return write_bundle(m, [constant]), constant


# --- real Warp kernels ------------------------------------------------------------------------------------


def compile_warp_module(out_dir: Path) -> dict:
    """Compiles tests/runtime/cuda_warp_kernels.py with Warp's NVRTC: PTX for sm_75 and a cubin for sm_90.

    Returns {"ptx75": bytes, "cubin90": bytes, "ptx_isa": "9.4", "entries": {key: entry}, "block_dim": 256}.
    Never touches wp.config or the module's options; the output goes to ``out_dir``.
    """
    import warp as wp

    import cuda_warp_kernels as kernels

    module = kernels.affine_vec3.module
    ptx = [Path(p) for p in wp.compile_aot_module(module, arch=[75], use_ptx=True, module_dir=str(out_dir))]
    cubin = [Path(p) for p in wp.compile_aot_module(module, arch=[90], use_ptx=False, module_dir=str(out_dir))]
    ptx_path = next(p for p in ptx if p.name.endswith(".sm75.ptx"))
    cubin_path = next(p for p in cubin if p.name.endswith(".sm90.cubin"))
    meta = json.loads(next(out_dir.glob("*.meta")).read_text())
    entries = {}
    for key in ("affine_vec3", "add_rows"):
        names = [k.removesuffix("_smem_bytes") for k in meta
                 if k.startswith(key + "_") and k.endswith("_cuda_kernel_forward_smem_bytes")]
        assert len(names) == 1, (key, sorted(meta))
        entries[key] = names[0]
    ptx_bytes = ptx_path.read_bytes()
    if not ptx_bytes.endswith(b"\0"):
        ptx_bytes += b"\0"
    isa = re.search(rb"\.version\s+(\d+\.\d+)", ptx_bytes).group(1).decode()
    block_dim = int(re.search(r"#define WP_TILE_BLOCK_DIM (\d+)", next(out_dir.glob("*.cu")).read_text()).group(1))
    return {"ptx75": ptx_bytes, "cubin90": cubin_path.read_bytes(), "ptx_isa": isa, "entries": entries,
            "block_dim": block_dim}


WARP_SCALE = 1.5
WARP_OFFSET = (0.5, -1.0, 2.0)
WARP_K = 3


def warp_bundle(compiled: dict, n: int, rows: int, cols: int, binaries=("ptx75", "cubin90")) -> bytes:
    """Two Warp launches in one segment:
    affine_vec3: y = WARP_SCALE * x + WARP_OFFSET (x, y: (n,) vec3f), hits[0] += 1 per thread (hits: init zero);
    add_rows:    out = a + bias * WARP_K (a, out: (rows, cols) float32; bias: (cols,)).
    """
    bd = compiled["block_dim"]
    m = base_manifest("test/warp_segment", compiled["ptx_isa"])
    blobs: list[bytes] = []
    entries = []
    for name in binaries:
        kind, arch = ("ptx", 75) if name == "ptx75" else ("cubin", 90)
        entries.append({"kind": kind, "arch": arch, "blob": len(blobs)})
        blobs.append(compiled[name])
    m["modules"] = [{"name": "cuda_warp_kernels", "binaries": entries}]
    m["kernels"] = [
        {"module": 0, "entry": compiled["entries"]["affine_vec3"], "key": "affine_vec3", "block_dim": bd,
         "smem_bytes": 0},
        {"module": 0, "entry": compiled["entries"]["add_rows"], "key": "add_rows", "block_dim": bd, "smem_bytes": 0},
    ]
    m["buffers"] = [
        {"id": 0, "bytes": 12 * n, "role": "input", "io": 0, "init": "none"},           # x
        {"id": 1, "bytes": 4 * rows * cols, "role": "input", "io": 1, "init": "none"},  # a
        {"id": 2, "bytes": 4 * cols, "role": "input", "io": 2, "init": "none"},         # bias
        {"id": 3, "bytes": 12 * n, "role": "output", "io": 0, "init": "none"},          # y
        {"id": 4, "bytes": 4, "role": "output", "io": 1, "init": "zero"},               # hits
        {"id": 5, "bytes": 4 * rows * cols, "role": "output", "io": 2, "init": "none"},  # out
    ]
    p1, o1, s1 = pack_params([
        launch_bounds(n),
        array_t((n,), (12,)),
        struct.pack("<f", WARP_SCALE),
        struct.pack("<3f", *WARP_OFFSET),
        array_t((n,), (12,)),
        array_t((1,), (4,)),
    ])
    p2, o2, s2 = pack_params([
        launch_bounds(rows, cols),
        array_t((rows, cols), (4 * cols, 4)),
        array_t((cols,), (4,)),
        struct.pack("<i", WARP_K),
        array_t((rows, cols), (4 * cols, 4)),
    ])
    blobs += [p1, p2]
    m["ops"] = [
        {"op": "launch", "kernel": 0, "grid": [-(-n // bd), 1, 1], "block": [bd, 1, 1], "smem": 0,
         "params": {"blob": len(blobs) - 2, "offsets": o1, "sizes": s1},
         "relocs": [{"param": 1, "offset": 0, "buffer": 0, "buffer_offset": 0},
                    {"param": 4, "offset": 0, "buffer": 3, "buffer_offset": 0},
                    {"param": 5, "offset": 0, "buffer": 4, "buffer_offset": 0}]},
        {"op": "launch", "kernel": 1, "grid": [-(-(rows * cols) // bd), 1, 1], "block": [bd, 1, 1], "smem": 0,
         "params": {"blob": len(blobs) - 1, "offsets": o2, "sizes": s2},
         "relocs": [{"param": 1, "offset": 0, "buffer": 1, "buffer_offset": 0},
                    {"param": 2, "offset": 0, "buffer": 2, "buffer_offset": 0},
                    {"param": 4, "offset": 0, "buffer": 5, "buffer_offset": 0}]},
    ]
    m["signature"] = {
        "inputs": [tensor("x", 0, "float32", [n, 3], "vec3f", [n]), tensor("a", 1, "float32", [rows, cols]),
                   tensor("bias", 2, "float32", [cols])],
        "outputs": [tensor("y", 3, "float32", [n, 3], "vec3f", [n]), tensor("hits", 4, "int32", [1]),
                    tensor("out", 5, "float32", [rows, cols])],
    }
    return write_bundle(m, blobs)
