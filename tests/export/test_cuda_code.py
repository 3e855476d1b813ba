"""CUDA code of a Warp module variant, compiled with Warp's NVRTC on a machine without a GPU."""

from __future__ import annotations

import dataclasses
import json
import re
import struct
import tempfile
from pathlib import Path

import numpy as np
import pytest

wp = pytest.importorskip("warp")

import warp._src.context as wctx  # noqa: E402

from leapp import _warp_private  # noqa: E402
from leapp._export import cuda_code  # noqa: E402
from leapp.errors import ExportError  # noqa: E402

TEST_ARCHS = (90,)  # one cubin keeps the suite fast; test_default_targets builds all of them once


@wp.kernel
def k_double(a: wp.array(dtype=float), out: wp.array(dtype=float)):
    i = wp.tid()
    out[i] = a[i] * 2.0


@wp.kernel
def k_tile(a: wp.array2d(dtype=float), out: wp.array2d(dtype=float)):
    i = wp.tid()
    t = wp.tile_load(a, shape=(1, 64), offset=(i, 0), storage="shared")
    wp.tile_store(out, t * 2.0, offset=(i, 0))


def config_snapshot() -> dict:
    values = {k: getattr(wp.config, k) for k in dir(wp.config) if not k.startswith("_")}
    return {k: v for k, v in values.items() if not callable(v) and not isinstance(v, type(wp))}


def module_state(module) -> dict:
    return {
        "options": dict(module.options),
        "hashes": {bd: h.get_hash() for bd, h in module.hashers.items()},
        "resolved": {bd: dict(o) for bd, o in module.resolved_options.items()},
        "execs": {k: id(v) for k, v in module.execs.items()},
        "kernel_hashes": {k.key: k.hash for k in module._get_live_kernels()},
        "mangled": {k.key: k.get_mangled_name() for k in module._get_live_kernels() if k.hash is not None},
    }


@pytest.fixture(scope="module")
def cpu_loaded():
    """The module as a user leaves it: loaded and launched on CPU (block_dim 1)."""
    a = wp.array(np.arange(4, dtype=np.float32), device="cpu")
    out = wp.zeros(4, dtype=float, device="cpu")
    wp.launch(k_double, dim=4, inputs=[a, out], device="cpu")
    assert out.numpy().tolist() == [0.0, 2.0, 4.0, 6.0]
    return k_double.module


@pytest.fixture(scope="module")
def compiled(cpu_loaded):
    return cuda_code.compile_module(k_double, 256, TEST_ARCHS)


def test_entry_exists_in_ptx_and_binaries_are_real(compiled):
    entry = compiled.entry(k_double)
    assert re.fullmatch(r"k_double_[0-9a-f]{8}_cuda_kernel_forward", entry)
    ptx = compiled.ptx[75]
    assert ptx.endswith(b"}\n\0") or ptx.endswith(b"\0") and ptx.count(b"\0") == 1
    assert f".entry {entry}(".encode() in ptx
    assert b".target sm_75" in ptx
    assert f".version {compiled.ptx_isa}".encode() in ptx and re.fullmatch(r"\d+\.\d+", compiled.ptx_isa)
    assert compiled.toolkit == "{}.{}".format(*wctx.runtime.toolkit_version)
    assert set(compiled.cubins) == set(TEST_ARCHS)
    assert all(c[:4] == b"\x7fELF" for c in compiled.cubins.values())
    assert compiled.entry_smem(k_double) == 0
    assert compiled.block_dim == 256 and compiled.name.startswith("wp_" + k_double.module.name + "_")
    assert [(kind, arch) for kind, arch, _ in compiled.binaries()] == [("ptx", 75), ("cubin", 90)]


def test_variant_is_the_cuda_default_block_dim_not_the_cpu_one(compiled, cpu_loaded):
    """A CPU capture (block_dim 1) exports the code Warp would load on CUDA (block_dim 256)."""
    module = k_double.module
    options = module.resolve_options(wp.config, block_dim=256)
    hasher = wctx.ModuleHasher(module._get_live_kernels(), options)
    assert compiled.module_hash == hasher.get_hash().hex()
    assert compiled.name == f"wp_{module.name}_{hasher.get_hash().hex()[:7]}"
    assert compiled.entry(k_double) == f"k_double_{hasher.kernel_hashes[k_double].hex()[:8]}_cuda_kernel_forward"
    cpu_hash = module.hashers[1].get_hash().hex()
    assert cpu_hash != compiled.module_hash  # the hash depends on block_dim


def test_user_module_and_config_are_unchanged(cpu_loaded):
    module = k_double.module
    before_state, before_config = module_state(module), config_snapshot()
    result = cuda_code.compile_module(k_double, 128, TEST_ARCHS)  # a variant nobody used
    assert result.block_dim == 128
    assert module_state(module) == before_state
    assert config_snapshot() == before_config
    # and the module still runs on CPU exactly as before
    a = wp.array(np.ones(3, dtype=np.float32), device="cpu")
    out = wp.zeros(3, dtype=float, device="cpu")
    wp.launch(k_double, dim=3, inputs=[a, out], device="cpu")
    assert out.numpy().tolist() == [2.0, 2.0, 2.0]
    assert module_state(module)["execs"] == before_state["execs"]


def test_only_forward_kernels_are_compiled_with_warps_entry_names(compiled):
    cuda_code.compile_module(k_tile, 256, TEST_ARCHS)  # the module's other kernel: its name in this variant
    """leapp's copy of the options has enable_backward=False: no adjoint entry, the same forward symbols and
    parameter lists as Warp's own (backward-enabled) build of the variant, the user's options untouched."""
    module = k_double.module
    assert module.options.get("enable_backward", wp.config.enable_backward) is True
    assert _warp_private.export_options(module, 256)["enable_backward"] is False
    assert _warp_private.export_options(module, 256)["use_precompiled_headers"] is False
    assert module.resolve_options(wp.config, block_dim=256)["enable_backward"] is True
    ptx = compiled.ptx[75].decode()
    entries = re.findall(r"\.entry\s+(\w+)\s*\(([^)]*)\)", ptx)
    assert {name for name, _ in entries} == {compiled.entry(k_double), compiled.entry(k_tile)}
    assert b"_cuda_kernel_backward" not in compiled.cubins[90]
    # Warp's own build of the same variant (backward included) declares the forward entry identically
    with _warp_private.preserved_module_state(module):
        cuda_code.wpp.module_variant_hash(module, 256)
        full = module.resolve_options(wp.config, block_dim=256)
        with tempfile.TemporaryDirectory() as tmp:
            _warp_private.compile_module_variant(module, full, tmp, 75, True)
            warp_ptx = Path(tmp, f"{compiled.name}.sm75.ptx").read_text()
    warp_entries = dict(re.findall(r"\.entry\s+(\w+)\s*\(([^)]*)\)", warp_ptx))
    assert compiled.entry(k_double).replace("forward", "backward") in warp_entries
    assert all(warp_entries[name] == params for name, params in entries)


def test_precompiled_headers_off_gives_the_same_bytes(compiled):
    """use_precompiled_headers=False in leapp's copy only saves time: NVRTC writes the same cubin with it on."""
    module = k_double.module
    with _warp_private.preserved_module_state(module):
        cuda_code.wpp.module_variant_hash(module, 256)
        options = {**_warp_private.export_options(module, 256), "use_precompiled_headers": True}
        with tempfile.TemporaryDirectory() as tmp:
            _warp_private.compile_module_variant(module, options, tmp, 90, False)
            with open(f"{tmp}/{compiled.name}.sm90.cubin", "rb") as f:
                assert f.read() == compiled.cubins[90]


def _fresh_compile(monkeypatch, processes: int, block_dim: int = 32):
    monkeypatch.setenv("LEAPP_NO_CACHE", "1")
    monkeypatch.setattr(cuda_code, "_threads", lambda count: min(count, processes))
    monkeypatch.setattr(cuda_code, "_store", {})  # compile again, leaving the other tests' compiled modules alone
    monkeypatch.setattr(cuda_code, "_cache", {})
    return cuda_code.compile_module(k_double, block_dim, (80, 90, 120))


def test_worker_processes_write_warps_bytes(monkeypatch, caplog):
    """Targets compiled by worker processes (nvrtc_worker.py) equal those Warp's Module._compile writes here."""
    import logging

    with caplog.at_level(logging.DEBUG, logger="leapp._export.cuda_code"):
        spread = _fresh_compile(monkeypatch, 3)
    workers = [r.getMessage() for r in caplog.records if "worker process" in r.getMessage()]
    assert len(workers) == 2 and any("(3 process(es))" in r.getMessage() for r in caplog.records), workers
    here = _fresh_compile(monkeypatch, 1)
    assert spread.ptx == here.ptx and spread.cubins == here.cubins and spread.smem_bytes == here.smem_bytes
    module = k_double.module  # the workers' .meta comes from the same codegen (the tile kernel's smem included)
    with _warp_private.preserved_module_state(module):
        _warp_private.module_variant_hash(module, 32)
        job = _warp_private.nvrtc_job(module, _warp_private.export_options(module, 32), 90, False)
    assert cuda_code._smem(job["meta"]) == here.smem_bytes and here.smem_bytes[here.entry(k_tile)] > 0


def test_a_worker_failure_names_the_target_and_nvrtcs_output(monkeypatch):
    real = _warp_private.nvrtc_job

    def broken(module, options, arch, use_ptx):
        job = real(module, options, arch, use_ptx)
        job["source"] += "\nthis is not CUDA;\n"
        return job

    monkeypatch.setattr(cuda_code.wpp, "nvrtc_job", broken)
    with pytest.raises(ExportError, match=r"to cubin sm_\d+ failed: NVRTC error \d+ in a worker process: (?s:.*)error: "
                       r"expected a declaration"):
        _fresh_compile(monkeypatch, 2, block_dim=16)


def test_no_worker_process_means_compiling_here(monkeypatch, caplog):
    def refuse(*args, **kwargs):
        raise OSError("fork refused")

    monkeypatch.setattr(cuda_code.subprocess, "Popen", refuse)
    compiled = _fresh_compile(monkeypatch, 3, block_dim=8)
    assert sorted(compiled.cubins) == [80, 90, 120] and compiled.ptx[75].endswith(b"\0")
    assert "could not start an NVRTC worker process (fork refused)" in caplog.text


def test_nvrtc_jobs_env_caps_the_processes(monkeypatch):
    monkeypatch.setenv(cuda_code.JOBS_ENV, "1")
    assert cuda_code._threads(8) == 1
    monkeypatch.setenv(cuda_code.JOBS_ENV, "0")
    with pytest.raises(ExportError, match=r"LEAPP_NVRTC_JOBS='0': expected a number of processes >= 1"):
        cuda_code._threads(8)
    monkeypatch.delenv(cuda_code.JOBS_ENV)
    assert 1 <= cuda_code._threads(8) <= 8


def test_cache_key_names_the_option_overrides(compiled):
    key = cuda_code._cache_key(module="m", module_hash="ab", block_dim=256, toolkit="13.4", kind="cubin", arch=90)
    assert json.loads(key.overrides) == {"enable_backward": False, "use_precompiled_headers": False}
    assert b"enable_backward" in key.encoded()
    assert key.filename() != dataclasses.replace(key, overrides="").filename()


def test_compiled_modules_are_cached_per_hash_and_block_dim(compiled):
    assert cuda_code.compile_module(k_double, 256, TEST_ARCHS) is compiled
    assert cuda_code.compile_module(k_tile, 256, TEST_ARCHS) is compiled  # same module, same variant
    other = cuda_code.compile_module(k_double, 64, TEST_ARCHS)
    assert other is not compiled and other.module_hash != compiled.module_hash
    assert other.entry(k_double) in other.ptx[75].decode()


def test_tile_kernel_has_dynamic_shared_memory_from_meta():
    compiled = cuda_code.compile_module(k_tile, 64, TEST_ARCHS)
    entry = compiled.entry(k_tile)
    assert entry in compiled.smem_bytes and compiled.entry_smem(k_tile) == compiled.smem_bytes[entry]
    assert f".entry {entry}(".encode() in compiled.ptx[75]
    assert _warp_private.uses_tiles(k_tile) and not _warp_private.uses_tiles(k_double)


def test_default_targets_are_ptx75_plus_one_cubin_per_family(monkeypatch, compiled):
    monkeypatch.delenv(cuda_code.ARCHS_ENV, raising=False)
    assert cuda_code.cubin_archs() == (75, 80, 86, 90, 100, 110, 120)  # Thor (11.0) included
    full = cuda_code.compile_module(k_double, 256)
    assert sorted(full.cubins) == [75, 80, 86, 90, 100, 110, 120] and list(full.ptx) == [75]
    # binaries compiled earlier for a subset of targets are reused, not rebuilt
    assert full.cubins[90] is compiled.cubins[90] and full.ptx[75] is compiled.ptx[75]
    for arch, cubin in full.cubins.items():
        assert cubin[:4] == b"\x7fELF"
        e_flags = struct.unpack_from("<I", cubin, 48)[0]  # ELF e_flags carry the SM version
        assert arch in (e_flags & 0xFF, (e_flags >> 8) & 0xFF), (arch, hex(e_flags))


def test_known_archs_are_what_warps_nvrtc_targets():
    """LEAPP_CUDA_ARCHS's list is Warp 1.19's NVRTC's own (a Warp update that changes it shows here)."""
    cuda_code.toolkit_version()  # initialises Warp
    assert set(cuda_code.KNOWN_CUBIN_ARCHS) == set(_warp_private.nvrtc_supported_archs())
    assert set(cuda_code.DEFAULT_CUBIN_ARCHS) <= set(cuda_code.KNOWN_CUBIN_ARCHS)


def test_archs_env(monkeypatch):
    monkeypatch.setenv(cuda_code.ARCHS_ENV, "sm_90, 75")
    assert cuda_code.cubin_archs() == (75, 90)
    monkeypatch.setenv(cuda_code.ARCHS_ENV, "87,110,121")  # beyond the default set: any SM NVRTC targets
    assert cuda_code.cubin_archs() == (87, 110, 121)
    monkeypatch.setenv(cuda_code.ARCHS_ENV, "91")
    with pytest.raises(ExportError, match="LEAPP_CUDA_ARCHS='91'"):
        cuda_code.cubin_archs()
    monkeypatch.setenv(cuda_code.ARCHS_ENV, "nine")
    with pytest.raises(ExportError, match="comma-separated"):
        cuda_code.cubin_archs()


def test_arch_suffix_config_is_refused_not_changed(monkeypatch):
    monkeypatch.setattr(wp.config, "cuda_arch_suffix", "a")
    with pytest.raises(ExportError, match="cuda_arch_suffix='a'"):
        cuda_code.compile_module(k_double, 32, TEST_ARCHS)
    assert wp.config.cuda_arch_suffix == "a"


def test_bad_block_dim():
    with pytest.raises(ExportError, match="block_dim 2048"):
        cuda_code.compile_module(k_double, 2048, TEST_ARCHS)


def test_installed_warp_other_than_1_19_is_refused(monkeypatch):
    monkeypatch.setattr(wp, "__version__", "1.20.1")
    with pytest.raises(ExportError, match="warp-lang 1.19.x only, but warp-lang 1.20.1 is installed"):
        cuda_code.compile_module(k_double, 256, TEST_ARCHS)
