"""leapp/_export/ptx_isa.py: declare a module's PTX at an ISA that CUDA 12 drivers read, and prove it.

A driver JIT-compiles PTX only up to its own CUDA version's ISA, and Warp
1.19's NVRTC (CUDA 13.4) starts every PTX with ``.version 9.4``: a Jetson Orin
on JetPack 6 (CUDA 12.2 to 12.6 drivers, ISA 8.2 to 8.5) would load nothing
of a default export. That line is a declaration, not a property of the code:
the compute_75 PTX Warp's NVRTC writes holds the instructions an older NVRTC
writes, and an assembler checks every feature against the declared version
(ptxas: "Feature 'Type .b128' requires PTX ISA .version 8.3 or later"). So the
exporter declares ISA 8.0 (CUDA 12.0: read by every CUDA 12 and 13 driver)
and, where a ``ptxas`` is at hand, assembles the declared text for sm_75: when
ptxas names a newer version, that one is declared instead; when it refuses
the text for any other reason, the NVRTC's own version is kept and the export
warns. One feature is dropped rather than followed: ``.pragma
"used_bytes_mask N"`` (ISA 8.3, written before vector loads of tiles) only
tells the assembler which loaded bytes are used, so without it every byte is
used, which is always correct (LLVM's NVPTX backend drops it the same way for
older targets, and ptxas 12.2 ignores it). The result is part of the binary-cache key, so ptxas runs once per
module variant. docs/portability.md has the coverage this gives.

    LEAPP_PTX_ISA=8.0 (default) | X.Y   the ISA to declare (never above the NVRTC's own)
    LEAPP_PTX_ISA=keep                  keep the NVRTC's ``.version`` (9.4: drivers of CUDA 13.4 and later)
    LEAPP_PTXAS=/path/to/ptxas          the assembler that checks it (default: ``ptxas`` on PATH, then
                                        $CUDA_HOME/bin, /usr/local/cuda/bin, NVIDIA's nvcc pip wheel)
    LEAPP_PTXAS=off                     declare without checking
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import os
import re
import shutil
import subprocess
import tempfile
import warnings
from dataclasses import dataclass

from leapp.errors import ExportError

__all__ = ["ISA_ENV", "PTXAS_ENV", "Declaration", "declaration"]

ISA_ENV = "LEAPP_PTX_ISA"
PTXAS_ENV = "LEAPP_PTXAS"
DEFAULT_ISA = (8, 0)
_KEEP = ("keep", "off", "none", "nvrtc")
_VERSION_LINE = re.compile(rb"^(\s*\.version\s+)(\d+)\.(\d+)", re.MULTILINE)
_RELEASE = re.compile(r"release (\d+\.\d+)")
_ROUNDS = 4  # each round drops a hint or raises the declared version (never lowers it)
# Features that are hints only: ptxas's name for one -> the lines that carry it (dropped, not followed)
_HINTS = {"used_bytes_mask": ((8, 3), re.compile(rb'^[ \t]*\.pragma[ \t]+"used_bytes_mask[ \t]+\w+";[ \t]*\r?\n',
                                                re.MULTILINE))}
_FEATURE = re.compile(r"Feature '([^']+)' requires PTX ISA \.version (\d+)\.(\d+) or later")

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Ptxas:
    path: str
    release: str  # "13.0"

    @functools.cached_property
    def identity(self) -> str:
        st = os.stat(self.path)
        return f"ptxas {self.release} {st.st_size}:{st.st_mtime_ns}"


@dataclass(frozen=True)
class Declaration:
    """What the exporter does to the ``.version`` of the sm_75 PTX (read once per compile from the environment)."""

    isa: tuple[int, int] | None  # None: keep the NVRTC's
    ptxas: Ptxas | None

    @property
    def identity(self) -> str:
        """What the declared PTX depends on besides the NVRTC's text (part of the binary-cache key)."""
        if self.isa is None:
            return "ISA as written"
        return f"declared {_text(self.isa)}; " + (f"checked by {self.ptxas.identity}" if self.ptxas else "unchecked")

    @property
    def description(self) -> str:
        """For the bundle's ``producer.ptx_isa_check`` and ``leapp inspect``."""
        if self.isa is None:
            return f"the NVRTC's own ISA ({ISA_ENV}=keep)"
        if self.ptxas is None:
            return f"declared {_text(self.isa)}, not checked (no ptxas found; {PTXAS_ENV})"
        return (f"declared {_text(self.isa)} or the version ptxas {self.ptxas.release} required (hint pragmas of "
                f"newer ISAs dropped), checked by it for sm_75")

    def apply(self, ptx: bytes, name: str) -> bytes:
        """``ptx`` (NUL-terminated or not) with its ``.version`` declared as configured; NUL-terminated like Warp's.

        Raises:
            ExportError: the PTX has no ``.version`` line.
        """
        text = ptx.rstrip(b"\0")
        match = _VERSION_LINE.search(text[:4096])
        if match is None:
            raise ExportError(f"module {name}: its PTX has no .version line in its first 4096 bytes")
        written = (int(match.group(2)), int(match.group(3)))
        if self.isa is None or self.isa >= written:
            return text + b"\0"
        isa, body = self.isa, text
        if self.ptxas is None:
            return _declare(_drop_hints(body, [f for f, (since, _) in _HINTS.items() if since > isa]), isa) + b"\0"
        for _ in range(_ROUNDS):
            declared = _declare(body, isa)
            problem = _assemble(self.ptxas, declared)
            if not problem:
                if isa != self.isa or body is not text:
                    log.info("module %s: PTX declared ISA %s (asked %s; ptxas %s)%s", name, _text(isa),
                             _text(self.isa), self.ptxas.release, " without hint pragmas" if body is not text else "")
                return declared + b"\0"
            features = _FEATURE.findall(problem)
            hints = [f for f, _, _ in features if f in _HINTS]
            needed = [(int(a), int(b)) for f, a, b in features if f not in _HINTS]
            if hints and body is text:
                body = _drop_hints(body, hints)
                continue
            if not needed or max(needed) <= isa or max(needed) >= written:
                break
            isa = max(needed)
        warnings.warn(f"leapp: module {name}: ptxas {self.ptxas.release} refused its PTX declared at ISA "
                      f"{_text(isa)} ({_first_error(problem)}); the PTX keeps the NVRTC's ISA {_text(written)}, which "
                      f"drivers before CUDA {_text(_cuda_for(written))} cannot JIT (docs/portability.md)",
                      RuntimeWarning, stacklevel=2)
        return text + b"\0"


def declaration() -> Declaration:
    """The configuration of ``$LEAPP_PTX_ISA`` and ``$LEAPP_PTXAS`` (module docstring).

    Raises:
        ExportError: either variable has a value that names nothing usable.
    """
    raw = os.environ.get(ISA_ENV, "").strip()
    if raw.lower() in _KEEP:
        return Declaration(None, None)
    isa = DEFAULT_ISA
    if raw:
        m = re.fullmatch(r"(\d{1,2})\.(\d{1,2})", raw)
        if m is None or (int(m.group(1)), int(m.group(2))) < (6, 0):
            raise ExportError(f"{ISA_ENV}={raw!r}: expected a PTX ISA version such as 8.0 (at least 6.0), or 'keep'")
        isa = (int(m.group(1)), int(m.group(2)))
    return Declaration(isa, find_ptxas())


def find_ptxas() -> Ptxas | None:
    """The ptxas ``$LEAPP_PTXAS`` names, else the first found (module docstring); None when off or none."""
    raw = os.environ.get(PTXAS_ENV, "").strip()
    if raw.lower() in ("off", "0", "none"):
        return None
    if raw:
        found = _probe(raw)
        if found is None:
            raise ExportError(f"{PTXAS_ENV}={raw!r} is not a ptxas that runs ('{raw} --version' failed)")
        return found
    for path in _candidates():
        found = _probe(path)
        if found is not None:
            return found
    return None


def _candidates() -> list[str]:
    out = [shutil.which("ptxas") or ""]
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home:
            out.append(os.path.join(home, "bin", "ptxas"))
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec is not None else []:
        out += [os.path.join(root, "cuda_nvcc", "bin", "ptxas"), os.path.join(root, "cu13", "bin", "ptxas")]
    return [p for p in dict.fromkeys(out) if p and os.path.isfile(p)]


@functools.lru_cache(maxsize=None)
def _probe(path: str) -> Ptxas | None:
    try:
        r = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    m = _RELEASE.search(r.stdout)
    return Ptxas(os.path.realpath(path), m.group(1)) if r.returncode == 0 and m else None


def _drop_hints(text: bytes, features) -> bytes:
    for feature in features:
        text = _HINTS[feature][1].sub(b"", text)
    return text


def _declare(text: bytes, isa: tuple[int, int]) -> bytes:
    match = _VERSION_LINE.search(text[:4096])  # apply() found it in the same header
    return text[: match.start(2)] + _text(isa).encode() + text[match.end(3):]


def _assemble(ptxas: Ptxas, ptx: bytes) -> str:
    """ptxas's complaint about ``ptx`` assembled for sm_75, or "" when it assembles."""
    with tempfile.TemporaryDirectory(prefix="leapp-ptxas-") as tmp:
        source = os.path.join(tmp, "module.ptx")
        with open(source, "wb") as f:
            f.write(ptx)
        try:
            r = subprocess.run([ptxas.path, "-arch=sm_75", source, "-o", os.path.join(tmp, "module.cubin")],
                               capture_output=True, text=True, timeout=600, check=False)
        except (OSError, subprocess.SubprocessError) as e:
            return f"ptxas could not run: {e}"
    return "" if r.returncode == 0 else (r.stderr or r.stdout or f"exit status {r.returncode}")


def _first_error(log_text: str) -> str:
    lines = [ln.strip() for ln in log_text.splitlines() if "error" in ln.lower()]
    return (lines or [log_text.strip()[:300]])[0][:300]


def _text(isa: tuple[int, int]) -> str:
    return f"{isa[0]}.{isa[1]}"


def _cuda_for(isa: tuple[int, int]) -> tuple[int, int]:
    from leapp import _native  # the table of ISAs per CUDA version is the loader's

    need = _native.ptx_isa_min_driver(*isa)
    return (need // 1000, need % 1000 // 10) if need else isa
