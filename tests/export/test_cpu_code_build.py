"""leapp._export.cpu_code: which segments get CPU code, what refuses it, and the half-precision conversions the
CPU code carries in place of warp.so's (docs/export-cpu.md)."""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from leapp._export import cpu_code
from leapp.errors import ExportError

needs_cxx = pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None,
                               reason="needs a C++ compiler")


@pytest.mark.parametrize("value, captured_on, wanted", [
    (None, "cpu", True), (None, "cuda", False), ("auto", "cuda", False), ("1", "cuda", True),
    ("always", "cpu", True), ("0", "cpu", False), ("never", "cuda", False)])
def test_which_segments_get_cpu_code(monkeypatch, value, captured_on, wanted):
    if value is None:
        monkeypatch.delenv(cpu_code.CPU_CODE_ENV, raising=False)
    else:
        monkeypatch.setenv(cpu_code.CPU_CODE_ENV, value)
    assert cpu_code.cpu_code_wanted(captured_on) is wanted


def test_an_unknown_setting_is_refused_by_name(monkeypatch):
    monkeypatch.setenv(cpu_code.CPU_CODE_ENV, "yes please")
    with pytest.raises(ExportError, match=r"\$LEAPP_CPU_CODE='yes please': expected 'auto'"):
        cpu_code.cpu_code_wanted("cpu")


def test_without_a_compiler_there_is_no_cpu_code_and_the_reason_says_so(monkeypatch, tmp_path):
    wp = pytest.importorskip("warp")

    @wp.kernel
    def plain(a: wp.array(dtype=float)):
        a[wp.tid()] = 1.0

    monkeypatch.delenv(cpu_code.CXX_ENV, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no c++, g++, clang++ or cross compiler here
    codes, why = cpu_code.build_cpu_code([("plain_cuda_kernel_forward", plain)], "segment s")
    assert codes == [] and why.startswith("no C++ compiler found (set $LEAPP_CXX"), why


def test_kernels_with_tiles_get_no_cpu_code():
    wp = pytest.importorskip("warp")

    @wp.kernel
    def tiled(a: wp.array2d(dtype=float), out: wp.array2d(dtype=float)):
        t = wp.tile_load(a, shape=(2, 2))
        wp.tile_store(out, t)

    codes, why = cpu_code.build_cpu_code([("tiled_cuda_kernel_forward", tiled)], "segment s")
    assert codes == [] and why == (f"kernels ['{tiled.key}'] use tiles, which the CPU code cannot run as the CUDA "
                                        "launches do"), why


@pytest.fixture(scope="module")
def support(tmp_path_factory):
    """SUPPORT_SOURCE compiled as the export compiles it, loaded with ctypes."""
    if shutil.which("c++") is None:
        pytest.skip("needs a C++ compiler (c++)")
    folder = tmp_path_factory.mktemp("support")
    (folder / "support.cpp").write_text(cpu_code.SUPPORT_SOURCE)
    flags = [f for f in cpu_code.FLAGS if f != "-s"]
    subprocess.run(["c++", *flags, str(folder / "support.cpp"), "-o", str(folder / "support.so")], check=True)
    lib = ctypes.CDLL(str(folder / "support.so"))
    lib.wp_float_to_half_bits.argtypes, lib.wp_float_to_half_bits.restype = [ctypes.c_float], ctypes.c_uint16
    lib.wp_half_bits_to_float.argtypes, lib.wp_half_bits_to_float.restype = [ctypes.c_uint16], ctypes.c_float
    lib.wp_float_to_bfloat16_bits.argtypes, lib.wp_float_to_bfloat16_bits.restype = [ctypes.c_float], ctypes.c_uint16
    lib.wp_bfloat16_bits_to_float.argtypes, lib.wp_bfloat16_bits_to_float.restype = [ctypes.c_uint16], ctypes.c_float
    return lib


def test_every_half_widens_exactly(support):
    bits = np.arange(65536, dtype=np.uint16)
    want = bits.view(np.float16).astype(np.float32)
    got = np.array([support.wp_half_bits_to_float(int(b)) for b in bits], dtype=np.float32)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))  # -0.0 included


@settings(max_examples=3000, deadline=None)
@given(x=st.floats(width=32, allow_nan=True, allow_infinity=True)
       | st.integers(0, 2**32 - 1).map(lambda b: float(np.uint32(b).view(np.float32))))
def test_float_to_half_rounds_to_nearest_even(support, x):
    got = support.wp_float_to_half_bits(x)
    with np.errstate(over="ignore"):  # beyond half's range numpy gives inf, as the conversion must
        want = int(np.float32(x).astype(np.float16).view(np.uint16))
    if np.isnan(x):
        assert (got & 0x7c00) == 0x7c00 and (got & 0x3ff) != 0, hex(got)
    else:
        assert got == want, (x, hex(got), hex(want))


@settings(max_examples=3000, deadline=None)
@given(x=st.floats(width=32, allow_nan=False, allow_infinity=True)
       | st.integers(0, 2**32 - 1).map(lambda b: float(np.uint32(b).view(np.float32))))
def test_bfloat16_rounds_like_torch(support, x):
    got = support.wp_float_to_bfloat16_bits(x)
    if np.isnan(x):
        assert (got & 0x7f80) == 0x7f80 and (got & 0x7f) != 0
        return
    want = int(torch.tensor([x], dtype=torch.float32).to(torch.bfloat16).view(torch.int16).item()) & 0xffff
    assert got == want, (x, hex(got), hex(want))
    back = support.wp_bfloat16_bits_to_float(got)
    assert np.float32(back).view(np.uint32) == np.uint32(got) << 16


@pytest.mark.skipif(shutil.which("aarch64-linux-gnu-g++") is None or cpu_code.this_machine() != "x86_64",
                    reason="needs an x86_64 machine with the aarch64 cross compiler (aarch64-linux-gnu-g++)")
def test_an_x86_64_export_carries_aarch64_code_too_when_it_can(tmp_path):
    """With the cross compiler on PATH the bundle holds a second object, for aarch64 (a Jetson, an ARM board):
    an ELF shared object for that machine, defining the entry and its layout table, needing only libc and libm.
    (Running it needs an aarch64 machine; here its symbols are checked.)"""
    wp = pytest.importorskip("warp")

    @wp.kernel
    def double(a: wp.array(dtype=float), b: wp.array(dtype=float)):
        i = wp.tid()
        b[i] = 2.0 * a[i]

    codes, why = cpu_code.build_cpu_code([("double_cuda_kernel_forward", double)], "segment s")
    assert why == "" and [c.machine for c in codes] == ["x86_64", "aarch64"], why
    arm = codes[1]
    assert arm.image[:4] == b"\x7fELF" and int.from_bytes(arm.image[18:20], "little") == 183
    (tmp_path / "arm.so").write_bytes(arm.image)
    nm = shutil.which("aarch64-linux-gnu-nm") or "nm"
    defined = subprocess.run([nm, "-D", "--defined-only", str(tmp_path / "arm.so")], capture_output=True, text=True,
                             check=True).stdout
    entry = arm.entries["double_cuda_kernel_forward"]
    assert f" {entry}\n" in defined and f" {entry}_leapp_args\n" in defined, defined
    readelf = shutil.which("aarch64-linux-gnu-readelf") or "readelf"
    needed = [line.split("[")[1].rstrip("]") for line in subprocess.run(
        [readelf, "-d", str(tmp_path / "arm.so")], capture_output=True, text=True, check=True).stdout.splitlines()
        if "(NEEDED)" in line]
    assert set(needed) <= {"libc.so.6", "libm.so.6"}, needed


@needs_cxx
def test_the_host_code_needs_only_libc_and_libm_and_exports_only_entries(tmp_path):
    """Nothing but the C library and libm is needed where it runs (the C++ runtime is linked in), and the dynamic
    symbols it defines are the entries, their layout tables and the half conversions: no other code is reachable
    by name."""
    wp = pytest.importorskip("warp")

    @wp.kernel
    def halve(a: wp.array(dtype=float), b: wp.array(dtype=float)):
        i = wp.tid()
        b[i] = 0.5 * a[i]

    (code, *_), why = cpu_code.build_cpu_code([("halve_cuda_kernel_forward", halve)], "segment s")
    assert why == ""
    (tmp_path / "host.so").write_bytes(code.image)
    dynamic = subprocess.run(["readelf", "-dW", "--dyn-syms", str(tmp_path / "host.so")], capture_output=True,
                             text=True, check=True).stdout.splitlines()
    needed = {line.split("[")[1].rstrip("]") for line in dynamic if "(NEEDED)" in line}
    assert needed <= {"libc.so.6", "libm.so.6"}, needed
    defined = {line.split()[-1] for line in dynamic if " GLOBAL " in line and " UND " not in line
               and (" FUNC " in line or " OBJECT " in line)}
    entry = code.entries["halve_cuda_kernel_forward"]
    assert {entry, f"{entry}_leapp_args"} <= defined
    assert defined - {entry, f"{entry}_leapp_args"} <= {"wp_float_to_half_bits", "wp_half_bits_to_float",
                                                       "wp_float_to_bfloat16_bits", "wp_bfloat16_bits_to_float"}, defined


def test_a_compiler_failure_is_an_error_only_when_cpu_code_was_asked_for(tmp_path, monkeypatch):
    """By default a CPU capture whose CPU code does not compile exports without it (warned, the reason in
    producer.cpu_code); with LEAPP_CPU_CODE=1 the failure is the export's, naming the compiler's output."""
    pytest.importorskip("warp")
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
    from leapp.bundle import read_bundle
    from cpu_observation import bundle_of, trace

    broken = tmp_path / "broken-cxx"
    broken.write_text("#!/bin/sh\necho 'error: this compiler refuses everything' >&2\nexit 1\n")
    broken.chmod(0o755)
    monkeypatch.setenv(cpu_code.CXX_ENV, str(broken))
    monkeypatch.setenv("PATH", str(tmp_path))  # no cross compiler either
    with pytest.warns(RuntimeWarning, match=r"compiling the CPU code for \w+ with .*broken-cxx failed \(exit 1\)"):
        _, folder = trace(tmp_path / "auto", "pt2", validate=False)
    note = read_bundle(bundle_of(folder)).manifest["producer"]["cpu_code"]
    assert note.startswith("none: compiling the CPU code for") and "failed (exit 1)" in note, note
    monkeypatch.setenv(cpu_code.CPU_CODE_ENV, "1")
    with pytest.raises(ExportError, match=r"(?s)failed \(exit 1\):\nerror: this compiler refuses everything"):
        trace(tmp_path / "always", "pt2", validate=False)


@needs_cxx
def test_the_same_compile_comes_from_the_binary_cache_and_a_bad_entry_is_refused(tmp_path, monkeypatch, caplog):
    """A second export of the same kernels reads the object the first one compiled (leapp's binary cache, folder
    cpu-v1); an entry changed on disk is refused (its sha256) and compiled again, and a sound entry must still
    hold an ELF object for its key's machine."""
    import logging

    wp = pytest.importorskip("warp")

    @wp.kernel
    def triple(a: wp.array(dtype=float), b: wp.array(dtype=float)):
        i = wp.tid()
        b[i] = 3.0 * a[i]

    monkeypatch.setenv("LEAPP_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("LEAPP_NO_CACHE", raising=False)
    kernels = [("triple_cuda_kernel_forward", triple)]
    with caplog.at_level(logging.DEBUG, logger="leapp._export.binary_cache"):
        first, _ = cpu_code.build_cpu_code(kernels, "segment s")
        second, _ = cpu_code.build_cpu_code(kernels, "segment s")
    assert [c.image for c in first] == [c.image for c in second]
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("cache cpu-v1: CPU code for ") and " read from " in m for m in messages), messages
    entries = list((tmp_path / "cache" / cpu_code.CACHE_SUBDIR).glob("*.bin"))
    assert entries
    caplog.clear()
    for path in entries:
        data = path.read_bytes()
        flipped = bytes(b ^ 0xFF for b in data[-40:-32])
        path.write_bytes(data[:-40] + flipped + data[-32:])  # the payload's tail changed: the sha256 refuses it
    with caplog.at_level(logging.WARNING, logger="leapp._export.binary_cache"):
        third, _ = cpu_code.build_cpu_code(kernels, "segment s")
    assert [c.image for c in third] == [c.image for c in first]
    assert any("refused: sha256 mismatch" in r.getMessage() for r in caplog.records), caplog.records
    from leapp._export import binary_cache

    other = "aarch64" if first[0].machine == "x86_64" else "x86_64"
    key = cpu_code.CpuCacheKey(other, "c++", "g++ 12", "-O2", "1.19.0", "ab" * 32)
    with pytest.raises(binary_cache.CacheEntryError, match=rf"ELF e_machine \d+ is not {other}'s"):
        key.check_payload(first[0].image)  # this machine's object under the other machine's key


@needs_cxx
def test_compiling_the_same_kernels_twice_gives_the_same_bytes(monkeypatch):
    """Exports are byte-reproducible: with the cache off, two compiles of one source give one object (no
    build id, no temporary paths, stripped)."""
    wp = pytest.importorskip("warp")

    @wp.kernel
    def norms(a: wp.array(dtype=wp.vec3), b: wp.array(dtype=float)):
        i = wp.tid()
        b[i] = wp.length(a[i])

    monkeypatch.setenv("LEAPP_NO_CACHE", "1")
    first, _ = cpu_code.build_cpu_code([("norms_cuda_kernel_forward", norms)], "segment s")
    second, _ = cpu_code.build_cpu_code([("norms_cuda_kernel_forward", norms)], "segment s")
    assert first and [c.image for c in first] == [c.image for c in second]
