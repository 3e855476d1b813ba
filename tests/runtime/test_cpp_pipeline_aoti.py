"""The C++ runner (leapp-run) on a PT2 node from its AOTInductor package, next to an ONNX node, on CPU CI.

One real export (``compile_session``): node 'obs' (PT2) calls ``leapp::warp_segment`` twice with
``leapp.bundle.testing``'s example bundle (as tests/runtime/test_aoti.py builds it), node 'policy'
(ONNX) reads obs's output 'out'; obs's second output 'h' is a pipeline output. ``leapp aoti`` compiles
obs once (module fixture) and records the package in pipeline.yaml / pipeline.json. leapp-run then runs
obs through libleapp_pipeline_aoti.so (AOTIModelPackageLoader) and policy through ONNX Runtime; the op
is the CPU-as-CUDA test build, the driver the fake (conftest.py's ``fake_cuda``): Warp kernels cannot
run here, and the fake driver emulates exactly the example kernel. Outputs must equal ``leapp.load``'s
(same fake environment, in a subprocess) bit for bit. The refusals need no second compile.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from runtime_helpers import mock_driver_env

import leapp
from leapp import cli
from leapp.errors import ExportError
from leapp.pipeline_format import sha256_file, twin_text, yaml_text
from leapp.runtime.libraries import native_dir

HERE = Path(__file__).resolve().parent
LEAPP_RUN = Path(sys.executable).with_name("leapp-run")
N = 64
SEGMENTS = 2

pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="AOTInductor packages and the fake driver are Linux .so files"),
    pytest.mark.skipif(not LEAPP_RUN.is_file(), reason="leapp-run was not built: ONNX Runtime's headers are missing "
                       "(bash scripts/fetch-ort-headers.sh, then pip install -e . again)"),
    pytest.mark.skipif(not (native_dir() / "libleapp_pipeline_aoti.so").is_file(),
                       reason="libleapp_pipeline_aoti.so was not built (torch was not found when leapp was built)"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning"),
]


def _compile_records():
    spec = importlib.util.spec_from_file_location("_cpp_aoti_compile_records", HERE.parent / "export" / "compile_records.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Policy(torch.nn.Module):
    """An ONNX node with outputs in tanh's unsaturated range for obs's large values (bit equality means something)."""

    def __init__(self):
        super().__init__()
        gen = torch.Generator().manual_seed(5)
        self.l1 = torch.nn.Linear(N, 16)
        self.l2 = torch.nn.Linear(16, 8)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)

    def forward(self, feat):
        return (torch.tanh(self.l2(torch.nn.functional.elu(self.l1(feat * 1e-4)))),)


@pytest.fixture(scope="module")
def export(tmp_path_factory) -> Path:
    from leapp._export.compile import compile_session

    cr = _compile_records()
    obs = cr.segment_node("obs", "pt2", n=N, segments=SEGMENTS, device="cpu", samples=0)
    policy = cr.NodeRecord(name="policy", export_with="onnx", backend_params={}, source="test_cpp_pipeline_aoti.py",
                           inputs=[cr.spec("feat", (N,))], outputs=[cr.spec("actions", (8,))],
                           graph=torch.fx.symbolic_trace(Policy().eval()), segments=[], samples=[])
    root = tmp_path_factory.mktemp("cpp_aoti")
    compile_session(cr.session(root, obs, policy, edges=[("obs", "out", "policy", "feat")]), validate=False,
                    bundles=cr.example_bundles)
    return root / "demo"


@pytest.fixture(scope="module")
def package(export) -> Path:
    """``leapp aoti EXPORT obs`` through the console entry point: one compile for the module."""
    assert cli.main(["aoti", str(export), "obs"]) == 0
    return export / "obs.aoti.pt2"


@pytest.fixture
def folder(export, package, tmp_path) -> Path:
    """A private copy (package included) to tamper with."""
    return Path(shutil.copytree(export, tmp_path / "demo"))


def _env(fake_cuda, **extra) -> dict:
    library, mock = fake_cuda
    return mock_driver_env(mock, LEAPP_WARP_PT2_CUSTOM_OP_LIBRARY=library, **extra)


def _leapp_run(env, *args) -> subprocess.CompletedProcess:
    return subprocess.run([str(LEAPP_RUN), *map(str, args)], env=env, capture_output=True, text=True, timeout=180)


def _rewrite(folder: Path, edit) -> None:
    """pipeline.yaml passed through ``edit`` (the parsed description), and its twin bound to it."""
    desc = yaml.safe_load((folder / "pipeline.yaml").read_text())
    edit(desc)
    (folder / "pipeline.yaml").write_text(yaml_text(desc))
    (folder / "pipeline.json").write_text(twin_text(desc, sha256_file(folder / "pipeline.yaml")))


_LOAD = """
import sys, torch, leapp
from pathlib import Path
folder, inputs, out = map(Path, sys.argv[1:])
x = torch.frombuffer(bytearray((inputs / "x.bin").read_bytes()), dtype=torch.float32)
out.mkdir()
for name, value in leapp.load(folder)(x=x).items():
    (out / f"{name}.bin").write_bytes(value.contiguous().numpy().tobytes())
"""


def test_package_is_recorded_in_pipeline_yaml_and_its_twin(export, package):
    node = yaml.safe_load((export / "pipeline.yaml").read_text())["nodes"][0]
    assert node["name"] == "obs" and node["aoti"] == {"path": "obs.aoti.pt2", "sha256": sha256_file(package),
                                                      "torch": str(torch.__version__)}
    twin = json.loads((export / "pipeline.json").read_text())
    assert twin["nodes"][0]["aoti"] == node["aoti"] and twin["pipeline_yaml_sha256"] == sha256_file(export / "pipeline.yaml")
    leapp.load(export)  # Python's reader accepts the entry (and does not need the package)


def test_leapp_run_pt2_package_and_onnx_equal_leapp_load_bit_for_bit(export, package, fake_cuda, tmp_path):
    env = _env(fake_cuda)
    expected_fn = _compile_records().expected_segment_outputs
    for seed in (1, 2):
        x = torch.randn(N, generator=torch.Generator().manual_seed(seed)) * seed
        inputs = tmp_path / f"in{seed}"
        inputs.mkdir()
        (inputs / "x.bin").write_bytes(x.numpy().tobytes())
        r = _leapp_run(env, export, "--in", inputs, "--out", tmp_path / f"cpp{seed}", "--time", "3")
        assert r.returncode == 0, r.stdout + r.stderr[-4000:]
        assert "(aoti-cpu)" in r.stdout and "(ort-cpu)" in r.stdout, r.stdout
        load = subprocess.run([sys.executable, "-c", _LOAD, str(export), str(inputs), str(tmp_path / f"py{seed}")],
                              env=env, capture_output=True, text=True, timeout=300)
        assert load.returncode == 0, load.stderr[-4000:]
        names = sorted(p.name for p in (tmp_path / f"py{seed}").iterdir())
        assert names == ["actions.bin", "h.bin"]
        assert sorted(p.name for p in (tmp_path / f"cpp{seed}").iterdir()) == names
        for name in names:
            assert (tmp_path / f"cpp{seed}" / name).read_bytes() == (tmp_path / f"py{seed}" / name).read_bytes(), name
        # the fake driver really replayed both segments: h = x + 1 comes out of segment 0's input side,
        # actions is computed from out = (x + 1) * c * c * 2
        h = torch.frombuffer(bytearray((tmp_path / f"cpp{seed}" / "h.bin").read_bytes()), dtype=torch.float32)
        torch.testing.assert_close(h, expected_fn(x, SEGMENTS)[1])
        actions = torch.frombuffer(bytearray((tmp_path / f"cpp{seed}" / "actions.bin").read_bytes()), dtype=torch.float32)
        with torch.no_grad():
            want = Policy()(expected_fn(x, SEGMENTS)[0])[0]
        torch.testing.assert_close(actions, want)
        assert actions.abs().max() < 0.999  # not saturated: the comparison sees the values


def test_core_runner_does_not_link_libtorch():
    """libtorch is the plugin's alone: leapp-run and libleapp_pipeline.so load without it."""
    ldd = shutil.which("ldd")
    if ldd is None:
        pytest.skip("no ldd")
    for path in (LEAPP_RUN, native_dir() / "libleapp_pipeline.so"):
        linked = subprocess.run([ldd, str(path)], capture_output=True, text=True).stdout
        assert "libtorch" not in linked and "libc10" not in linked, (path, linked)
    linked = subprocess.run([ldd, str(native_dir() / "libleapp_pipeline_aoti.so")], capture_output=True, text=True).stdout
    assert "libtorch_cpu" in linked, linked


def _refusal(env, folder: Path, *args) -> str:
    r = _leapp_run(env, folder, *(args or ("--in", folder, "--out", folder / "out")))
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    assert not (folder / "out").exists()
    return r.stderr.strip().removeprefix("leapp-run: ")


def test_pt2_node_without_a_package_is_refused_naming_leapp_aoti(folder, fake_cuda):
    _rewrite(folder, lambda d: d["nodes"][0].pop("aoti"))
    text = _refusal(_env(fake_cuda), folder)
    assert text == (f"pipeline 'demo' node 'obs': a pt2 node (obs.pt2) without an AOTInductor package; leapp's C++ "
                    f"runner runs a PT2 node from the package that `leapp aoti {folder} obs` makes and records in "
                    "pipeline.yaml (docs/aoti.md), or export the node with export_with='onnx'")


def test_node_runs_alone_without_packages_for_the_others(export, tmp_path):
    """Issue 34: ``leapp-run --node policy`` refused because another node (obs, PT2) had no AOTInductor package.
    The other nodes' files are still checked (a changed obs.pt2 is refused by name); only the named node opens."""
    import numpy as np
    import onnxruntime as ort

    folder = Path(shutil.copytree(export, tmp_path / "demo"))
    _rewrite(folder, lambda d: d["nodes"][0].pop("aoti", None))  # the module's package fixture may have run
    feat = torch.randn(N, generator=torch.Generator().manual_seed(2)) * 1e3
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "feat.bin").write_bytes(feat.numpy().tobytes())
    r = _leapp_run(None, folder, "--in", tmp_path / "in", "--out", tmp_path / "out", "--node", "policy")
    assert r.returncode == 0, r.stderr
    session = ort.InferenceSession(str(folder / "policy.onnx"), providers=["CPUExecutionProvider"])
    (want,) = session.run(None, {session.get_inputs()[0].name: feat.numpy()})
    got = np.frombuffer((tmp_path / "out" / "actions.bin").read_bytes(), dtype=np.float32)
    assert got.tobytes() == want.astype(np.float32).tobytes()
    r = _leapp_run(None, folder, "--describe")  # the whole pipeline still needs the package
    assert r.returncode == 1 and "without an AOTInductor package" in r.stderr
    with open(folder / "obs.pt2", "ab") as f:
        f.write(b"\0")
    r = _leapp_run(None, folder, "--in", tmp_path / "in", "--out", tmp_path / "out2", "--node", "policy")
    assert r.returncode == 1 and "node 'obs'" in r.stderr and "has sha256" in r.stderr, r.stderr
    r = _leapp_run(None, folder, "--in", tmp_path / "in", "--out", tmp_path / "out2", "--node", "nope")
    assert r.returncode == 2 and "--node: pipeline 'demo' has no node 'nope' (nodes: ['obs', 'policy'])" in r.stderr


def test_a_cpu_package_with_warp_segments_is_refused_at_open_with_leapps_reason(folder):
    """Issue 34: leapp's one-line reason came out buried in 17 frames of torch's stack trace, at the first run,
    ending with "Move the inputs to a CUDA device". leapp's own op library cannot replay a segment on the CPU,
    so the pipeline refuses the CPU package of a node with Warp segments at open, with leapp's reason alone."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "LEAPP_WARP_PT2_CUSTOM_OP_LIBRARY"}
    text = _refusal(env, folder)
    assert text == (f"pipeline 'demo' node 'obs': {SEGMENTS} of its {SEGMENTS} Warp segment(s) hold no CPU code for "
                    "this machine and replay on CUDA devices only, and its AOTInductor package (obs.aoti.pt2) runs on "
                    "the CPU: export the node with CPU code (trace it on the CPU, or LEAPP_CPU_CODE=1; "
                    "docs/export-cpu.md), or make its package on a CUDA device (`leapp aoti`) and open the pipeline "
                    "with device buffers (leapp-run --device cuda)")


def test_changed_package_is_refused(folder, fake_cuda):
    data = bytearray((folder / "obs.aoti.pt2").read_bytes())
    data[len(data) // 2] ^= 1
    (folder / "obs.aoti.pt2").write_bytes(bytes(data))
    recorded = yaml.safe_load((folder / "pipeline.yaml").read_text())["nodes"][0]["aoti"]["sha256"]
    want = (f"pipeline 'demo' node 'obs': AOTInductor package {folder}/obs.aoti.pt2 has sha256 "
            f"{sha256_file(folder / 'obs.aoti.pt2')} but pipeline.yaml records {recorded} ({folder}/pipeline.json: "
            f"nodes[0].aoti.sha256); the file changed after `leapp aoti` recorded it: run `leapp aoti {folder} obs` again")
    env = _env(fake_cuda)
    assert _refusal(env, folder) == want
    assert _refusal(env, folder, "--check") == want  # --check verifies packages too, opening nothing
    (folder / "obs.aoti.pt2").unlink()
    assert _refusal(env, folder) == (f"pipeline 'demo' node 'obs': AOTInductor package {folder}/obs.aoti.pt2 is missing "
                                     f"({folder}/pipeline.json: nodes[0].aoti.path); run `leapp aoti {folder} obs` again")


def test_package_path_outside_the_folder_is_refused(folder, fake_cuda, tmp_path):
    shutil.copy(folder / "obs.aoti.pt2", tmp_path / "outside.pt2")
    _rewrite(folder, lambda d: d["nodes"][0]["aoti"].update(path="../outside.pt2"))
    text = _refusal(_env(fake_cuda), folder)
    assert text.startswith(f"{folder}/pipeline.json: nodes[0].aoti.path (pipeline 'demo' node 'obs'): path "
                           f"'../outside.pt2' leaves the pipeline folder {folder}"), text


def test_package_of_another_torch_is_refused(folder, fake_cuda):
    _rewrite(folder, lambda d: d["nodes"][0]["aoti"].update(torch="2.12.0+cu128"))
    text = _refusal(_env(fake_cuda), folder)
    assert (f"pipeline 'demo' node 'obs': its AOTInductor package {folder}/obs.aoti.pt2 was compiled by torch 2.12.0+cu128 "
            f"({folder}/pipeline.json: nodes[0].aoti.torch), and leapp's plugin") in text
    assert f"runs libtorch {torch.__version__.split('+')[0]}; a package runs on the torch release that compiled it" in text


def test_malformed_entry_is_refused_by_both_readers_alike(folder, fake_cuda):
    from leapp.pipeline_format import PipelineError

    _rewrite(folder, lambda d: d["nodes"][0]["aoti"].pop("sha256"))
    with pytest.raises(PipelineError) as python:
        leapp.load(folder)
    text = _refusal(_env(fake_cuda), folder, "--check")
    assert text == str(python.value).replace(f"{folder}/pipeline.yaml", f"{folder}/pipeline.json")
    assert "nodes[0].aoti.sha256: missing" in text


def test_without_the_plugin_the_node_is_refused(folder, fake_cuda, tmp_path):
    """No plugin next to the package (a build without torch) and a plugin that does not load: both name it."""
    from leapp.runtime.libraries import onnxruntime_library

    empty = tmp_path / "empty_package"
    empty.mkdir()
    ort_library = onnxruntime_library()
    env = _env(fake_cuda, LEAPP_PACKAGE_DIR=empty, LEAPP_ONNXRUNTIME_LIBRARY=ort_library,
               LEAPP_WARP_ONNX_CUSTOM_OP_LIBRARY=native_dir() / "libleapp_warp_ort.so")
    text = _refusal(env, folder)
    assert text.startswith("pipeline 'demo' node 'obs': a pt2 node runs from its AOTInductor package (obs.aoti.pt2) "
                           "through leapp's plugin libleapp_pipeline_aoti.so, which was not found"), text
    broken = tmp_path / "libleapp_pipeline_aoti.so"
    broken.write_bytes(b"not an ELF file")
    text = _refusal(_env(fake_cuda, LEAPP_PIPELINE_AOTI_PLUGIN=broken), folder)
    assert text.startswith(f"pipeline 'demo' node 'obs': cannot load leapp's AOTInductor plugin {broken}: "), text


def test_package_written_outside_the_folder_is_not_recorded(export, tmp_path):
    import leapp.aoti

    assert leapp.aoti.recorded_path(export, export / "obs.aoti.pt2") == "obs.aoti.pt2"
    assert leapp.aoti.recorded_path(export, tmp_path / "obs.aoti.pt2") is None


def test_recording_refuses_a_pipeline_yaml_changed_meanwhile(folder):
    """pipeline.yaml edited while the package compiled is not overwritten (the package stays unrecorded)."""
    import leapp.aoti
    from leapp.pipeline_format import read_pipeline

    path, desc = read_pipeline(folder)
    before = (folder / "pipeline.yaml").read_bytes()
    with pytest.raises(ExportError, match=r"pipeline\.yaml changed while `leapp aoti` compiled node 'obs'"):
        leapp.aoti._record(path, desc, "0" * 64, 0, folder / "obs.aoti.pt2", "1" * 64, "2.13.0")
    assert (folder / "pipeline.yaml").read_bytes() == before
