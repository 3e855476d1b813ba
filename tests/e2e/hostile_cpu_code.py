"""Hostile CPU code objects for the loader-rule tests (docs/export-cpu.md section 4): each built with the system
compiler, defines the real CPU entries and layout tables of an export (so only its hostile part is wrong) and
writes a marker file when any of its code runs; and an export rewritten around one, every digest recomputed as
an attacker who can write the folder would (bundle, the ONNX node's signature, pipeline.yaml/json sha256)."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

from leapp.bundle import elf
from leapp.bundle.format import MAGIC
from leapp.pipeline_format.reader import parse_description
from leapp.pipeline_format.twin import write_twin
from leapp.pipeline_format.yaml_text import yaml_text

# variant -> (extra source, extra compiler flags, reason the readers give); {folder} is the export folder
VARIANTS = {
    "plain": ("", [], None),  # the control: nothing hostile; its entries mark when they run
    "constructor": ('__attribute__((constructor)) static void evil() { mark("constructor"); }', ["startfiles"],
                    r"\(code run at load\) is not allowed"),
    "init_array": ('static void evil() { mark("init_array"); }\n'
                   '__attribute__((used, section(".init_array"))) static void (*evil_p)() = evil;', [],
                   r"DT_INIT_ARRAY \(code run at load\) is not allowed"),
    "fini_array": ('static void evil() { mark("fini_array"); }\n'
                   '__attribute__((used, section(".fini_array"))) static void (*evil_p)() = evil;', [],
                   r"DT_FINI_ARRAY \(code run at unload\) is not allowed"),
    "ifunc": ('static void real_target() {}\n'
              'extern "C" void* resolve_target() { mark("ifunc"); return (void*)real_target; }\n'
              'extern "C" V void target() __attribute__((ifunc("resolve_target")));\n'
              'extern "C" V void (*const volatile target_used)() = target;', [],
              r"STT_GNU_IFUNC \(an IFUNC resolver\) is not allowed"),
    "needed": ("", ["-Wl,--no-as-needed", "{folder}/libevil.so"],
               r"DT_NEEDED '/[^']*' is not one of the C runtime's libraries"),  # the path, cut to 60 bytes
    "runpath": ("", ["-Wl,-rpath,$ORIGIN", "-Wl,--enable-new-dtags"],
                r"DT_RUNPATH \(a library search path\) is not allowed"),
    "tls": ('extern "C" V __thread int leapp_calls;\n__thread int leapp_calls;', [],
            r"PT_TLS \(thread-local storage\) is not allowed"),
    "data_entry": ("", ["data_entry"], r"CPU entry '[^']+': symbol \d+ is not a function"),
}
# Variants whose code runs inside dlopen itself (shown by the control: a plain dlopen writes their marker).
RUN_AT_LOAD = ("constructor", "init_array", "ifunc", "needed")

PRELUDE = r"""
#include <fcntl.h>
#define V __attribute__((visibility("default")))
// Raw system calls: an IFUNC resolver runs before the object's own calls into libc are bound.
static long sys4(long n, long a, long b, long c, long d) {
#if defined(__x86_64__)
  register long r10 __asm__("r10") = d;
  long r;
  __asm__ volatile("syscall" : "=a"(r) : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10) : "rcx", "r11", "memory");
  return r;
#elif defined(__aarch64__)
  register long x8 __asm__("x8") = n, x0 __asm__("x0") = a, x1 __asm__("x1") = b, x2 __asm__("x2") = c,
                x3 __asm__("x3") = d;
  __asm__ volatile("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3) : "memory");
  return x0;
#endif
}
#if defined(__x86_64__)
enum { kOpenat = 257, kWrite = 1, kClose = 3 };
#else
enum { kOpenat = 56, kWrite = 64, kClose = 57 };
#endif
#define mark(what) mark_n(what, sizeof(what) - 1)  // no strlen: libc may not be bound yet
static void mark_n(const char* what, long n) {
  long fd = sys4(kOpenat, AT_FDCWD, (long)MARKER, O_WRONLY | O_CREAT | O_APPEND, 0644);
  if (fd >= 0) {
    sys4(kWrite, fd, (long)what, n, 0);
    sys4(kClose, fd, 0, 0, 0);
  }
}
"""


def layout_tables(image: bytes, machine: str, entries: list[str]) -> dict[str, list[int]]:
    """Each entry's layout table (its u64 cells) as the object holds them, read through the readers' own parse."""
    check = elf._Check(bytes(image), machine, entries)
    check.run()
    tables = {}
    for entry in entries:
        (s,) = check.defined(f"{entry}_leapp_args".encode())
        _, _, _, _, value, size = check.syms[s]
        off = check.file_part(value, size, "layout table")
        tables[entry] = [check.u64(off + 8 * i) for i in range(size // 8)]
    return tables


def source_of(variant: str, tables: dict[str, list[int]]) -> str:
    extra, flags, _ = VARIANTS[variant]
    lines = [PRELUDE, 'extern "C" {']
    for n, (entry, cells) in enumerate(tables.items()):
        if n == 0 and "data_entry" in flags:  # the entry named by the manifest is a data symbol
            lines.append(f"extern V const unsigned long long {entry}[] = {{0xc3c3c3c3c3c3c3c3ull, 0, 0, 0}};")
        else:
            lines.append(f'V void {entry}(void*, void*) {{ mark("entry"); }}')
        lines.append(f"extern V const unsigned long long {entry}_leapp_args[] = {{{', '.join(map(str, cells))}}};")
    lines.append("}")
    lines.append(extra)
    return "\n".join(lines) + "\n"


def build_evil_library(folder: Path, marker: Path, cxx: str = "c++") -> Path:
    """libevil.so in ``folder``: a library an attacker drops beside the export; its constructor marks. It has no
    soname, so an object linked with its path needs it by that absolute path."""
    src = folder / "evil_lib.cpp"
    src.write_text(PRELUDE + '__attribute__((constructor)) static void evil() { mark("needed library"); }\n')
    out = folder / "libevil.so"
    subprocess.run([cxx, "-shared", "-fPIC", f'-DMARKER="{marker}"', str(src), "-o",
                    str(out)], check=True, capture_output=True, text=True)
    src.unlink()
    return out


def build_variant(variant: str, tables: dict[str, list[int]], work: Path, folder: Path, marker: Path,
                  cxx: str = "c++") -> bytes:
    """The variant's shared object (its bytes), compiled in ``work`` with the export folder ``folder``."""
    _, flags, _ = VARIANTS[variant]
    src = work / f"{variant}.cpp"
    src.write_text(source_of(variant, tables))
    out = work / f"{variant}.so"
    extra = [f.format(folder=folder) for f in flags if f not in ("startfiles", "data_entry")]
    start = [] if "startfiles" in flags else ["-nostartfiles"]
    r = subprocess.run([cxx, "-shared", "-fPIC", "-O1", *start, f'-DMARKER="{marker}"', str(src), "-o", str(out),
                        *extra], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return out.read_bytes()


def swap_cpu_code(folder: Path, rewrite) -> bytes:
    """Replaces the ONNX export's one segment bundle by ``rewrite(bundle bytes)`` and recomputes what names it: the
    WarpSegment node's signature digest, the artifact's sha256 and the segment digest in pipeline.yaml/json;
    returns the new bundle."""
    import onnx

    path = folder / "obs.onnx"
    model = onnx.load(str(path))
    (tensor,) = [t for t in model.graph.initializer if t.data_type == onnx.TensorProto.UINT8 and
                 t.raw_data.startswith(MAGIC)]
    old = tensor.raw_data
    new = rewrite(old)
    tensor.raw_data = new
    tensor.dims[0] = len(new)
    old_digest, new_digest = old[-32:].hex(), new[-32:].hex()
    for node in model.graph.node:
        for attr in node.attribute:
            if attr.name == "signature":
                sig = json.loads(attr.s)
                assert sig["digest"] == old_digest
                sig["digest"] = new_digest
                attr.s = json.dumps(sig, sort_keys=True, separators=(",", ":")).encode()
    onnx.save(model, str(path))
    description = parse_description((folder / "pipeline.yaml").read_bytes())
    (node,) = description["nodes"]
    node["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    (segment,) = node["segments"]
    assert segment["digest"] == old_digest
    segment["digest"] = new_digest
    (folder / "pipeline.yaml").write_text(yaml_text(description))
    write_twin(folder, description)
    return new
