"""AOTInductor packages of an exported PT2 node (``leapp aoti``), replayed on CPU-only CI through the fake driver.

The export is real (``compile_session`` writes pipeline.yaml and obs.pt2), of a node recorded on
the CPU whose two segments are ``leapp.bundle.testing``'s example bundle (``y = x * [1..n]``):
a Warp kernel cannot run here, and the fake driver (mock_cuda/) emulates exactly that kernel.
``leapp aoti`` makes ONE package (module fixture, about 25 s cold), which is then run

- in Python (``torch._inductor.aoti_load_package``) and
- in C++ (aoti_cpp/main.cpp: dlopen of the op library, ``AOTIModelPackageLoader``, no Python),

both in processes whose op library is the CPU-as-CUDA test build and whose libcuda.so.1 is the
fake (the session fixture ``fake_cuda`` of conftest.py), and compared with ``leapp.load`` of the same export on the same fresh inputs: equal.
The refusals (unknown node, ONNX node, changed artifact, hostile names) need no compile.
"""

from __future__ import annotations

import contextlib
import io
import functools
import importlib.util
import logging
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
import yaml

from leapp.pipeline_format import write_twin
from aoti_replay import read_tensors, write_tensors
from runtime_helpers import mock_driver_env

from leapp import cli
from leapp._export.cxx_runtime import RUNTIME_SYMBOL, defined_dynamic_symbols, probe_compiler
from leapp.errors import ExportError

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="AOTInductor packages and the fake driver are Linux .so files"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning"),
]

HERE = Path(__file__).resolve().parent
N = 64
SEGMENTS = 2


@functools.cache
def _compile_records():
    """tests/export/compile_records.py (hand-made recorder output), loaded by path: it lives in another test folder."""
    spec = importlib.util.spec_from_file_location("_aoti_compile_records", HERE.parent / "export" / "compile_records.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _expected(x: torch.Tensor) -> list[torch.Tensor]:
    """What node 'obs' computes: (x + 1) * c * c * 2 and x + 1, with c = [1..N] (compile_records.segment_graph)."""
    return _compile_records().expected_segment_outputs(x, SEGMENTS)


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory) -> Path:
    """A leapp export folder: node 'obs' (PT2, two segment calls) and pipeline.yaml, written by the exporter."""
    from leapp._export.compile import compile_session

    cr = _compile_records()
    node = cr.segment_node("obs", "pt2", n=N, segments=SEGMENTS, device="cpu", samples=0)
    root = tmp_path_factory.mktemp("aoti_export")
    compile_session(cr.session(root, node), validate=False, bundles=cr.example_bundles)
    return root / "demo"


AOTI_LOG: list[str] = []  # what the package fixture's `leapp aoti` logged (leapp.aoti, INFO)
AOTI_ERR: list[str] = []  # and printed on stderr


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_leapp_aoti_logs_the_compile_and_its_time(package, export_dir):
    assert AOTI_LOG[0] == f"pipeline 'demo' node 'obs': compiling obs.pt2 with AOTInductor into {package}"
    assert re.fullmatch(r"pipeline 'demo' node 'obs': AOTInductor package obs\.aoti\.pt2 written in \d+\.\d\d s; "
                        r"recorded in pipeline\.yaml", AOTI_LOG[1]), AOTI_LOG


def test_leapp_aoti_warns_that_a_cpu_package_cannot_run_warp_segments(package):
    """Issue 34: `leapp aoti` compiled a CPU package for a node whose Warp segments can only run on CUDA, without
    a word. It still compiles (the tests' fake driver runs such packages), and says why it cannot run them."""
    warnings = [line for line in AOTI_ERR if line.startswith("leapp aoti: warning:")]
    ids = [f"obs/warp_segment_{i}" for i in range(SEGMENTS)]
    assert warnings == [f"leapp aoti: warning: pipeline 'demo' node 'obs' has {SEGMENTS} Warp segment(s) recorded on cpu, "
                        f"and {ids} hold no CPU code for this machine, so they replay on CUDA devices only: its "
                        "AOTInductor package for cpu cannot run them. Export the node with CPU code "
                        "(docs/export-cpu.md), or record it on a CUDA device and run `leapp aoti` on that export"], \
        AOTI_ERR


@pytest.fixture(scope="module")
def package(export_dir) -> Path:
    """``leapp aoti EXPORT obs`` (the console entry point, in this process); the global Inductor config is untouched."""
    before = torch._inductor.config.get_config_copy()
    logger, handler = logging.getLogger("leapp.aoti"), _Collect()
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            assert cli.main(["aoti", str(export_dir), "obs"]) == 0
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    AOTI_LOG[:] = handler.messages
    AOTI_ERR[:] = err.getvalue().splitlines()
    assert torch._inductor.config.get_config_copy() == before, "leapp aoti changed torch._inductor.config"
    path = export_dir / "obs.aoti.pt2"
    assert path.is_file()
    return path


@pytest.fixture(scope="module")
def input_sets(tmp_path_factory) -> Path:
    """Two sets of fresh inputs (never the example inputs the program was exported with)."""
    root = tmp_path_factory.mktemp("aoti_sets")
    gen = torch.Generator().manual_seed(11)
    for k in range(2):
        write_tensors(root / f"set{k}", [torch.randn(N, generator=gen) * (k + 1)], "input")
    return root


@pytest.fixture(scope="module")
def python_run(export_dir, package, fake_cuda, input_sets) -> Path:
    """aoti_replay.py under the fake driver: leapp.load's and the package's outputs per input set."""
    library, mock = fake_cuda
    proc = subprocess.run(
        [sys.executable, str(HERE / "aoti_replay.py"), str(export_dir), "obs", str(package), str(input_sets)],
        cwd=HERE, env=mock_driver_env(mock, LEAPP_WARP_PT2_CUSTOM_OP_LIBRARY=library),
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return input_sets


def _assert_equal(got: list[torch.Tensor], want: list[torch.Tensor], what: str) -> None:
    assert len(got) == len(want), f"{what}: {len(got)} outputs, expected {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype and g.shape == w.shape, (what, i, g.dtype, w.dtype, g.shape, w.shape)
        assert torch.equal(g, w), f"{what}: output {i} differs (max abs {(g - w).abs().max().item()})"


def test_package_runs_the_op_through_the_proxy_executor(package, tmp_path):
    """The package calls leapp::warp_segment (serialised for the proxy executor) and links the shared C++ runtime."""
    with zipfile.ZipFile(package) as archive:
        names = archive.namelist()
        calls = [archive.read(n).decode() for n in names if n.endswith(".wrapper.json")]
        libraries = [n for n in names if n.endswith(".so")]
        assert len(calls) == 1 and calls[0].count('"target": "leapp::warp_segment"') == SEGMENTS, calls
        assert len(libraries) == 1, names
        so = tmp_path / "model.so"
        so.write_bytes(archive.read(libraries[0]))
    assert RUNTIME_SYMBOL not in defined_dynamic_symbols(so), "the model library carries its own C++ runtime"


def test_package_in_python_equals_leapp_load(python_run):
    import json

    info = json.loads((python_run / "info.json").read_text())
    assert info["native"] is True and info["library"].endswith("libleapp_warp_torch_test.so"), info
    for k in range(2):
        folder = python_run / f"set{k}"
        (x,) = read_tensors(folder, "input")
        want = read_tensors(folder / "load")
        for got, expected in zip(want, _expected(x)):  # the fake driver really replayed both segments
            torch.testing.assert_close(got, expected)
        _assert_equal(read_tensors(folder / "python_aoti"), want, f"aoti_load_package on set{k}")


@pytest.fixture(scope="module")
def cpp_program(tmp_path_factory) -> Path:
    """aoti_cpp/ built with CMake against this torch (Debug: -O0 -g, one source file)."""
    cmake = shutil.which("cmake")
    if cmake is None:
        pytest.skip("cmake is not installed (the C++ loader program is built with CMake)")
    if not (Path(torch.__file__).parent / "include" / "torch" / "csrc" / "inductor" / "aoti_package").is_dir():
        pytest.skip("this torch ships no AOTInductor C++ headers")
    build = tmp_path_factory.mktemp("aoti_cpp_build")
    configure = subprocess.run(
        [cmake, "-S", str(HERE / "aoti_cpp"), "-B", str(build), "-DCMAKE_BUILD_TYPE=Debug",
         f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}"],
        capture_output=True, text=True, timeout=300,
    )
    assert configure.returncode == 0, configure.stdout[-3000:] + configure.stderr[-3000:]
    compiled = subprocess.run([cmake, "--build", str(build)], capture_output=True, text=True, timeout=600)
    assert compiled.returncode == 0, compiled.stdout[-4000:] + compiled.stderr[-4000:]
    return build / "aoti_run"


def test_package_in_cpp_equals_leapp_load(cpp_program, package, fake_cuda, python_run):
    library, mock = fake_cuda
    ldd = shutil.which("ldd")
    if ldd:  # no Python in the process: the program links libtorch, never libpython or libtorch_python
        linked = subprocess.run([ldd, str(cpp_program)], capture_output=True, text=True).stdout
        assert "libtorch_cpu" in linked and "libpython" not in linked and "libtorch_python" not in linked, linked
    env = mock_driver_env(mock)
    for k in range(2):
        folder = python_run / f"set{k}"
        out = folder / "cpp_aoti"
        out.mkdir()
        proc = subprocess.run([str(cpp_program), str(library), str(package), "cpu", str(folder), str(out)],
                              env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert "2 outputs on cpu" in proc.stdout, proc.stdout
        _assert_equal(read_tensors(out), read_tensors(folder / "load"), f"C++ AOTIModelPackageLoader on set{k}")


def test_cpp_load_without_the_op_library_names_the_op(cpp_program, package, fake_cuda, python_run, tmp_path):
    """The proxy executor resolves the op when the package is loaded: without the library, a clear error."""
    _, mock = fake_cuda
    libc10 = Path(torch.__file__).parent / "lib" / "libc10.so"  # loads fine, registers no leapp op
    proc = subprocess.run([str(cpp_program), str(libc10), str(package), "cpu", str(python_run / "set0"), str(tmp_path)],
                          env=mock_driver_env(mock), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "Could not find schema for leapp::warp_segment" in proc.stderr, proc.stderr[-2000:]


# --- a compiler whose links carry a private C++ runtime (the H200 machine's /opt/gcc) ------------------


def _wrapper_compiler(folder: Path, extra_case: str = "") -> Path:
    """A g++ whose shared-library links embed a static libstdc++ (as one whose -lstdc++ finds only libstdc++.a)."""
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("no g++ to wrap")
    script = folder / "g++-static-runtime"
    script.write_text(
        "#!/bin/sh\n"
        f"{extra_case}"
        f'for a in "$@"; do [ "$a" = "-shared" ] && exec {gxx} "$@" -static-libstdc++; done\n'
        f'exec {gxx} "$@"\n'
    )
    script.chmod(0o755)
    return script


def test_static_runtime_compiler_gets_the_shared_one(export_dir, tmp_path):
    """leapp aoti links libstdc++.so.6 into the package when the compiler would embed its own copy."""
    compiler = _wrapper_compiler(tmp_path)
    probe = probe_compiler(str(compiler))
    assert probe.private and probe.fix == [":libstdc++.so.6"], probe
    import leapp.aoti

    configs = {"cpp.cxx": (None, str(compiler))}
    path = leapp.aoti.package(export_dir, "obs", tmp_path / "static.pt2", inductor_configs=configs)
    assert configs == {"cpp.cxx": (None, str(compiler))}, "the caller's inductor_configs were changed"
    with zipfile.ZipFile(path) as archive:
        (so_name,) = [n for n in archive.namelist() if n.endswith(".so")]
        so = tmp_path / "model.so"
        so.write_bytes(archive.read(so_name))
    assert RUNTIME_SYMBOL not in defined_dynamic_symbols(so), "the package carries a private C++ runtime"
    torch._inductor.aoti_load_package(str(path))  # loads (without the fix: "Error: std::bad_cast", nothing loads)


def test_static_runtime_compiler_without_a_fix_is_refused(tmp_path):
    import leapp.aoti

    compiler = _wrapper_compiler(tmp_path, 'for a in "$@"; do case "$a" in -l:*) echo "ld: cannot find $a" >&2; exit 1;; esac; done\n')
    with pytest.raises(ExportError, match=rf"the C\+\+ compiler Inductor uses \({re.escape(str(compiler))}: \$CXX .*links a private, "
                                          r"static copy of libstdc\+\+.*ld: cannot find -l:libstdc\+\+\.so\.6.*CXX=/usr/bin/g\+\+"):
        leapp.aoti.compiler_configs({"cpp.cxx": (None, str(compiler))})


def test_shared_runtime_compiler_needs_nothing():
    if shutil.which("g++") is None:
        pytest.skip("no g++")
    import leapp.aoti

    assert not probe_compiler("g++").private
    assert leapp.aoti.compiler_configs({"cpp.cxx": (None, "g++")}) == {"cpp.cxx": (None, "g++")}


# --- refusals: no compile ----------------------------------------------------------------------------


def _variant(export_dir: Path, tmp_path: Path, edit=None) -> Path:
    """A copy of the export whose pipeline.yaml is passed through ``edit`` (the parsed description)."""
    folder = tmp_path / "variant"
    shutil.copytree(export_dir, folder, ignore=shutil.ignore_patterns("*.aoti.pt2"))
    if edit is not None:
        desc = yaml.safe_load((folder / "pipeline.yaml").read_text())
        edit(desc)
        (folder / "pipeline.yaml").write_text(yaml.safe_dump(desc, sort_keys=False))
        write_twin(folder)  # as whoever edited it would: a stale twin is refused before anything else
    return folder


def _refused(capsys, *args) -> str:
    assert cli.main(["aoti", *map(str, args)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    return captured.err


def test_unknown_node_is_refused(export_dir, capsys):
    err = _refused(capsys, export_dir, "policy")
    assert f"leapp aoti: error: {export_dir / 'pipeline.yaml'}: no node named 'policy' (nodes: obs)" in err


def test_onnx_node_is_refused(export_dir, tmp_path, capsys):
    def as_onnx(desc):
        desc["nodes"][0]["backend"] = "onnx"

    folder = _variant(export_dir, tmp_path, as_onnx)
    err = _refused(capsys, folder, "obs")
    assert f"{folder / 'pipeline.yaml'}: node 'obs' is a onnx node (obs.pt2); AOTInductor packages are made from PT2 nodes" in err


def test_changed_artifact_is_refused(export_dir, tmp_path, capsys):
    folder = _variant(export_dir, tmp_path)
    data = bytearray((folder / "obs.pt2").read_bytes())
    data[len(data) // 2] ^= 1
    (folder / "obs.pt2").write_bytes(bytes(data))
    err = _refused(capsys, folder, "obs")
    assert "pipeline 'demo' node 'obs': artifact" in err and "obs.pt2 has sha256" in err and "the file changed after export" in err
    assert not list(folder.glob("*.aoti.pt2")) and not list(folder.glob(".leapp-aoti-*"))


def test_missing_export_is_refused(tmp_path, capsys):
    err = _refused(capsys, tmp_path, "obs")
    assert f"leapp aoti: error: no pipeline.yaml in {tmp_path}" in err


def test_without_torch_the_command_says_so(export_dir):
    code = ("import sys; sys.modules['torch'] = None; from leapp import cli; "
            f"sys.exit(cli.main(['aoti', {str(export_dir)!r}, 'obs']))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "leapp aoti: error: AOTInductor packages need torch with Inductor (ModuleNotFoundError" in proc.stderr


@pytest.mark.parametrize("hostile", ["../obs", "sub/obs", ".obs"])
def test_hostile_node_name_cannot_place_the_package(export_dir, tmp_path, capsys, hostile):
    """The node name becomes the file name: pipeline.yaml is untrusted, so the exporter's path rule applies."""
    def rename(desc):
        desc["nodes"][0]["name"] = hostile
        for entry in desc["inputs"]:
            for consumer in entry["consumers"]:
                consumer["node"] = hostile
        for entry in desc["outputs"]:
            entry["node"] = hostile

    folder = _variant(export_dir, tmp_path, rename)
    err = _refused(capsys, folder, hostile)
    assert f"node '{hostile}' of {folder}: invalid name" in err, err
    assert sorted(p.name for p in tmp_path.rglob("*")) == sorted(["variant", "obs.pt2", "pipeline.json", "pipeline.yaml"])


def test_output_paths(export_dir, tmp_path):
    import leapp.aoti

    assert leapp.aoti.package_path(export_dir, "obs") == export_dir / "obs.aoti.pt2"
    assert leapp.aoti.package_path(export_dir, "obs", tmp_path) == tmp_path / "obs.aoti.pt2"
    assert leapp.aoti.package_path(export_dir, "obs", tmp_path / "m.pt2") == tmp_path / "m.pt2"
    with pytest.raises(ExportError, match=r"the output .*m\.so must end in \.pt2"):
        leapp.aoti.package_path(export_dir, "obs", tmp_path / "m.so")
    with pytest.raises(ExportError, match=r"the output folder .*nowhere does not exist"):
        leapp.aoti.package_path(export_dir, "obs", tmp_path / "nowhere" / "m.pt2")
    outside = tmp_path / "outside"
    outside.mkdir()
    inside = tmp_path / "inside"
    inside.mkdir()
    os.symlink(outside / "m.pt2", inside / "m.pt2")
    with pytest.raises(ExportError, match=r"resolves to .*outside.*leapp writes only inside that folder"):
        leapp.aoti.package_path(export_dir, "obs", inside / "m.pt2")
