"""Sizes and names from an export folder never reach an allocator or a C API unchecked (docs/runtime.md, "Memory";
docs/bundle-format.md): an attacker who can write the folder and recompute every digest (tests/hostile_export.py)
gets a refusal naming the segment and the size, at a peak memory that stays near a normal run's, from leapp.load and
leapp-run alike. Also: a segment that would write none of an output is refused by both readers, and released CPU
code leaves no memfd behind.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cpu_observation import BATCH, quats, trace, warp_cpu
from hostile_export import copy_export, resealed, swap_onnx_bundle

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning"), warp_cpu]

TESTS = Path(__file__).resolve().parents[1]
GIB = 2**30

# One call of the export's node in a fresh process; prints the outcome and the process's peak resident memory.
_LOAD = f"""
import json, resource, sys
sys.path[:0] = [{str(TESTS / "e2e")!r}, {str(TESTS)!r}]
import leapp
from cpu_observation import quats
outcome = "ran"
try:
    pipeline = leapp.load(sys.argv[1])
    pipeline(**{{next(iter(pipeline.inputs)): quats({BATCH}, 1)}})
except Exception as e:  # noqa: BLE001 - the outcome is what the test checks
    outcome = f"{{type(e).__name__}}: {{e}}"
print(json.dumps({{"outcome": outcome, "peak_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}}))
"""

# A command's exit code, output and peak resident memory (its own: this wrapper has no other child).
_MEASURED = """
import json, resource, subprocess, sys
r = subprocess.run(sys.argv[1:], capture_output=True, text=True, timeout=300)
print(json.dumps({"rc": r.returncode, "output": r.stdout + r.stderr,
                  "peak_kib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))
"""


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> Path:
    _, folder = trace(tmp_path_factory.mktemp("limits"), "onnx", validate=False)
    return folder


def _leapp_run() -> Path:
    path = Path(sys.executable).with_name("leapp-run")
    if not path.is_file():
        pytest.skip("leapp-run was not built (ONNX Runtime's headers were missing at build time)")
    return path


def _load(folder: Path, **env) -> dict:
    r = subprocess.run([sys.executable, "-c", _LOAD, str(folder)], capture_output=True, text=True, timeout=300,
                       env={**os.environ, **env})
    assert r.returncode == 0, r.stdout + r.stderr  # a signal or an uncaught error: never acceptable
    return json.loads(r.stdout.strip().splitlines()[-1])


def _run(folder: Path, tmp_path: Path) -> dict:
    from leapp.testing.cpp_runner import leapp_run_env

    inputs = tmp_path / "in"
    inputs.mkdir(parents=True, exist_ok=True)
    (inputs / "quat.bin").write_bytes(quats(BATCH, 1).numpy().tobytes())
    command = [str(_leapp_run()), str(folder), "--in", str(inputs), "--out", str(tmp_path / "out")]
    r = subprocess.run([sys.executable, "-c", _MEASURED, *command], capture_output=True, text=True, timeout=360,
                       env=leapp_run_env())
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def _scratch(nbytes: int):
    def edit(manifest: dict, blobs: list) -> None:
        next(b for b in manifest["buffers"] if b["role"] == "scratch")["bytes"] = nbytes
    return edit


@pytest.mark.parametrize("nbytes", [6 * GIB, 2**40 - 2**20], ids=["6GiB", "1TiB"])
def test_a_scratch_from_the_file_beyond_the_limit_is_refused_before_anything_is_allocated(export, tmp_path, nbytes):
    normal_load, normal_run = _load(export), _run(export, tmp_path / "normal")
    assert normal_load["outcome"] == "ran" and normal_run["rc"] == 0, (normal_load, normal_run)

    folder = copy_export(export, tmp_path / "hostile")
    swap_onnx_bundle(folder, "obs", _scratch(nbytes))
    wanted = ["leapp segment 'obs/warp_segment_0' needs", "scratch " + str(nbytes), "LEAPP_MAX_SEGMENT_BYTES",
              "nothing was allocated"]
    loaded = _load(folder)
    assert all(w in loaded["outcome"] for w in wanted), loaded
    assert "bad_alloc" not in loaded["outcome"]
    ran = _run(folder, tmp_path / "hostile-run")
    assert ran["rc"] != 0 and all(w in ran["output"] for w in wanted), ran
    assert "bad_alloc" not in ran["output"]
    # the peak stays at a normal call's: nothing near the declared size was ever allocated
    assert loaded["peak_kib"] < normal_load["peak_kib"] + 256 * 1024, (loaded, normal_load)
    assert ran["peak_kib"] < normal_run["peak_kib"] + 256 * 1024, (ran, normal_run)
    print(f"peak KiB: leapp.load normal {normal_load['peak_kib']} hostile {loaded['peak_kib']}; "
          f"leapp-run normal {normal_run['peak_kib']} hostile {ran['peak_kib']}")


def test_the_limit_is_four_gib_unless_the_environment_sets_it(export):
    from leapp import _native
    from cpu_observation import bundle_of

    assert _native.segment_memory_limit() == 4 * GIB
    bundle = _native.Bundle(bundle_of(export))
    outputs, scratch, constants = _native.segment_memory(bundle)
    assert outputs == BATCH * 4 + BATCH * 3 * 4  # norm (float) and grav (vec3)
    assert scratch == 256 * ((BATCH * 3 * 4 + 255) // 256)  # the Warp temporary, 256-byte aligned
    assert constants == 0

    tight = _load(export, LEAPP_MAX_SEGMENT_BYTES=str(outputs + scratch - 1))
    assert f"more than the {outputs + scratch - 1} bytes" in tight["outcome"], tight
    assert _load(export, LEAPP_MAX_SEGMENT_BYTES=str(outputs + scratch))["outcome"] == "ran"
    bad = _load(export, LEAPP_MAX_SEGMENT_BYTES="4G")
    assert "LEAPP_MAX_SEGMENT_BYTES='4G' is not a byte count" in bad["outcome"], bad


def test_a_segment_that_writes_none_of_an_output_is_refused_by_both_readers(export, tmp_path):
    from leapp import _native
    from leapp.bundle import BundleError, read_bundle
    from cpu_observation import bundle_of

    def no_ops(manifest: dict, blobs: list) -> None:
        manifest["ops"] = []
        for b in manifest["buffers"]:
            b["init"] = "none" if b["role"] == "output" else b["init"]

    data = resealed(bundle_of(export), no_ops)
    wanted = "which no op writes and no init fills (a call would return memory nothing wrote)"
    with pytest.raises(BundleError, match=re.escape(wanted)):
        read_bundle(data)
    with pytest.raises(ValueError, match=re.escape(wanted)):
        _native.Bundle(data)
    folder = copy_export(export, tmp_path / "no-ops")
    swap_onnx_bundle(folder, "obs", no_ops)
    assert wanted in _load(folder)["outcome"]
    ran = _run(folder, tmp_path / "no-ops-run")
    assert ran["rc"] != 0 and wanted in ran["output"], ran

    def zero_filled(manifest: dict, blobs: list) -> None:  # defined: writes zeros, the same in both readers
        manifest["ops"] = []
        for b in manifest["buffers"]:
            b["init"] = "zero" if b["role"] == "output" else b["init"]

    read_bundle(resealed(bundle_of(export), zero_filled))
    folder = copy_export(export, tmp_path / "zeros")
    swap_onnx_bundle(folder, "obs", zero_filled)
    ran = _run(folder, tmp_path / "zeros-run")
    assert ran["rc"] == 0, ran
    (name,) = [p.name for p in (tmp_path / "zeros-run" / "out").iterdir()]
    assert not np.fromfile(tmp_path / "zeros-run" / "out" / name, dtype=np.float32).any()


_RELEASE = f"""
import os, sys
sys.path[:0] = [{str(TESTS / "e2e")!r}, {str(TESTS)!r}]
import leapp, leapp.runtime
from cpu_observation import quats

def memfds():
    fds = [os.readlink(f"/proc/self/fd/{{fd}}") for fd in os.listdir("/proc/self/fd")
           if os.path.exists(f"/proc/self/fd/{{fd}}")]
    maps = open("/proc/self/maps").read()
    return sum("leapp-cpu-code" in f for f in fds), maps.count("leapp-cpu-code")

pipeline = leapp.load(sys.argv[1])
pipeline(**{{next(iter(pipeline.inputs)): quats({BATCH}, 1)}})
loaded = memfds()
leapp.runtime.release_segments()
print(loaded, memfds())
"""


def test_released_cpu_code_leaves_no_memfd_and_no_mapping(tmp_path):
    _, folder = trace(tmp_path, "pt2", validate=False)  # leapp.load runs the torch op on this thread
    r = subprocess.run([sys.executable, "-c", _RELEASE, str(folder)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    loaded, released = r.stdout.strip().splitlines()[-1].split(") (")
    assert not loaded.startswith("(0,"), r.stdout  # loaded: one memfd open, mapped
    assert released == "0, 0)", r.stdout


_PARSE = """
import json, resource, sys
from leapp import _native
from leapp.bundle import BundleError, read_bundle
data = open(sys.argv[1], "rb").read()
verdicts = []
for parse, error in ((read_bundle, BundleError), (_native.Bundle, ValueError)):
    try:
        parse(data)
        verdicts.append("accepted")
    except error as e:
        verdicts.append(str(e))
print(json.dumps({"verdicts": verdicts, "peak_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))
"""


def _parse_measured(data: bytes, tmp_path: Path, name: str) -> dict:
    path = tmp_path / name
    path.write_bytes(data)
    r = subprocess.run([sys.executable, "-c", _PARSE, str(path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_a_cpu_object_declared_to_decode_to_a_gib_is_refused_before_decoding(export, tmp_path):
    """4 MiB stored, 1 GiB declared (within the LZ4 ratio bound of 255): both readers refuse it at the 64 MiB bound
    before decoding anything, at the peak memory of parsing the real bundle."""
    from cpu_observation import bundle_of

    original = bundle_of(export)

    def inflated(manifest: dict, blobs: list) -> None:
        code = manifest["cpu_code"][0]
        code.update(encoding="lz4-block", decoded_bytes=2**30)
        blobs[code["blob"]] = os.urandom(4 * 2**20 + 4096)

    normal = _parse_measured(original, tmp_path, "normal.bundle")
    hostile = _parse_measured(resealed(original, inflated), tmp_path, "hostile.bundle")
    assert normal["verdicts"] == ["accepted", "accepted"], normal
    python, native = hostile["verdicts"]
    assert "decoded_bytes 1073741824 is not in [0, 67108864]" in python, python
    assert "decoded_bytes 1073741824 out of range [0, 67108864]" in native, native
    assert hostile["peak_kib"] < normal["peak_kib"] + 64 * 1024, (hostile, normal)  # 4 MiB read, nothing decoded
    print(f"peak KiB: parse normal {normal['peak_kib']} hostile {hostile['peak_kib']}")
