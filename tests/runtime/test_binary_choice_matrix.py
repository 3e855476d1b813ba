"""Binary choice across GPU families and driver versions (issue 17), on a CPU machine.

Three views of the same rules (docs/bundle-format.md section 3, docs/portability.md):
  * a table: for each bundle kind an export makes, each GPU (Orin 8.7, Thor 11.0, GB10 12.1, B300 10.3,
    H200 9.0, RTX 4090 8.9, a future 13.0) and each driver (below / at / above CUDA 13.0 and 13.4), the
    binary the runtime's choice (leapp._native.binary_choice_for) picks, or that none fits and why;
  * the real loader against the fake driver (tests/runtime/mock_cuda), one process per GPU and driver (run
    together in a module fixture): the
    binary that actually loads, or the error text, agrees with the table;
  * properties (hypothesis) for any binaries, compute capability and driver: what is chosen can run there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from runtime_helpers import mock_driver_env

from leapp import _native
from leapp.bundle.format import DEFAULT_CUBIN_ARCHS

HERE = Path(__file__).resolve().parent
GPUS = {"Jetson Orin": (8, 7), "Jetson Thor": (11, 0), "GB10": (12, 1), "B300": (10, 3), "H200": (9, 0),
        "RTX 4090": (8, 9), "future 13.0": (13, 0)}
DRIVERS = (12000, 12020, 12060, 12080, 12090, 13000, 13020, 13040, 14000)
CUBINS = [("cubin", a, "") for a in DEFAULT_CUBIN_ARCHS]
# what an export holds: default (Warp's PTX declared ISA 8.0, leapp._export.ptx_isa), with the NVRTC's own ISA
# 9.4 (LEAPP_PTX_ISA=keep), with the PTX of an older NVRTC (ptx-compat 12.9), and LEAPP_CUDA_ARCHS=75 (the GPU
# test's export) with Warp's ISA or a 13.0 NVRTC's PTX
BUNDLES = {
    "default": [("ptx", 75, "8.0"), *CUBINS],
    "keep-9.4": [("ptx", 75, "9.4"), *CUBINS],
    "compat-12.9": [("ptx", 75, "8.8"), *CUBINS],
    "sm75-only": [("ptx", 75, "9.4"), ("cubin", 75, "")],
    "sm75-only-compat-13.0": [("ptx", 75, "9.0"), ("cubin", 75, "")],
}
# the cubin each GPU runs by the family rule (same major, highest minor <= the device's)
FAMILY_CUBIN = {"Jetson Orin": 86, "Jetson Thor": 110, "GB10": 120, "B300": 100, "H200": 90, "RTX 4090": 86,
                "future 13.0": None}


def expected(bundle: str, gpu: str, driver: int) -> str:
    """The table, written out: 'cubin sm_XY', 'ptx sm_75' or 'none'."""
    isa = {"9.4": 13040, "9.0": 13000, "8.8": 12090, "8.0": 12000}[BUNDLES[bundle][0][2]]  # oldest driver reading it
    cubin = FAMILY_CUBIN[gpu] if bundle.startswith(("default", "keep", "compat")) else None
    if cubin is not None and driver >= 13000:  # CUDA 13 cubins need a CUDA 13 driver
        return f"cubin sm_{cubin}"
    return "ptx sm_75" if driver >= isa else "none"


def choice(bundle: str, gpu: str, driver: int) -> dict:
    return _native.binary_choice_for(BUNDLES[bundle], *GPUS[gpu], driver, gpu, "13.4")


def picked(c: dict) -> str:
    if c["chosen"] < 0:
        return "none"
    b = c["candidates"][c["chosen"]]
    return f"{b['kind']} sm_{b['arch']}"


CASES = [(b, g, d) for b in BUNDLES for g in GPUS for d in DRIVERS]


@pytest.mark.parametrize(("bundle", "gpu", "driver"), CASES)
def test_matrix(bundle, gpu, driver):
    c = choice(bundle, gpu, driver)
    assert picked(c) == expected(bundle, gpu, driver), c["summary"]
    if picked(c) == "none":
        text = c["summary"]
        major, minor = GPUS[gpu]
        assert text.startswith(f"no binary fits {gpu} (compute capability {major}.{minor}) with the CUDA "
                               f"{driver // 1000}.{driver % 1000 // 10} driver: the bundle holds ptx sm_75 (PTX ISA ")
        isa = BUNDLES[bundle][0][2]
        reads = _native.driver_ptx_isa(driver)
        assert f"Its PTX is ISA {isa}, this driver reads PTX up to ISA {reads[0]}.{reads[1]}." in text
        if driver < 13000 and any(k == "cubin" and a // 10 == major and a % 10 <= minor for k, a, _ in BUNDLES[bundle]):
            assert "Its cubins were built by CUDA 13.4: they need a CUDA 13.0 driver or later." in text
            assert "re-export with PTX of an older ISA" in text and "a cubin for" not in text  # it has one
        else:
            assert f"re-export with a cubin for sm_{10 * major + minor} or with PTX of an older ISA" in text


def test_matrix_headline_rows():
    """The rows docs/portability.md states in words."""
    assert picked(choice("default", "Jetson Thor", 13000)) == "cubin sm_110"  # Thor runs with JetPack 7's driver
    for driver in (12020, 12060):  # Orin on JetPack 6.0 and 6.1/6.2: a default export's PTX, JIT-compiled
        assert picked(choice("default", "Jetson Orin", driver)) == "ptx sm_75"
        assert picked(choice("keep-9.4", "Jetson Orin", driver)) == "none"  # what exports loaded there before
    assert picked(choice("default", "future 13.0", 13000)) == "ptx sm_75"
    assert picked(choice("keep-9.4", "future 13.0", 13000)) == "none"  # ISA 9.4 PTX needs CUDA 13.4
    assert picked(choice("compat-12.9", "future 13.0", 13000)) == "ptx sm_75"
    assert picked(choice("sm75-only", "H200", 13000)) == "none"  # error 222, predicted
    assert picked(choice("sm75-only-compat-13.0", "H200", 13000)) == "ptx sm_75"  # the GPU test's route


# --- the loader against the fake driver -------------------------------------------------------------------------

WORKER = """
import json, sys
sys.modules["torch"] = None  # the loader needs no torch: import leapp then skips the op (3 s a process on 2 cores)
import numpy as np
sys.path.insert(0, {here!r})
from cuda_bundles import fake_cubin, with_binaries
from leapp import _native
from leapp.bundle.testing import EXAMPLE_ENTRY, EXAMPLE_PTX
import ctypes
mock = ctypes.CDLL("libcuda.so.1")
def last():
    buf = ctypes.create_string_buffer(64); mock.mock_last_loaded(buf, 64); return buf.value.decode()
out = {{}}
for name, binaries in json.loads(sys.argv[1]).items():
    blobs = [(k, a, EXAMPLE_PTX.replace(".version 7.5", ".version " + isa).encode() + b"\\0" if k == "ptx"
              else fake_cubin(a, EXAMPLE_ENTRY)) for k, a, isa in binaries]
    data = with_binaries(blobs, n=16, cuda_toolkit="13.4")  # the cubins of a real export: CUDA 13.4
    x = np.arange(16, dtype=np.float32); y = np.zeros(16, np.float32)
    try:
        _native.run_segment_host(_native.Bundle(data), [x], [y])
        assert np.array_equal(y, x * np.arange(1, 17, dtype=np.float32))
        out[name] = {{"loaded": last()}}
    except RuntimeError as e:
        out[name] = {{"error": str(e)}}
print(json.dumps(out))
"""


LOADER_DRIVERS = (12020, 12060, 12080, 12090, 13000, 13040)


@pytest.fixture(scope="module")
def loader_runs(mock_driver_dir) -> dict:
    """(gpu, driver) -> the worker's process, all started together: each is a fresh process (the fake driver
    reads its GPU and version from the environment), and most of each one's time is importing leapp."""

    def run(gpu: str, driver: int) -> subprocess.CompletedProcess:
        major, minor = GPUS[gpu]
        env = mock_driver_env(mock_driver_dir, MOCK_CC=10 * major + minor, MOCK_DRIVER_VERSION=driver,
                              MOCK_MAX_PTX="", MOCK_DEVICES=1)
        return subprocess.run([sys.executable, "-c", WORKER.format(here=str(HERE)), json.dumps(BUNDLES)],
                              env=env, capture_output=True, text=True, timeout=300)

    keys = [(gpu, driver) for gpu in GPUS for driver in LOADER_DRIVERS]
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 1)) as pool:
        return dict(zip(keys, pool.map(lambda key: run(*key), keys)))


@pytest.mark.parametrize("driver", LOADER_DRIVERS)
@pytest.mark.parametrize("gpu", list(GPUS))
def test_loader_agrees_with_the_table(loader_runs, gpu, driver):
    major, minor = GPUS[gpu]
    proc = loader_runs[(gpu, driver)]
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    for bundle, result in results.items():
        want = expected(bundle, gpu, driver)
        if want == "none":
            text = result.get("error", "")
            assert f"Mock GPU 0, compute capability {major}.{minor}), CUDA driver {driver // 1000}." in text, text
            assert "the bundle holds ptx sm_75 (PTX ISA " in text and "it reads PTX up to ISA" in text, text
            if driver < 13000 and FAMILY_CUBIN[gpu] and bundle.startswith(("default", "keep", "compat")):
                assert "Its cubins were built by CUDA 13.4: they need a CUDA 13.0 driver or later." in text, text
        else:
            kind, arch = want.split(" sm_")
            isa = BUNDLES[bundle][0][2]
            assert result.get("loaded") == (f"cubin sm_{arch}" if kind == "cubin" else f"ptx {isa}"), (bundle, result)


def _assumed_run(mock_driver_dir, assume: str, gpu: str = "Jetson Orin", driver: int = 13000) -> dict:
    major, minor = GPUS[gpu]
    env = mock_driver_env(mock_driver_dir, MOCK_CC=10 * major + minor, MOCK_DRIVER_VERSION=driver, MOCK_MAX_PTX="",
                          MOCK_DEVICES=1, LEAPP_ASSUME_DRIVER=assume)
    bundles = {k: BUNDLES[k] for k in ("default", "keep-9.4")}
    proc = subprocess.run([sys.executable, "-c", WORKER.format(here=str(HERE)), json.dumps(bundles)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_an_assumed_older_driver_loads_what_that_driver_would(mock_driver_dir):
    """LEAPP_ASSUME_DRIVER=12.2 on a CUDA 13.0 driver: the Orin's sm_86 cubin, which this driver would load, is
    not tried; the default export loads its PTX (ISA 8.0), the ISA 9.4 one loads nothing and says why."""
    results = _assumed_run(mock_driver_dir, "12.2")
    assert results["default"] == {"loaded": "ptx 8.0"}
    text = results["keep-9.4"]["error"]
    assert "CUDA driver 13.0 loading as a CUDA 12.2 driver would (LEAPP_ASSUME_DRIVER)" in text, text
    assert "Its PTX is ISA 9.4, this driver reads PTX up to ISA 8.2." in text, text
    assert "cubin sm_86:" not in text  # never handed to this driver


@pytest.mark.parametrize(("assume", "message"), [
    ("banana", "LEAPP_ASSUME_DRIVER='banana' is not a CUDA version such as 12.2 or 12020"),
    ("12.20", "LEAPP_ASSUME_DRIVER='12.20' is not a CUDA version"),
    ("13.4", "LEAPP_ASSUME_DRIVER=13.4 names a driver newer than this machine's (CUDA 13.0)"),
])
def test_an_assumed_driver_that_cannot_be_reproduced_is_refused_by_name(mock_driver_dir, assume, message):
    results = _assumed_run(mock_driver_dir, assume)
    for result in results.values():
        assert message in result["error"], result


# --- properties ------------------------------------------------------------------------------------------------

ARCH_POOL = [75, 80, 86, 87, 89, 90, 100, 103, 110, 120, 121, 130]
ISA_POOL = ["7.8", "8.0", "8.5", "8.8", "9.0", "9.4", ""]
binaries_st = st.lists(
    st.one_of(st.tuples(st.just("cubin"), st.sampled_from(ARCH_POOL), st.just("")),
              st.tuples(st.just("ptx"), st.sampled_from(ARCH_POOL), st.sampled_from(ISA_POOL))),
    min_size=1, max_size=8, unique_by=lambda b: (b[0], b[1]))
ccs = st.tuples(st.integers(7, 14), st.integers(0, 9))
drivers = st.sampled_from([0, 11080, 12000, 12060, 12080, 12090, 13000, 13010, 13040, 13090, 14000])


def isa_tuple(text: str) -> tuple[int, int]:
    major, minor = text.split(".")
    return int(major), int(minor)


@settings(max_examples=400)
@given(binaries=binaries_st, cc=ccs, driver=drivers, toolkit=st.sampled_from(["13.4", "12.9", "none"]))
def test_choice_properties(binaries, cc, driver, toolkit):
    c = _native.binary_choice_for(binaries, *cc, driver, "GPU", toolkit)
    arch = 10 * cc[0] + cc[1]
    listed = [(o["kind"], o["arch"]) for o in c["candidates"] + c["excluded"]]
    assert sorted(listed) == sorted((k, a) for k, a, _ in binaries)  # every binary judged once

    def runs(kind: str, a: int) -> bool:  # CUDA's rules, by compute capability alone
        return (a // 10 == cc[0] and a % 10 <= cc[1]) if kind == "cubin" else a <= arch

    assert all(runs(o["kind"], o["arch"]) for o in c["candidates"])
    assert not any(runs(o["kind"], o["arch"]) for o in c["excluded"])
    expected_flags = [o["expected"] for o in c["candidates"]]
    assert expected_flags == sorted(expected_flags, reverse=True)  # those expected to load come first
    reads = _native.driver_ptx_isa(driver)
    for o in c["candidates"]:
        predicted_fail = False
        if driver and o["kind"] == "ptx" and o["ptx_isa"]:
            predicted_fail = reads < isa_tuple(o["ptx_isa"])
        if driver and o["kind"] == "cubin" and toolkit[0].isdigit():
            predicted_fail = driver // 1000 < int(toolkit.split(".")[0])
        assert o["expected"] == (not predicted_fail), o
    if c["chosen"] >= 0:
        assert c["chosen"] == 0 and c["candidates"][0]["expected"]
        best = c["candidates"][0]
        # nothing better was expected to load: an exact cubin, then the highest same-family cubin, then PTX
        better = [o for o in c["candidates"] if o["expected"] and (
            (o["kind"], best["kind"]) == ("cubin", "ptx") or
            (o["kind"] == best["kind"] == "cubin" and (o["arch"] == arch) > (best["arch"] == arch)) or
            (o["kind"] == best["kind"] == "cubin" and best["arch"] != arch and o["arch"] > best["arch"]))]
        assert not better, (best, better)
        assert c["summary"].startswith(f"{best['kind']} sm_{best['arch']}: ")
    else:
        assert all(not o["expected"] for o in c["candidates"])
        text = c["summary"]
        assert text.startswith(f"no binary fits GPU (compute capability {cc[0]}.{cc[1]})")
        assert c["holdings"] in text
        if driver:
            assert f"with the CUDA {driver // 1000}.{driver % 1000 // 10} driver" in text
        if any(o["kind"] == "ptx" and o["ptx_isa"] and reads < isa_tuple(o["ptx_isa"]) for o in c["candidates"]):
            assert "this driver reads PTX up to ISA" in text
