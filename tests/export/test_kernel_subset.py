"""A bundle carries the kernels its segment launches, not their whole Warp module (docs/export-cuda.md section 5).

This file's module holds four kernels, a @wp.func, a @wp.struct and a tile kernel. Segments launching some of
them get binaries of just those (Warp's own entry names and shared-memory sizes), compiled by the NVRTC call
the worker processes make; subsets never share a binary, in this process or in the binary cache.
"""

from __future__ import annotations

import logging
import os
import re

import numpy as np
import pytest

wp = pytest.importorskip("warp")
torch = pytest.importorskip("torch")

from leapp import _warp_private  # noqa: E402
from leapp._apic.wrp import parse_wrp  # noqa: E402
from leapp._contract.records import SegmentIO, TensorSpec  # noqa: E402
from leapp._export import binary_cache as bc  # noqa: E402
from leapp._export import cuda_code  # noqa: E402
from leapp._export.segment_bundle import build_bundle_from_wrp  # noqa: E402
from leapp.bundle import read_bundle  # noqa: E402

ARCHS = (90,)
ENTRY = re.compile(r"\.entry\s+(\w+)\s*\(([^)]*)\)")


@wp.struct
class Gain:
    k: float
    b: float


@wp.func
def affine_gain(x: float, g: Gain):
    return x * g.k + g.b


@wp.kernel
def k_gain(a: wp.array(dtype=float), g: Gain, out: wp.array(dtype=float)):
    i = wp.tid()
    out[i] = affine_gain(a[i], g)


@wp.kernel
def k_sine(a: wp.array(dtype=float), out: wp.array(dtype=float)):
    i = wp.tid()
    out[i] = wp.sin(a[i]) * 3.0


@wp.kernel
def k_square(a: wp.array(dtype=float), out: wp.array(dtype=float)):
    i = wp.tid()
    out[i] = a[i] * a[i]


@wp.kernel
def k_tiles(a: wp.array2d(dtype=float), out: wp.array2d(dtype=float)):
    i = wp.tid()
    t = wp.tile_load(a, shape=(1, 64), offset=(i, 0), storage="shared")
    wp.tile_store(out, t * 2.0, offset=(i, 0))


def entries(ptx: bytes) -> dict[str, str]:
    """entry symbol -> its parameter list, in a PTX."""
    return dict(ENTRY.findall(ptx.decode()))


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """An empty binary cache of the test's own and an empty in-process store (other tests' modules kept)."""
    monkeypatch.setenv(bc.CACHE_DIR_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(cuda_code.WHOLE_MODULES_ENV, raising=False)
    monkeypatch.setattr(cuda_code, "_store", {})
    monkeypatch.setattr(cuda_code, "_cache", {})
    return tmp_path / "cache" / bc.SUBDIR


@pytest.fixture(scope="module")
def whole():
    """The whole module at block_dim 256, as every bundle carried it before kernel subsets."""
    return cuda_code.compile_module(k_gain, 256, ARCHS)


# ------------------------------------------------------------------ compile_module with kernels


def test_a_subset_holds_just_its_kernels_under_warps_names(fresh, whole):
    sub = cuda_code.compile_module(k_gain, 256, ARCHS, kernels=[k_gain])
    assert sub.kernels == (sub.entry(k_gain).removesuffix("_cuda_kernel_forward"),)
    assert sub.name == whole.name and sub.module_hash == whole.module_hash
    assert sub.entry(k_gain) == whole.entry(k_gain)
    full = entries(whole.ptx[75])
    assert set(full) == {whole.entry(k) for k in (k_gain, k_sine, k_square, k_tiles)}
    ptx = entries(sub.ptx[75])
    assert ptx == {sub.entry(k_gain): full[sub.entry(k_gain)]}  # the same symbol, the same parameter list
    assert len(sub.ptx[75]) < len(whole.ptx[75]) and len(sub.cubins[90]) < len(whole.cubins[90])
    assert sub.entry(k_gain).encode() in sub.cubins[90] and whole.entry(k_sine).encode() not in sub.cubins[90]
    with pytest.raises(Exception, match=r"kernel 'k_sine' is not part of the compiled module"):
        sub.entry(k_sine)


def test_tile_kernels_keep_the_modules_shared_memory_keys(fresh, whole):
    sub = cuda_code.compile_module(k_tiles, 256, ARCHS, kernels=[k_tiles, k_square])
    assert set(entries(sub.ptx[75])) == {whole.entry(k_tiles), whole.entry(k_square)}
    assert sub.smem_bytes == {e: whole.smem_bytes[e] for e in sub.smem_bytes}
    assert set(sub.smem_bytes) == {whole.entry(k_tiles), whole.entry(k_square)}
    assert sub.entry_smem(k_tiles) == whole.entry_smem(k_tiles) > 0


def test_a_launched_kernel_gets_the_functions_and_structs_it_uses():
    """Codegen of the subset defines k_gain's @wp.func and @wp.struct, and none of the other kernels."""
    module = k_gain.module
    with _warp_private.preserved_module_state(module):
        _warp_private.module_variant_hash(module, 256)
        names = _warp_private.kernel_variant_names(module, 256)
        options = _warp_private.export_options(module, 256)
        job = _warp_private.nvrtc_job(module, options, 90, False, frozenset({names[k_gain]}))
    source = job["source"]
    assert re.search(r"\baffine_gain_\w*\(", source) and re.search(r"struct Gain_\w+", source)
    assert names[k_gain] in source and names[k_sine] not in source and names[k_tiles] not in source
    assert set(job["meta"]) == {f"{names[k_gain]}_cuda_kernel_forward_smem_bytes"}


def test_all_kernels_of_the_variant_are_the_whole_module(fresh, whole):
    every = cuda_code.compile_module(k_sine, 256, ARCHS, kernels=[k_tiles, k_sine, k_square, k_gain])
    assert every.kernels == () and every.ptx == whole.ptx and every.cubins == whole.cubins


def test_whole_modules_env_keeps_the_old_bundles(fresh, monkeypatch, whole):
    monkeypatch.setenv(cuda_code.WHOLE_MODULES_ENV, "1")
    old = cuda_code.compile_module(k_sine, 256, ARCHS, kernels=[k_sine])
    assert old.kernels == () and old.ptx == whole.ptx and old.entry(k_gain) == whole.entry(k_gain)
    monkeypatch.setenv(cuda_code.WHOLE_MODULES_ENV, "maybe")
    with pytest.raises(Exception, match="LEAPP_BUNDLE_WHOLE_MODULES='maybe'"):
        cuda_code.compile_module(k_sine, 256, ARCHS, kernels=[k_sine])


def test_worker_processes_and_this_process_write_the_same_subset(fresh, monkeypatch, caplog):
    compiled = {}
    for processes in (3, 1):
        monkeypatch.setattr(cuda_code, "_store", {})
        monkeypatch.setattr(cuda_code, "_cache", {})
        monkeypatch.setenv("LEAPP_NO_CACHE", "1")
        monkeypatch.setattr(cuda_code, "_threads", lambda count, p=processes: min(count, p))
        with caplog.at_level(logging.DEBUG, logger="leapp._export.cuda_code"):
            compiled[processes] = cuda_code.compile_module(k_sine, 64, (80, 90, 120), kernels=[k_sine, k_square])
    assert "(3 process(es))" in caplog.text and "NVRTC in this process" in caplog.text
    spread, here = compiled[3], compiled[1]
    assert spread.ptx == here.ptx and spread.cubins == here.cubins and spread.smem_bytes == here.smem_bytes
    assert set(entries(here.ptx[75])) == {here.entry(k_sine), here.entry(k_square)}


def test_a_module_the_nvrtc_call_cannot_build_is_compiled_whole(fresh, monkeypatch, caplog, whole):
    """Where nvrtc_job refuses the subset (MathDx link inputs, llvm_cuda, extra include folders) Warp's own build
    compiles the whole module, and the DEBUG log says why."""
    real = _warp_private.nvrtc_job
    monkeypatch.setattr(cuda_code.wpp, "nvrtc_job", lambda m, o, a, p, kernels=None: None if kernels else
                        real(m, o, a, p))
    with caplog.at_level(logging.DEBUG, logger="leapp._export.cuda_code"):
        compiled = cuda_code.compile_module(k_sine, 256, ARCHS, kernels=[k_sine])
    assert "compiling the whole module, not just the 1 launched kernel(s): it links device code" in caplog.text
    assert compiled.ptx == whole.ptx and compiled.cubins == whole.cubins
    assert compiled.entry(k_sine) == whole.entry(k_sine)


def test_nvrtc_refusal_names_what_the_call_cannot_express():
    options = _warp_private.export_options(k_gain.module, 256)
    assert _warp_private.nvrtc_refusal(options) == ""
    assert "llvm_cuda" in _warp_private.nvrtc_refusal(options | {"llvm_cuda": True})
    assert "extra_cuda_include_dirs" in _warp_private.nvrtc_refusal(options | {"extra_cuda_include_dirs": ["/x"]})


def test_the_binary_cache_never_serves_one_subset_for_another(fresh, monkeypatch, caplog):
    def compile_(kernels):
        monkeypatch.setattr(cuda_code, "_store", {})  # only the persistent cache may serve a binary
        monkeypatch.setattr(cuda_code, "_cache", {})
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="leapp._export.cuda_code"):
            return cuda_code.compile_module(kernels[0], 128, ARCHS, kernels=kernels)

    first = compile_([k_sine])
    assert "compiled PTX sm_75, cubin sm_90" in caplog.text and len(list(fresh.glob("*.bin"))) == 2
    other = compile_([k_square])  # a cold miss, never the k_sine entries
    assert "compiled PTX sm_75, cubin sm_90" in caplog.text and "binary cache" not in caplog.text
    both = compile_([k_square, k_sine])
    assert "compiled PTX sm_75, cubin sm_90" in caplog.text and len(list(fresh.glob("*.bin"))) == 6
    assert len({first.ptx[75], other.ptx[75], both.ptx[75]}) == 3
    assert set(entries(other.ptx[75])) == {other.entry(k_square)}
    again = compile_([k_sine])
    assert "read from the binary cache" in caplog.text and "compiled" not in caplog.text
    assert again.ptx == first.ptx and again.cubins == first.cubins
    key = cuda_code._cache_key("m", "ab", 128, "13.4", "ptx", 75, kernels=first.kernels)
    assert key.kernels == first.kernels[0] and key.filename() != cuda_code._cache_key(
        "m", "ab", 128, "13.4", "ptx", 75).filename()


def _state(module) -> dict:
    """What exporting must leave as it was: the module's caches and options, its kernels' names, wp.config."""
    config = {k: getattr(wp.config, k) for k in dir(wp.config) if not k.startswith("_")}
    return {"hashers": {bd: h.get_hash() for bd, h in module.hashers.items()},
            "resolved": {bd: dict(o) for bd, o in module.resolved_options.items()},
            "options": dict(module.options), "execs": {k: id(v) for k, v in module.execs.items()},
            "kernels": {k.key: (k.hash, k.get_mangled_name()) for k in module._get_live_kernels()},
            "config": {k: v for k, v in config.items() if not callable(v) and not isinstance(v, type(wp))}}


def test_user_module_and_config_are_unchanged_by_a_subset(fresh):
    module = k_gain.module
    a, out = wp.array(np.arange(3, dtype=np.float32), device="cpu"), wp.zeros(3, dtype=float, device="cpu")
    wp.launch(k_square, dim=3, inputs=[a, out], device="cpu")
    before = _state(module)
    cuda_code.compile_module(k_square, 32, ARCHS, kernels=[k_square, k_gain])
    assert _state(module) == before
    wp.launch(k_square, dim=3, inputs=[a, out], device="cpu")
    assert out.numpy().tolist() == [0.0, 1.0, 4.0]


# ------------------------------------------------------------------ segments


def _bundle(tmp_path, launch, inputs: dict, outputs: dict, kernels):
    """The bundle of a CPU APIC capture of ``launch`` with these named float arrays as inputs and outputs."""
    with wp.ScopedCapture(device="cpu", apic=True) as cap:
        launch()
    stem = os.path.join(tmp_path, f"seg{len(os.listdir(tmp_path))}")
    wp.capture_save(cap.graph, stem, inputs={**inputs, **outputs})
    with open(stem + ".wrp", "rb") as f:
        wrp = parse_wrp(f.read())

    def io(name, arr):
        shape = tuple(arr.shape)
        return SegmentIO(TensorSpec(name, torch.float32, shape, "float32", shape), wrp.bindings[name], arr.capacity)

    data = build_bundle_from_wrp(wrp, segment_id="obs/warp_segment_0", source="pipe.py:1", kernels=kernels,
                                 inputs=[io(n, a) for n, a in inputs.items()],
                                 outputs=[io(n, a) for n, a in outputs.items()], archs=ARCHS)
    return data, read_bundle(data)


def test_segments_launching_different_kernels_of_one_module_carry_different_code(fresh, tmp_path, monkeypatch,
                                                                                 whole):
    a = wp.array(np.linspace(0.0, 1.0, 8, dtype=np.float32), device="cpu")
    out = wp.zeros(8, dtype=float, device="cpu")
    gain = Gain()
    gain.k, gain.b = 2.0, 0.5
    sine = lambda: wp.launch(k_sine, dim=8, inputs=[a, out], device="cpu")  # noqa: E731

    def gain_then_square():
        wp.launch(k_gain, dim=8, inputs=[a, gain, out], device="cpu")
        wp.launch(k_square, dim=8, inputs=[out, out], device="cpu")
        wp.launch(k_gain, dim=8, inputs=[out, gain, out], device="cpu")

    data1, b1 = _bundle(tmp_path, sine, {"a": a}, {"out": out}, [k_sine])
    data2, b2 = _bundle(tmp_path, gain_then_square, {"a": a}, {"out": out}, [k_gain, k_square])
    assert data1 != data2
    for b, launched in ((b1, [k_sine]), (b2, [k_gain, k_square])):
        (module,) = b.modules
        assert module["name"] == whole.name  # Warp's variant name, as before
        assert [k["entry"] for k in b.kernels] == [whole.entry(k) for k in launched]
        assert [op["kernel"] for op in b.ops] == ([0] if len(launched) == 1 else [0, 1, 0])
        ptx = b.binary(0, 0)
        assert set(entries(ptx)) == {whole.entry(k) for k in launched} and len(ptx) < len(whole.ptx[75])
        assert {e: p for e, p in entries(ptx).items()} == {e: entries(whole.ptx[75])[e] for e in entries(ptx)}

    monkeypatch.setenv(cuda_code.WHOLE_MODULES_ENV, "1")
    data_old, old = _bundle(tmp_path, sine, {"a": a}, {"out": out}, [k_sine])
    assert set(entries(old.binary(0, 0))) == set(entries(whole.ptx[75])) and len(data1) < len(data_old)
    assert old.kernels == b1.kernels and old.ops == b1.ops  # the same manifest but for the binaries
