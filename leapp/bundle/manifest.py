"""leapp/bundle/manifest.py: the manifest rules of docs/bundle-format.md section 2.

NOTE: the writer and the reader call the same ``validate_manifest``, so a
bundle that ``write_bundle`` produced is one that ``read_bundle`` accepts.
The manifest it checks is the JSON-decoded form: lists, dicts, str, int
(a bool or a float is never an integer here, as in the C++ reader).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NoReturn

from leapp.bundle import lz4_block
from leapp.bundle.format import (
    BINARY_KINDS,
    ENCODING_MIN_READER,
    ENCODINGS,
    DTYPE_ITEMSIZE,
    FORMAT_NAME,
    MAX_BUFFER_BYTES,
    MAX_INT,
    MAX_OWNED_BYTES,
    OP_KINDS,
    ROLES,
    is_ptx_isa,
    ptx_isa_of,
    BundleError,
)

__all__ = ["validate_manifest"]

U32_MAX = 2**32 - 1
MAX_BLOCK_THREADS = 1024

# role -> init forms it may use ("blob" and "input" stand for {"blob": n} and {"input": j})
ALLOWED_INIT = {
    "input": ("none",),
    "output": ("none", "zero", "input"),
    "scratch": ("none", "zero"),
    "constant": ("blob",),
}
# roles the ops may not write (memset buffer, copy dst)
READ_ONLY_ROLES = ("input", "constant")


def validate_manifest(
    manifest: dict, blob_lengths: Sequence[int], blobs: Sequence[bytes | memoryview] | None = None,
    min_reader_version: int | None = None,
) -> dict[int, bytes]:
    """Raises BundleError naming the first field that breaks a rule of section 2.

    Args:
        manifest: the decoded manifest.
        blob_lengths: the length of every blob of the bundle, in table order.
        blobs: the blob bytes when known; enables the content rules (PTX blobs
            end with a NUL byte, compressed binaries decode under section 1.1).
            The writer and reader always pass them.
        min_reader_version: the file header's; a compressed binary needs 2 or more.
            None (the writer, which derives it from the manifest) skips that rule.

    Returns:
        blob index -> decoded bytes of every compressed binary (empty without ``blobs``).
    """
    check = _ManifestCheck(manifest, list(blob_lengths), blobs, min_reader_version)
    check.run()
    return check.decoded


def _describe(value: Any) -> str:
    """A short, typed rendering of a bad value for an error message."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        kind = "object" if isinstance(value, dict) else "array"
        text = repr(value)
        return f"{kind} {text[:60]}{'...' if len(text) > 60 else ''}"
    text = repr(value)
    return f"{text[:60]}{'...' if len(text) > 60 else ''} ({type(value).__name__})"


def _a(word: str) -> str:
    return f"an {word}" if word[0] in "aeiou" else f"a {word}"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


class _ManifestCheck:
    """One validation pass; methods named after the section they check."""

    def __init__(self, manifest: Any, blob_lengths: list[int], blobs: Sequence[bytes | memoryview] | None,
                 min_reader_version: int | None = None):
        self.m = manifest
        self.blob_lengths = blob_lengths
        self.blobs = blobs
        self.min_reader_version = min_reader_version
        self.decoded: dict[int, bytes] = {}  # blob -> decoded bytes of a compressed binary

    # --- primitives -------------------------------------------------------------------------------------

    @staticmethod
    def fail(message: str) -> NoReturn:
        raise BundleError(f"bundle manifest: {message}")

    def obj(self, value: Any, path: str) -> dict:
        if not isinstance(value, dict):
            self.fail(f"{path} must be an object, got {_describe(value)}")
        return value

    def arr(self, value: Any, path: str) -> list:
        if not isinstance(value, list):
            self.fail(f"{path} must be an array, got {_describe(value)}")
        return value

    def get(self, obj: dict, key: str, path: str) -> Any:
        if key not in obj:
            self.fail(f"{path}.{key} is missing" if path != "manifest" else f"{key} is missing")
        return obj[key]

    def integer(self, value: Any, path: str, lo: int = 0, hi: int = MAX_INT) -> int:
        if not isinstance(value, int) or isinstance(value, bool):
            self.fail(f"{path} must be an integer, got {_describe(value)}")
        if not lo <= value <= hi:
            shown = value if abs(value) < 10**30 else f"{'-' if value < 0 else ''}<{len(str(abs(value)))}-digit integer>"
            self.fail(f"{path} {shown} is not in [{lo}, {hi}]")
        return value

    def string(self, value: Any, path: str, nonempty: bool = False) -> str:
        if not isinstance(value, str):
            self.fail(f"{path} must be a string, got {_describe(value)}")
        if nonempty and not value:
            self.fail(f"{path} must not be empty")
        return value

    def index(self, value: Any, path: str, count: int, table: str) -> int:
        self.integer(value, path)
        if value >= count:
            self.fail(f"{path} {value} is out of range: {table} has {count} {'entry' if count == 1 else 'entries'}")
        return value

    def blob(self, value: Any, path: str) -> int:
        count = len(self.blob_lengths)
        self.integer(value, path)
        if value >= count:
            self.fail(f"{path} {value} is out of range: the bundle has {_plural(count, 'blob')}")
        return value

    def field(self, obj: dict, key: str, path: str, kind: str, **kw: Any) -> Any:
        """obj[key] checked as ``kind`` (int, str, obj, arr); the error path is ``path.key``."""
        value = self.get(obj, key, path)
        sub = f"{path}.{key}" if path != "manifest" else key
        if kind == "int":
            return self.integer(value, sub, **kw)
        if kind == "str":
            return self.string(value, sub, **kw)
        if kind == "obj":
            return self.obj(value, sub)
        return self.arr(value, sub)

    # --- sections ---------------------------------------------------------------------------------------

    def run(self) -> None:
        m = self.obj(self.m, "the manifest")
        fmt = self.get(m, "format", "manifest")
        if fmt != FORMAT_NAME:
            self.fail(f'format must be "{FORMAT_NAME}", got {_describe(fmt)}')
        self.field(m, "segment", "manifest", "str")
        self.field(m, "source", "manifest", "str")
        producer = self.field(m, "producer", "manifest", "obj")
        for key, value in producer.items():
            self.string(value, f"producer.{key}")
        self.modules = self.field(m, "modules", "manifest", "arr")
        self.kernels = self.field(m, "kernels", "manifest", "arr")
        self.buffers = self.field(m, "buffers", "manifest", "arr")
        self.ops = self.field(m, "ops", "manifest", "arr")
        self.signature = self.field(m, "signature", "manifest", "obj")
        self.sig_inputs = self.field(self.signature, "inputs", "signature", "arr")
        self.sig_outputs = self.field(self.signature, "outputs", "signature", "arr")

        for i, module in enumerate(self.modules):
            self.check_module(module, f"modules[{i}]")
        for k, kernel in enumerate(self.kernels):
            self.check_kernel(kernel, f"kernels[{k}]")
        for i, buffer in enumerate(self.buffers):
            self.check_buffer(buffer, i)
        self.check_owned_bytes()
        self.check_signature_side(self.sig_inputs, "inputs", "input")
        self.check_signature_side(self.sig_outputs, "outputs", "output")
        for i, buffer in enumerate(self.buffers):
            self.check_io(buffer, i)
        for i, buffer in enumerate(self.buffers):
            self.check_init(buffer, i)
        for i, op in enumerate(self.ops):
            self.check_op(op, f"ops[{i}]")

    def check_module(self, module: Any, path: str) -> None:
        module = self.obj(module, path)
        self.field(module, "name", path, "str")
        binaries = self.field(module, "binaries", path, "arr")
        if not binaries:
            self.fail(f"{path}.binaries is empty: a module has at least one binary")
        seen: dict[tuple[str, int], int] = {}
        for b, binary in enumerate(binaries):
            bpath = f"{path}.binaries[{b}]"
            binary = self.obj(binary, bpath)
            kind = self.get(binary, "kind", bpath)
            if kind not in BINARY_KINDS:
                self.fail(f'{bpath}.kind must be "ptx" or "cubin", got {_describe(kind)}')
            arch = self.field(binary, "arch", bpath, "int", lo=10)
            if (kind, arch) in seen:
                self.fail(f"{bpath} is a second {kind} for arch {arch} (first: binaries[{seen[kind, arch]}])")
            seen[kind, arch] = b
            blob = self.blob(self.get(binary, "blob", bpath), f"{bpath}.blob")
            image = self.check_encoding(binary, blob, bpath)  # the binary's bytes (None without blobs)
            if kind == "ptx":
                self.check_ptx_blob(blob, bpath, image)
            if "ptx_isa" in binary:
                self.check_ptx_isa(binary, kind, image, bpath)

    def check_encoding(self, binary: dict, blob: int, path: str) -> bytes | memoryview | None:
        """Section 1.1: the optional ``encoding`` and its ``decoded_bytes``; returns the binary's bytes."""
        image = self.blobs[blob] if self.blobs is not None else None
        if "encoding" not in binary:
            if "decoded_bytes" in binary:
                self.fail(f"{path}.decoded_bytes is given without an encoding")
            return image
        encoding = self.field(binary, "encoding", path, "str")
        if encoding not in ENCODINGS:
            self.fail(f"{path}.encoding {_describe(encoding)} is not {' or '.join(map(repr, ENCODINGS))}")
        if self.min_reader_version is not None and self.min_reader_version < ENCODING_MIN_READER:
            self.fail(f"{path}.encoding is used by a file whose min_reader_version is {self.min_reader_version} "
                      f"(a compressed binary needs {ENCODING_MIN_READER}: older readers would take the block for "
                      "the binary)")
        size = self.field(binary, "decoded_bytes", path, "int", hi=MAX_BUFFER_BYTES)
        if image is None:
            return None
        if blob not in self.decoded:
            try:
                self.decoded[blob] = lz4_block.decode_block(bytes(image), size)
            except lz4_block.BlockError as e:
                self.fail(f"{path}.blob {blob} ({len(image)} bytes, decoded_bytes {size}): LZ4 block: {e}")
        elif len(self.decoded[blob]) != size:  # one block, two declared sizes: decode again to report it
            try:
                lz4_block.decode_block(bytes(image), size)
            except lz4_block.BlockError as e:
                self.fail(f"{path}.blob {blob} ({len(image)} bytes, decoded_bytes {size}): LZ4 block: {e}")
        return self.decoded[blob]

    def check_ptx_isa(self, binary: dict, kind: str, image: bytes | memoryview | None, path: str) -> None:
        """The optional ``ptx_isa``: a PTX binary's ISA, equal to its text's ``.version`` (both readers check it)."""
        isa = self.field(binary, "ptx_isa", path, "str")
        if kind != "ptx":
            self.fail(f"{path}.ptx_isa is given for a cubin (only PTX has an ISA version)")
        if not is_ptx_isa(isa):
            self.fail(f'{path}.ptx_isa {_describe(isa)} is not a PTX ISA version such as "9.0"')
        if image is not None:
            own = ptx_isa_of(image)
            if own != isa:
                self.fail(f"{path}.ptx_isa {isa!r} differs from the PTX text's .version "
                          f"{own or '(none in its first 4096 bytes)'}")

    def check_ptx_blob(self, blob: int, path: str, image: bytes | memoryview | None) -> None:
        if (len(image) if image is not None else self.blob_lengths[blob]) == 0:
            self.fail(f"{path}: PTX blob {blob} is empty (PTX blobs end with a NUL byte)")
        if image is not None and image[-1] != 0:
            self.fail(f"{path}: PTX blob {blob} does not end with a NUL byte")

    def check_kernel(self, kernel: Any, path: str) -> None:
        kernel = self.obj(kernel, path)
        self.index(self.get(kernel, "module", path), f"{path}.module", len(self.modules), "modules")
        self.field(kernel, "entry", path, "str", nonempty=True)
        if "key" in kernel:
            self.string(kernel["key"], f"{path}.key")
        self.field(kernel, "block_dim", path, "int", lo=1, hi=MAX_BLOCK_THREADS)
        self.field(kernel, "smem_bytes", path, "int", hi=U32_MAX)

    def check_buffer(self, buffer: Any, i: int) -> None:
        path = f"buffers[{i}]"
        buffer = self.obj(buffer, path)
        buffer_id = self.field(buffer, "id", path, "int")
        if buffer_id != i:
            self.fail(f"{path}.id must be {i} (its position), got {buffer_id}")
        self.field(buffer, "bytes", path, "int", lo=1, hi=MAX_BUFFER_BYTES)
        role = self.get(buffer, "role", path)
        if role not in ROLES:
            self.fail(f"{path}.role must be one of {', '.join(ROLES)}, got {_describe(role)}")
        if role in ("input", "output"):
            side = self.sig_inputs if role == "input" else self.sig_outputs
            self.index(self.get(buffer, "io", path), f"{path}.io", len(side), f"signature.{role}s")
        self.init_kind(buffer, path)  # the form only; references are checked once the signature is known

    def init_kind(self, buffer: dict, path: str) -> str:
        init = self.get(buffer, "init", path)
        if init in ("none", "zero"):
            kind = init
        elif isinstance(init, dict) and ("blob" in init) != ("input" in init):
            kind = "blob" if "blob" in init else "input"
        else:
            self.fail(f'{path}.init must be "none", "zero", {{"blob": n}} or {{"input": j}}, got {_describe(init)}')
        role = buffer["role"]
        if kind not in ALLOWED_INIT[role]:
            allowed = " or ".join(f'"{k}"' if k in ("none", "zero") else f'{{"{k}": ...}}' for k in ALLOWED_INIT[role])
            self.fail(f"{path}.init of {_a(role)} buffer must be {allowed}, got {_describe(init)}")
        return kind

    def check_owned_bytes(self) -> None:
        """What the runtime allocates and holds per device (scratch also per stream) stays within MAX_OWNED_BYTES."""
        owned = sum(b["bytes"] for b in self.buffers if b["role"] in ("scratch", "constant"))
        if owned > MAX_OWNED_BYTES:
            self.fail(f"buffers hold {owned} bytes of scratch and constant memory, more than {MAX_OWNED_BYTES} (2^40)")

    def check_io(self, buffer: dict, i: int) -> None:
        """An input/output buffer is the one its signature entry names (entries -> buffers is checked per entry)."""
        role = buffer["role"]
        if role in ("input", "output"):
            side = f"signature.{role}s"
            owner = (self.sig_inputs if role == "input" else self.sig_outputs)[buffer["io"]]["buffer"]
            if owner != i:
                self.fail(f"buffers[{i}].io {buffer['io']} points to {side}[{buffer['io']}], whose buffer is {owner}")

    def check_init(self, buffer: dict, i: int) -> None:
        path = f"buffers[{i}]"
        kind = self.init_kind(buffer, path)
        if kind == "blob":
            blob = self.blob(buffer["init"]["blob"], f"{path}.init.blob")
            if self.blob_lengths[blob] != buffer["bytes"]:
                self.fail(
                    f"{path}.init.blob {blob} has {self.blob_lengths[blob]} bytes, the buffer has {buffer['bytes']}"
                )
        elif kind == "input":
            j = self.index(buffer["init"]["input"], f"{path}.init.input", len(self.sig_inputs), "signature.inputs")
            source = self.buffers[self.sig_inputs[j]["buffer"]]
            if source["bytes"] != buffer["bytes"]:
                self.fail(
                    f"{path}.init.input {j} has {source['bytes']} bytes "
                    f"(buffers[{self.sig_inputs[j]['buffer']}]), the buffer has {buffer['bytes']}"
                )

    def check_signature_side(self, entries: list, side: str, role: str) -> None:
        names: dict[str, int] = {}
        for j, entry in enumerate(entries):
            path = f"signature.{side}[{j}]"
            entry = self.obj(entry, path)
            name = self.field(entry, "name", path, "str", nonempty=True)
            if name in names:
                self.fail(f'{path}.name "{name}" is already used by signature.{side}[{names[name]}]')
            names[name] = j
            b = self.index(self.get(entry, "buffer", path), f"{path}.buffer", len(self.buffers), "buffers")
            buffer = self.buffers[b]
            if buffer["role"] != role:
                self.fail(f"{path}.buffer {b} has role {buffer['role']}, expected {role}")
            if buffer["io"] != j:
                self.fail(f"{path}.buffer {b} has io {buffer['io']}, expected {j}")
            dtype = self.get(entry, "dtype", path)
            if not isinstance(dtype, str) or dtype not in DTYPE_ITEMSIZE:
                self.fail(f"{path}.dtype must be one of {', '.join(DTYPE_ITEMSIZE)}, got {_describe(dtype)}")
            shape = self.field(entry, "shape", path, "arr")
            for d, dim in enumerate(shape):
                self.integer(dim, f"{path}.shape[{d}]")
            nbytes = math.prod(shape) * DTYPE_ITEMSIZE[dtype]
            if nbytes != buffer["bytes"]:
                self.fail(
                    f"{path} is {dtype} {list(shape)} = {nbytes} bytes, but buffers[{b}].bytes = {buffer['bytes']}"
                )
            if "warp_dtype" in entry:
                self.string(entry["warp_dtype"], f"{path}.warp_dtype")
            if "logical_shape" in entry:
                logical = self.arr(entry["logical_shape"], f"{path}.logical_shape")
                for d, dim in enumerate(logical):
                    self.integer(dim, f"{path}.logical_shape[{d}]")

    def check_op(self, op: Any, path: str) -> None:
        op = self.obj(op, path)
        kind = self.get(op, "op", path)
        if kind not in OP_KINDS:
            self.fail(f"{path}.op must be one of {', '.join(OP_KINDS)}, got {_describe(kind)}")
        getattr(self, f"check_{kind}")(op, path)

    def buffer_ref(self, op: dict, key: str, path: str, writes: bool = False) -> dict:
        b = self.index(self.get(op, key, path), f"{path}.{key}", len(self.buffers), "buffers")
        buffer = self.buffers[b]
        if writes and buffer["role"] in READ_ONLY_ROLES:
            self.fail(f"{path}.{key} {b} is {_a(buffer['role'])} buffer, which the ops never write")
        return buffer

    def dims3(self, op: dict, key: str, path: str) -> list[int]:
        dims = self.field(op, key, path, "arr")
        if len(dims) != 3:
            self.fail(f"{path}.{key} must have 3 entries, got {len(dims)}")
        return [self.integer(v, f"{path}.{key}[{d}]", lo=1, hi=U32_MAX) for d, v in enumerate(dims)]

    def check_launch(self, op: dict, path: str) -> None:
        k = self.index(self.get(op, "kernel", path), f"{path}.kernel", len(self.kernels), "kernels")
        self.dims3(op, "grid", path)
        block = self.dims3(op, "block", path)
        if math.prod(block) > MAX_BLOCK_THREADS:
            self.fail(f"{path}.block {block} has {math.prod(block)} threads, more than {MAX_BLOCK_THREADS}")
        block_dim = self.kernels[k]["block_dim"]
        if block[0] != block_dim:
            self.fail(f"{path}.block[0] {block[0]} differs from kernels[{k}].block_dim {block_dim}")
        self.field(op, "smem", path, "int", hi=U32_MAX)

        params = self.field(op, "params", path, "obj")
        ppath = f"{path}.params"
        blob = self.blob(self.get(params, "blob", ppath), f"{ppath}.blob")
        offsets = self.field(params, "offsets", ppath, "arr")
        sizes = self.field(params, "sizes", ppath, "arr")
        if len(offsets) != len(sizes):
            self.fail(f"{ppath} has {len(offsets)} offsets but {len(sizes)} sizes")
        if not sizes:
            self.fail(f"{ppath} is empty: parameter 0 is the launch bounds")
        for i, (offset, size) in enumerate(zip(offsets, sizes)):
            self.integer(offset, f"{ppath}.offsets[{i}]")
            self.integer(size, f"{ppath}.sizes[{i}]", lo=1)
            if offset + size > self.blob_lengths[blob]:
                self.fail(
                    f"{ppath}.offsets[{i}] {offset} + sizes[{i}] {size} exceeds "
                    f"the length of blob {blob} ({self.blob_lengths[blob]} bytes)"
                )

        relocs = self.field(op, "relocs", path, "arr")
        for r, reloc in enumerate(relocs):
            rpath = f"{path}.relocs[{r}]"
            reloc = self.obj(reloc, rpath)
            p = self.index(self.get(reloc, "param", rpath), f"{rpath}.param", len(sizes), f"{ppath}.sizes")
            offset = self.field(reloc, "offset", rpath, "int")
            if offset + 8 > sizes[p]:
                self.fail(f"{rpath}.offset {offset} + 8 exceeds params.sizes[{p}] = {sizes[p]}")
            b = self.index(self.get(reloc, "buffer", rpath), f"{rpath}.buffer", len(self.buffers), "buffers")
            buffer_offset = self.field(reloc, "buffer_offset", rpath, "int")
            if buffer_offset > self.buffers[b]["bytes"]:
                self.fail(
                    f"{rpath}.buffer_offset {buffer_offset} exceeds buffers[{b}].bytes = {self.buffers[b]['bytes']}"
                )

    def byte_range(self, op: dict, buffer: dict, offset_key: str, buffer_key: str, path: str) -> int:
        offset = self.field(op, offset_key, path, "int")
        nbytes = op["bytes"]
        if offset + nbytes > buffer["bytes"]:
            self.fail(
                f"{path}.{offset_key} {offset} + bytes {nbytes} exceeds "
                f"buffers[{op[buffer_key]}].bytes = {buffer['bytes']}"
            )
        return offset

    def check_memset(self, op: dict, path: str) -> None:
        buffer = self.buffer_ref(op, "buffer", path, writes=True)
        self.field(op, "bytes", path, "int", lo=1, hi=MAX_BUFFER_BYTES)
        self.byte_range(op, buffer, "offset", "buffer", path)
        self.field(op, "value", path, "int", hi=255)

    def check_copy(self, op: dict, path: str) -> None:
        dst = self.buffer_ref(op, "dst", path, writes=True)
        src = self.buffer_ref(op, "src", path)
        nbytes = self.field(op, "bytes", path, "int", lo=1, hi=MAX_BUFFER_BYTES)
        dst_offset = self.byte_range(op, dst, "dst_offset", "dst", path)
        src_offset = self.byte_range(op, src, "src_offset", "src", path)
        if op["src"] == op["dst"] and src_offset < dst_offset + nbytes and dst_offset < src_offset + nbytes:
            self.fail(
                f"{path} copies buffers[{op['src']}] [{src_offset}, {src_offset + nbytes}) onto the "
                f"overlapping [{dst_offset}, {dst_offset + nbytes})"
            )
