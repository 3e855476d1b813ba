"""Where the loader-facing fields of a real CPU code object lie, and both readers' verdict on a bundle carrying an
edited copy (the loader-rule tests: test_elf_rules.py, test_elf_rules_hypothesis.py)."""

from __future__ import annotations

import struct

from cpu_observation import rewritten
from leapp.bundle import BundleError, lz4_block, read_bundle
from leapp.bundle import elf


def object_of(data: bytes) -> tuple[str, bytes, list[str]]:
    """The bundle's CPU code (machine, decoded object bytes) and its kernels' CPU entries."""
    bundle = read_bundle(data)
    code = bundle.manifest["cpu_code"][0]
    image = bytes(bundle.blobs[code["blob"]])
    if "encoding" in code:
        image = lz4_block.decode_block(image, code["decoded_bytes"])
    return code["machine"], image, [k["cpu_entry"] for k in bundle.manifest["kernels"]]


def with_object(data: bytes, image: bytes, entry: str | None = None) -> bytes:
    """The bundle with its CPU code replaced by ``image`` (stored raw) and resealed unchecked."""

    def edit(manifest, blobs):
        code = manifest["cpu_code"][0]
        code.pop("encoding", None)
        code.pop("decoded_bytes", None)
        blobs[code["blob"]] = image
        if entry is not None:
            manifest["kernels"][0]["cpu_entry"] = entry

    return rewritten(data, edit)


def verdicts(data: bytes) -> tuple[str, str]:
    """(Python reader, C++ reader): "" for accepted, else the error text after the field path."""
    from leapp import _native

    try:
        read_bundle(data)
        py = ""
    except BundleError as e:
        py = str(e).split("bundle manifest: ", 1)[1]
    try:
        _native.Bundle(data)
        native = ""
    except ValueError as e:
        native = str(e).split("': ", 1)[1]
    return py, native


class Fields:
    """Byte ranges (offset, width) of the fields the loader reads in ``image``, named, from the readers' parse."""

    def __init__(self, image: bytes, machine: str, entries: list[str]):
        check = elf._Check(image, machine, entries)
        check.run()
        self.check = check
        f: dict[str, tuple[int, int]] = {}
        for name, off, width in (("e_ident", 4, 4), ("e_ident_version", 6, 1), ("e_type", 16, 2),
                                 ("e_machine", 18, 2), ("e_phoff", 32, 8), ("e_shoff", 40, 8),
                                 ("e_phentsize", 54, 2), ("e_phnum", 56, 2)):
            f[name] = (off, width)
        phoff = check.u64(32)
        phnum = struct.unpack_from("<H", image, 56)[0]
        for i in range(phnum):
            base = phoff + 56 * i
            for name, off, width in (("type", 0, 4), ("flags", 4, 4), ("offset", 8, 8), ("vaddr", 16, 8),
                                     ("filesz", 32, 8), ("memsz", 40, 8), ("align", 48, 8)):
                f[f"ph{i}.{name}"] = (base + off, width)
        dyn = check.file_part(check.dyn_vaddr, check.dyn_size, "PT_DYNAMIC")
        for j in range(check.dyn_end // 16):
            f[f"dyn{j}.tag"] = (dyn + 16 * j, 8)
            f[f"dyn{j}.value"] = (dyn + 16 * j + 8, 8)
        for s in range(check.count):
            base = check.symtab + 24 * s
            for name, off, width in (("name", 0, 4), ("info", 4, 1), ("shndx", 6, 2), ("value", 8, 8),
                                     ("size", 16, 8)):
                f[f"sym{s}.{name}"] = (base + off, width)
        tags = check.tags
        if 0x6FFFFEF5 in tags:
            gnu = check.file_part(tags[0x6FFFFEF5], 16, "gnu hash")
            nbuckets, _, bloom, _ = struct.unpack_from("<IIII", image, gnu)
            for k, name in enumerate(("nbuckets", "symoffset", "bloom", "shift")):
                f[f"gnu.{name}"] = (gnu + 4 * k, 4)
            for k in range(nbuckets):
                f[f"gnu.bucket{k}"] = (gnu + 16 + 8 * bloom + 4 * k, 4)
            chains = gnu + 16 + 8 * bloom + 4 * nbuckets
            for k in range(max(0, check.count - struct.unpack_from("<I", image, gnu + 4)[0])):
                f[f"gnu.chain{k}"] = (chains + 4 * k, 4)
        if 0x6FFFFFFE in tags:
            vn = check.file_part(tags[0x6FFFFFFE], 16, "verneed")
            for name, off, width in (("version", 0, 2), ("cnt", 2, 2), ("file", 4, 4), ("aux", 8, 4),
                                     ("next", 12, 4)):
                f[f"verneed.{name}"] = (vn + off, width)
            aux = vn + struct.unpack_from("<I", image, vn + 8)[0]
            for name, off, width in (("other", 6, 2), ("name", 8, 4), ("next", 12, 4)):
                f[f"vernaux.{name}"] = (aux + off, width)
        if 0x6FFFFFF0 in tags:
            versym = check.file_part(tags[0x6FFFFFF0], 2 * check.count, "versym")
            for s in range(check.count):
                f[f"versym{s}"] = (versym + 2 * s, 2)
        for label, where, size in (("rela", 7, 8), ("jmprel", 23, 2)):
            if where in tags:
                base = check.file_part(tags[where], tags[size], label)
                for r in range(tags[size] // 24):
                    f[f"{label}{r}.offset"] = (base + 24 * r, 8)
                    f[f"{label}{r}.info"] = (base + 24 * r + 8, 8)
        self.fields = f

    def symbol(self, name: str) -> int:
        (s,) = self.check.defined(name.encode())
        return s

    def dyn_index(self, tag: int) -> int:
        base = self.fields["dyn0.tag"][0]
        for j in range(self.check.dyn_end // 16):
            if self.check.u64(base + 16 * j) == tag:
                return j
        raise KeyError(tag)

    def phdr_index(self, p_type: int) -> int:
        i = 0
        while f"ph{i}.type" in self.fields:
            if self.check.u32(self.fields[f"ph{i}.type"][0]) == p_type:
                return i
            i += 1
        raise KeyError(p_type)


def put(image: bytes, field: tuple[int, int], value: int) -> bytes:
    """``image`` with the field set to ``value`` (little-endian, cut to the field's width)."""
    off, width = field
    out = bytearray(image)
    out[off:off + width] = (value % (1 << (8 * width))).to_bytes(width, "little")
    return bytes(out)
