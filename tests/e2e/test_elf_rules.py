"""The loader rules of CPU code (docs/export-cpu.md section 4) in both readers, on a real leapp-built object and on
hand-made edits of it: each edit is refused by the Python and the C++ reader with the same words, naming the
segment (the blob's path) and the reason."""

from __future__ import annotations

import re
import shutil

import pytest

from cpu_observation import bundle_of, trace, warp_cpu
from elf_fields import Fields, object_of, put, verdicts, with_object
from leapp.bundle import elf
from leapp.bundle.format import MAX_CPU_CODE_BYTES

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning"),
              pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None,
                                 reason="needs a C++ compiler: the export compiles Warp's CPU source"),
              warp_cpu]


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    _, folder = trace(tmp_path_factory.mktemp("elf"), "pt2", validate=False)
    data = bundle_of(folder)
    machine, image, entries = object_of(data)
    return data, machine, image, entries, Fields(image, machine, entries)


def refused(data: bytes, pattern: str) -> str:
    py, native = verdicts(data)
    assert py == native, (py, native)
    assert re.fullmatch(r"cpu_code\[0\]\.blob \d+: " + pattern, py), py
    return py


def test_the_object_leapp_builds_passes_both_readers_and_runs_nothing_at_load(real):
    data, machine, image, entries, fields = real
    assert verdicts(with_object(data, image)) == ("", "")
    assert elf.cpu_code_problem(image, machine, entries) == ""
    tags = set(fields.check.tags)
    assert not tags & {12, 13, 25, 26, 27, 28, 32, 33, 15, 29}, tags  # no DT_INIT/FINI*/INIT_ARRAY/RPATH/RUNPATH
    assert all(name in elf.ALLOWED_NEEDED for name in (n.decode() for n in fields.check.needed_names))


def _tag(fields, image, old_tag, new_tag, value=None):
    j = fields.dyn_index(old_tag)
    image = put(image, fields.fields[f"dyn{j}.tag"], new_tag)
    return put(image, fields.fields[f"dyn{j}.value"], value) if value is not None else image


@pytest.mark.parametrize("tag, pattern", [
    (12, r"dynamic entry \d+: DT_INIT \(code run at load\) is not allowed"),
    (13, r"dynamic entry \d+: DT_FINI \(code run at unload\) is not allowed"),
    (25, r"dynamic entry \d+: DT_INIT_ARRAY \(code run at load\) is not allowed"),
    (26, r"dynamic entry \d+: DT_FINI_ARRAY \(code run at unload\) is not allowed"),
    (32, r"dynamic entry \d+: DT_PREINIT_ARRAY \(code run at load\) is not allowed"),
    (15, r"dynamic entry \d+: DT_RPATH \(a library search path\) is not allowed"),
    (29, r"dynamic entry \d+: DT_RUNPATH \(a library search path\) is not allowed"),
    (0x7FFFFFFF, r"dynamic entry \d+: DT_FILTER \(a filter library\) is not allowed"),
    (0x6FFFFEFC, r"dynamic entry \d+: DT_AUDIT \(an audit library\) is not allowed"),
    (22, r"dynamic entry \d+: DT_TEXTREL \(relocations of read-only code\) is not allowed"),
    (17, r"dynamic entry \d+: DT_REL \(REL relocations: this machine uses RELA\) is not allowed"),
    (36, r"dynamic entry \d+: DT_RELR \(packed relocations, which leapp does not emit\) is not allowed"),
    (0x6000000D, r"dynamic entry \d+: tag 0x6000000d is not allowed"),
])
def test_a_refused_dynamic_tag_is_named(real, tag, pattern):
    data, _, image, _, fields = real
    refused(with_object(data, _tag(fields, image, 16, tag, 0x1000)), pattern)


def test_a_needed_library_other_than_the_c_runtime_is_refused(real):
    data, _, image, _, fields = real
    name = b"libm.so.6"
    at = image.index(name + b"\0", fields.check.strtab)
    edited = image[:at] + b"libX.so.6" + image[at + len(name):]
    refused(with_object(data, edited), r"dynamic entry 0: DT_NEEDED 'libX.so.6' is not one of the C runtime's "
                                       r"libraries \(libc.so.6, libm.so.6\)")


@pytest.mark.parametrize("edit, pattern", [
    (lambda f, i: put(i, f.fields[f"ph{f.phdr_index(1)}.offset"], len(i)),
     r"program header 0 \(PT_LOAD\): its file range \[\d+, \+\d+\) lies outside the \d+-byte file"),
    (lambda f, i: put(i, f.fields[f"ph{f.phdr_index(0x6474E550)}.type"], 7),
     r"program header \d+: PT_TLS \(thread-local storage\) is not allowed"),
    (lambda f, i: put(i, f.fields[f"ph{f.phdr_index(0x6474E550)}.type"], 3),
     r"program header \d+: PT_INTERP \(a program interpreter\) is not allowed"),
    (lambda f, i: put(i, f.fields[f"ph{f.phdr_index(0x6474E551)}.flags"], 7),
     r"program header \d+ \(PT_GNU_STACK\): the object asks for an executable stack"),
    (lambda f, i: put(i, f.fields[f"ph{f.phdr_index(0x6474E551)}.type"], 0),
     r"no PT_GNU_STACK program header \(the loader would make the stack executable\)"),
    (lambda f, i: put(i, f.fields[f"dyn{f.dyn_index(30)}.value"], 0x12),
     r"dynamic entry \d+: DT_FLAGS has DF_STATIC_TLS \(thread-local storage\)"),
    (lambda f, i: put(put(i, f.fields[f"dyn{f.check.dyn_end // 16 - 1}.tag"], 21),
                      f.fields[f"ph{f.phdr_index(2)}.filesz"], f.check.dyn_end),
     r"dynamic section: no DT_NULL within its \d+ bytes"),
    (lambda f, i: put(i, f.fields["ph0.align"], 4097),
     r"program header 0 \(PT_LOAD\): p_align 4097 is not a power of two in \[4096, 268435456\]"),
    (lambda f, i: put(i, f.fields["ph0.flags"], 0x10),
     r"program header 0 \(PT_LOAD\): p_flags 0x10 is not PF_R, with PF_W or PF_X at most \(the loader reads it\)"),
    (lambda f, i: put(put(i, f.fields[f"ph{f.phdr_index(0x6474E550)}.type"], 4),
                      f.fields[f"ph{f.phdr_index(0x6474E550)}.align"], 4),
     r"program header \d+ \(PT_NOTE\): the note at \+0 ends at \+\d+, past its \d+ bytes"),
    (lambda f, i: put(i, f.fields[f"dyn{f.dyn_index(0x6FFFFFF0)}.tag"], 0),
     r"dynamic section: DT_VERNEED or DT_VERDEF without DT_VERSYM \(glibc reads it regardless\)"),
    (lambda f, i: put(i, f.fields[f"ph{f.phdr_index(0x6474E550)}.type"], 6),
     r"program header \d+ \(PT_PHDR\): \[0x[0-9a-f]+, \+\d+\) is not the program header table \[64, \+\d+\) "
     r"itself \(the unwinder reads the table there\)"),
    (lambda f, i: put(i, f.fields["gnu.nbuckets"], 70000), r"DT_GNU_HASH: nbuckets 70000 is not in \[1, 65536\]"),
    (lambda f, i: put(i, f.fields[f"dyn{f.dyn_index(2)}.value"], 24 * 70000),
     r"dynamic section: DT_PLTRELSZ 1680000 holds more than 65536 relocations"),
    (lambda f, i: put(i, f.fields["e_phentsize"], 64), r"ELF e_phentsize 64 is not 56"),
    (lambda f, i: put(i, f.fields["e_ident_version"], 0), r"ELF EI_VERSION 0 is not 1"),
])
def test_a_bad_program_header_or_dynamic_section_is_refused(real, edit, pattern):
    data, _, image, _, fields = real
    refused(with_object(data, edit(fields, image)), pattern)


def _symbol_edit(field: str, value):
    def edit(f, image, entries):
        s = f.symbol(entries[0])
        return put(image, f.fields[f"sym{s}.{field}"], value(f, s) if callable(value) else value)

    return edit


@pytest.mark.parametrize("edit, pattern", [
    (_symbol_edit("info", 0x1A), r"symbol \d+ '[^']+': STT_GNU_IFUNC \(an IFUNC resolver\) is not allowed"),
    (_symbol_edit("info", 0x16), r"symbol \d+ '[^']+': STT_TLS \(thread-local storage\) is not allowed"),
    (_symbol_edit("info", 0x11), r"kernels\[0\] CPU entry '[^']+': symbol \d+ is not a function \(type 1\)"),
    (_symbol_edit("value", lambda f, s: f.check.syms[f.symbol(f.check.entries[0] + "_leapp_args")][4]),
     r"kernels\[0\] CPU entry '[^']+': its code \[0x[0-9a-f]+, \+\d+\) does not lie inside the file part of an "
     r"executable PT_LOAD"),
    (lambda f, image, entries: put(image, f.fields[f"sym{f.symbol(entries[0] + '_leapp_args')}.size"], 16),
     r"kernels\[0\] CPU entry '[^']+': its layout table '[^']+' has 16 bytes, fewer than 24"),
    (lambda f, image, entries: put(image, f.fields[f"sym{f.symbol(entries[1])}.name"],
                                   f.check.syms[f.symbol(entries[0])][0]),
     r"kernels\[0\] CPU entry '[^']+': defined twice by the CPU code \(symbols \d+ and \d+\)"),
])
def test_a_bad_symbol_or_entry_is_refused(real, edit, pattern):
    data, _, image, entries, fields = real
    refused(with_object(data, edit(fields, image, entries)), pattern)


def test_an_ifunc_or_tls_relocation_is_refused(real):
    data, machine, image, _, fields = real
    irelative, tls = (37, 18) if machine == "x86_64" else (1032, 1030)
    (field,) = [v for k, v in fields.fields.items() if k.startswith("jmprel0.info")]
    info = fields.check.u64(field[0])
    refused(with_object(data, put(image, field, info & ~0xFFFFFFFF | irelative)),
            r"DT_JMPREL entry 0: R_(X86_64|AARCH64)_IRELATIVE \(an IFUNC relocation\) is not allowed")
    refused(with_object(data, put(image, field, info & ~0xFFFFFFFF | tls)),
            r"DT_JMPREL entry 0: R_\w+ \(a TLS relocation\) is not allowed")
    table = fields.check.syms[fields.symbol(fields.check.entries[0] + "_leapp_args")][4]
    refused(with_object(data, put(image, fields.fields["jmprel0.offset"], table)),
            r"DT_JMPREL entry 0: r_offset 0x[0-9a-f]+ does not lie inside a writable PT_LOAD")


def test_a_cut_or_oversized_object_is_refused(real):
    data, _, image, _, _ = real
    refused(with_object(data, image[:100]), r"the program header table \[64, \+\d+\) lies outside the 100-byte file")
    refused(with_object(data, image[:5000]), r"program header 1 \(PT_LOAD\): its file range \[4096, \+\d+\) lies "
                                             r"outside the 5000-byte file")
    refused(with_object(data, image[:40]), r"not an ELF file \(no \\x7fELF magic in a 64-byte header\)")
    big = image + bytes(MAX_CPU_CODE_BYTES + 1 - len(image))
    refused(with_object(data, big), rf"the object has {MAX_CPU_CODE_BYTES + 1} bytes, more than {MAX_CPU_CODE_BYTES} "
                                    r"\(64 MiB\)")


def test_a_nul_inside_a_cpu_entry_is_refused_at_read(real):
    data, _, image, entries, _ = real
    from leapp import _native
    from leapp.bundle import BundleError, read_bundle

    edited = with_object(data, image, entry=entries[0] + "\0evil")
    with pytest.raises(BundleError, match=r"NUL.*kernels\[0\]\.cpu_entry|kernels\[0\]\.cpu_entry.*NUL"):
        read_bundle(edited)
    with pytest.raises(ValueError, match=r"NUL.*kernels\[0\]\.cpu_entry|kernels\[0\]\.cpu_entry.*NUL"):
        _native.Bundle(edited)


def test_a_long_or_unprintable_entry_name_is_cut_in_the_message(real):
    data, _, image, _, _ = real
    py = refused(with_object(data, image, entry="\x01" + "x" * 200),
                 r"kernels\[0\] CPU entry '\\x01x{59}\.\.\.': not defined by the CPU code")
    assert len(py) < 200


def test_a_compressed_object_declaring_more_than_the_bound_is_refused_before_decoding(real):
    from cpu_observation import rewritten
    from leapp import _native
    from leapp.bundle import BundleError, read_bundle

    data = real[0]
    big = MAX_CPU_CODE_BYTES + 1
    edited = rewritten(data, lambda m, b: m["cpu_code"][0].update(encoding="lz4-block", decoded_bytes=big))
    with pytest.raises(BundleError, match=rf"cpu_code\[0\]\.decoded_bytes {big} is not in \[0, {MAX_CPU_CODE_BYTES}\]"):
        read_bundle(edited)
    with pytest.raises(ValueError, match=rf"cpu_code\[0\]\.decoded_bytes {big} out of range \[0, {MAX_CPU_CODE_BYTES}\]"):
        _native.Bundle(edited)
