"""leapp/_export/ptx_compat.py: the PTX fallback written by an older NVRTC, so older drivers can JIT it.

Warp 1.19's NVRTC (CUDA 13.4) writes PTX ISA 9.4, which no driver before CUDA
13.4 reads (error 222 on a CUDA 13.0 driver, measured). The same generated CUDA
source compiles with older NVRTCs from NVIDIA's pip wheels (checked for the
gravity segment with 11.8, 12.0, 12.6, 12.8, 12.9 and 13.0: ISA 7.8 ... 9.0; the
PTX assembles for sm_75 ... sm_121 with ptxas 13.0), and a driver reads any ISA
up to its own CUDA version. So when such a library is named, the exporter
compiles the sm_75 PTX with it (cubins still come from Warp's NVRTC), with the
options Warp's own ``wp_cuda_compile_program`` passes (warp/native/warp.cu,
``append_common_nvrtc_compile_options``), resolved from the module's options.

    LEAPP_PTX_NVRTC=/path/to/libnvrtc.so.12   that library
    LEAPP_PTX_NVRTC=auto                      an NVRTC of NVIDIA's pip wheels installed here
                                              (``pip install leapp[ptx-compat]``), the oldest first
    unset, "" or "off"                        Warp's NVRTC, as before

Modules that link device code at build time (MathDx tile FFT / linear algebra:
Warp links LTO-IR with nvJitLink) cannot take this route: compiling such a
module fails with an ExportError naming the module (set LEAPP_PTX_NVRTC=off).
"""

from __future__ import annotations

import ctypes
import functools
import glob
import importlib.util
import os
import re
from dataclasses import dataclass

from leapp import _warp_private as wpp
from leapp.errors import ExportError

__all__ = ["NVRTC_ENV", "CompatNvrtc", "compat_nvrtc", "compile_ptx", "nvrtc_options"]

NVRTC_ENV = "LEAPP_PTX_NVRTC"
# Where NVIDIA's NVRTC wheels put the library, below the "nvidia" namespace package:
# nvidia-cuda-nvrtc-cu11 / -cu12 and nvidia-cuda-nvrtc (CUDA 13).
_WHEEL_LIBRARIES = ("cuda_nvrtc/lib/libnvrtc.so.11.2", "cuda_nvrtc/lib/libnvrtc.so.12", "cu13/lib/libnvrtc.so.13")
_ENTRY = re.compile(rb"\.entry\s+([A-Za-z_$][\w$]*)")


@dataclass(frozen=True)
class CompatNvrtc:
    """An NVRTC other than Warp's, loaded with ctypes."""

    path: str
    version: tuple[int, int]

    @property
    def version_text(self) -> str:
        return f"{self.version[0]}.{self.version[1]}"

    @functools.cached_property
    def identity(self) -> str:
        """What the PTX depends on besides the source and options (binary cache key): version, size, mtime."""
        st = os.stat(self.path)
        return f"nvrtc {self.version_text} {st.st_size}:{st.st_mtime_ns}"


def _wheel_candidates() -> list[str]:
    spec = importlib.util.find_spec("nvidia")
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    return [os.path.join(root, rel) for rel in _WHEEL_LIBRARIES for root in roots
            if os.path.isfile(os.path.join(root, rel))]


@functools.lru_cache(maxsize=None)
def _load(path: str) -> tuple[ctypes.CDLL, tuple[int, int]]:
    # NVRTC dlopens libnvrtc-builtins.so.<major>.<minor> by name; the wheels keep it next to libnvrtc
    # (CUDA 12's RUNPATH $ORIGIN finds it, CUDA 13's does not): load it first, globally.
    for builtins in sorted(glob.glob(os.path.join(os.path.dirname(path), "libnvrtc-builtins.so.*"))):
        if ".alt." not in builtins:
            ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
    lib = ctypes.CDLL(path)
    major, minor = ctypes.c_int(), ctypes.c_int()
    if lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)) != 0:
        raise OSError("nvrtcVersion failed")
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    return lib, (major.value, minor.value)


def compat_nvrtc() -> CompatNvrtc | None:
    """The NVRTC $LEAPP_PTX_NVRTC names (see the module docstring), or None for Warp's own.

    Raises:
        ExportError: the variable names a library that cannot be loaded, or "auto" finds none.
    """
    raw = os.environ.get(NVRTC_ENV, "").strip()
    if raw.lower() in ("", "off", "0", "none", "warp"):
        return None
    candidates = _wheel_candidates() if raw.lower() == "auto" else [raw]
    if not candidates:
        raise ExportError(f"{NVRTC_ENV}=auto: no NVRTC of NVIDIA's pip wheels is installed "
                          "(pip install 'leapp[ptx-compat]', or name a libnvrtc.so)")
    found, problems = [], []
    for path in candidates:
        try:
            found.append(CompatNvrtc(path, _load(path)[1]))
        except OSError as e:
            problems.append(f"{path}: {e}")
    if not found:
        raise ExportError(f"{NVRTC_ENV}={raw!r}: cannot load an NVRTC ({'; '.join(problems)})")
    return min(found, key=lambda n: n.version)  # the oldest: the lowest PTX ISA, read by the most drivers


def nvrtc_options(options: dict, arch: int, version: tuple[int, int]) -> list[str]:
    """The NVRTC options Warp 1.19's ``wp_cuda_compile_program`` passes for PTX of ``arch``, for an NVRTC of
    ``version`` (Warp decides some at its own build time from CUDA_VERSION: the same rules, applied to it)."""
    opts = [f"--gpu-architecture=compute_{arch}", f"--include-path={wpp.native_include_dir()}", "--std=c++17"]
    level = options.get("optimization_level")
    level = 3 if level is None else int(level)
    if version >= (12, 9):  # --Ofast-compile exists since 12.9, inverse to -O
        if level == 0:
            opts.append("--Ofast-compile=mid" if version >= (13, 1) else "--Ofast-compile=max")
        else:
            opts.append({1: "--Ofast-compile=mid", 2: "--Ofast-compile=min"}.get(level, "--Ofast-compile=0"))
    if options.get("mode") == "debug":
        opts += ["--define-macro=_DEBUG", "--generate-line-info", "--device-debug"]
    else:
        opts.append("--define-macro=NDEBUG")
        if options.get("lineinfo"):
            opts.append("--generate-line-info")
    opts.append("--define-macro=WP_VERIFY_FP" if options.get("verify_fp") else "--undefine-macro=WP_VERIFY_FP")
    opts.append(f"--define-macro=WP_ENABLE_MATHDX={1 if wpp.mathdx_enabled() else 0}")
    if options.get("fast_math"):
        opts.append("--use_fast_math")
    opts.append("--fmad=true" if options.get("fuse_fp", True) else "--fmad=false")
    opts += ["--device-as-default-execution-space", "--extra-device-vectorization", "--restrict",
             "--diag-suppress=177,550"]
    opts += [f"--include-path={os.path.realpath(os.fspath(d))}" for d in options.get("extra_cuda_include_dirs") or ()]
    return opts


def compile_ptx(nvrtc: CompatNvrtc, source: bytes, name: str, options: dict, arch: int, reference: bytes) -> bytes:
    """PTX (NUL-terminated) of Warp's generated CUDA ``source`` for compute_``arch``, by ``nvrtc``.

    ``reference`` is the PTX Warp's own NVRTC wrote for the same source: the result must define the same
    kernel entries and call no external function (what a module linking LTO-IR would).

    Raises:
        ExportError: the compile fails (NVRTC's log is in the message) or the PTX is incomplete.
    """
    lib, _ = _load(nvrtc.path)
    opts = nvrtc_options(options, arch, nvrtc.version)
    prog = ctypes.c_void_p()
    what = f"compiling {name} to PTX compute_{arch} with NVRTC {nvrtc.version_text} ({nvrtc.path}; {NVRTC_ENV})"
    r = lib.nvrtcCreateProgram(ctypes.byref(prog), source, f"{name}.cu".encode(), 0, None, None)
    if r != 0:
        raise ExportError(f"{what}: nvrtcCreateProgram: {lib.nvrtcGetErrorString(r).decode()}")
    try:
        array = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
        r = lib.nvrtcCompileProgram(prog, len(opts), array)
        if r != 0:
            size = ctypes.c_size_t()
            lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            log = ctypes.create_string_buffer(size.value)
            lib.nvrtcGetProgramLog(prog, log)
            errors = [line for line in log.value.decode(errors="replace").splitlines() if "error" in line]
            raise ExportError(f"{what} failed: {lib.nvrtcGetErrorString(r).decode()}: "
                              f"{' | '.join(errors[:5]) or log.value.decode(errors='replace')[-2000:]} "
                              f"(set {NVRTC_ENV}=off to keep Warp's PTX)")
        size = ctypes.c_size_t()
        lib.nvrtcGetPTXSize(prog, ctypes.byref(size))
        out = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetPTX(prog, out)
        ptx = out.raw.rstrip(b"\0") + b"\0"
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
    have, want = set(_ENTRY.findall(ptx)), set(_ENTRY.findall(reference))
    if have != want:
        raise ExportError(f"{what}: its PTX defines the entries {sorted(have)}, Warp's {sorted(want)}")
    if b".extern .func" in ptx and b".extern .func" not in reference:
        raise ExportError(f"{what}: its PTX calls external functions (link-time code such as MathDx); "
                          f"set {NVRTC_ENV}=off for this module")
    return ptx
