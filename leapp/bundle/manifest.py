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
from leapp.bundle.elf import cpu_code_problem
from leapp.bundle.format import (
    BINARY_KINDS,
    CPU_MACHINES,
    ENCODING_MIN_READER,
    ENCODINGS,
    DTYPE_ITEMSIZE,
    DYNAMIC_BATCH_VERSION,
    FORMAT_NAME,
    MAX_BATCH,
    MAX_BUFFER_BYTES,
    MAX_CPU_CODE_BYTES,
    MAX_RULE_COEFFICIENT,
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
        self.check_cpu_code(m)
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
        self.check_outputs_written()
        _DynamicCheck(self).run()

    def check_outputs_written(self) -> None:
        """Every output is written by an op (a launch's relocation into it, a memset or a copy onto it) or filled by
        its init: a segment writing none of an output would hand the caller memory nothing wrote."""
        written = set()
        for op in self.ops:
            if op["op"] == "memset":
                written.add(op["buffer"])
            elif op["op"] == "copy":
                written.add(op["dst"])
            written.update(reloc["buffer"] for reloc in op.get("relocs", ()))
        for i, buffer in enumerate(self.buffers):
            if buffer["role"] == "output" and buffer["init"] == "none" and i not in written:
                self.fail(f"buffers[{i}] is signature.outputs[{buffer['io']}], which no op writes and no init fills "
                          "(a call would return memory nothing wrote)")

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

    def check_cpu_code(self, m: dict) -> None:
        """Section "CPU code": the optional ``cpu_code`` (one ELF shared object per machine) and the
        ``cpu_entry`` of every kernel, present exactly when ``cpu_code`` is."""
        entries = [kernel.get("cpu_entry") for kernel in self.kernels]
        if "cpu_code" not in m:
            for k, entry in enumerate(entries):
                if entry is not None:
                    self.fail(f"kernels[{k}].cpu_entry is given, but the manifest has no cpu_code")
            return
        codes = self.field(m, "cpu_code", "manifest", "arr")
        if not codes:
            self.fail("cpu_code is empty: leave it out when there is no CPU code")
        for k, entry in enumerate(entries):  # the object is checked against its entries: they come first
            if entry is None:
                self.fail(f"kernels[{k}].cpu_entry is missing: with cpu_code every kernel names its CPU entry")
            self.string(entry, f"kernels[{k}].cpu_entry", nonempty=True)
            if "\0" in entry:
                self.fail(f"kernels[{k}].cpu_entry contains a NUL byte")
        seen: dict[str, int] = {}
        for c, code in enumerate(codes):
            path = f"cpu_code[{c}]"
            code = self.obj(code, path)
            machine = self.field(code, "machine", path, "str")
            if machine not in CPU_MACHINES:
                self.fail(f"{path}.machine must be one of {', '.join(CPU_MACHINES)}, got {_describe(machine)}")
            if machine in seen:
                self.fail(f"{path} is a second CPU code for {machine} (first: cpu_code[{seen[machine]}])")
            seen[machine] = c
            blob = self.blob(self.get(code, "blob", path), f"{path}.blob")
            if "decoded_bytes" in code:  # bounded before anything is decoded
                self.integer(code["decoded_bytes"], f"{path}.decoded_bytes", hi=MAX_CPU_CODE_BYTES)
            image = self.check_encoding(code, blob, path)  # the shared object's bytes (None without blobs)
            if image is not None:  # before anything maps it: docs/export-cpu.md section 4
                problem = cpu_code_problem(image, machine, entries)
                if problem:
                    self.fail(f"{path}.blob {blob}: {problem}")

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


# ------------------------------------------------------------------------------------------------------------
# Dynamic batch (docs/bundle-format.md, "Dynamic batch"): rules [a, b] = a * batch + b, checked at both ends.

_OP_RULES = {"memset": ("offset_rule", "bytes_rule"), "copy": ("src_offset_rule", "dst_offset_rule", "bytes_rule")}
_LAUNCH_KEYS = ("size_rule", "grid_stride", "max_blocks", "patches")


def grid_for(size: int, block_dim: int, grid_stride: bool, max_blocks: int = 0) -> tuple[int, int, int]:
    """The grid ``wp_cuda_launch_kernel`` (warp.cu) uses for ``size`` threads of ``block_dim`` (docs/export-cuda.md
    section 3): the exporter writes it, both readers check it, the runtime recomputes it for a dynamic batch."""
    total = (size + block_dim - 1) // block_dim
    if grid_stride:
        cap = max_blocks if max_blocks > 0 else 2**31 - 1
        return (max(1, min(total, cap)), 1, 1)
    gx = max(1, min(total, (1 << 24) // block_dim))
    remaining = (total + gx - 1) // gx
    gy = max(1, min(remaining, 65535))
    gz = max(1, min((remaining + gy - 1) // gy, 65535))
    return (gx, gy, gz)


class _DynamicCheck:
    """The optional dynamic-batch fields, after the static rules held (static values are the traced batch's)."""

    def __init__(self, base: _ManifestCheck):
        self.c = base
        self.m = base.m

    def fail(self, message: str) -> NoReturn:
        self.c.fail(message)

    def rule(self, value: Any, path: str) -> tuple[int, int]:
        if not isinstance(value, list) or len(value) != 2:
            self.fail(f"{path} must be an array of two integers [a, b] (a * batch + b), got {_describe(value)}")
        a, b = (self.c.integer(v, f"{path}[{i}]", lo=-MAX_RULE_COEFFICIENT, hi=MAX_RULE_COEFFICIENT)
                for i, v in enumerate(value))
        return a, b

    def at(self, rule: tuple[int, int], batch: int) -> int:
        return rule[0] * batch + rule[1]

    def traced_equal(self, rule: tuple[int, int], static: int, path: str, static_path: str) -> None:
        value = self.at(rule, self.traced)
        if value != static:
            self.fail(f"{path} {list(rule)} gives {value} at batch.traced {self.traced}, but {static_path} is {static}")

    def each_end(self):
        return (("batch.min", self.lo), ("batch.max", self.hi))

    def within(self, rule: tuple[int, int], path: str, lo: int, hi: int) -> None:
        for name, batch in self.each_end():
            v = self.at(rule, batch)
            if not lo <= v <= hi:
                self.fail(f"{path} {list(rule)} gives {v} at {name} {batch}, outside [{lo}, {hi}]")

    def optional_rule(self, obj: dict, key: str, path: str) -> tuple[int, int] | None:
        return self.rule(obj[key], f"{path}.{key}") if key in obj else None

    def rule_keys_present(self) -> str | None:
        for i, b in enumerate(self.c.buffers):
            if "bytes_rule" in b:
                return f"buffers[{i}].bytes_rule"
        for side in ("inputs", "outputs"):
            for j, e in enumerate(self.c.signature[side]):
                if "batch_rule" in e:
                    return f"signature.{side}[{j}].batch_rule"
        for i, op in enumerate(self.c.ops):
            for key in _LAUNCH_KEYS + _OP_RULES.get(op["op"], ()):
                if key in op:
                    return f"ops[{i}].{key}"
            for r, reloc in enumerate(op.get("relocs", [])):
                if "buffer_offset_rule" in reloc:
                    return f"ops[{i}].relocs[{r}].buffer_offset_rule"
        return None

    def run(self) -> None:
        if "batch" not in self.m:
            found = self.rule_keys_present()
            if found:
                self.fail(f"{found} is a dynamic-batch rule, but the manifest has no batch")
            return
        batch = self.c.obj(self.m["batch"], "batch")
        if self.c.min_reader_version is not None and self.c.min_reader_version < DYNAMIC_BATCH_VERSION:
            self.fail(f"batch is used by a file whose min_reader_version is {self.c.min_reader_version} (dynamic-batch "
                      f"rules need {DYNAMIC_BATCH_VERSION}: an older reader would replay the traced batch only)")
        self.lo = self.c.field(batch, "min", "batch", "int", lo=1, hi=MAX_BATCH)
        self.hi = self.c.field(batch, "max", "batch", "int", lo=1, hi=MAX_BATCH)
        self.traced = self.c.field(batch, "traced", "batch", "int", lo=1, hi=MAX_BATCH)
        if not self.lo <= self.traced <= self.hi:
            self.fail(f"batch must have min <= traced <= max, got min {self.lo}, traced {self.traced}, max {self.hi}")
        self.bytes_rules = [self.buffer(b, i) for i, b in enumerate(self.c.buffers)]
        for name, batch_value in self.each_end():
            owned = sum(self.at(r, batch_value) for r, b in zip(self.bytes_rules, self.c.buffers)
                        if b["role"] in ("scratch", "constant"))
            if owned > MAX_OWNED_BYTES:
                self.fail(f"buffers hold {owned} bytes of scratch and constant memory at {name} {batch_value}, "
                          f"more than {MAX_OWNED_BYTES} (2^40)")
        for i, b in enumerate(self.c.buffers):
            if self.c.init_kind(b, f"buffers[{i}]") == "input":
                j = b["init"]["input"]
                src = self.c.sig_inputs[j]["buffer"]
                if self.bytes_rules[src] != self.bytes_rules[i]:
                    self.fail(f"buffers[{i}].init.input {j}: the buffer's size rule {list(self.bytes_rules[i])} "
                              f"differs from buffers[{src}]'s {list(self.bytes_rules[src])}")
        follows = False
        for side in ("inputs", "outputs"):
            for j, entry in enumerate(self.c.signature[side]):
                rule = self.signature_entry(entry, f"signature.{side}[{j}]")
                follows = follows or (side == "inputs" and rule is not None and rule[0] != 0)
        if not follows:
            self.fail("batch is given, but no signature input has a batch_rule [a, b] with a != 0 "
                      "(the runtime reads the batch from one)")
        for i, op in enumerate(self.c.ops):
            path = f"ops[{i}]"
            if op["op"] == "launch":
                self.launch(op, path)
            else:
                self.transfer(op, path)

    def buffer(self, b: dict, i: int) -> tuple[int, int]:
        path = f"buffers[{i}]"
        rule = self.optional_rule(b, "bytes_rule", path)
        if rule is None:
            return (0, b["bytes"])
        if b["role"] == "constant":
            self.fail(f"{path}.bytes_rule is given for a constant buffer (constants never change size)")
        self.traced_equal(rule, b["bytes"], f"{path}.bytes_rule", f"{path}.bytes")
        self.within(rule, f"{path}.bytes_rule", 1, MAX_BUFFER_BYTES)
        return rule

    def signature_entry(self, entry: dict, path: str) -> tuple[int, int] | None:
        rule = self.optional_rule(entry, "batch_rule", path)
        buffer_rule = self.bytes_rules[entry["buffer"]]
        if rule is None:
            if buffer_rule[0] != 0:
                self.fail(f"{path} has no batch_rule, but buffers[{entry['buffer']}] has bytes_rule {list(buffer_rule)}")
            return None
        shape = entry["shape"]
        if not shape:
            self.fail(f"{path}.batch_rule is given for a 0-d tensor (dim 0 follows the batch)")
        self.traced_equal(rule, shape[0], f"{path}.batch_rule", f"{path}.shape[0]")
        self.within(rule, f"{path}.batch_rule", 1, MAX_BUFFER_BYTES)
        row = DTYPE_ITEMSIZE[entry["dtype"]] * math.prod(shape[1:])
        expected = (rule[0] * row, rule[1] * row)
        if buffer_rule != expected:
            self.fail(f"{path}.batch_rule {list(rule)} with rows of {row} bytes needs buffers[{entry['buffer']}]"
                      f".bytes_rule {list(expected)}, got {list(buffer_rule)}")
        return rule

    def launch(self, op: dict, path: str) -> None:
        sizes = op["params"]["sizes"]
        relocs = op["relocs"]
        for r, reloc in enumerate(relocs):
            rpath = f"{path}.relocs[{r}]"
            rule = self.optional_rule(reloc, "buffer_offset_rule", rpath)
            if rule is None:
                continue
            self.traced_equal(rule, reloc["buffer_offset"], f"{rpath}.buffer_offset_rule", f"{rpath}.buffer_offset")
            buffer_rule = self.bytes_rules[reloc["buffer"]]
            for name, batch in self.each_end():
                v, n = self.at(rule, batch), self.at(buffer_rule, batch)
                if not 0 <= v <= n:
                    self.fail(f"{rpath}.buffer_offset_rule {list(rule)} gives {v} at {name} {batch}, outside "
                              f"[0, {n}] (buffers[{reloc['buffer']}] at that batch)")
        present = [k for k in _LAUNCH_KEYS if k in op]
        if not present:
            return
        if len(present) != len(_LAUNCH_KEYS):
            missing = [k for k in _LAUNCH_KEYS if k not in op]
            self.fail(f"{path} has {', '.join(present)} but not {', '.join(missing)} (they go together)")
        size_rule = self.rule(op["size_rule"], f"{path}.size_rule")
        self.within(size_rule, f"{path}.size_rule", 0, MAX_INT)
        grid_stride = op["grid_stride"]
        if not isinstance(grid_stride, bool):
            self.fail(f"{path}.grid_stride must be true or false, got {_describe(grid_stride)}")
        max_blocks = self.c.field(op, "max_blocks", path, "int", hi=U32_MAX)
        traced_grid = grid_for(self.at(size_rule, self.traced), op["block"][0], grid_stride, max_blocks)
        if list(traced_grid) != op["grid"]:
            self.fail(f"{path}.grid {op['grid']} is not the grid {list(traced_grid)} of size_rule {list(size_rule)} at "
                      f"batch.traced {self.traced}")
        patches = self.c.arr(op["patches"], f"{path}.patches")
        taken: set[tuple[int, int]] = {(rel["param"], rel["offset"] + i) for rel in relocs for i in range(8)}
        blob = self.c.blobs[op["params"]["blob"]] if self.c.blobs is not None else None
        for q, patch in enumerate(patches):
            ppath = f"{path}.patches[{q}]"
            patch = self.c.obj(patch, ppath)
            p = self.c.index(self.c.get(patch, "param", ppath), f"{ppath}.param", len(sizes), f"{path}.params.sizes")
            offset = self.c.field(patch, "offset", ppath, "int")
            width = self.c.field(patch, "width", ppath, "int")
            if width not in (4, 8):
                self.fail(f"{ppath}.width must be 4 or 8, got {width}")
            if offset + width > sizes[p]:
                self.fail(f"{ppath}.offset {offset} + width {width} exceeds params.sizes[{p}] = {sizes[p]}")
            for i in range(width):
                if (p, offset + i) in taken:
                    self.fail(f"{ppath} overlaps a relocation or an earlier patch of parameter {p} at byte {offset + i}")
                taken.add((p, offset + i))
            rule = self.rule(self.c.get(patch, "rule", ppath), f"{ppath}.rule")
            self.within(rule, f"{ppath}.rule", 0, U32_MAX if width == 4 else MAX_INT)
            if blob is not None:
                start = op["params"]["offsets"][p] + offset
                static = int.from_bytes(bytes(blob[start:start + width]), "little")
                self.traced_equal(rule, static, f"{ppath}.rule", f"the {width} bytes it patches")

    def transfer(self, op: dict, path: str) -> None:
        rules = {}
        for key in _OP_RULES[op["op"]]:
            static_key = key.removesuffix("_rule")
            rule = self.optional_rule(op, key, path)
            if rule is not None:
                self.traced_equal(rule, op[static_key], f"{path}.{key}", f"{path}.{static_key}")
            rules[static_key] = rule or (0, op[static_key])
        self.within(rules["bytes"], f"{path}.bytes_rule" if "bytes_rule" in op else f"{path}.bytes", 1,
                    MAX_BUFFER_BYTES)
        ranges = [("offset", "buffer")] if op["op"] == "memset" else [("src_offset", "src"), ("dst_offset", "dst")]
        for name, batch in self.each_end():
            n = self.at(rules["bytes"], batch)
            spans = []
            for offset_key, buffer_key in ranges:
                off = self.at(rules[offset_key], batch)
                size = self.at(self.bytes_rules[op[buffer_key]], batch)
                if off < 0 or off + n > size:
                    self.fail(f"{path}.{offset_key} {off} + bytes {n} at {name} {batch} exceeds "
                              f"buffers[{op[buffer_key]}] of {size} bytes at that batch")
                spans.append(off)
            if op["op"] == "copy" and op["src"] == op["dst"] and spans[0] < spans[1] + n and spans[1] < spans[0] + n:
                self.fail(f"{path} copies overlapping ranges of buffers[{op['src']}] at {name} {batch}")
