"""Hostile CPU code in a real export (issue 46, docs/export-cpu.md section 4): objects built with the system
compiler that run code inside dlopen (constructor, .init_array, IFUNC resolver, a library dropped beside the
export), at unload (.fini_array), search other folders (RUNPATH $ORIGIN), use TLS, or name a data symbol as the
entry, each put into a CPU-traced ONNX export with every digest recomputed. leapp.load, leapp-run and
leapp-run --check must refuse each with its reason and never run its code: no marker file appears. Controls: a
plain object in the same place runs (its marker appears), and a plain dlopen of each load-time variant writes
its marker (so the marker would show a refused object that had run).
"""

from __future__ import annotations

import json
import re
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from elf_fields import object_of
from cpu_observation import BATCH, bundle_of, quats, rewritten, trace, warp_cpu
from hostile_cpu_code import RUN_AT_LOAD, VARIANTS, build_evil_library, build_variant, layout_tables, swap_cpu_code

pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning"),
              pytest.mark.skipif(shutil.which("c++") is None, reason="needs the system C++ compiler (c++)"),
              warp_cpu]

HOSTILE = [v for v in VARIANTS if v != "plain"]




def _with_code(image: bytes):
    def edit(manifest, blobs):
        code = manifest["cpu_code"][0]
        code.pop("encoding", None)
        code.pop("decoded_bytes", None)
        blobs[code["blob"]] = image

    return lambda data: rewritten(data, edit)


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> dict:
    """variant -> (export folder, marker file, bundle bytes); plus the load-time controls' markers."""
    root = tmp_path_factory.mktemp("hostile")
    _, folder = trace(root / "base", "onnx", validate=False)
    machine, image, entries = object_of(bundle_of(folder))
    tables = layout_tables(image, machine, entries)
    (root / "markers").mkdir()
    (root / "work").mkdir()
    (root / "control").mkdir()
    found = {}
    for variant in VARIANTS:
        target = root / variant
        shutil.copytree(folder, target)
        marker = root / "markers" / variant
        if variant == "needed":
            build_evil_library(target, marker)
        new = build_variant(variant, tables, root / "work", target, marker)
        found[variant] = (target, marker, swap_cpu_code(target, _with_code(new)))
    controls = {}
    for variant in RUN_AT_LOAD:  # the same objects, their own markers, loaded as plain shared objects
        work = root / "control" / variant
        work.mkdir()
        marker = root / "control" / f"{variant}.marker"
        if variant == "needed":
            build_evil_library(work, marker)
        build_variant(variant, tables, work, work, marker)
        controls[variant] = (work / f"{variant}.so", marker)
    return {"variants": found, "controls": controls}


LOAD_ALL = r"""
import json, sys
import torch
import leapp
quat = torch.nn.functional.normalize(torch.randn(%d, 4, generator=torch.Generator().manual_seed(0)), dim=1)
results = {}
for name, folder in json.loads(sys.argv[1]).items():
    try:
        out = leapp.load(folder)(quat=quat)
        results[name] = "ran"
    except Exception as e:  # the refusal, reported to the test
        results[name] = f"{type(e).__name__}: {e}"
print("RESULTS " + json.dumps(results))
""" % BATCH


@pytest.fixture(scope="module")
def loaded(exports) -> dict[str, str]:
    """What leapp.load(folder)(...) did for every variant, in one fresh process (its code must never run here)."""
    folders = {v: str(f) for v, (f, _, _) in exports["variants"].items()}
    r = subprocess.run([sys.executable, "-c", LOAD_ALL, json.dumps(folders)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr  # a signal death would show here
    line = next(line for line in r.stdout.splitlines() if line.startswith("RESULTS "))
    return json.loads(line[len("RESULTS "):])


def _marks(marker: Path) -> str:
    return marker.read_text() if marker.exists() else ""


def test_the_plain_control_runs_and_marks(exports, loaded):
    """The plain object, put in place the same way, is accepted and runs: the marker shows when code ran."""
    _, marker, _ = exports["variants"]["plain"]
    assert loaded["plain"] == "ran", loaded["plain"]
    assert "entry" in _marks(marker)


@pytest.mark.parametrize("variant", RUN_AT_LOAD)
def test_a_plain_dlopen_of_a_load_time_variant_runs_its_code(exports, variant):
    """The control: these objects do run code inside dlopen when nothing checks them first."""
    path, marker = exports["controls"][variant]
    r = subprocess.run([sys.executable, "-c", f"import ctypes; ctypes.CDLL({str(path)!r})"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert _marks(marker), f"{variant}: its code did not run in a plain dlopen"


@pytest.mark.parametrize("variant", HOSTILE)
def test_both_readers_refuse_the_variant_with_the_same_reason(exports, variant):
    from leapp import _native
    from leapp.bundle import BundleError, read_bundle

    _, marker, data = exports["variants"][variant]
    reason = VARIANTS[variant][2]
    with pytest.raises(BundleError, match=reason) as py:
        read_bundle(data)
    with pytest.raises(ValueError, match=reason) as native:
        _native.Bundle(data)
    tail = str(py.value).split("cpu_code[0].blob ", 1)[1]
    assert str(native.value).endswith(tail)
    assert not _marks(marker)


@pytest.mark.parametrize("variant", HOSTILE)
def test_leapp_load_refuses_the_variant_and_runs_none_of_it(exports, loaded, variant):
    _, marker, _ = exports["variants"][variant]
    assert loaded[variant] != "ran"
    assert VARIANTS[variant][2] and re.search(VARIANTS[variant][2], loaded[variant]), loaded[variant]
    assert not _marks(marker), f"{variant}: its code ran: {_marks(marker)!r}"


def _leapp_run() -> Path:
    path = Path(sys.executable).with_name("leapp-run")
    if not path.is_file():
        pytest.skip("leapp-run was not built (ONNX Runtime's headers were missing at build time)")
    return path


@pytest.mark.parametrize("variant", HOSTILE)
def test_leapp_run_refuses_the_variant_and_runs_none_of_it(exports, variant, tmp_path):
    from leapp.testing.cpp_runner import leapp_run_env

    folder, marker, _ = exports["variants"][variant]
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "quat.bin").write_bytes(quats(BATCH, 0).numpy().tobytes())
    env = leapp_run_env()
    r = subprocess.run([str(_leapp_run()), str(folder), "--in", str(tmp_path / "in"), "--out", str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=120, env=env, cwd=folder)
    assert r.returncode == 1, (r.returncode, r.stdout + r.stderr)  # refused, not killed by a signal
    assert re.search(VARIANTS[variant][2], r.stdout + r.stderr), r.stdout + r.stderr
    check = subprocess.run([str(_leapp_run()), str(folder), "--check"], capture_output=True, text=True,
                           timeout=120, env=env, cwd=folder)
    assert check.returncode == 1, (check.returncode, check.stdout + check.stderr)  # it parses the bundles too
    assert re.search(VARIANTS[variant][2], check.stdout + check.stderr), check.stdout + check.stderr
    assert not _marks(marker), f"{variant}: its code ran: {_marks(marker)!r}"


def test_leapp_run_runs_the_plain_control(exports, tmp_path):
    from leapp.testing.cpp_runner import leapp_run_env

    folder, marker, _ = exports["variants"]["plain"]
    marker.unlink(missing_ok=True)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "quat.bin").write_bytes(quats(BATCH, 0).numpy().tobytes())
    r = subprocess.run([str(_leapp_run()), str(folder), "--in", str(tmp_path / "in"), "--out", str(tmp_path / "out")],
                       capture_output=True, text=True, timeout=120, env=leapp_run_env())
    assert r.returncode == 0, r.stdout + r.stderr
    assert "entry" in _marks(marker)
    assert os.path.exists(tmp_path / "out")
