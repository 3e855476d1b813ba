"""leapp/bundle/format.py: the constants of docs/bundle-format.md (segment bundle, format version 2).

NOTE: the C++ reader (ext/core) mirrors every constant here by hand; the spec
text is the single source of truth, and a change here is a change there.
Pure Python on purpose: a bundle must be readable where neither torch nor
warp is installed.
"""

from __future__ import annotations

import platform
import re
import struct

from leapp.errors import LeappError

__all__ = [
    "BundleError",
    "MAGIC",
    "FORMAT_VERSION",
    "MIN_READER_VERSION",
    "READER_VERSION",
    "DYNAMIC_BATCH_VERSION",
    "MAX_RULE_COEFFICIENT",
    "MAX_BATCH",
    "OLDEST_READABLE_VERSION",
    "ENCODINGS",
    "ENCODING_MIN_READER",
    "min_reader_version_of",
    "HEADER",
    "HEADER_SIZE",
    "BLOB_ENTRY",
    "BLOB_ENTRY_SIZE",
    "HASH_SIZE",
    "MIN_FILE_SIZE",
    "ALIGNMENT",
    "MAX_BLOBS",
    "MAX_MANIFEST_SIZE",
    "MAX_JSON_DEPTH",
    "MAX_JSON_VALUES",
    "MAX_BUFFER_BYTES",
    "MAX_OWNED_BYTES",
    "MAX_INT",
    "FORMAT_NAME",
    "ROLES",
    "INIT_KINDS",
    "OP_KINDS",
    "BINARY_KINDS",
    "DTYPE_ITEMSIZE",
    "DTYPES",
    "align_up",
    "ptx_isa_of",
    "is_ptx_isa",
    "DEFAULT_CUBIN_ARCHS",
    "CPU_MACHINES",
    "MAX_CPU_CODE_BYTES",
    "elf_problem",
    "this_machine",
    "COPY_ONLY_NOTE",
    "claims_any_machine",
    "cpu_code_runs_here",
    "segment_runs_on_this_cpu",
]

# The cubins a default export holds (the exporter, leapp._export.cuda_code, compiles them; the runtime's
# leapp.runtime.binary_choice describes them), chosen by CUDA's binary compatibility (SASS for X.y runs on
# X.z, z >= y, never across majors), one per family plus Ampere's consumer minor: 75 Turing; 80 A100 (8.0);
# 86 RTX 30xx, Jetson Orin (8.7), RTX 40xx (8.9: its SASS equals sm_86's for the kernels compared,
# docs/portability.md); 90 H100/H200; 100 B200/B300 (10.3); 110 Jetson Thor; 120 RTX 50xx, GB10 (12.1).
DEFAULT_CUBIN_ARCHS: tuple[int, ...] = (75, 80, 86, 90, 100, 110, 120)


class BundleError(LeappError, ValueError):
    """A bundle (or its manifest, or a segment signature) breaks docs/bundle-format.md.

    The message names the check, the field and what was expected vs found.
    """


BundleError.__module__ = "leapp.bundle"

MAGIC = b"LEAPPWB\0"
FORMAT_VERSION = 2  # what this writer writes
MIN_READER_VERSION = 1  # the oldest reader able to read a file this writer writes without compressed binaries
READER_VERSION = 2  # the newest format this reader knows (files with min_reader_version above it are refused)
DYNAMIC_BATCH_VERSION = 2  # the min_reader_version of a bundle with dynamic-batch rules (an older reader ignores them)
MAX_RULE_COEFFICIENT = 2**40  # |a| and |b| of a dynamic-batch rule [a, b]
MAX_BATCH = 2**31 - 1
OLDEST_READABLE_VERSION = 1  # the oldest format_version this reader still reads
# Compressed binaries (section 1.1, format version 2): ``modules[m].binaries[b].encoding``; a file that uses
# one is written with min_reader_version 2 (a version-1 reader would take the block for the binary).
ENCODINGS = ("lz4-block",)
ENCODING_MIN_READER = 2

# magic, format_version, min_reader_version, file_size, blob_table_offset,
# blob_count, flags, manifest_offset, manifest_size, reserved
HEADER = struct.Struct("<8sIIQQIIQQQ")
HEADER_SIZE = 64
assert HEADER.size == HEADER_SIZE

# offset, length, sha256
BLOB_ENTRY = struct.Struct("<QQ32s")
BLOB_ENTRY_SIZE = 48
assert BLOB_ENTRY.size == BLOB_ENTRY_SIZE

HASH_SIZE = 32  # trailing sha256 of bytes [0, file_size - 32)
MIN_FILE_SIZE = HEADER_SIZE + HASH_SIZE
ALIGNMENT = 8
MAX_BLOBS = 65536
MAX_MANIFEST_SIZE = 64 * 1024 * 1024
MAX_JSON_DEPTH = 512  # nesting of arrays/objects in the manifest, the top-level object being 1
MAX_JSON_VALUES = 2**20  # values in one manifest or signature document (object keys not counted)
# Declared sizes (docs/bundle-format.md "Resource bounds"): 2^40 bytes (1 TiB) is several times any one
# GPU's memory, and 2^20 values of at most 2^40 sum to at most 2^60: no sum or offset + length overflows.
MAX_BUFFER_BYTES = 2**40  # buffers[i].bytes, memset/copy bytes, a blob's length
MAX_OWNED_BYTES = 2**40  # the sum of a segment's scratch and constant buffer bytes (runtime-allocated, per device)
MAX_INT = 2**63 - 1  # every manifest integer lies in [0, MAX_INT]: sums of two never overflow a u64

FORMAT_NAME = "leapp.warp.bundle"
ROLES = ("input", "output", "scratch", "constant")
INIT_KINDS = ("none", "zero", "blob", "input")
OP_KINDS = ("launch", "memset", "copy")
BINARY_KINDS = ("ptx", "cubin")
# CPU code (section "CPU code"): cpu_code[c].machine -> the ELF e_machine its shared object must declare
CPU_MACHINES = {"x86_64": 62, "aarch64": 183}
MAX_CPU_CODE_BYTES = 64 * 1024 * 1024  # a CPU code object's (decoded) size: leapp's are tens of KiB

# torch dtype name -> bytes per element (Warp's uint16/32/64 travel as the signed type of that width)
DTYPE_ITEMSIZE = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float64": 8,
    "int8": 1,
    "int16": 2,
    "int32": 4,
    "int64": 8,
    "uint8": 1,
    "bool": 1,
}
DTYPES = tuple(DTYPE_ITEMSIZE)


def min_reader_version_of(manifest: dict) -> int:
    """The min_reader_version a file with this manifest needs: 2 when a binary (or CPU code) has an ``encoding`` or the manifest
    has dynamic-batch rules (``batch``: a version-1 reader would ignore them and replay the traced batch only), else 1."""
    if isinstance(manifest, dict) and "batch" in manifest:
        return DYNAMIC_BATCH_VERSION
    modules = manifest.get("modules") if isinstance(manifest, dict) else None
    for module in modules if isinstance(modules, list) else ():
        binaries = module.get("binaries") if isinstance(module, dict) else None
        for binary in binaries if isinstance(binaries, list) else ():
            if isinstance(binary, dict) and "encoding" in binary:
                return ENCODING_MIN_READER
    codes = manifest.get("cpu_code") if isinstance(manifest, dict) else None
    for code in codes if isinstance(codes, list) else ():
        if isinstance(code, dict) and "encoding" in code:
            return ENCODING_MIN_READER
    return MIN_READER_VERSION


def align_up(n: int, alignment: int = ALIGNMENT) -> int:
    """The smallest multiple of ``alignment`` that is >= n."""
    return (n + alignment - 1) // alignment * alignment


_PTX_ISA = re.compile(r"[0-9]{1,3}\.[0-9]{1,3}")
_PTX_VERSION = re.compile(rb"\.version([ \t]*)([0-9.]*)")
PTX_ISA_SCAN = 4096  # the .version directive is looked for in a PTX blob's first 4096 bytes


def is_ptx_isa(text: str) -> bool:
    """Whether ``text`` is a PTX ISA version as the manifest writes it: "<1-3 digits>.<1-3 digits>" ("9.0")."""
    return isinstance(text, str) and _PTX_ISA.fullmatch(text) is not None


def ptx_isa_of(ptx: bytes) -> str:
    """The ISA of a PTX text (section 2, ``binaries[b].ptx_isa``): the first ".version" in its first 4096 bytes,
    then at least one space or tab, then "<1-3 digits>.<1-3 digits>"; "" when there is none of that form."""
    match = _PTX_VERSION.search(bytes(ptx[:PTX_ISA_SCAN]))
    if match is None or not match.group(1):
        return ""
    isa = match.group(2).decode("ascii")
    return isa if is_ptx_isa(isa) else ""


def elf_problem(head: bytes, machine: str) -> str:
    """Why the first 64 bytes of a CPU code blob are not the header of a 64-bit little-endian ELF shared object
    for ``machine`` ("" when they are); both readers apply the same checks."""
    if len(head) < 64 or head[:4] != b"\x7fELF":
        return "not an ELF file (no \\x7fELF magic in a 64-byte header)"
    if head[4] != 2 or head[5] != 1:
        return f"not a 64-bit little-endian ELF file (class {head[4]}, data {head[5]})"
    e_type, e_machine = struct.unpack_from("<HH", head, 16)
    if e_type != 3:
        return f"not an ELF shared object (e_type {e_type}, expected 3, ET_DYN)"
    if e_machine != CPU_MACHINES[machine]:
        return f"ELF e_machine {e_machine} is not {machine}'s ({CPU_MACHINES[machine]})"
    return ""


def this_machine() -> str:
    """The CPU code machine name of this machine ("x86_64", "aarch64"; another name when leapp has none for it)."""
    machine = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)


# producer.cpu_code of a segment that launches no kernel: its copies and memsets run as memmove and memset on every
# machine, with no compiled code. Readers recognise the "any" prefix (claims_any_machine); both claim checks
# require such a bundle to hold no kernel and no CPU code.
COPY_ONLY_NOTE = "any: the segment launches no kernel; its copies and memsets need no CPU code"


def claims_any_machine(note: str) -> bool:
    """Whether a ``producer.cpu_code`` note claims every machine (``COPY_ONLY_NOTE``)."""
    return note.startswith("any")


def cpu_code_runs_here(note: str) -> bool:
    """Whether a segment's ``producer.cpu_code`` note (its machines, "x86_64, aarch64", "any: ..." for copies
    only, or "none: why") says it runs on this machine's CPU. A note is a claim: the runtime checks the bundle
    itself before it runs anything."""
    if claims_any_machine(note):
        return True
    return not note.startswith("none") and this_machine() in [m.strip() for m in note.split(",")]


def segment_runs_on_this_cpu(segment) -> bool:
    """``cpu_code_runs_here`` of a pipeline.yaml segment entry (its ``producer`` is the bundle's; an entry
    without a note has no CPU code)."""
    producer = segment.get("producer") if hasattr(segment, "get") else None
    note = producer.get("cpu_code", "none") if isinstance(producer, dict) else "none"
    return cpu_code_runs_here(str(note))
