"""leapp/_export/cuda_code.py: CUDA code of a Warp module variant, compiled without a GPU.

A bundle replays kernels through the CUDA driver, so export needs the exact
PTX/cubin of each module variant a segment launches. Warp's NVRTC compiles them
on machines without a driver. We compile one variant (module content + block_dim)
for PTX sm_75 plus cubins for sm_75/80/86/90/100/110/120 into a temporary
directory and read the files back. A segment that launches some of a module's
kernels gets a binary of just those (and the functions and structs they use):
Warp's codegen of the variant restricted to them, the same entry names, compiled
by the NVRTC call of ``nvrtc_worker``; where that call cannot build the module
(device code linked at build time, LLVM CUDA, extra include folders) the whole
module is compiled, as ``$LEAPP_BUNDLE_WHOLE_MODULES=1`` asks for every module. The targets compile concurrently (this
process and worker processes, one per CPU this process may use: NVRTC in Warp
compiles one program at a time per process), and every binary goes into the
persistent binary cache (``binary_cache``: the user's cache folder, keyed by
all that changes the bytes), where a later process finds it.

NOTE: never change ``wp.config`` or a user's module. Warp's private compile
path (``leapp._warp_private``: ``compile_module_variant`` with options resolved
per block_dim, copied with ``enable_backward=False``: a bundle replays forward
kernels only) builds one variant without touching module options, and
``preserved_module_state`` undoes the hash caches that hashing and building
leave on the module.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from dataclasses import dataclass, field

from leapp import _warp_private as wpp
from leapp._export import binary_cache, nvrtc_worker, ptx_compat, ptx_isa
from leapp.bundle.format import DEFAULT_CUBIN_ARCHS
from leapp.errors import ExportError

__all__ = [
    "KNOWN_CUBIN_ARCHS",
    "PTX_ARCH",
    "ARCHS_ENV",
    "JOBS_ENV",
    "WHOLE_MODULES_ENV",
    "CompiledModule",
    "cubin_archs",
    "whole_modules",
    "compile_module",
    "toolkit_version",
    "clear_cache",
]

PTX_ARCH = 75  # driver-JIT fallback for GPUs newer than every cubin
# DEFAULT_CUBIN_ARCHS: the cubins of a default export (leapp.bundle.format, docs/portability.md)
# Cubin targets $LEAPP_CUDA_ARCHS may name: the SM versions Warp 1.19's NVRTC compiles for (compile_module
# also checks the installed NVRTC's own list), e.g. "87,110" for an export that runs on Jetsons only.
KNOWN_CUBIN_ARCHS = (75, 80, 86, 87, 88, 89, 90, 100, 103, 107, 110, 120, 121)
JOBS_ENV = "LEAPP_NVRTC_JOBS"  # at most this many processes compile a module's targets (default: the CPUs usable)
ARCHS_ENV = "LEAPP_CUDA_ARCHS"  # e.g. "90" or "75,90": the cubins to build (tests, one-GPU exports); PTX sm_75 always
# "1": every bundle carries the whole module of each kernel it launches (leapp's behaviour before kernel subsets;
# for comparisons such as benchmarks/bundle_subset.py, and as a way back should a subset ever misbehave)
WHOLE_MODULES_ENV = "LEAPP_BUNDLE_WHOLE_MODULES"

log = logging.getLogger(__name__)

_PTX_VERSION = re.compile(rb"^\s*\.version\s+(\d+\.\d+)", re.MULTILINE)


@dataclass
class CompiledModule:
    """The CUDA code of one Warp module variant (module content, options, block_dim): of all its kernels, or of
    the ``kernels`` a segment launches (then ``entry`` knows only those)."""

    name: str  # "wp_<module>_<hash7>", as Warp names the variant's files
    module_hash: str  # full hex hash of the variant
    block_dim: int  # WP_TILE_BLOCK_DIM compiled in; launches must use it as blockDim.x
    ptx: dict[int, bytes]  # arch -> NUL-terminated PTX text
    cubins: dict[int, bytes]  # arch -> cubin image
    smem_bytes: dict[str, int]  # entry symbol -> dynamic shared memory bytes (the .meta file)
    ptx_isa: str  # ".version" of the PTX, e.g. "9.4"
    toolkit: str  # NVRTC / CUDA toolkit version, e.g. "13.4"
    ptx_toolkit: str = ""  # the NVRTC version that wrote the PTX: toolkit, or an older one (ptx_compat)
    ptx_isa_check: str = ""  # how its .version was declared (ptx_isa.Declaration.description)
    kernels: tuple[str, ...] = ()  # mangled names of the kernels asked for, sorted; () the whole module
    _kernel_names: weakref.WeakKeyDictionary = field(default_factory=weakref.WeakKeyDictionary, repr=False)

    def entry(self, kernel) -> str:
        """The exact forward entry symbol of ``kernel`` in this variant."""
        name = self._kernel_names.get(kernel)
        if name is None:
            raise ExportError(f"kernel '{kernel.key}' is not part of the compiled module {self.name}")
        return name + "_cuda_kernel_forward"

    def entry_smem(self, kernel) -> int:
        entry = self.entry(kernel)
        if entry not in self.smem_bytes:
            raise ExportError(f"module {self.name}: no shared-memory size for entry {entry} in its .meta file")
        return self.smem_bytes[entry]

    def binaries(self) -> list[tuple[str, int, bytes]]:
        """(kind, arch, bytes) in manifest order: PTX first, then cubins by arch."""
        out = [("ptx", arch, data) for arch, data in sorted(self.ptx.items())]
        out += [("cubin", arch, data) for arch, data in sorted(self.cubins.items())]
        return out


# (module name, module hash, block_dim, PTX compiler, kernels) -> every binary compiled so far for that variant
# (kernels: the sorted mangled names of a subset, () the whole module; one subset never serves another);
# (..., archs) -> the CompiledModule handed out for one set of cubin targets.
_store: dict[tuple, CompiledModule] = {}
_cache: dict[tuple, CompiledModule] = {}
_cache_lock = threading.Lock()


def clear_cache() -> None:
    """Forget compiled modules (tests; a long-lived process that exported many variants)."""
    with _cache_lock:
        _store.clear()
        _cache.clear()


def _warp():
    import warp

    wpp.require_supported_warp()
    warp.init()
    return warp


def toolkit_version() -> str:
    """NVRTC / CUDA toolkit version Warp compiles with, e.g. "13.4"."""
    _warp()
    tk = wpp.nvrtc_toolkit()
    if tk is None:
        raise ExportError("Warp was built without CUDA support (no NVRTC): cannot compile CUDA code for export")
    return f"{tk[0]}.{tk[1]}"


def cubin_archs() -> tuple[int, ...]:
    """Cubin targets: DEFAULT_CUBIN_ARCHS, or those $LEAPP_CUDA_ARCHS names (any of KNOWN_CUBIN_ARCHS)."""
    raw = os.environ.get(ARCHS_ENV, "").strip()
    if not raw:
        return DEFAULT_CUBIN_ARCHS
    try:
        archs = tuple(sorted({int(a.strip().removeprefix("sm_")) for a in raw.split(",") if a.strip()}))
    except ValueError:
        raise ExportError(f"{ARCHS_ENV}={raw!r}: expected comma-separated SM versions such as '75,90'") from None
    bad = [a for a in archs if a not in KNOWN_CUBIN_ARCHS]
    if bad or not archs:
        raise ExportError(f"{ARCHS_ENV}={raw!r}: each arch must be one of {list(KNOWN_CUBIN_ARCHS)}")
    return archs


def whole_modules() -> bool:
    """Whether ``$LEAPP_BUNDLE_WHOLE_MODULES`` asks for whole modules instead of the launched kernels."""
    value = os.environ.get(WHOLE_MODULES_ENV, "").strip().lower()
    if value in ("", "0", "false", "no", "off"):
        return False
    if value in ("1", "true", "yes", "on"):
        return True
    raise ExportError(f"{WHOLE_MODULES_ENV}={value!r}: expected 1 (bundles carry whole Warp modules) or 0 "
                      "(the default: only the kernels a segment launches)")


def compile_module(kernel, block_dim: int, archs: tuple[int, ...] | None = None,
                   kernels=None) -> CompiledModule:
    """Compile the module of ``kernel`` for CUDA at ``block_dim`` (cached per module hash, block_dim and kernels).

    Args:
        kernel: a (resolved, non-generic) ``wp.Kernel``.
        block_dim: the CUDA block size of the variant (Warp compiles it in).
        archs: cubin targets; default ``cubin_archs()``. PTX is always built for sm_75.
        kernels: the kernels of ``kernel``'s module to compile (it among them): what a segment launches at
            this block_dim. Default None: the whole module. Every kernel of the variant, or
            ``$LEAPP_BUNDLE_WHOLE_MODULES=1``, also compiles the whole module.

    Raises:
        ExportError: unsupported Warp, no NVRTC, a kernel option that cannot be
            exported (thread-block clusters, ``wp.config.cuda_arch_suffix``), or a
            compile failure (the NVRTC message is chained).
    """
    wp = _warp()
    archs = tuple(sorted(set(archs if archs is not None else cubin_archs())))
    if not 1 <= block_dim <= 1024:
        raise ExportError(f"kernel '{kernel.key}': block_dim {block_dim} is outside 1..1024")
    if wp.config.cuda_arch_suffix is not None:
        raise ExportError(
            f"wp.config.cuda_arch_suffix={wp.config.cuda_arch_suffix!r} builds architecture-specific code; "
            "leapp exports portable sm_75..sm_120 binaries: unset it before exporting"
        )
    if wpp.kernel_cluster_dim(kernel) > 1:
        raise ExportError(
            f"kernel '{kernel.key}' uses cluster_dim={wpp.kernel_cluster_dim(kernel)}: thread-block clusters "
            "need sm_90+ and cannot be exported with the sm_75 PTX fallback"
        )
    module = kernel.module
    toolkit = toolkit_version()
    compat = ptx_compat.compat_nvrtc()  # an older NVRTC for the PTX ($LEAPP_PTX_NVRTC), or None
    declared = ptx_isa.declaration()  # the PTX's .version as older drivers need it ($LEAPP_PTX_ISA)
    supported = wpp.nvrtc_supported_archs()
    missing = [a for a in (PTX_ARCH, *archs) if a not in supported]
    if missing:
        raise ExportError(f"Warp's NVRTC {toolkit} cannot target sm_{missing[0]} (supports {sorted(supported)})")

    with _cache_lock, wpp.preserved_module_state(module):
        module_hash = wpp.module_variant_hash(module, block_dim)
        names = wpp.kernel_variant_names(module, block_dim)
        for k in (kernel, *(kernels or ())):
            if k not in names or k.module is not module:
                raise ExportError(f"kernel '{k.key}' is not a live kernel of module '{module.name}'")
        subset = _subset(module, block_dim, names, kernels)
        variant = (module.name, module_hash, block_dim, compat.identity if compat else "", declared.identity, subset)
        compiled = _cache.get((*variant, archs))
        if compiled is not None:
            log.debug("module '%s' (%s, block_dim %d): compiled code reused", module.name, module_hash[:7], block_dim)
        else:
            store = _store.get(variant)
            missing = tuple(a for a in archs if store is None or a not in store.cubins)
            if store is None or missing:
                fresh = _compile_variant(module, block_dim, missing, module_hash, toolkit, ptx=store is None,
                                         compat=compat, declared=declared, subset=subset)
                if store is None:
                    store = _store[variant] = fresh
                store.cubins.update(fresh.cubins)
            else:
                log.debug("module '%s' (%s, block_dim %d): cubins %s reused", module.name, module_hash[:7],
                          block_dim, list(archs))
            compiled = dataclasses.replace(store, cubins={a: store.cubins[a] for a in archs})
            compiled._kernel_names = store._kernel_names
            _cache[(*variant, archs)] = compiled
        compiled._kernel_names.update({k: n for k, n in names.items() if not subset or n in subset})
        if wpp.needs_deterministic(kernel):
            raise ExportError(
                f"kernel '{kernel.key}' runs in Warp's deterministic mode (hidden reduction buffers); "
                "it cannot be exported: disable deterministic mode for this module"
            )
    return compiled


def _subset(module, block_dim: int, names: dict, kernels) -> tuple[str, ...]:
    """The sorted mangled names of ``kernels`` in the variant; () for the whole module (kernels None, all of the
    variant's kernels, or ``$LEAPP_BUNDLE_WHOLE_MODULES``)."""
    if kernels is None or whole_modules():
        return ()
    subset = tuple(sorted({names[k] for k in kernels}))
    return () if set(subset) == wpp.unique_kernel_names(module, block_dim) else subset


def _compile_variant(
    module, block_dim: int, archs: tuple[int, ...], module_hash: str, toolkit: str, ptx: bool = True,
    compat: ptx_compat.CompatNvrtc | None = None, declared: ptx_isa.Declaration | None = None,
    subset: tuple[str, ...] = (),
) -> CompiledModule:
    """The PTX (unless ``ptx`` is False) and the cubins of ``archs`` for one variant, of the kernels ``subset``
    names (() all): read from the binary cache (``binary_cache``) where it has them, the rest compiled
    concurrently and added to it."""
    options = wpp.export_options(module, block_dim)  # a copy, forward kernels only (backward is never replayed)
    name = wpp.module_identifier(module, block_dim)
    targets = [("ptx", PTX_ARCH)] * ptx + [("cubin", a) for a in archs]
    cache = binary_cache.default_cache()
    if cache is not None and options.get("extra_cuda_include_dirs"):
        log.debug("module '%s': extra_cuda_include_dirs are not part of Warp's hash, binary cache not used", module.name)
        cache = None
    declared = declared or ptx_isa.declaration()
    ptx_nvrtc = (f"{toolkit}; PTX by {compat.identity}" if compat else toolkit) + f"; {declared.identity}"
    keys = {t: _cache_key(module.name, module_hash, block_dim, ptx_nvrtc if t[0] == "ptx" else toolkit, *t,
                          kernels=subset) for t in targets} if cache else {}
    found = {}
    for t in keys:
        entry = cache.get(keys[t])
        if entry is not None:
            found[t] = entry
    missing = [t for t in targets if t not in found]
    start = time.perf_counter()
    fresh, processes = _compile_targets(module, options, name, block_dim, missing, compat, declared, subset)
    what = f"{len(subset)} launched kernel(s) of " if subset else ""
    if fresh:
        log.info("%smodule '%s' (%s, block_dim %d): compiled %s in %.2f s (%d process(es))%s", what, module.name,
                 module_hash[:7], block_dim, _names(fresh), time.perf_counter() - start, processes,
                 f"; {_names(found)} from the binary cache" if found else "")
    if found:
        log.info("%smodule '%s' (%s, block_dim %d): %s read from the binary cache %s", what, module.name,
                 module_hash[:7], block_dim, _names(found), cache.folder)
    if cache is not None and fresh:
        for t, entry in fresh.items():
            cache.put(keys[t], entry)
        cache.trim()
    entries = found | fresh

    ptx_text = {PTX_ARCH: entries[("ptx", PTX_ARCH)].payload.rstrip(b"\0") + b"\0"} if ptx else {}
    cubins = {a: entries[("cubin", a)].payload for a in archs}
    match = _PTX_VERSION.search(ptx_text[PTX_ARCH]) if ptx else None
    if ptx and match is None:
        raise ExportError(f"module {name}: the sm_{PTX_ARCH} PTX has no .version line")
    smem = dict(entries[targets[0]].meta) if targets else {}
    return CompiledModule(
        name=name, module_hash=module_hash, block_dim=block_dim, ptx=ptx_text, cubins=cubins, smem_bytes=smem,
        ptx_isa=match.group(1).decode() if match else "", toolkit=toolkit,
        ptx_toolkit=(compat.version_text if compat else toolkit) if ptx else "", kernels=subset,
        ptx_isa_check=declared.description if ptx else "",
    )


def _names(entries) -> str:
    return ", ".join(f"{'PTX' if kind == 'ptx' else 'cubin'} sm_{arch}" for kind, arch in entries)


def _threads(count: int) -> int:
    """Processes that compile ``count`` targets: one per target, at most one per CPU this process may use and
    at most ``$LEAPP_NVRTC_JOBS`` (1: every target in the exporting process)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        cpus = os.cpu_count() or 1
    raw = os.environ.get(JOBS_ENV, "").strip()
    if raw:
        try:
            cpus = min(cpus, int(raw))
            if cpus < 1:
                raise ValueError
        except ValueError:
            raise ExportError(f"{JOBS_ENV}={raw!r}: expected a number of processes >= 1") from None
    return max(1, min(count, cpus))


WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "nvrtc_worker.py")
WORKER_TIMEOUT_S = 1800  # one NVRTC target of a large module takes minutes at most


def _compile_targets(module, options: dict, name: str, block_dim: int, targets: list[tuple[str, int]],
                     compat: ptx_compat.CompatNvrtc | None = None, declared: ptx_isa.Declaration | None = None,
                     subset: tuple[str, ...] = ()) -> tuple[dict, int]:
    """((kind, arch) -> binary_cache.Entry, processes used), compiled by Warp's NVRTC, each target in its own
    temporary folder.

    NVRTC inside Warp compiles one program at a time per process (threads calling it finish one after
    another), so the targets are split into one share per usable CPU: this process compiles the first
    share (the PTX first), and each other share runs in a worker process (``nvrtc_worker.py``: warp.so
    through ctypes, the call Warp's ``build_cuda`` makes, on the source Warp's codegen generated here).
    The whole module compiles here through Warp's own ``Module._compile``; a ``subset`` of its kernels,
    which ``Module._compile`` cannot generate alone, through the worker's NVRTC call made in this process.
    Modules that call cannot build (``_warp_private.nvrtc_job`` returns None: LTO-IR, LLVM CUDA, extra
    include folders) compile whole, every target here, one after another, as on one-CPU machines. The
    caller holds ``_cache_lock`` and ``preserved_module_state``, so no other leapp compile touches the module
    meanwhile. With ``compat``, the PTX is then compiled again from the generated ``.cu`` by that older
    NVRTC (``ptx_compat``), and its ``.version`` declared as ``declared`` says (``ptx_isa``).
    """
    declared = declared or ptx_isa.declaration()
    if not targets:
        return {}, 0
    targets = sorted(targets, key=lambda t: t[0] != "ptx")  # the PTX (and its compat step) stays here
    jobs = _subset_jobs(module, options, name, block_dim, targets, subset) if subset else {}
    by_call = bool(jobs)  # the subset's codegen compiled by the NVRTC call, here too; else Module._compile here
    with tempfile.TemporaryDirectory(prefix="leapp-cuda-") as tmp:

        def here(target: tuple[str, int]) -> binary_cache.Entry:
            kind, arch = target
            out_dir = os.path.join(tmp, f"{kind}{arch}", name)
            start = time.perf_counter()
            if by_call:
                entry = _nvrtc_here(module, out_dir, name, block_dim, target, jobs[target], options, compat,
                                    declared)
                log.debug("module '%s': %s sm_%d of %d kernel(s) built in %.3f s (codegen before, NVRTC in this "
                          "process)", module.name, "PTX" if kind == "ptx" else "cubin", arch, len(subset),
                          time.perf_counter() - start)
                return entry
            try:
                wpp.compile_module_variant(module, options, out_dir, arch, kind == "ptx")
            except Exception as e:
                raise _compile_error(module, name, block_dim, target, e) from e
            log.debug("module '%s': %s sm_%d built in %.3f s (codegen + NVRTC, in this process)", module.name,
                      "PTX" if kind == "ptx" else "cubin", arch, time.perf_counter() - start)
            meta = json.loads(_read(out_dir, f"{name}.meta").decode("utf-8"))
            payload = _read(out_dir, f"{name}.sm{arch}.{kind}")
            if kind == "ptx":
                payload = _final_ptx(payload, _read(out_dir, f"{name}.cu"), name, options, compat, declared)
            return binary_cache.Entry(payload, _smem(meta))

        shares = _threads(len(targets))
        if shares > 1 and sys.executable and not jobs:
            for target in targets[1:]:
                job = wpp.nvrtc_job(module, options, target[1], target[0] == "ptx")
                if job is None:
                    log.debug("module '%s': %s cannot be compiled in a worker process; compiling here", module.name,
                              _names([target]))
                    jobs = {}
                    break
                jobs[target] = job
        if shares == 1 or not sys.executable or not jobs:
            return {t: here(t) for t in targets}, 1
        local = targets[::shares]
        workers = []
        try:
            for i in range(1, shares):
                share = targets[i::shares]
                try:
                    workers.append(_start_worker(tmp, i, name, share, jobs))
                except OSError as e:  # no process could be started here: this process compiles that share
                    log.warning("module '%s': could not start an NVRTC worker process (%s); compiling %s here",
                                module.name, e, _names(share))
                    local = local + share
            out = {t: here(t) for t in local}
            for worker in workers:
                out.update(_finish_worker(worker, module, name, block_dim, jobs))
        finally:
            for worker in workers:
                if worker["process"].poll() is None:
                    worker["process"].kill()
                    worker["process"].wait()
                worker["log"].close()
        return out, 1 + len(workers)


def _subset_jobs(module, options: dict, name: str, block_dim: int, targets: list[tuple[str, int]],
                 subset: tuple[str, ...]) -> dict:
    """target -> ``nvrtc_job`` of the ``subset`` kernels, or {} when the NVRTC call cannot build the module: it
    is then compiled whole (logged at DEBUG with the reason)."""
    jobs = {}
    for kind, arch in targets:
        job = wpp.nvrtc_job(module, options, arch, kind == "ptx", frozenset(subset))
        if job is None:
            why = wpp.nvrtc_refusal(options) or "it links device code at build time (MathDx LTO-IR or fatbins)"
            log.debug("module '%s' (%s, block_dim %d): compiling the whole module, not just the %d launched "
                      "kernel(s): %s, which only Warp's own build handles", module.name, name, block_dim,
                      len(subset), why)
            return {}
        jobs[(kind, arch)] = job
    return jobs


def _nvrtc_here(module, out_dir: str, name: str, block_dim: int, target: tuple[str, int], job: dict,
                options: dict, compat: ptx_compat.CompatNvrtc | None,
                declared: ptx_isa.Declaration) -> binary_cache.Entry:
    """One target of ``job`` compiled in this process by the worker's NVRTC call (``nvrtc_worker``)."""
    kind, arch = target
    (entry,) = _job_targets(out_dir, name, [target], {target: job})
    results, ok = nvrtc_worker.compile_targets({"library": wpp.native_library_path(), "targets": [entry]})
    if not ok:
        raise _compile_error(module, name, block_dim, target, f"NVRTC error {results[0]['error']} in this process "
                             "(NVRTC printed its log to this process's output)")
    payload = _read(out_dir, f"{name}.sm{arch}.{kind}")
    if kind == "ptx":
        payload = _final_ptx(payload, job["source"].encode("utf-8"), name, options, compat, declared)
    return binary_cache.Entry(payload, _smem(job["meta"]))


def _final_ptx(ptx: bytes, source: bytes, name: str, options: dict, compat: ptx_compat.CompatNvrtc | None,
               declared: ptx_isa.Declaration) -> bytes:
    """The sm_75 PTX a bundle carries: Warp's, or ``compat``'s from the same ``source``, its ISA declared."""
    if compat is not None:
        ptx = ptx_compat.compile_ptx(compat, source, name, options, PTX_ARCH, ptx)
    return declared.apply(ptx, name)


def _smem(meta: dict) -> dict[str, int]:
    return {k.removesuffix("_smem_bytes"): int(v) for k, v in meta.items() if k.endswith("_smem_bytes")}


def _compile_error(module, name: str, block_dim: int, target: tuple[str, int], why) -> ExportError:
    kind, arch = target
    return ExportError(f"compiling Warp module '{module.name}' ({name}, block_dim={block_dim}) "
                       f"to {'PTX' if kind == 'ptx' else 'cubin'} sm_{arch} failed: {why}")


def _job_targets(folder: str, name: str, share: list[tuple[str, int]], jobs: dict) -> list[dict]:
    """The ``nvrtc_worker`` targets of ``share``, their sources written under ``folder``, outputs in it."""
    os.makedirs(folder, exist_ok=True)
    entries, sources = [], {}
    for kind, arch in share:
        job = jobs[(kind, arch)]
        source = sources.get(job["source"])
        if source is None:  # one file per distinct source (all targets share one unless codegen is per arch)
            source = sources[job["source"]] = os.path.join(folder, f"src{len(sources)}", job["program"])
            os.makedirs(os.path.dirname(source))
            with open(source, "w", encoding="utf-8") as f:
                f.write(job["source"])
        entries.append({**job["args"], "source": source, "program": job["program"],
                        "output": os.path.join(folder, f"{name}.sm{arch}.{kind}")})
    return entries


def _start_worker(tmp: str, index: int, name: str, share: list[tuple[str, int]], jobs: dict) -> dict:
    """Writes the sources and the job file of one share and starts its worker process."""
    folder = os.path.join(tmp, f"worker{index}")
    entries = _job_targets(folder, name, share, jobs)
    job_file = os.path.join(folder, "job.json")
    with open(job_file, "w", encoding="utf-8") as f:
        json.dump({"library": wpp.native_library_path(), "results": os.path.join(folder, "results.json"),
                   "targets": entries}, f)
    log_file = open(os.path.join(folder, "log.txt"), "wb")  # noqa: SIM115 - closed in _finish_worker
    try:
        process = subprocess.Popen([sys.executable, "-I", "-S", WORKER, job_file], stdin=subprocess.DEVNULL,
                                   stdout=log_file, stderr=subprocess.STDOUT, cwd=folder)
    except OSError:
        log_file.close()
        raise
    return {"process": process, "folder": folder, "share": share, "log": log_file, "entries": entries}


def _finish_worker(worker: dict, module, name: str, block_dim: int, jobs: dict) -> dict:
    """Waits for a worker and reads its binaries; ExportError naming the target and NVRTC's output on failure."""
    process, folder, share = worker["process"], worker["folder"], worker["share"]
    try:
        status = process.wait(timeout=WORKER_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        status = None
    finally:
        worker["log"].close()
    with open(os.path.join(folder, "log.txt"), "rb") as f:
        output = f.read().decode("utf-8", errors="replace").strip()
    try:
        with open(os.path.join(folder, "results.json"), encoding="utf-8") as f:
            results = json.load(f)["targets"]
    except (OSError, ValueError, KeyError):
        results = []
    out = {}
    for target, result in zip(share, results):
        if result.get("error"):
            raise _compile_error(module, name, block_dim, target, f"NVRTC error {result['error']} in a worker "
                                 f"process: {output[-4000:] or 'no output'}")
        kind, arch = target
        log.debug("module '%s': %s sm_%d built in %.3f s (NVRTC, worker process %d)", module.name,
                  "PTX" if kind == "ptx" else "cubin", arch, result["seconds"], process.pid)
        out[target] = binary_cache.Entry(_read(folder, f"{name}.sm{arch}.{kind}"), _smem(jobs[target]["meta"]))
    if len(out) != len(share):
        missing = [t for t in share if t not in out]
        why = "timed out" if status is None else f"exit status {status}"
        raise _compile_error(module, name, block_dim, missing[0], f"the worker process ({WORKER}) {why} without "
                             f"a result: {output[-4000:] or 'no output'}")
    return out


@functools.cache
def _warp_native() -> str:
    st = os.stat(wpp.native_library_path())
    return f"{st.st_size}:{st.st_mtime_ns}"


def _cache_key(module: str, module_hash: str, block_dim: int, toolkit: str, kind: str, arch: int,
               kernels: tuple[str, ...] = ()):
    from leapp.bundle.format import FORMAT_VERSION

    return binary_cache.CacheKey(
        warp=wpp.installed_warp_version(), warp_native=_warp_native(), nvrtc=toolkit, module=module,
        module_hash=module_hash, block_dim=block_dim, kind=kind, arch=arch, bundle_format=FORMAT_VERSION,
        overrides=json.dumps(wpp.EXPORT_OPTION_OVERRIDES, sort_keys=True, separators=(",", ":")),
        kernels=",".join(kernels),
    )


def _read(directory: str, filename: str) -> bytes:
    path = os.path.join(directory, filename)
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        have = sorted(os.listdir(directory)) if os.path.isdir(directory) else []
        raise ExportError(f"Warp did not write {filename} (found {have})") from None
