"""leapp/_export/cxx_runtime.py: does a C++ compiler give shared libraries the process's C++ runtime?

A GCC whose ``-lstdc++`` finds only ``libstdc++.a`` (a toolchain wrapper that
ships the static library alone) puts a private copy of the C++ runtime into every
shared library it links. A process that loads two C++ runtimes can crash (docs/building.md,
"One C++ runtime per process"), and AOTInductor links each package's model
library with the same compiler (``$CXX``, ``torch._inductor.config.cpp.cxx``).

The test is a link, not a guess from ``-print-file-name``: a tiny library that
throws and catches is linked with the compiler, and its ELF dynamic symbol
table says whether ``__cxa_begin_catch`` is defined inside it (a private copy)
or left to ``libstdc++.so.6``. The symbol table is read here (no ``nm``, no
``dlopen``: loading a library with a second C++ runtime is what crashes).
"""

from __future__ import annotations

import functools
import struct
import subprocess
import tempfile
from pathlib import Path

__all__ = [
    "RUNTIME_SYMBOL",
    "SHARED_RUNTIME_LIBRARY",
    "CxxRuntimeProbe",
    "defined_dynamic_symbols",
    "probe_compiler",
]

RUNTIME_SYMBOL = "__cxa_begin_catch"  # defined only by a C++ runtime (libstdc++, libc++abi)
SHARED_RUNTIME_LIBRARY = "libstdc++.so.6"  # what torch and Python's extensions load on Linux

_PROBE_SOURCE = """#include <stdexcept>
extern "C" int leapp_probe(int x) {
  try { if (x) throw std::runtime_error("probe"); } catch (const std::exception&) { return 1; }
  return 0;
}
"""

_SHT_DYNSYM = 11
_SHN_UNDEF = 0


def defined_dynamic_symbols(path: str | Path) -> set[str]:
    """Names an ELF shared library defines in its dynamic symbol table (what ``nm -D --defined-only`` lists).

    Raises ValueError for a file that is not ELF.
    """
    data = Path(path).read_bytes()
    if data[:4] != b"\x7fELF":
        raise ValueError(f"{path}: not an ELF file")
    is64 = data[4] == 2
    order = "<" if data[5] == 1 else ">"
    if is64:
        shoff, = struct.unpack_from(order + "Q", data, 0x28)
        shentsize, shnum = struct.unpack_from(order + "HH", data, 0x3A)
        section = struct.Struct(order + "IIQQQQIIQQ")  # name type flags addr offset size link info align entsize
        symbol = struct.Struct(order + "IBBHQQ")  # name info other shndx value size
    else:
        shoff, = struct.unpack_from(order + "I", data, 0x20)
        shentsize, shnum = struct.unpack_from(order + "HH", data, 0x2E)
        section = struct.Struct(order + "IIIIIIIIII")
        symbol = struct.Struct(order + "IIIBBH")  # name value size info other shndx
    headers = [section.unpack_from(data, shoff + i * shentsize) for i in range(shnum)]
    names: set[str] = set()
    for header in headers:
        if header[1] != _SHT_DYNSYM:
            continue
        offset, size, link = header[4], header[5], header[6]
        strtab = headers[link][4]
        for start in range(offset + symbol.size, offset + size, symbol.size):  # entry 0 is the null symbol
            fields = symbol.unpack_from(data, start)
            shndx = fields[3] if is64 else fields[5]
            if shndx == _SHN_UNDEF:
                continue
            end = data.index(b"\0", strtab + fields[0])
            names.add(data[strtab + fields[0]:end].decode("utf-8", "replace"))
    return names


class CxxRuntimeProbe:
    """What linking a shared library with ``compiler`` gives.

    ``private``: the plain link defines ``__cxa_begin_catch`` itself (a static C++ runtime);
    ``fix``: the extra ``-l`` names that make it use ``libstdc++.so.6`` instead (empty when
    not needed), or None when that link failed or still carries a private copy;
    ``detail``: the compiler's output of a failed link.
    """

    def __init__(self, compiler: str, private: bool, fix: list[str] | None, detail: str = ""):
        self.compiler = compiler
        self.private = private
        self.fix = fix
        self.detail = detail

    def __repr__(self) -> str:
        return f"CxxRuntimeProbe({self.compiler!r}, private={self.private}, fix={self.fix})"


def _link(compiler: str, folder: Path, name: str, extra: list[str]) -> tuple[Path | None, str]:
    source = folder / "probe.cpp"
    if not source.exists():
        source.write_text(_PROBE_SOURCE)
    out = folder / name
    try:
        proc = subprocess.run([compiler, "-shared", "-fPIC", str(source), *extra, "-o", str(out)],
                              capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"{type(e).__name__}: {e}"
    return (out if proc.returncode == 0 else None), (proc.stdout + proc.stderr)[-2000:]


@functools.lru_cache(maxsize=8)
def probe_compiler(compiler: str) -> CxxRuntimeProbe:
    """Links the probe library with ``compiler``, and again with ``-l:libstdc++.so.6`` when the first carries a runtime.

    Cached per compiler string for the process: each probe is one or two compiler runs
    (figures: benchmarks/results/performance-history.md).
    """
    with tempfile.TemporaryDirectory(prefix="leapp-cxx-probe-") as tmp:
        folder = Path(tmp)
        plain, detail = _link(compiler, folder, "plain.so", [])
        if plain is None:
            return CxxRuntimeProbe(compiler, private=False, fix=None, detail=detail)
        try:
            symbols = defined_dynamic_symbols(plain)
        except ValueError as e:  # not ELF (another platform): nothing this check knows how to read
            return CxxRuntimeProbe(compiler, private=False, fix=None, detail=str(e))
        if RUNTIME_SYMBOL not in symbols:
            return CxxRuntimeProbe(compiler, private=False, fix=[])
        fixed, detail = _link(compiler, folder, "fixed.so", [f"-l:{SHARED_RUNTIME_LIBRARY}"])
        if fixed is None:
            return CxxRuntimeProbe(compiler, private=True, fix=None, detail=detail)
        if RUNTIME_SYMBOL in defined_dynamic_symbols(fixed):
            return CxxRuntimeProbe(compiler, private=True, fix=None,
                                   detail=f"-l:{SHARED_RUNTIME_LIBRARY} linked, but {RUNTIME_SYMBOL} is still defined inside")
        return CxxRuntimeProbe(compiler, private=True, fix=[f":{SHARED_RUNTIME_LIBRARY}"])
