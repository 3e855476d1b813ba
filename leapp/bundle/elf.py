"""leapp/bundle/elf.py: the rules a CPU code object meets before anything maps it (docs/export-cpu.md section 4).

The runtime dlopens a bundle's CPU code (docs/bundle-format.md, "CPU code"); glibc's loader trusts every table
it reads and runs constructors, IFUNC resolvers and other libraries' code inside dlopen, before leapp could
check anything. So both readers parse the object's program headers, dynamic section, hash tables, symbols,
versions and relocations from the file bytes here, at parse time, and refuse what could run code at load, load
a library no digest covers, or make the loader read outside the object.

NOTE: ext/core/src/elf_check.cpp applies the same rules in the same order with the same words (a differential
test compares them); a change here is a change there. Pure Python: readable where torch is not installed.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

from leapp.bundle.format import CPU_MACHINES, MAX_CPU_CODE_BYTES, elf_problem

__all__ = ["cpu_code_problem", "MAX_LOAD_SPAN", "ALLOWED_NEEDED"]

MAX_LOAD_SPAN = 256 * 1024 * 1024  # the address span of an object's PT_LOAD segments
MAX_ADDRESS = 2**48  # every p_vaddr + p_memsz and table address: no sum overflows a u64
MIN_ALIGN = 4096  # a PT_LOAD's p_align: at least the smallest page
MAX_PHNUM = 64
MAX_VERSIONS = 256  # DT_VERNEEDNUM, DT_VERDEFNUM, and each entry's count of names
MAX_FIELDS = 4096  # a layout table's field count
MAX_SYMBOLS = 65536  # symbols, hash buckets, the bloom filter's words, relocations: leapp's objects have dozens
MAX_DYNAMIC = 4096  # dynamic entries before DT_NULL, notes in a segment
MAX_NAME = 4096  # bytes of a name in the string table: the readers scan each name once
ALLOWED_NEEDED = ("libc.so.6", "libm.so.6")  # the C runtime's own libraries, by bare soname

PT_NAMES = {0: "PT_NULL", 1: "PT_LOAD", 2: "PT_DYNAMIC", 3: "PT_INTERP", 4: "PT_NOTE", 6: "PT_PHDR", 7: "PT_TLS",
            0x6474E550: "PT_GNU_EH_FRAME", 0x6474E551: "PT_GNU_STACK", 0x6474E552: "PT_GNU_RELRO",
            0x6474E553: "PT_GNU_PROPERTY"}
PT_ALLOWED = (0, 1, 2, 4, 6, 0x6474E550, 0x6474E551, 0x6474E552, 0x6474E553)
PT_REFUSED = {3: "a program interpreter", 7: "thread-local storage"}
PT_IN_FILE_PART = (2, 4, 6, 0x6474E550, 0x6474E553)  # the loader reads these at their p_vaddr
PF_X, PF_W, PF_R = 1, 2, 4

DT_NAMES = {0: "DT_NULL", 1: "DT_NEEDED", 2: "DT_PLTRELSZ", 3: "DT_PLTGOT", 4: "DT_HASH", 5: "DT_STRTAB",
            6: "DT_SYMTAB", 7: "DT_RELA", 8: "DT_RELASZ", 9: "DT_RELAENT", 10: "DT_STRSZ", 11: "DT_SYMENT",
            14: "DT_SONAME", 16: "DT_SYMBOLIC", 20: "DT_PLTREL", 21: "DT_DEBUG", 23: "DT_JMPREL", 24: "DT_BIND_NOW",
            30: "DT_FLAGS", 0x6FFFFEF5: "DT_GNU_HASH", 0x6FFFFFF0: "DT_VERSYM", 0x6FFFFFF9: "DT_RELACOUNT",
            0x6FFFFFFB: "DT_FLAGS_1", 0x6FFFFFFC: "DT_VERDEF", 0x6FFFFFFD: "DT_VERDEFNUM",
            0x6FFFFFFE: "DT_VERNEED", 0x6FFFFFFF: "DT_VERNEEDNUM"}
DT_REFUSED = {12: ("DT_INIT", "code run at load"), 13: ("DT_FINI", "code run at unload"),
              15: ("DT_RPATH", "a library search path"), 17: ("DT_REL", "REL relocations: this machine uses RELA"),
              18: ("DT_RELSZ", "REL relocations: this machine uses RELA"),
              19: ("DT_RELENT", "REL relocations: this machine uses RELA"),
              22: ("DT_TEXTREL", "relocations of read-only code"), 25: ("DT_INIT_ARRAY", "code run at load"),
              26: ("DT_FINI_ARRAY", "code run at unload"), 27: ("DT_INIT_ARRAYSZ", "code run at load"),
              28: ("DT_FINI_ARRAYSZ", "code run at unload"), 29: ("DT_RUNPATH", "a library search path"),
              32: ("DT_PREINIT_ARRAY", "code run at load"), 33: ("DT_PREINIT_ARRAYSZ", "code run at load"),
              35: ("DT_RELRSZ", "packed relocations, which leapp does not emit"),
              36: ("DT_RELR", "packed relocations, which leapp does not emit"),
              37: ("DT_RELRENT", "packed relocations, which leapp does not emit"),
              0x6FFFFEFB: ("DT_DEPAUDIT", "an audit library"), 0x6FFFFEFC: ("DT_AUDIT", "an audit library"),
              0x7FFFFFFD: ("DT_AUXILIARY", "a filter library"), 0x7FFFFFFF: ("DT_FILTER", "a filter library")}
DF_TEXTREL, DF_STATIC_TLS, DF_ALLOWED = 0x4, 0x10, 0x2 | 0x8  # DF_SYMBOLIC, DF_BIND_NOW
DF_1_ALLOWED = 0x1 | 0x8  # DF_1_NOW, DF_1_NODELETE
DT_RELA_TAG = 7

# machine -> (allowed relocation types, IRELATIVE, TLS relocation types), by name
RELOCATIONS = {
    "x86_64": ({0: "R_X86_64_NONE", 1: "R_X86_64_64", 6: "R_X86_64_GLOB_DAT", 7: "R_X86_64_JUMP_SLOT",
                8: "R_X86_64_RELATIVE"}, (37, "R_X86_64_IRELATIVE"),
               {16: "R_X86_64_DTPMOD64", 17: "R_X86_64_DTPOFF64", 18: "R_X86_64_TPOFF64", 19: "R_X86_64_TLSGD",
                20: "R_X86_64_TLSLD", 21: "R_X86_64_DTPOFF32", 22: "R_X86_64_GOTTPOFF", 23: "R_X86_64_TPOFF32",
                36: "R_X86_64_TLSDESC"}),
    "aarch64": ({0: "R_AARCH64_NONE", 257: "R_AARCH64_ABS64", 1025: "R_AARCH64_GLOB_DAT",
                 1026: "R_AARCH64_JUMP_SLOT", 1027: "R_AARCH64_RELATIVE"}, (1032, "R_AARCH64_IRELATIVE"),
                {1028: "R_AARCH64_TLS_DTPMOD", 1029: "R_AARCH64_TLS_DTPREL", 1030: "R_AARCH64_TLS_TPREL",
                 1031: "R_AARCH64_TLSDESC"}),
}
RELATIVE = {"x86_64": 8, "aarch64": 1027}
STT_OBJECT, STT_FUNC, STT_TLS, STT_GNU_IFUNC = 1, 2, 6, 10
SHN_LORESERVE = 0xFF00

_PHDR = struct.Struct("<IIQQQQQQ")
_DYN = struct.Struct("<QQ")
_SYM = struct.Struct("<IBBHQQ")
_RELA = struct.Struct("<QQQ")
_VERNEED = struct.Struct("<HHIII")
_VERNAUX = struct.Struct("<IHHII")
_VERDEF = struct.Struct("<HHHHIII")
_VERDAUX = struct.Struct("<II")


class _Refused(Exception):
    """The first rule the object breaks; its text is the reason."""


def shown(name: bytes) -> str:
    """A name from the object or the manifest for a message: at most 60 bytes, anything but printable ASCII
    (and a backslash or a quote) as \\xNN."""
    text = "".join(chr(c) if 0x20 <= c < 0x7F and c not in (0x5C, 0x27) else f"\\x{c:02x}" for c in name[:60])
    return text + ("..." if len(name) > 60 else "")


def cpu_code_problem(image: bytes, machine: str, entries: Iterable[str]) -> str:
    """Why the CPU code object ``image`` for ``machine`` may not be loaded for these CPU entries ("" when it
    may); both readers apply the same rules, in the same order, with the same words."""
    try:
        _Check(bytes(image), machine, list(entries)).run()
    except _Refused as e:
        return str(e)
    return ""


def _fail(message: str):
    raise _Refused(message)


class _Load:
    __slots__ = ("index", "flags", "offset", "vaddr", "filesz", "memsz", "align")

    def __init__(self, index, flags, offset, vaddr, filesz, memsz, align):
        self.index, self.flags, self.offset, self.vaddr = index, flags, offset, vaddr
        self.filesz, self.memsz, self.align = filesz, memsz, align


class _Check:
    """One pass over one object: header, program headers, dynamic section, tables, symbols, entries, relocations."""

    def __init__(self, data: bytes, machine: str, entries: list[str]):
        self.d, self.machine, self.entries = data, machine, entries
        self.loads: list[_Load] = []

    # --- addressing: the loader reads every table at its address, so the checker does too -------------------

    def file_part(self, vaddr: int, n: int, what: str, writable: bool | None = None, executable: bool | None = None,
                  kind: str = "a PT_LOAD") -> int:
        """The file offset of [vaddr, vaddr + n), which must lie in the file part of one PT_LOAD (of the kind asked)."""
        for load in self.loads:
            if load.vaddr <= vaddr and n <= load.filesz and vaddr - load.vaddr <= load.filesz - n:
                if (writable is None or bool(load.flags & PF_W) == writable) and \
                        (executable is None or bool(load.flags & PF_X) == executable):
                    return load.offset + vaddr - load.vaddr
                break
        _fail(f"{what} [0x{vaddr:x}, +{n}) does not lie inside the file part of {kind}")

    def in_memory(self, vaddr: int, n: int) -> _Load | None:
        for load in self.loads:
            if load.vaddr <= vaddr and n <= load.memsz and vaddr - load.vaddr <= load.memsz - n:
                return load
        return None

    def table(self, vaddr: int, n: int, what: str) -> int:
        """A table the loader reads: in a non-writable PT_LOAD's file part, where no relocation can change it."""
        if vaddr >= MAX_ADDRESS or n >= MAX_ADDRESS:
            _fail(f"{what} [0x{vaddr:x}, +{n}) does not lie inside the file part of a non-writable PT_LOAD")
        return self.file_part(vaddr, n, what, writable=False, kind="a non-writable PT_LOAD")

    def u32(self, off: int) -> int:
        return int.from_bytes(self.d[off:off + 4], "little")

    def u64(self, off: int) -> int:
        return int.from_bytes(self.d[off:off + 8], "little")

    def string(self, off: int, what: str) -> bytes:
        if off >= self.strsz:
            _fail(f"{what}: name offset {off} lies outside the {self.strsz}-byte string table")
        start = self.strtab + off
        end = self.d.find(b"\0", start, start + min(MAX_NAME + 1, self.strsz - off))
        if end < 0:
            _fail(f"{what}: the name at offset {off} is longer than {MAX_NAME} bytes")
        return self.d[start:end]

    # --- the rules --------------------------------------------------------------------------------------------

    def run(self) -> None:
        size = len(self.d)
        if size > MAX_CPU_CODE_BYTES:
            _fail(f"the object has {size} bytes, more than {MAX_CPU_CODE_BYTES} (64 MiB)")
        problem = elf_problem(self.d[:64], self.machine)
        if problem:
            _fail(problem)
        if self.d[6] != 1:
            _fail(f"ELF EI_VERSION {self.d[6]} is not 1")
        phoff = self.u64(32)
        phentsize, phnum = struct.unpack_from("<HH", self.d, 54)
        if phentsize != 56:
            _fail(f"ELF e_phentsize {phentsize} is not 56")
        if not 1 <= phnum <= MAX_PHNUM:
            _fail(f"ELF e_phnum {phnum} is not in [1, {MAX_PHNUM}]")
        if phoff > size or phnum * 56 > size - phoff:
            _fail(f"the program header table [{phoff}, +{phnum * 56}) lies outside the {size}-byte file")
        self.program_headers([_PHDR.unpack_from(self.d, phoff + 56 * i) for i in range(phnum)], phoff)
        self.dynamic_section()
        self.strings()
        self.symbols_and_hashes()
        self.versions()
        self.entry_points()
        self.relocations()

    def program_headers(self, headers: list[tuple], phoff: int) -> None:
        size = len(self.d)
        dynamic = stack = -1
        for i, (p_type, flags, offset, vaddr, _paddr, filesz, memsz, align) in enumerate(headers):
            name = PT_NAMES.get(p_type, f"type 0x{p_type:x}")
            where = f"program header {i} ({name})"
            if p_type in PT_REFUSED:
                _fail(f"program header {i}: {name} ({PT_REFUSED[p_type]}) is not allowed")
            if p_type not in PT_ALLOWED:
                _fail(f"program header {i}: type 0x{p_type:x} is not allowed")
            if p_type == 0:
                continue
            if offset > size or filesz > size - offset:
                _fail(f"{where}: its file range [{offset}, +{filesz}) lies outside the {size}-byte file")
            if vaddr >= MAX_ADDRESS or memsz >= MAX_ADDRESS - vaddr:
                _fail(f"{where}: p_vaddr 0x{vaddr:x} + p_memsz 0x{memsz:x} is not below 2^48")
            if filesz > memsz:
                _fail(f"{where}: p_filesz {filesz} exceeds p_memsz {memsz}")
            if p_type == 0x6474E551:
                if flags & PF_X:
                    _fail(f"{where}: the object asks for an executable stack")
                stack = i
            if p_type == 2:
                if dynamic >= 0:
                    _fail(f"{where}: a second PT_DYNAMIC (first: program header {dynamic})")
                dynamic = i
            if p_type != 1:
                continue
            if align < MIN_ALIGN or align > MAX_LOAD_SPAN or align & (align - 1):
                _fail(f"{where}: p_align {align} is not a power of two in [{MIN_ALIGN}, {MAX_LOAD_SPAN}]")
            if vaddr % align != offset % align:
                _fail(f"{where}: p_vaddr 0x{vaddr:x} and p_offset 0x{offset:x} differ modulo p_align {align}")
            if not flags & PF_R or flags & ~(PF_R | PF_W | PF_X):
                _fail(f"{where}: p_flags 0x{flags:x} is not PF_R, with PF_W or PF_X at most (the loader reads it)")
            if flags & PF_W and flags & PF_X:
                _fail(f"{where}: a segment both writable and executable")
            if self.loads:
                prev = self.loads[-1]
                end = -(-(prev.vaddr + prev.memsz) // prev.align) * prev.align
                if vaddr // align * align < end:
                    _fail(f"{where}: p_vaddr 0x{vaddr:x} is not past the pages of the previous PT_LOAD (which end "
                          f"at 0x{end:x})")
            self.loads.append(_Load(i, flags, offset, vaddr, filesz, memsz, align))
        if not self.loads:
            _fail("no PT_LOAD program header")
        first, last = self.loads[0], self.loads[-1]
        span = -(-(last.vaddr + last.memsz) // last.align) * last.align - first.vaddr // first.align * first.align
        if span > MAX_LOAD_SPAN:
            _fail(f"the PT_LOAD segments span {span} bytes, more than {MAX_LOAD_SPAN} (256 MiB)")
        if dynamic < 0:
            _fail("no PT_DYNAMIC program header")
        if stack < 0:
            _fail("no PT_GNU_STACK program header (the loader would make the stack executable)")
        for i, (p_type, flags, offset, vaddr, _paddr, filesz, memsz, align) in enumerate(headers):
            where = f"program header {i} ({PT_NAMES[p_type]})"
            if p_type in PT_IN_FILE_PART:
                base = self.file_part(vaddr, memsz, where)
                if p_type in (4, 0x6474E553) and align in (4, 8):  # glibc reads the notes of these
                    self.notes(base, memsz, align, where)
                if p_type == 6 and not (base == offset == phoff and filesz == memsz == 56 * len(headers)):
                    _fail(f"{where}: [0x{vaddr:x}, +{memsz}) is not the program header table [{phoff}, "
                          f"+{56 * len(headers)}) itself (the unwinder reads the table there)")
            elif p_type == 0x6474E552:
                load = self.in_memory(vaddr, memsz)
                if load is None or not load.flags & PF_W:
                    _fail(f"{where} [0x{vaddr:x}, +{memsz}) does not lie inside a writable PT_LOAD")
        _, _, _, self.dyn_vaddr, _, self.dyn_size, _, _ = headers[dynamic]

    def notes(self, base: int, size: int, align: int, where: str) -> None:
        """Each note glibc walks (its header starts before the end) ends inside the segment."""
        at = notes = 0
        while at + 12 < size:
            notes += 1
            if notes > MAX_DYNAMIC:
                _fail(f"{where}: more than {MAX_DYNAMIC} notes")
            namesz, descsz = self.u32(base + at), self.u32(base + at + 4)
            end = -(-(at + 12 + namesz) // align) * align + descsz
            if end > size:
                _fail(f"{where}: the note at +{at} ends at +{end}, past its {size} bytes")
            at = -(-end // align) * align

    def dynamic_section(self) -> None:
        base = self.file_part(self.dyn_vaddr, self.dyn_size, "PT_DYNAMIC")
        self.tags: dict[int, int] = {}
        self.needed: list[tuple[int, int]] = []  # (entry, name offset)
        j = 0
        while True:
            if 16 * j + 16 > self.dyn_size:
                _fail(f"dynamic section: no DT_NULL within its {self.dyn_size} bytes")
            if j == MAX_DYNAMIC:
                _fail(f"dynamic section: more than {MAX_DYNAMIC} entries before DT_NULL")
            tag, value = _DYN.unpack_from(self.d, base + 16 * j)
            if tag == 0:
                break
            where = f"dynamic entry {j}"
            if tag in DT_REFUSED:
                name, why = DT_REFUSED[tag]
                _fail(f"{where}: {name} ({why}) is not allowed")
            if tag not in DT_NAMES:
                _fail(f"{where}: tag 0x{tag:x} is not allowed")
            if tag == 1:
                self.needed.append((j, value))
            elif tag in self.tags:
                _fail(f"{where}: a second {DT_NAMES[tag]}")
            else:
                self.tags[tag] = value
            if tag == 30:
                if value & DF_STATIC_TLS:
                    _fail(f"{where}: DT_FLAGS has DF_STATIC_TLS (thread-local storage)")
                if value & DF_TEXTREL:
                    _fail(f"{where}: DT_FLAGS has DF_TEXTREL (relocations of read-only code)")
                if value & ~DF_ALLOWED:
                    _fail(f"{where}: DT_FLAGS has flags 0x{value & ~DF_ALLOWED:x}, which are not allowed")
            if tag == 0x6FFFFFFB and value & ~DF_1_ALLOWED:
                _fail(f"{where}: DT_FLAGS_1 has flags 0x{value & ~DF_1_ALLOWED:x}, which are not allowed")
            j += 1
        self.dyn_end = 16 * j + 16  # the entries the loader reads, DT_NULL included

    def need(self, tag: int) -> int:
        if tag not in self.tags:
            _fail(f"dynamic section: no {DT_NAMES[tag]}")
        return self.tags[tag]

    def strings(self) -> None:
        vaddr, self.strsz = self.need(5), self.need(10)
        self.strtab = self.table(vaddr, self.strsz, "DT_STRTAB")
        if self.strsz == 0 or self.d[self.strtab + self.strsz - 1] != 0:
            _fail("dynamic section: the string table (DT_STRTAB) does not end with a NUL byte")
        self.needed_names = []
        for j, off in self.needed:
            name = self.string(off, f"dynamic entry {j} (DT_NEEDED)")
            if name.decode("latin-1") not in ALLOWED_NEEDED:
                _fail(f"dynamic entry {j}: DT_NEEDED '{shown(name)}' is not one of the C runtime's libraries "
                      f"({', '.join(ALLOWED_NEEDED)})")
            self.needed_names.append(name)
        if 14 in self.tags:
            self.string(self.tags[14], "DT_SONAME")

    def symbols_and_hashes(self) -> None:
        symtab = self.need(6)
        if self.tags.get(11, 24) != 24:
            _fail(f"dynamic section: DT_SYMENT {self.tags[11]} is not 24")
        if 4 not in self.tags and 0x6FFFFEF5 not in self.tags:
            _fail("dynamic section: neither DT_HASH nor DT_GNU_HASH")
        count = 0
        if 0x6FFFFEF5 in self.tags:
            count = self.gnu_hash(self.tags[0x6FFFFEF5])
        if 4 in self.tags:
            count = max(count, self.sysv_hash(self.tags[4]))
        self.count = count
        self.symtab = self.table(symtab, 24 * count, f"DT_SYMTAB ({count} symbols)")
        self.syms = [_SYM.unpack_from(self.d, self.symtab + 24 * s) for s in range(count)]
        self.names = []
        self.by_name: dict[bytes, list[int]] = {}  # name -> the defined symbols of that name
        for s, (st_name, info, _other, shndx, _value, _size) in enumerate(self.syms):
            name = self.string(st_name, f"symbol {s}")
            self.names.append(name)
            if shndx != 0:
                self.by_name.setdefault(name, []).append(s)
            if info & 0xF == STT_GNU_IFUNC:
                _fail(f"symbol {s} '{shown(name)}': STT_GNU_IFUNC (an IFUNC resolver) is not allowed")
            if info & 0xF == STT_TLS:
                _fail(f"symbol {s} '{shown(name)}': STT_TLS (thread-local storage) is not allowed")

    def gnu_hash(self, vaddr: int) -> int:
        head = self.table(vaddr, 16, "DT_GNU_HASH")
        nbuckets, symoffset, bloom, shift = struct.unpack_from("<IIII", self.d, head)
        if not 1 <= nbuckets <= MAX_SYMBOLS:
            _fail(f"DT_GNU_HASH: nbuckets {nbuckets} is not in [1, {MAX_SYMBOLS}]")
        if bloom == 0 or bloom & (bloom - 1) or bloom > MAX_SYMBOLS:
            _fail(f"DT_GNU_HASH: the bloom filter's size {bloom} is not a power of two in [1, {MAX_SYMBOLS}]")
        if symoffset > MAX_SYMBOLS:
            _fail(f"DT_GNU_HASH: symoffset {symoffset} is more than {MAX_SYMBOLS}")
        if shift >= 32:
            _fail(f"DT_GNU_HASH: the bloom shift {shift} is not below 32")
        head = self.table(vaddr, 16 + 8 * bloom + 4 * nbuckets, "DT_GNU_HASH")
        buckets = head + 16 + 8 * bloom
        top, top_bucket = 0, -1
        for k in range(nbuckets):
            b = self.u32(buckets + 4 * k)
            if b != 0 and b < symoffset:
                _fail(f"DT_GNU_HASH: bucket {k} starts at symbol {b}, below symoffset {symoffset}")
            if b > top:
                top, top_bucket = b, k
        if top_bucket < 0:
            return symoffset
        chains = vaddr + 16 + 8 * bloom + 4 * nbuckets
        index = top
        while True:  # every chain ends at the first end bit at or after its start: the highest start reaches furthest
            if index >= MAX_SYMBOLS:
                _fail(f"DT_GNU_HASH: the chain of bucket {top_bucket} runs past {MAX_SYMBOLS} symbols")
            at = chains + 4 * (index - symoffset)
            try:
                word = self.u32(self.table(at, 4, "DT_GNU_HASH chain"))
            except _Refused:
                _fail(f"DT_GNU_HASH: the chain of bucket {top_bucket} runs out of its PT_LOAD")
            if word & 1:
                return max(symoffset, index + 1)
            index += 1

    def sysv_hash(self, vaddr: int) -> int:
        head = self.table(vaddr, 8, "DT_HASH")
        nbucket, nchain = struct.unpack_from("<II", self.d, head)
        if nbucket > MAX_SYMBOLS or nchain > MAX_SYMBOLS:
            _fail(f"DT_HASH: nbucket {nbucket} or nchain {nchain} is more than {MAX_SYMBOLS}")
        head = self.table(vaddr, 8 + 4 * (nbucket + nchain), "DT_HASH")
        chain = head + 8 + 4 * nbucket
        seen = bytearray(nchain)
        for k in range(nbucket):
            index = self.u32(head + 8 + 4 * k)
            while index != 0:
                if index >= nchain:
                    _fail(f"DT_HASH: bucket {k} reaches symbol {index}, past nchain {nchain}")
                if seen[index]:
                    _fail(f"DT_HASH: bucket {k}'s chain meets another chain or loops at symbol {index}")
                seen[index] = 1
                index = self.u32(chain + 4 * index)
        return nchain

    def versions(self) -> None:
        high = 0
        needed = set(self.needed_names)
        if (0x6FFFFFFE in self.tags) != (0x6FFFFFFF in self.tags):
            _fail("dynamic section: DT_VERNEED and DT_VERNEEDNUM go together")
        if (0x6FFFFFFC in self.tags) != (0x6FFFFFFD in self.tags):
            _fail("dynamic section: DT_VERDEF and DT_VERDEFNUM go together")
        if (0x6FFFFFFE in self.tags or 0x6FFFFFFC in self.tags) and 0x6FFFFFF0 not in self.tags:
            _fail("dynamic section: DT_VERNEED or DT_VERDEF without DT_VERSYM (glibc reads it regardless)")
        if 0x6FFFFFFE in self.tags:
            vaddr, num = self.tags[0x6FFFFFFE], self.tags[0x6FFFFFFF]
            if not 1 <= num <= MAX_VERSIONS:
                _fail(f"dynamic section: DT_VERNEEDNUM {num} is not in [1, {MAX_VERSIONS}]")
            for n in range(num):
                where = f"DT_VERNEED entry {n}"
                off = self.table(vaddr, 16, where)
                version, cnt, file, aux, nxt = _VERNEED.unpack_from(self.d, off)
                if version != 1:
                    _fail(f"{where}: vn_version {version} is not 1")
                name = self.string(file, where)
                if name not in needed:
                    _fail(f"{where}: file '{shown(name)}' is not one of the object's DT_NEEDED")
                if not 1 <= cnt <= MAX_VERSIONS:
                    _fail(f"{where}: vn_cnt {cnt} is not in [1, {MAX_VERSIONS}]")
                at = vaddr + aux
                for a in range(cnt):
                    awhere = f"{where} name {a}"
                    aoff = self.table(at, 16, awhere)
                    _hash, _flags, other, aname, anext = _VERNAUX.unpack_from(self.d, aoff)
                    self.string(aname, awhere)
                    high = max(high, other & 0x7FFF)
                    if (anext == 0) != (a == cnt - 1):
                        _fail(f"{where}: its names' links do not match vn_cnt {cnt}")
                    at += anext
                if (nxt == 0) != (n == num - 1):
                    _fail(f"{where}: the entries' links do not match DT_VERNEEDNUM {num}")
                vaddr += nxt
        if 0x6FFFFFFC in self.tags:
            vaddr, num = self.tags[0x6FFFFFFC], self.tags[0x6FFFFFFD]
            if not 1 <= num <= MAX_VERSIONS:
                _fail(f"dynamic section: DT_VERDEFNUM {num} is not in [1, {MAX_VERSIONS}]")
            for n in range(num):
                where = f"DT_VERDEF entry {n}"
                off = self.table(vaddr, 20, where)
                version, _flags, ndx, cnt, _hash, aux, nxt = _VERDEF.unpack_from(self.d, off)
                if version != 1:
                    _fail(f"{where}: vd_version {version} is not 1")
                if not 1 <= cnt <= MAX_VERSIONS:
                    _fail(f"{where}: vd_cnt {cnt} is not in [1, {MAX_VERSIONS}]")
                high = max(high, ndx & 0x7FFF)
                at = vaddr + aux
                for a in range(cnt):
                    awhere = f"{where} name {a}"
                    aoff = self.table(at, 8, awhere)
                    aname, anext = _VERDAUX.unpack_from(self.d, aoff)
                    self.string(aname, awhere)
                    if (anext == 0) != (a == cnt - 1):
                        _fail(f"{where}: its names' links do not match vd_cnt {cnt}")
                    at += anext
                if (nxt == 0) != (n == num - 1):
                    _fail(f"{where}: the entries' links do not match DT_VERDEFNUM {num}")
                vaddr += nxt
        if 0x6FFFFFF0 in self.tags:
            if high == 0:
                _fail("dynamic section: DT_VERSYM without a version (no DT_VERNEED or DT_VERDEF index)")
            off = self.table(self.tags[0x6FFFFFF0], 2 * self.count, f"DT_VERSYM ({self.count} symbols)")
            for s in range(self.count):
                v = int.from_bytes(self.d[off + 2 * s:off + 2 * s + 2], "little") & 0x7FFF
                if v > high:
                    _fail(f"DT_VERSYM entry {s}: version index {v} is not defined (the highest is {high})")

    def defined(self, name: bytes) -> list[int]:
        return self.by_name.get(name, [])

    def entry_points(self) -> None:
        """Each kernel's CPU entry and layout table."""
        seen = set()
        for k, text in enumerate(self.entries):
            entry = text.encode()
            if entry in seen:
                continue
            seen.add(entry)
            where = f"kernels[{k}] CPU entry '{shown(entry)}'"
            found = self.defined(entry)
            if not found:
                _fail(f"{where}: not defined by the CPU code")
            if len(found) > 1:
                _fail(f"{where}: defined twice by the CPU code (symbols {found[0]} and {found[1]})")
            _, info, _, shndx, value, size = self.syms[found[0]]
            if info & 0xF != STT_FUNC:
                _fail(f"{where}: symbol {found[0]} is not a function (type {info & 0xF})")
            if shndx >= SHN_LORESERVE or size == 0:
                _fail(f"{where}: symbol {found[0]} has section index 0x{shndx:x} and size {size}")
            self.file_part(value, size, f"{where}: its code", executable=True, kind="an executable PT_LOAD")
            table = entry + b"_leapp_args"
            twhere = f"{where}: its layout table '{shown(table)}'"
            found = self.defined(table)
            if not found:
                _fail(f"{twhere} is not defined by the CPU code")
            if len(found) > 1:
                _fail(f"{twhere} is defined twice (symbols {found[0]} and {found[1]})")
            _, info, _, shndx, value, size = self.syms[found[0]]
            if info & 0xF != STT_OBJECT or shndx >= SHN_LORESERVE:
                _fail(f"{twhere}: symbol {found[0]} is not a data object (type {info & 0xF}, section index "
                      f"0x{shndx:x})")
            if size < 24:
                _fail(f"{twhere} has {size} bytes, fewer than 24")
            # read-only: no relocation (their targets are writable) can change it after the check
            off = self.file_part(value, size, twhere, writable=False, executable=False,
                                 kind="a read-only, non-executable PT_LOAD")
            fields = self.u64(off)
            if fields > MAX_FIELDS:
                _fail(f"{twhere} declares {fields} arguments, more than {MAX_FIELDS}")
            if size < 8 * (3 + 2 * fields):
                _fail(f"{twhere} has {size} bytes, fewer than the {8 * (3 + 2 * fields)} its {fields} arguments need")

    def relocations(self) -> None:
        """Each relocation's type, symbol and target: a writable PT_LOAD, so never code, a layout table or a table
        the loader reads (all in non-writable ones), and never the dynamic section."""
        allowed, (irelative, irelative_name), tls = RELOCATIONS[self.machine]
        if self.tags.get(9, 24) != 24:
            _fail(f"dynamic section: DT_RELAENT {self.tags[9]} is not 24")
        if (7 in self.tags) != (8 in self.tags):
            _fail("dynamic section: DT_RELA and DT_RELASZ go together")
        if (23 in self.tags) != (2 in self.tags) or (23 in self.tags) != (20 in self.tags):
            _fail("dynamic section: DT_JMPREL, DT_PLTRELSZ and DT_PLTREL go together")
        if 20 in self.tags and self.tags[20] != DT_RELA_TAG:
            _fail(f"dynamic section: DT_PLTREL {self.tags[20]} is not DT_RELA (7)")
        if 3 in self.tags:
            load = self.in_memory(self.tags[3], 24) if self.tags[3] < MAX_ADDRESS else None
            if load is None or not load.flags & PF_W:
                _fail(f"dynamic section: DT_PLTGOT 0x{self.tags[3]:x} does not lie inside a writable PT_LOAD")
        tables = [("DT_RELA", 7, 8), ("DT_JMPREL", 23, 2)]
        relative_count = self.tags.get(0x6FFFFFF9, 0)
        if relative_count and 7 not in self.tags:
            _fail("dynamic section: DT_RELACOUNT without DT_RELA")
        for name, where_tag, size_tag in tables:
            if where_tag not in self.tags:
                continue
            size = self.tags[size_tag]
            if size % 24:
                _fail(f"dynamic section: {DT_NAMES[size_tag]} {size} is not a multiple of 24")
            if size // 24 > MAX_SYMBOLS:
                _fail(f"dynamic section: {DT_NAMES[size_tag]} {size} holds more than {MAX_SYMBOLS} relocations")
            base = self.table(self.tags[where_tag], size, name)
            if name == "DT_RELA" and relative_count > size // 24:
                _fail(f"dynamic section: DT_RELACOUNT {relative_count} exceeds the {size // 24} DT_RELA entries")
            for r in range(size // 24):
                offset, info, _addend = _RELA.unpack_from(self.d, base + 24 * r)
                kind, sym = info & 0xFFFFFFFF, info >> 32
                where = f"{name} entry {r}"
                if kind == irelative:
                    _fail(f"{where}: {irelative_name} (an IFUNC relocation) is not allowed")
                if kind in tls:
                    _fail(f"{where}: {tls[kind]} (a TLS relocation) is not allowed")
                if kind not in allowed:
                    _fail(f"{where}: relocation type {kind} is not allowed for {self.machine}")
                if name == "DT_RELA" and r < relative_count and kind != RELATIVE[self.machine]:
                    _fail(f"{where}: one of the DT_RELACOUNT first entries, but not {allowed[RELATIVE[self.machine]]}")
                if sym >= self.count:
                    _fail(f"{where}: symbol index {sym} is out of range ({self.count} symbols)")
                load = self.in_memory(offset, 8) if offset < MAX_ADDRESS else None
                if load is None or not load.flags & PF_W:
                    _fail(f"{where}: r_offset 0x{offset:x} does not lie inside a writable PT_LOAD")
                if offset < self.dyn_vaddr + self.dyn_size and self.dyn_vaddr < offset + 8:
                    _fail(f"{where}: r_offset 0x{offset:x} lies inside the dynamic section")


assert set(CPU_MACHINES) == set(RELOCATIONS)
