"""leapp/_warp_private.py: every use of Warp's private API, and the Warp release it was written against.

leapp relies on parts of Warp 1.19 that are not public: ``warp._src`` types,
module hashers and ``Module._compile``, the APIC capture's region table, the
tape's ``record_launch`` hook and the way ``wp.from_torch`` arrays keep their
storage. They are gathered here so that a Warp upgrade is one file to review
(docs/warp-internals.md says what each one is relied on for), and ruff's
banned-api rule keeps ``warp._src`` out of every other module.

NOTE: warp is imported inside the functions, not at module scope, so the
exporter and the ``.wrp`` tools stay importable on machines without Warp.
NOTE: nothing here writes ``wp.config`` or a user's module options;
``preserved_module_state`` undoes the caches hashing and compiling leave.
"""

from __future__ import annotations

import contextlib
import os
import functools
import threading
from collections.abc import Iterator

from leapp.errors import ExportError

__all__ = [
    "SUPPORTED_WARP_SERIES",
    "installed_warp_version",
    "require_supported_warp",
    "is_struct_type",
    "scalar_types",
    "kernel_args",
    "written_args",
    "array_base",
    "views_torch_storage",
    "launch_observer",
    "recorded_launch_observer",
    "recorded_launch_args",
    "apic_regions",
    "apic_transient_regions",
    "clamp_apic_region",
    "apic_kernels",
    "nvrtc_toolkit",
    "native_library_path",
    "nvrtc_supported_archs",
    "kernel_cluster_dim",
    "preserved_module_state",
    "module_variant_hash",
    "kernel_variant_names",
    "unique_kernel_names",
    "hashed_variant_hash",
    "hashed_variant_name",
    "module_identifier",
    "resolved_options",
    "EXPORT_OPTION_OVERRIDES",
    "export_options",
    "compile_module_variant",
    "nvrtc_refusal",
    "nvrtc_job",
    "native_include_dir",
    "cpu_codegen",
    "mathdx_enabled",
    "needs_deterministic",
    "uses_tiles",
    "expected_arg_size",
    "kernel_ssa",
]

SUPPORTED_WARP_SERIES = "1.19"  # the release series every private use below was checked against (pinned: 1.19.0)


# ---------------------------------------------------------------- version


def installed_warp_version() -> str:
    import warp

    return warp.__version__


def require_supported_warp() -> str:
    """The installed Warp version; raises a clear error for any release but 1.19.x."""
    version = installed_warp_version()
    if ".".join(str(version).split(".")[:2]) != SUPPORTED_WARP_SERIES:
        raise ExportError(
            f"leapp exports Warp segments with warp-lang {SUPPORTED_WARP_SERIES}.x only, but warp-lang {version} is "
            f"installed; install warp-lang=={SUPPORTED_WARP_SERIES}.* to export"
        )
    return version


# ---------------------------------------------------------------- types and kernels


def is_struct_type(t) -> bool:
    """Whether ``t`` is a ``@wp.struct`` type."""
    import warp._src.codegen as codegen

    return isinstance(t, codegen.Struct)


def scalar_types():
    """Warp's scalar types (float16..float64, int8..uint64), without ``wp.bool``."""
    import warp._src.types as wt

    return wt.scalar_types


def kernel_args(kernel) -> list:
    """The kernel's parameters (``.label``, ``.type``), in launch order."""
    return kernel.adj.args


def written_args(kernel, block_dim: int) -> set[int]:
    """Indices of the kernel's parameters its code writes (array elements, also through @wp.func calls and
    struct fields).

    Warp's codegen marks written array arguments (``Var.is_write``) only when the builder option
    ``verify_autograd_array_access`` is on, so the kernel's module is code-generated once more here with
    that option in leapp's own copy of the options (CPU target, nothing compiled; ``wp.config`` and the
    module's options are not touched, its caches are restored, the verifier's warnings are dropped). The
    result is the same for every kernel of a module and is cached per module variant.
    """
    import warnings

    module = kernel.module
    with _WRITTEN_LOCK, preserved_module_state(module):  # two tracing threads must not interleave the restore
        key = (id(module), module_variant_hash(module, block_dim))
        cached = _WRITTEN.get(key)
        if cached is None or cached[0] is not module:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                module._run_codegen(resolved_options(module, block_dim) | {"verify_autograd_array_access": True},
                                    True)
            kernels = [o for k in module._get_live_kernels()
                       for o in (k.overloads.values() if getattr(k, "is_generic", False) else (k,))]
            cached = _WRITTEN[key] = (module, {k: {i for i, a in enumerate(k.adj.args) if a.is_write}
                                               for k in kernels})
    return cached[1].get(kernel, set())  # a kernel codegen did not build: its writes are seen by value only


_WRITTEN: dict = {}  # (id(module), variant hash) -> (module, {kernel: written parameter indices})
_WRITTEN_LOCK = threading.Lock()


def needs_deterministic(kernel) -> bool:
    """Whether the kernel's last build runs in deterministic mode (hidden reduction buffers)."""
    meta = getattr(kernel.adj, "det_meta", None)
    return bool(meta is not None and getattr(meta, "needs_deterministic", False))


def uses_tiles(kernel) -> bool:
    """Whether the kernel's last build used tile values (their semantics depend on block_dim)."""
    import warp._src.codegen as codegen
    import warp._src.types as wt

    for var in getattr(kernel.adj, "variables", ()):
        t = codegen.strip_reference(var.type)
        if wt.is_tile(t):
            return True
    return False


def expected_arg_size(arg_type) -> int | None:
    """Bytes Warp passes for a kernel argument of Warp type ``arg_type`` (None when unknown).

    Used to check recorded argument blobs before they are packed into a bundle.
    """
    import ctypes

    import warp._src.codegen as codegen
    import warp._src.types as wt

    if wt.matches_array_class(arg_type, wt.indexedarray):
        return ctypes.sizeof(wt.indexedarray_t)
    if wt.matches_array_class(arg_type, wt.array):
        return ctypes.sizeof(wt.array_t)
    if isinstance(arg_type, codegen.Struct):
        return ctypes.sizeof(arg_type.ctype)
    if arg_type is bool:
        return ctypes.sizeof(ctypes.c_bool)
    try:
        return wt.type_size_in_bytes(arg_type)
    except Exception:  # noqa: BLE001 - exotic types (fabric arrays, ...) are checked by Warp itself
        return None


# ---------------------------------------------------------------- arrays


def views_torch_storage(arr) -> bool:
    """Whether a Warp array views a torch storage (made by ``wp.from_torch``)."""
    return getattr(arr, "_storage_base_ptr", None) is not None


def array_base(arr) -> tuple[object, int, int]:
    """(base array, base pointer, capacity) the way APIC keys a region.

    Mirrors ``APICapture._find_base`` of Warp 1.19: arrays made by
    ``wp.from_torch`` carry the torch storage's base pointer and size.
    """
    base = arr
    while getattr(base, "_ref", None) is not None and hasattr(base._ref, "ptr"):
        base = base._ref
    ptr = base._storage_base_ptr if views_torch_storage(base) else base.ptr
    capacity = base._storage_nbytes if getattr(base, "_storage_nbytes", None) is not None else base.capacity
    return base, ptr, capacity


# ---------------------------------------------------------------- launches and APIC captures


@functools.cache
def _launch_observer_class():
    import warp as wp

    class LaunchObserver(wp.Tape):
        """A ``wp.Tape`` that records nothing for autodiff; it reports each ``wp.launch``."""

        def __init__(self, on_launch) -> None:
            super().__init__()
            self._on_launch = on_launch

        def record_launch(self, kernel, dim, max_blocks, inputs, outputs, device, block_dim=0, metadata=None):
            caller = (metadata or {}).get("caller") or {}
            self._on_launch(kernel, device, block_dim, caller.get("file", "<unknown>"), caller.get("lineno", 0),
                            inputs, outputs)

        def record_func(self, backward, arrays):  # wp.copy's adjoint; inference needs none
            return None

    return LaunchObserver


def launch_observer(on_launch):
    """A tape to enter around Warp work: ``on_launch(kernel, device, block_dim, file, line, inputs, outputs)``
    is called for every ``wp.launch`` while it is active.

    Warp calls ``record_launch`` on the active tape (``runtime.tape``) for each
    launch, with the caller's file and line in ``metadata`` (Warp 1.19's hook).
    """
    return _launch_observer_class()(on_launch)


class _RecordedLaunchProfile:
    """A per-thread profile function that reports calls of ``wp.Launch.launch`` and ``wp.copy`` (see below)."""

    def __init__(self, on_launch, on_copy=None) -> None:
        import warp as wp

        self._code = wp.Launch.launch.__code__
        self._copy_code = wp.copy.__code__
        self._on_launch = on_launch
        self._on_copy = on_copy
        self._previous = None

    def __call__(self, frame, event, arg):
        if event != "call":
            return
        if frame.f_code is self._code:
            launch = frame.f_locals.get("self")
            caller = frame.f_back
            self._on_launch(launch, caller.f_code.co_filename if caller else "<unknown>",
                            caller.f_lineno if caller else 0)
        elif frame.f_code is self._copy_code and self._on_copy is not None:
            local = frame.f_locals  # one mapping: a second read would refresh it from the frame
            caller = frame.f_back
            done = self._on_copy(local.get("dest"), local.get("src"), local.get("dest_offset"),
                                 local.get("src_offset"), local.get("count"), local.get("stream"),
                                 caller.f_code.co_filename if caller else "<unknown>", caller.f_lineno if caller else 0)
            if done:
                _skip_copy(local)

    def __enter__(self):
        import sys

        self._previous = sys.getprofile()
        if self._previous is None:  # a profiler of the user's is left alone (the launch is then refused later)
            sys.setprofile(self)
        return self

    def __exit__(self, *exc) -> None:
        import sys

        if self._previous is None and sys.getprofile() is self:
            sys.setprofile(None)


def _skip_copy(local) -> None:
    """Turn the ``wp.copy`` call being entered into one that returns at once: its source becomes an empty array
    and its count 0, and Warp 1.19's ``copy`` returns when ``count`` is 0 and the source has no element (before
    anything touches memory or the capture). Written through the frame's locals, which CPython writes back to the
    frame when a profile function returns (3.10-3.12; a write-through view since 3.13): this one call of this
    thread only."""
    import warp as wp

    dest = local.get("dest")
    local["src"] = wp.empty(0, dtype=dest.dtype, device=dest.device)
    local["count"] = 0
    local["src_offset"] = 0
    local["dest_offset"] = 0


def recorded_launch_observer(on_launch, on_copy=None):
    """A context manager that reports ``Launch.launch()`` calls of this thread: ``on_launch(launch, file, line)``;
    and, with ``on_copy``, ``wp.copy`` calls: ``on_copy(dest, src, dest_offset, src_offset, count, stream, file,
    line)``, which returns True when it made the copy itself (Warp's call then does nothing).

    ``wp.launch(..., record_cmd=True)`` returns a ``wp.Launch`` and its ``launch()`` goes straight to the
    native launcher, past the tape ``launch_observer`` uses (launch caches such as Isaac Lab's do this). A
    profile function (``sys.setprofile``: this thread only, removed on exit) sees those calls; the
    ``wp.Launch`` attributes read are ``kernel``, ``device``, ``block_dim`` and ``fwd_args`` (Warp 1.19).
    ``wp.copy`` is seen the same way (its parameters ``dest``, ``src``, ``dest_offset``, ``src_offset``,
    ``count``, ``stream``): Warp's capture refuses copies between non-contiguous arrays, which leapp records as a
    copy kernel of its own (leapp/_recorder/strided_copy.py).
    """
    return _RecordedLaunchProfile(on_launch, on_copy)


def recorded_launch_args(launch) -> list | None:
    """The argument values a ``wp.Launch`` was recorded with (inputs then outputs), or None when Warp kept
    none (its parameters were set by index): Warp's capture then cannot record the launch."""
    args = getattr(launch, "fwd_args", None)
    return None if args is None else list(args)


def apic_regions(graph) -> dict[int, tuple[int, int, object]]:
    """region id -> (base pointer, capacity, base array) of an APIC-captured graph (largest capacity per id)."""
    regions: dict[int, tuple[int, int, object]] = {}
    for region_id, ptr, capacity, base in graph._apic_capture._regions.values():
        if region_id not in regions or capacity > regions[region_id][1]:
            regions[region_id] = (ptr, capacity, base)
    return regions


def clamp_apic_region(graph, region_id: int, capacity: int) -> None:
    """Shrink the capacity a capture records for one region before ``wp.capture_save`` snapshots it.

    A view made with ``wp.array(ptr=..., shape, strides)`` gets ``shape[0] * strides[0]`` bytes as its
    capacity, which for a column view reaches past the end of the allocation it views: the snapshot's
    device-to-host copy then fails on CUDA (and reads past the buffer on the CPU). Only leapp's own capture
    object is changed (``APICapture._regions``, read by ``capture_save``), before it is saved.
    """
    regions = graph._apic_capture._regions
    for key, (rid, ptr, cap, base) in list(regions.items()):
        if rid == region_id and cap > capacity:
            regions[key] = (rid, ptr, capacity, base)


def apic_transient_regions(graph):
    """Ids of the regions APIC saw allocated and freed inside the capture."""
    return graph._apic_capture._transient_regions


def apic_kernels(graph) -> Iterator[tuple[str, int]]:
    """(kernel key, block_dim) of each module variant an APIC-captured graph launches."""
    for info in graph._apic_capture.collected_kernels.values():
        yield info["kernel_key"], int(info["block_dim"])


# ---------------------------------------------------------------- compiling module variants


def _context():
    import warp._src.context as ctx

    return ctx


def nvrtc_toolkit() -> tuple[int, int] | None:
    """(major, minor) of the CUDA toolkit Warp's NVRTC compiles with; None when Warp has no CUDA."""
    return _context().runtime.toolkit_version


def native_library_path() -> str:
    """Path of Warp's native library (warp.so: codegen runtime and the NVRTC it compiles with)."""
    return _context().runtime.core._name


def nvrtc_supported_archs():
    return _context().runtime.nvrtc_supported_archs


def kernel_cluster_dim(kernel) -> int:
    return _context()._get_kernel_cluster_dim(kernel)


@contextlib.contextmanager
def preserved_module_state(module):
    """Undo the variant caches that hashing/compiling a block_dim variant leaves on a module.

    Hashing a variant caches a ``ModuleHasher`` on the module and building it
    sets each kernel's hash and mangled name; exactly that state is restored.
    """
    hashers = dict(module.hashers)
    resolved = dict(module.resolved_options)
    unresolved = module.has_unresolved_static_expressions
    failed = dict(module.failed_builds)
    kernels = [(k, k._hash, k._mangled_name) for k in module._get_live_kernels()]
    try:
        yield
    finally:
        module.hashers.clear()
        module.hashers.update(hashers)
        module.resolved_options.clear()
        module.resolved_options.update(resolved)
        module.has_unresolved_static_expressions = unresolved
        module.failed_builds.clear()
        module.failed_builds.update(failed)
        for k, h, mangled in kernels:
            k._hash = h
            k._mangled_name = mangled


def module_variant_hash(module, block_dim: int) -> str:
    """Hex hash of the module's ``block_dim`` variant; hashes it (use inside ``preserved_module_state``)."""
    return module.get_module_hash(block_dim).hex()


def kernel_variant_names(module, block_dim: int) -> dict:
    """kernel -> mangled name in the module's ``block_dim`` variant (after ``module_variant_hash``)."""
    return {k: k.get_mangled_name(kernel_hash=h) for k, h in module.hashers[block_dim].kernel_hashes.items()}


def unique_kernel_names(module, block_dim: int) -> set[str]:
    """Mangled names of the kernels Warp's codegen builds for the variant (the hasher's ``unique_kernels``:
    live kernels, overloads of generic ones, duplicates once); hash the variant first."""
    return {k.get_mangled_name(kernel_hash=h) for h, k in module.hashers[block_dim].unique_kernels.items()}


def hashed_variant_hash(kernel, block_dim: int) -> str | None:
    """Hex hash of a module variant Warp already hashed (None when it never did: no side effects)."""
    hasher = kernel.module.hashers.get(block_dim)
    return hasher.get_hash().hex() if hasher is not None else None


def hashed_variant_name(kernel, block_dim: int) -> str | None:
    """The kernel's mangled name in a variant Warp already hashed (None when it never did)."""
    hasher = kernel.module.hashers.get(block_dim)
    h = hasher.kernel_hashes.get(kernel) if hasher is not None else None
    return kernel.get_mangled_name(kernel_hash=h) if h is not None else None


def module_identifier(module, block_dim: int) -> str:
    """"wp_<module>_<hash7>": the stem of the variant's compiled files."""
    return module.get_module_identifier(block_dim=block_dim)


def resolved_options(module, block_dim: int) -> dict:
    """The module's options for one ``block_dim`` variant, resolved against ``wp.config`` (a copy: nothing is set)."""
    import warp

    return module.resolve_options(warp.config, block_dim=block_dim)


# What leapp's own copy of a variant's options changes before compiling it for a bundle:
# - enable_backward=False: the backward (adjoint) kernels are never replayed, and without them every binary
#   is about half the size. Codegen reads the option (``ModuleBuilder.build_kernel``: ``options |
#   kernel.options``, so a kernel declared with its own ``enable_backward=True`` keeps its adjoint); the
#   mangled names come from the variant's cached hasher (``module.hashers[block_dim]``, built with the
#   module's real options), so the forward entry symbols, the module identifier and the ``.meta`` smem keys
#   of forward kernels stay exactly Warp's.
# - use_precompiled_headers=False: NVRTC 13's precompiled header is built per target arch and process, and
#   an export compiles each arch once, so it only costs: 0.55 s per target with it, 0.39 s without (gravity
#   segment, one CPU); the binaries are byte-identical (measured for PTX and cubins, tile kernels included).
EXPORT_OPTION_OVERRIDES: dict = {"enable_backward": False, "use_precompiled_headers": False}


def export_options(module, block_dim: int) -> dict:
    """``resolved_options`` with ``EXPORT_OPTION_OVERRIDES`` applied: a new dict; the module and ``wp.config``
    are untouched. Hash the variant first (``module_variant_hash``) so codegen reuses that hasher's names."""
    return {**resolved_options(module, block_dim), **EXPORT_OPTION_OVERRIDES}


def compile_module_variant(module, options: dict, out_dir: str, arch: int, use_ptx: bool) -> None:
    """Compile one variant (``resolved_options``) into ``out_dir`` as PTX or a cubin for ``arch``."""
    module._compile(None, out_dir, output_arch=arch, use_ptx=use_ptx, options=options)


def nvrtc_refusal(options: dict) -> str:
    """Why a variant with these (resolved) options cannot be compiled by the plain ``wp_cuda_compile_program``
    call ``nvrtc_job`` describes ("" when it can); device code linked at build time shows only in codegen's
    output, so ``nvrtc_job`` also returns None for it."""
    import warp

    if options.get("llvm_cuda"):
        return "it is compiled by the LLVM CUDA path (llvm_cuda)"
    if options.get("extra_cuda_include_dirs"):
        return "it has extra_cuda_include_dirs"
    if warp.config.cuda_arch_suffix:
        return "wp.config.cuda_arch_suffix is set"
    if options.get("use_precompiled_headers") and _context().runtime.get_nvrtc_pch_dir() is not None:
        return "it uses a precompiled-header folder (NVRTC before 13)"
    return ""


class _KernelSubset:
    """A variant's cached ``ModuleHasher`` seen through some of its kernels: the two things ``ModuleBuilder``
    reads of a hasher (``unique_kernels``, ``get_unique_kernels()``), restricted to those kernels. The hashes,
    hence the mangled names, stay the variant's; the builder then generates those kernels and the
    ``@wp.func`` functions and structs they use, nothing else."""

    def __init__(self, hasher, names: frozenset[str]) -> None:
        self.unique_kernels = {h: k for h, k in hasher.unique_kernels.items()
                               if k.get_mangled_name(kernel_hash=h) in names}
        missing = names - {k.get_mangled_name(kernel_hash=h) for h, k in self.unique_kernels.items()}
        if missing:
            raise ExportError(f"kernels {sorted(missing)} are not in the module variant Warp hashed")

    def get_unique_kernels(self):
        return self.unique_kernels.values()


def _cuda_codegen(module, options: dict, kernels: frozenset[str] | None) -> tuple[str, str, dict, list, list]:
    """``Module._run_codegen(options, False)``, or, given mangled names, the same for just those kernels: a
    ``ModuleBuilder`` on a ``_KernelSubset`` of the variant's cached hasher, under Warp's codegen lock, as
    ``_run_codegen`` builds one (Warp 1.19's ``context.py``)."""
    if kernels is None:
        return module._run_codegen(options, False)
    ctx = _context()
    with ctx._codegen_lock:
        hasher = _KernelSubset(module.hashers[options["block_dim"]], kernels)
        builder = ctx.ModuleBuilder(module, options, hasher=hasher, target="cuda")
        source = builder.codegen("cuda")
        meta = builder.build_meta()
        ltoirs, fatbins = builder.get_link_inputs()
    return source, "cu", meta, ltoirs, fatbins


def nvrtc_job(module, options: dict, arch: int, use_ptx: bool, kernels: frozenset[str] | None = None) -> dict | None:
    """What compiling one target of a variant with one NVRTC call needs (in a worker process, or in this one
    for a kernel subset), or None when only ``compile_module_variant`` can build it: {"source": generated
    CUDA source, "meta": the .meta dict, "program": "<name>.cu", "args": the arguments
    ``warp._src.build.build_cuda`` passes to ``wp_cuda_compile_program`` (``leapp/_export/nvrtc_worker.py``
    makes that call)}.

    ``kernels``: mangled names of the variant's kernels to generate (default: all of them, the module as
    Warp builds it). Runs Warp's codegen (what ``Module._compile`` runs first; hash the variant first so it
    uses the variant's names). None for what the plain call cannot express (``nvrtc_refusal``) and for
    device code linked at build time (MathDx LTO-IR, fatbins).
    """
    import warp
    import warp._src.build as build

    if nvrtc_refusal(options):
        return None
    source, ext, meta, ltoirs, fatbins = _cuda_codegen(module, options | {"output_arch": arch}, kernels)
    if ltoirs or fatbins or ext != "cu":
        return None
    opt = options["optimization_level"]
    return {
        "source": source,
        "meta": meta,
        "program": f"{module_identifier(module, options['block_dim'])}.cu",
        "args": {
            "arch": arch,
            "include": os.path.join(build.warp_home, "native"),
            "debug": options["mode"] == "debug",
            "optimization_level": 3 if opt is None else opt,
            "verbose": warp.config.log_level <= warp.LOG_DEBUG,
            "verify_fp": bool(options["verify_fp"]),
            "fast_math": bool(options["fast_math"]),
            "fuse_fp": bool(options["fuse_fp"]),
            "lineinfo": bool(options["lineinfo"]),
            "compile_time_trace": bool(options["compile_time_trace"]),
            "precompiled_headers": bool(options["use_precompiled_headers"]),
        },
        "use_ptx": use_ptx,
    }


def cpu_codegen(module, options: dict, kernels: frozenset[str]) -> tuple[str, dict[str, list[str]]]:
    """Warp's generated C++ for the CPU of a module variant's kernels ``kernels`` (mangled names; hash the
    variant first, ``options["block_dim"]`` names it), as ``Module._run_codegen(options, True)`` generates it
    for the whole module, and per kernel the field names of its ``wp_args_<mangled>`` struct in order (the
    kernel's argument labels: the CPU entry takes its arguments as that struct)."""
    ctx = _context()
    with ctx._codegen_lock:
        hasher = _KernelSubset(module.hashers[options["block_dim"]], kernels)
        builder = ctx.ModuleBuilder(module, options, hasher=hasher, target="cpu")
        source = builder.codegen("cpu")
    fields = {k.get_mangled_name(kernel_hash=h): [a.label for a in k.adj.args] for h, k in hasher.unique_kernels.items()}
    return source, fields


def native_include_dir() -> str:
    """Warp's ``native`` folder: the headers its generated CUDA source includes (NVRTC's --include-path)."""
    import warp

    return os.path.join(os.path.dirname(warp.__file__), "native")


def mathdx_enabled() -> bool:
    """Whether Warp's native library was built with MathDx (its NVRTC compiles define WP_ENABLE_MATHDX to match)."""
    core = _context().runtime.core
    return bool(core.wp_is_mathdx_enabled()) if hasattr(core, "wp_is_mathdx_enabled") else False


# ---------------------------------------------------------------- kernel SSA (lowering)

# Emitters whose C++ the lowering cannot read from calls alone; each is recorded as a "construct" and refused.
_SSA_CONSTRUCTS = {"Assert": "assert"}


def _ssa_type(t) -> str:
    """A Warp type as a plain name: float32, int32, bool, vec3f, quatf, mat33f, transformf, ref[vec3f],
    array2d[float32]; anything else its repr (which no table row matches)."""
    import warp as wp
    import warp._src.codegen as codegen

    if codegen.is_reference(t):
        return f"ref[{_ssa_type(t.value_type)}]"
    if (isinstance(t, wp.array) and type(t).__name__ == "array") or getattr(t, "_concrete_cls", None) is wp.array:
        return f"array{t.ndim}d[{_ssa_type(t.dtype)}]"  # an array, or an annotation such as wp.array2d[wp.quat]
    scalar = getattr(t, "_wp_scalar_type_", None)
    if scalar is wp.float32:
        if wp.types.type_is_quaternion(t):
            return "quatf"
        if wp.types.type_is_transformation(t):
            return "transformf"
        if wp.types.type_is_matrix(t):
            return f"mat{t._shape_[0]}{t._shape_[1]}f"
        if wp.types.type_is_vector(t):
            return f"vec{t._length_}f"
    if scalar is wp.int32 and wp.types.type_is_vector(t):
        return f"vec{t._length_}i"
    if t in (wp.float32, wp.int32, wp.bool):
        return t.__name__
    if t is bool:
        return "bool"
    return wp.types.type_repr(t) if isinstance(t, type) or hasattr(t, "dtype") else repr(t)


def kernel_arg_type_name(t) -> str:
    """A kernel parameter's Warp type as the lowering names it (``array1d[vec3f]``, ``float32``, ...)."""
    return _ssa_type(t)


def array_t_offsets() -> tuple[int, int]:
    """Byte offsets of ``shape[4]`` and ``strides[4]`` (int32 each) in the ``array_t`` a launch passes."""
    import warp._src.types as wt

    return wt.array_t.shape.offset, wt.array_t.strides.offset


def _ssa_arg(value):
    """One bound argument: ("var", label, type), ("const", value, type), ("tuple", [...]) or ("py", value)."""
    import warp._src.codegen as codegen

    if isinstance(value, codegen.Var):
        if value.constant is not None:
            constant = getattr(value.constant, "value", value.constant)
            return ("const", constant, _ssa_type(value.type))
        return ("var", value.label, _ssa_type(value.type))
    if isinstance(value, tuple):
        return ("tuple", [_ssa_arg(v) for v in value])
    return ("py", value)


def kernel_ssa(kernel, max_unroll: int = 64) -> dict:
    """The forward SSA Warp builds for a kernel or ``wp.func`` overload, as a flat list of events, in order.

    Builds a fresh ``Adjoint`` (the module's own is left alone; its options are
    copied, with ``max_unroll`` raised so that constant-range loops unroll in
    Warp's own unroller) and records what the lowering reads:

    - ``("call", key, builtin, args, outputs, line, callee)``: each ``add_call``
      (Warp's resolved builtin or ``wp.func`` overload, bound arguments, output
      Vars); ``callee`` is the ``wp.func``'s own SSA (recursively), else None;
    - ``("compare", ops, left, comparators, out, line)``;
    - ``("bool", is_and, out, first, line)``, then per later operand
      ``("guard", out, is_and, line)`` ... ``("end", line)`` and
      ``("bool_step", is_and, out, value, line)``;
    - ``("if", cond, line)`` / ``("else", cond, line)`` ... ``("end", line)``;
    - ``("for", iter, const_range, value, line)`` ... ``("end_for", line)``;
    - ``("while", line)``, the condition's events, ``("while_cond", cond, line)``,
      the body, ``("end_while", line)``;
    - ``("continue", line)``, ``("break", line)``, ``("return", values, line)``;
    - ``("construct", text, line)``: any other statement Warp writes outside a
      call (the lowering refuses it), so nothing passes silently.
    """
    import warp._src.codegen as codegen

    source = kernel.adj
    adj = codegen.Adjoint(
        kernel.func,
        overload_annotations=dict(source.arg_types),
        is_user_function=source.is_user_function,
        source=source.source,
        transformers=source.transformers,
    )
    adj.fun_lineno = source.fun_lineno  # a given source skips Warp's own line lookup
    events: list[tuple] = []
    quiet = [0]  # >0 while an emitter this function records as a whole writes its own statements

    def where() -> int:
        return adj.fun_lineno + (adj.lineno or 0)

    original_call = adj.add_call

    def add_call(func, args, kwargs, type_args, min_outputs=None, return_value_used=True, arg_nodes=None,
                 kwarg_nodes=None, return_resolved=False):
        quiet[0] += 1
        try:
            output, resolved, bound = original_call(func, args, kwargs, type_args, min_outputs, return_value_used,
                                                    arg_nodes, kwarg_nodes, return_resolved=True)
        finally:
            quiet[0] -= 1
        outputs = [] if output is None else list(output) if isinstance(output, (list, tuple)) else [output]
        callee = None
        if not resolved.is_builtin():
            callee = kernel_ssa(resolved, max_unroll) if quiet[0] < 8 else {"error": "wp.func calls nested too deep"}
        events.append((
            "call",
            resolved.key,
            resolved.is_builtin(),
            {name: _ssa_arg(value) for name, value in bound.items()},
            [(o.label, _ssa_type(o.type)) for o in outputs],
            where(),
            callee,
        ))
        return (output, resolved, bound) if return_resolved else output

    original_forward = adj.add_forward

    def add_forward(statement, replay=None, skip_replay=False):
        if quiet[0] == 0 and not statement.lstrip().startswith("//"):
            events.append(("construct", f"statement `{statement.strip()}`", where()))
        return original_forward(statement, replay, skip_replay)

    adj.add_call = add_call
    adj.add_forward = add_forward

    def wrap(name, before=None, after=None):
        original = getattr(adj, name)

        def emitter(*args, **kwargs):
            if before is not None:
                events.append(before(*args))
            quiet[0] += 1
            try:
                result = original(*args, **kwargs)
            finally:
                quiet[0] -= 1
            if after is not None:
                events.append(after(result, *args))
            return result

        setattr(adj, name, emitter)

    def label(var):
        return var.label if isinstance(var, codegen.Var) else None

    wrap("begin_if", before=lambda cond: ("if", label(cond), where()))
    wrap("begin_else", before=lambda cond: ("else", label(cond), where()))
    wrap("end_if", after=lambda _r, cond: ("end", where()))
    wrap("end_else", after=lambda _r, cond: ("end", where()))

    def for_event(value, iterator, constant_range=None):
        rng = None if constant_range is None else (constant_range.start, constant_range.stop, constant_range.step)
        return ("for", label(iterator), rng, label(value), where())

    wrap("begin_for", after=for_event)
    wrap("end_for", after=lambda _r, *a, **k: ("end_for", where()))
    wrap("add_comp", after=lambda out, ops, left, comps: (
        "compare", list(ops), _ssa_arg(left), [_ssa_arg(c) for c in comps], label(out), where()))
    wrap("add_return", before=lambda var: (
        "return", [] if var is None else [_ssa_arg(v) for v in var], where()))

    import ast

    visitors = dict(codegen.Adjoint.node_visitors)  # Warp dispatches statements through this table

    def quietly(original, a, node):
        quiet[0] += 1
        try:
            return original(a, node)
        finally:
            quiet[0] -= 1

    def continue_or_break(node_type, kind):
        original = visitors[node_type]

        def emitter(a, node):
            a.materialize_redefinitions(a.loop_symbols[-1])  # recorded as "assign" calls
            events.append((kind, where()))
            a.loop_symbols[-1] = dict(a.symbols)  # nothing left for Warp's own emitter to materialize
            return quietly(original, a, node)

        visitors[node_type] = emitter

    continue_or_break(ast.Continue, "continue")
    continue_or_break(ast.Break, "break")

    def emit_bool(a, node):
        is_and = isinstance(node.op, ast.And)
        output = adj.add_var(codegen.builtins.bool)
        first = adj.load(adj.eval(node.values[0]))
        events.append(("bool", is_and, output.label, _ssa_arg(first), where()))
        for expr in node.values[1:]:
            events.append(("guard", output.label, is_and, where()))
            value = adj.load(adj.eval(expr))
            events.append(("end", where()))
            events.append(("bool_step", is_and, output.label, _ssa_arg(value), where()))
        return output

    visitors[ast.BoolOp] = emit_bool

    def emit_while(a, node):
        a._promote_mutated_iter_constants(node.body)
        events.append(("while", where()))
        loaded = []
        original_load = a.load

        def load(var):
            out = original_load(var)
            loaded.append(out)
            return out

        a.load = load  # begin_while evaluates the condition and loads it last
        try:
            a.begin_while(node.test)
        finally:
            del a.load
        events.append(("while_cond", loaded[-1].label, where()))
        a.loop_symbols.append(a.symbols.copy())
        for statement in node.body:
            a.eval(statement)
        a.materialize_redefinitions(a.loop_symbols[-1])
        a.loop_symbols.pop()
        quiet[0] += 1
        try:
            a.end_while()
        finally:
            quiet[0] -= 1
        events.append(("end_while", where()))

    visitors[ast.While] = emit_while

    def refused(node_type, construct):
        original = visitors[node_type]

        def emitter(a, node):
            events.append(("construct", construct, where()))
            return quietly(original, a, node)

        visitors[node_type] = emitter

    for node_name, construct in _SSA_CONSTRUCTS.items():
        refused(getattr(ast, node_name), construct)
    adj.node_visitors = visitors
    options = dict(kernel.module.options)  # a copy: the module's options are never changed
    options["max_unroll"] = max(int(options.get("max_unroll", 16)), max_unroll)
    adj.build(None, options)
    return {
        "name": kernel.key,
        "file": adj.filename,
        "line": adj.fun_lineno,
        "args": [(a.label, _ssa_type(a.type)) for a in adj.args],
        "events": events,
    }
