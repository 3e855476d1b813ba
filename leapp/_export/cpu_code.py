"""leapp/_export/cpu_code.py: a segment's Warp kernels as native CPU code, one shared object per machine.

Warp generates C++ for the CPU from the same kernels it generates CUDA from (the module's block_dim 1
variant, Warp's CPU default); Warp itself compiles that with its bundled Clang into an object its own JIT
loads. leapp compiles the same source, for the kernels a segment launches, with the system's C++
compiler into a position-independent shared object that needs nothing but the C library and libm, so
that the native runtime runs the segment on the CPU with no Warp and no compiler (docs/export-cpu.md).

Each CPU entry ``<mangled>_cpu_forward(launch_bounds_t* dim, wp_args_<mangled>* args)`` takes its
arguments as one struct; the object also exports ``<mangled>_cpu_forward_leapp_args``, a table of that
struct's layout (field count, struct size, launch-bounds size, then each field's offset and size) that the
runtime checks
against every launch's packed parameters before it calls the entry.

NOTE: kernels that use tiles are left out (their CPU code calls into Warp's runtime for its block
scheduler), and so is any module whose object would need another library: the segment then has no CPU
code, and the reason is reported, never a silent fallback.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from leapp import _warp_private as wpp
from leapp._export import binary_cache
from leapp.bundle.elf import cpu_code_problem
from leapp.bundle.format import CPU_MACHINES, this_machine
from leapp.errors import ExportError

__all__ = ["CPU_CODE_ENV", "CXX_ENV", "CpuCode", "cpu_code_setting", "cpu_code_wanted", "compilers",
           "build_cpu_code"]

CPU_CODE_ENV = "LEAPP_CPU_CODE"  # auto (default: segments captured on the CPU), 1 (every segment), 0 (none)
CXX_ENV = "LEAPP_CXX"  # the host C++ compiler (default: c++, g++ or clang++ from PATH)
CROSS_CXX = {"aarch64": "aarch64-linux-gnu-g++"}  # cross compilers used when they are on PATH
CPU_BLOCK_DIM = 1  # the module variant Warp runs on the CPU by default
# -nostartfiles: no crti/crtbeginS, so no DT_INIT/DT_FINI/.init_array/.fini_array (frame_dummy and
# __do_global_dtors_aux): nothing may run inside dlopen. -z separate-code: read-only data (the layout tables)
# in a non-executable PT_LOAD, as the loader rules ask (aarch64's linker otherwise maps it with the code; x86-64's
# default already). docs/export-cpu.md section 4.
FLAGS = ("-std=c++17", "-O2", "-fPIC", "-shared", "-DNDEBUG", "-ffp-contract=off", "-fvisibility=hidden",
         "-Wno-invalid-offsetof", "-static-libstdc++", "-static-libgcc", "-nostartfiles", "-Wl,-z,defs",
         "-Wl,-z,separate-code", "-Wl,-Bsymbolic", "-Wl,--build-id=none", "-s")
# What Warp's generated CPU code calls in warp.so when it is not compiled by Clang (which converts half precision
# with its own _Float16): float <-> half and bfloat16 bits, written here (IEEE round to nearest, ties to even;
# NaN stays a quiet NaN with its payload's top bits) and compiled into every object, bound locally (-Bsymbolic).
SUPPORT_SOURCE = r"""
#include <cstdint>
#include <cstring>
#define V __attribute__((visibility("default")))
extern "C" {
V uint16_t wp_float_to_half_bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u, exp = (x >> 23) & 0xffu;
  uint32_t mant = x & 0x7fffffu;
  if (exp == 0xffu) return uint16_t(sign | 0x7c00u | (mant ? 0x200u | (mant >> 13) : 0u));
  const int e = int(exp) - 127 + 15;
  if (e >= 0x1f) return uint16_t(sign | 0x7c00u);
  if (e <= 0) {
    if (e < -10) return uint16_t(sign);
    mant |= 0x800000u;
    const uint32_t shift = uint32_t(14 - e), half = mant >> shift, rest = mant & ((1u << shift) - 1u);
    const uint32_t halfway = 1u << (shift - 1u);
    return uint16_t(sign | (half + (rest > halfway || (rest == halfway && (half & 1u)))));
  }
  const uint32_t half = sign | (uint32_t(e) << 10) | (mant >> 13), rest = mant & 0x1fffu;
  return uint16_t(half + (rest > 0x1000u || (rest == 0x1000u && (half & 1u))));  // a carry rounds up the exponent
}
V float wp_half_bits_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1fu) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp == 0) {
    const float v = float(mant) * 5.9604644775390625e-08f;  // mant * 2^-24, exact
    return sign ? -v : v;
  } else {
    bits = sign | ((exp + 112u) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
V uint16_t wp_float_to_bfloat16_bits(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u)  // NaN: truncated, a quiet bit set where the kept mantissa is zero
    return uint16_t((x >> 16) | ((x & 0x7f0000u) ? 0u : 0x40u));
  return uint16_t((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}
V float wp_bfloat16_bits_to_float(uint16_t u) {
  const uint32_t bits = uint32_t(u) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
}
"""


# What the layout tables use: offsetof, and the size of an entry's launch_bounds_t<N> (its first parameter).
LAYOUT_PRELUDE = """
#include <cstddef>
template <typename D, typename A>
constexpr unsigned long long leapp_dim_bytes(void (*)(D*, A*)) { return sizeof(D); }
"""


@dataclass(frozen=True)
class CpuCode:
    """One shared object: the machine it runs on, its bytes and the CPU entry of each launched kernel."""

    machine: str
    image: bytes
    entries: dict[str, str]  # CUDA entry of the kernel -> its CPU entry in ``image``


def cpu_code_setting() -> str:
    """$LEAPP_CPU_CODE as "auto", "always" or "never"; ExportError naming the variable for anything else."""
    value = os.environ.get(CPU_CODE_ENV, "auto").strip().lower()
    setting = {"": "auto", "auto": "auto", "1": "always", "always": "always", "0": "never", "never": "never"}.get(value)
    if setting is None:
        raise ExportError(f"${CPU_CODE_ENV}={value!r}: expected 'auto' (the default: CPU code for segments captured "
                          "on the CPU), '1' (every segment, a CUDA export too) or '0' (none)")
    return setting


def cpu_code_wanted(captured_on: str) -> bool:
    """Whether a segment captured on ``captured_on`` ("cpu" or "cuda") gets CPU code ($LEAPP_CPU_CODE)."""
    setting = cpu_code_setting()
    return setting == "always" or (setting == "auto" and captured_on == "cpu")


def compilers() -> list[tuple[str, str]]:
    """(machine, compiler) pairs CPU code is built with: the host's ($LEAPP_CXX, else c++/g++/clang++), then
    each cross compiler of ``CROSS_CXX`` found on PATH for another machine."""
    found = []
    host = this_machine()
    if host in CPU_MACHINES:
        chosen = os.environ.get(CXX_ENV) or next((c for c in ("c++", "g++", "clang++") if shutil.which(c)), None)
        if chosen:
            found.append((host, chosen))
    for machine, cxx in CROSS_CXX.items():
        if machine != host and shutil.which(cxx):
            found.append((machine, cxx))
    return found


def build_cpu_code(kernels: Sequence[tuple[str, object]], where: str) -> tuple[list[CpuCode], str]:
    """CPU code of ``kernels`` ((CUDA entry, live wp.Kernel) pairs, the launched ones) for every machine a
    compiler is found for; and "" or why there is none (then the list is empty).

    Raises:
        ExportError: a compiler failed on Warp's source (names the machine, the compiler and its output).
    """
    if not kernels:
        return [], "the segment launches no kernel"
    targets = compilers()
    if not targets:
        return [], (f"no C++ compiler found (set ${CXX_ENV}, or install c++, g++ or clang++) for machine "
                    f"{this_machine()}")
    sources, entries = _sources(kernels)  # codegen builds each kernel's adjoint: its variables are known after
    tiled = sorted({k.key for _, k in kernels if wpp.uses_tiles(k)})
    if tiled:  # a tile kernel's CPU variant runs one thread per block: not what the CUDA launch sizes mean
        return [], f"kernels {tiled} use tiles, which the CPU code cannot run as the CUDA launches do"
    codes = []
    for machine, cxx in targets:
        image = _compile(cxx, machine, sources, where)
        problem = cpu_code_problem(image, machine, entries.values())  # what both readers will check
        if problem:
            raise ExportError(f"{where}: the CPU code {cxx} built for {machine} breaks the loader's rules "
                              f"(docs/export-cpu.md section 4): {problem}")
        codes.append(CpuCode(machine, image, entries))
    return codes, ""


def _sources(kernels: Iterable[tuple[str, object]]) -> tuple[list[str], dict[str, str]]:
    """One C++ source per Warp module (its kernels subset, plus the layout tables), and CUDA entry -> CPU entry."""
    by_module: dict[int, tuple[object, list[tuple[str, object]]]] = {}
    for entry, kernel in kernels:
        by_module.setdefault(id(kernel.module), (kernel.module, []))[1].append((entry, kernel))
    sources, entries = [], {}
    for module, launched in by_module.values():
        with wpp.preserved_module_state(module):
            wpp.module_variant_hash(module, CPU_BLOCK_DIM)
            names = wpp.kernel_variant_names(module, CPU_BLOCK_DIM)
            mangled = {entry: names[kernel] for entry, kernel in launched}
            source, fields = wpp.cpu_codegen(module, wpp.export_options(module, CPU_BLOCK_DIM),
                                             frozenset(mangled.values()))
        tables = []
        for name in sorted(set(mangled.values())):
            struct = f"wp_args_{name}"
            cells = [str(len(fields[name])), f"sizeof({struct})", f"leapp_dim_bytes(&{name}_cpu_forward)"]
            for label in fields[name]:
                cells += [f"offsetof({struct}, {label})", f"sizeof((({struct}*)0)->{label})"]
            tables.append(f'extern "C" __attribute__((visibility("default"))) const unsigned long long '
                          f"{name}_cpu_forward_leapp_args[] = {{{', '.join(cells)}}};")
        sources.append(source + LAYOUT_PRELUDE + "\n".join(tables) + "\n")
        entries.update({entry: f"{name}_cpu_forward" for entry, name in mangled.items()})
    return sources, entries


CACHE_SUBDIR = "cpu-v1"  # the binary cache's folder for CPU code (leapp._export.binary_cache)


@dataclasses.dataclass(frozen=True)
class CpuCacheKey(binary_cache.JsonKey):
    """What one object depends on: the machine, the compiler (its path and ``--version``), the flags, Warp's
    version (its headers) and every source compiled."""

    machine: str
    compiler: str
    compiler_version: str
    flags: str
    warp: str
    sources: str  # sha256 of the sources, in order

    def describe(self) -> str:
        return f"CPU code for {self.machine} ({self.sources[:12]})"

    def check_payload(self, payload: bytes) -> None:
        problem = cpu_code_problem(payload, self.machine, ())
        if problem:
            raise binary_cache.CacheEntryError(f"the CPU code is {problem}")


@functools.lru_cache(maxsize=8)
def _compiler_version(cxx: str) -> str:
    try:
        r = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unknown ({e})"
    return (r.stdout or r.stderr).strip().splitlines()[0] if (r.stdout or r.stderr).strip() else "unknown"


def _compile(cxx: str, machine: str, sources: Sequence[str], where: str) -> bytes:
    """The object for ``machine``: from the binary cache when an identical compile made it, else compiled."""
    digest = hashlib.sha256()
    for source in [*sources, SUPPORT_SOURCE]:
        digest.update(hashlib.sha256(source.encode()).digest())
    key = CpuCacheKey(machine, shutil.which(cxx) or cxx, _compiler_version(cxx), " ".join(FLAGS),
                      wpp.installed_warp_version(), digest.hexdigest())
    cache = binary_cache.default_cache(CACHE_SUBDIR)
    entry = cache.get(key) if cache is not None else None
    if entry is not None:
        return entry.payload
    image = _compiled(cxx, machine, sources, where)
    if cache is not None:
        cache.put(key, binary_cache.Entry(image, {}))
    return image


def _compiled(cxx: str, machine: str, sources: Sequence[str], where: str) -> bytes:
    with tempfile.TemporaryDirectory(prefix="leapp-cpu-") as tmp:
        files = []
        for i, source in enumerate([*sources, SUPPORT_SOURCE]):
            path = Path(tmp) / f"module{i}.cpp"
            path.write_text(source)
            files.append(str(path))
        out = Path(tmp) / "segment.so"
        command = [cxx, *FLAGS, "-I", wpp.native_include_dir(), *files, "-o", str(out), "-lm"]
        try:
            r = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise ExportError(f"{where}: compiling the CPU code for {machine} with {cxx} failed: {e}") from e
        if r.returncode != 0:
            raise ExportError(f"{where}: compiling the CPU code for {machine} with {cxx} failed "
                              f"(exit {r.returncode}):\n{(r.stderr or r.stdout)[-4000:]}")
        image = out.read_bytes()
    elf_machine = int.from_bytes(image[18:20], "little") if len(image) >= 20 else -1
    if image[:4] != b"\x7fELF" or elf_machine != CPU_MACHINES[machine]:
        raise ExportError(f"{where}: {cxx} did not produce an ELF shared object for {machine} (e_machine "
                          f"{elf_machine}, expected {CPU_MACHINES[machine]})")
    return image
