"""Warp segments on the CPU (docs/export-cpu.md): a node traced on the CPU exports with native CPU code for its
Warp kernels, validates on a machine without a GPU, and leapp.load, the ONNX op and leapp-run run it there.

Everything here runs on a CPU-only machine; it needs Warp and a C++ compiler (the export compiles Warp's CPU
source) and leapp's native module.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import leapp
from leapp import annotate
from leapp.bundle import BundleError, read_bundle
from leapp.runtime.pipeline import load
from cpu_observation import BATCH, add_rows, bundle_of, gravity_scaled, observe, quats, rewritten, trace, warp_cpu

wp = pytest.importorskip("warp")
pytestmark = [pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning"),
              pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None,
                                 reason="needs a C++ compiler: the export compiles Warp's CPU source")]
@pytest.fixture(scope="module", params=["pt2", "onnx"])
def export(request, tmp_path_factory):
    report, folder = trace(tmp_path_factory.mktemp(request.param), request.param)
    return request.param, report, folder


@warp_cpu
def test_a_cpu_traced_node_validates_on_the_cpu(export):
    backend, report, folder = export
    entry = report["obs"]
    assert entry.status == "passed", str(report)
    assert all(check.max_abs <= 1e-6 for check in entry.validation.outputs), str(report)


@warp_cpu
def test_the_bundle_carries_cpu_code_and_inspect_shows_it(export):
    _, _, folder = export
    r = subprocess.run([str(Path(sys.executable).with_name("leapp")), "inspect", str(folder)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert "CPU code: x86_64 shared object" in r.stdout or "CPU code: aarch64 shared object" in r.stdout, r.stdout
    assert "CPU entry gravity_scaled_" in r.stdout and "_cpu_forward" in r.stdout, r.stdout


@warp_cpu
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**31 - 1))
def test_loaded_export_equals_eager_warp_on_the_cpu(export, seed):
    _, _, folder = export
    pipeline = leapp.load(folder)
    quat = quats(BATCH, seed)
    got = pipeline(quat=quat)
    (out,) = got.values()
    torch.testing.assert_close(out, observe(quat), rtol=1e-5, atol=1e-6)


@warp_cpu
def test_concurrent_calls_share_no_state(export):
    _, _, folder = export
    pipeline = leapp.load(folder)
    _in_threads(lambda quat: next(iter(pipeline(quat=quat).values())), calls=50, seed=100)


def _in_threads(call, calls: int, seed: int, threads: int = 8) -> None:
    """``call(quat)`` from ``threads`` threads at once, ``calls`` times each on its own input; every last result
    must equal eager."""
    inputs = [quats(BATCH, seed + i) for i in range(threads)]
    want = [observe(q) for q in inputs]
    errors, got = [], [None] * threads

    def run(i):
        try:
            for _ in range(calls):
                got[i] = call(inputs[i])
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    assert not errors, errors
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


@warp_cpu
def test_dynamic_batch_runs_every_batch_of_the_range(tmp_path):
    report, folder = trace(tmp_path, "pt2", dynamic=(1, 64))
    assert report["obs"].status == "passed", str(report)
    pipeline = leapp.load(folder)
    for batch in (1, 7, 16, 64):
        quat = quats(batch, batch)
        (out,) = pipeline(quat=quat).values()
        torch.testing.assert_close(out, observe(quat), rtol=1e-5, atol=1e-6)


@warp_cpu
def test_leapp_run_runs_the_onnx_export_on_the_cpu(export, tmp_path):
    backend, _, folder = export
    if backend != "onnx":
        pytest.skip("leapp-run runs a pt2 node from an AOTInductor package: test_aoti_cpu_package covers it")
    leapp_run = Path(sys.executable).with_name("leapp-run")
    if not leapp_run.is_file():
        pytest.skip("leapp-run was not built (ONNX Runtime's headers were missing at build time)")
    _leapp_run_equals_eager(leapp_run, folder, tmp_path, seed=7)


def _leapp_run_equals_eager(leapp_run: Path, folder: Path, tmp_path: Path, seed: int) -> str:
    """leapp-run on the export (20 timed steps, host buffers) equals eager on new inputs; returns its stdout."""
    from leapp.testing.cpp_runner import leapp_run_env

    quat = quats(BATCH, seed)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "quat.bin").write_bytes(quat.numpy().tobytes())
    r = subprocess.run([str(leapp_run), str(folder), "--in", str(tmp_path / "in"), "--out", str(tmp_path / "out"),
                        "--time", "20"], capture_output=True, text=True, timeout=600, env=leapp_run_env())
    assert r.returncode == 0, r.stdout + r.stderr
    (name,) = leapp.load(folder).outputs
    got = np.fromfile(tmp_path / "out" / f"{name}.bin", dtype=np.float32).reshape(BATCH, 4)
    np.testing.assert_allclose(got, observe(quat).numpy(), rtol=1e-5, atol=1e-6)
    return r.stdout


@warp_cpu
def test_no_cpu_code_when_turned_off(tmp_path, monkeypatch):
    monkeypatch.setenv("LEAPP_CPU_CODE", "0")
    report, folder = trace(tmp_path, "pt2", validate=False)
    assert "cpu_code" not in read_bundle(bundle_of(folder)).manifest
    with pytest.raises(RuntimeError, match=r"holds no CPU code for this machine \(\w+\): it was exported for CUDA "
                                           r"devices only \(export it with LEAPP_CPU_CODE=1"):
        leapp.load(folder)(quat=quats(BATCH, 0))
    monkeypatch.setenv("LEAPP_CPU_CODE", "sometimes")
    with pytest.raises(leapp.ExportError, match=r"\$LEAPP_CPU_CODE='sometimes': expected 'auto'"):
        trace(tmp_path / "bad", "pt2", validate=False)


# ------------------------------------------------------------------ hostile bundles


def _native_parse(data: bytes):
    from leapp import _native

    return _native.Bundle(data)


def _raw_code(manifest: dict, blobs: list, data: bytes) -> None:
    """cpu_code[0] replaced by ``data``, stored raw."""
    code = manifest["cpu_code"][0]
    code.pop("encoding", None)
    code.pop("decoded_bytes", None)
    blobs[code["blob"]] = data


def _compressed_code(manifest: dict, blobs: list, data: bytes) -> None:
    """cpu_code[0] replaced by ``data``, stored as an LZ4 block (a valid one: the decoded bytes are refused)."""
    from leapp.bundle.lz4_block import encode_block

    code = manifest["cpu_code"][0]
    code.update(encoding="lz4-block", decoded_bytes=len(data))
    blobs[code["blob"]] = encode_block(data)


@pytest.fixture(scope="module")
def cpu_bundle(tmp_path_factory) -> bytes:
    _, folder = trace(tmp_path_factory.mktemp("hostile"), "pt2", validate=False)
    return bundle_of(folder)


@pytest.mark.parametrize("edit, message", [
    (lambda m, b: m["cpu_code"][0].update(machine="riscv64"), "machine"),
    (lambda m, b: m["cpu_code"].append(dict(m["cpu_code"][0])), "second CPU code"),
    (lambda m, b: _raw_code(m, b, b"\x7fELF" + bytes(60)), "64-bit little-endian"),
    (lambda m, b: _raw_code(m, b, b"MZ" + bytes(100)), "not an ELF file"),
    (lambda m, b: _compressed_code(m, b, b"MZ" + bytes(100)), "not an ELF file"),
    (lambda m, b: m["cpu_code"][0].update(machine="aarch64" if os.uname().machine == "x86_64" else "x86_64"),
     "e_machine"),
    (lambda m, b: m.pop("cpu_code"), "cpu_entry"),
    (lambda m, b: m["kernels"][0].pop("cpu_entry"), "cpu_entry"),
    (lambda m, b: m.update(cpu_code=[]), "empty"),
], ids=["machine", "twice", "elf-class", "not-elf", "not-elf-compressed", "other-machine", "entry-without-code", "code-without-entry",
        "empty"])
@warp_cpu
def test_both_readers_refuse_a_hostile_cpu_code_entry(cpu_bundle, edit, message):
    data = rewritten(cpu_bundle, edit)
    with pytest.raises(BundleError, match=message):
        read_bundle(data)
    with pytest.raises(ValueError, match=message):
        _native_parse(data)


def _run_cpu(data: bytes, n: int = BATCH):
    from leapp import _native

    bundle = _native.Bundle(data)
    quat, grav, norm = quats(n, 1), torch.empty(n, 3), torch.empty(n)
    _native.run_segment_cpu(bundle, [quat.data_ptr()], [norm.data_ptr(), grav.data_ptr()], [quat.numel() * 4],
                            [norm.numel() * 4, grav.numel() * 4])  # signature order: norm is zeroed first
    return norm, grav


@warp_cpu
def test_a_cpu_entry_the_code_does_not_define_is_refused_by_name(cpu_bundle):
    norm, grav = _run_cpu(rewritten(cpu_bundle, lambda m, b: None))  # the control: resealed as is, it runs
    torch.testing.assert_close(torch.cat([grav, norm[:, None]], dim=1) * 0.5, observe(quats(BATCH, 1)))
    data = rewritten(cpu_bundle, lambda m, b: m["kernels"][0].update(cpu_entry="system"))
    with pytest.raises(ValueError, match=r"kernels\[0\] CPU entry 'system': not defined by the CPU code"):
        _run_cpu(data)


@warp_cpu
def test_parameters_that_do_not_fit_the_entry_are_refused_before_anything_runs(cpu_bundle):
    def shrink(m, b):
        launch = next(op for op in m["ops"] if op["op"] == "launch")
        launch["params"]["sizes"][1] -= 8

    with pytest.raises(ValueError, match=r"ops\[\d+\] argument 0 has 48 bytes, the CPU entry's has 56"):
        _run_cpu(rewritten(cpu_bundle, shrink))


@warp_cpu
def test_wrong_sizes_are_refused(cpu_bundle):
    with pytest.raises(ValueError, match=r"input.*'in0' has 252 bytes, expected 256"):
        from leapp import _native

        bundle = _native.Bundle(cpu_bundle)
        quat, grav, norm = quats(BATCH, 1), torch.empty(BATCH, 3), torch.empty(BATCH)
        _native.run_segment_cpu(bundle, [quat.data_ptr()], [norm.data_ptr(), grav.data_ptr()], [252],
                                [norm.numel() * 4, grav.numel() * 4])


def _observe_on(device: str):
    """observe() for tensors on ``device`` (the Warp arrays and launches follow it)."""

    def observe_device(quat: torch.Tensor) -> torch.Tensor:
        grav = torch.empty(quat.shape[0], 3, device=quat.device)
        norm = torch.empty(quat.shape[0], device=quat.device)
        with annotate.warp_op():
            q = wp.from_torch(quat, dtype=wp.quat)
            tmp = wp.empty(quat.shape[0], dtype=wp.vec3, device=device)
            out = wp.from_torch(grav, dtype=wp.vec3)
            n = wp.from_torch(norm)
            n.zero_()
            wp.launch(gravity_scaled, dim=quat.shape[0], inputs=[q, wp.vec3(0.0, 0.0, -1.0), 2.0], outputs=[tmp],
                      device=device)
            wp.copy(out, tmp)
            wp.launch(add_rows, dim=quat.shape[0], inputs=[tmp, out], outputs=[n], device=device)
        return torch.cat([grav, norm[:, None]], dim=1) * 0.5

    return observe_device


@pytest.mark.cuda
def test_a_cuda_export_with_cpu_code_runs_on_both(tmp_path, monkeypatch):
    """LEAPP_CPU_CODE=1: a node traced on CUDA carries CPU code too; its ONNX model runs on the CUDA EP and, the same
    file, on the CPU EP of a machine without a GPU (the segment from its CPU code), both equal to eager."""
    wp.init()
    if not torch.cuda.is_available() or not wp.is_cuda_available():
        pytest.skip("torch or Warp sees no CUDA device")
    monkeypatch.setenv("LEAPP_CPU_CODE", "1")
    node = leapp.node("obs", export_with="onnx")(_observe_on("cuda:0"))
    with leapp.trace("both", save_path=str(tmp_path)) as session:
        for seed in range(3):
            node(quats(BATCH, seed).cuda())
    report = session.compile(validate=True)
    assert report["obs"].status == "passed", str(report)
    folder = tmp_path / "both"
    assert "cpu_code" in read_bundle(bundle_of(folder)).manifest
    quat = quats(BATCH, 11)
    want = _observe_on("cuda:0")(quat.cuda()).cpu()  # Warp's own CUDA run (a Warp without warp-clang has no CPU)
    (on_gpu,) = leapp.load(folder)(quat=quat.cuda()).values()
    torch.testing.assert_close(on_gpu.cpu(), want, rtol=1e-5, atol=1e-6)
    (on_cpu,) = load(folder, onnx_ep="cpu")(quat=quat).values()  # the CPU EP on a GPU machine
    assert on_cpu.device.type == "cpu"
    torch.testing.assert_close(on_cpu, want, rtol=1e-5, atol=1e-6)


@warp_cpu
def test_leapp_testing_runs_its_cpu_routes_on_a_warp_export(export):
    """leapp.testing compares the export with eager on every route that runs here: on a CPU machine, the Warp
    segment from its CPU code (before, every route of a Warp export skipped "captured on the CPU")."""
    from leapp.testing import assert_equivalent, input_strategy, unit_norm

    backend, _, folder = export
    result = assert_equivalent(observe, folder, input_strategy(folder, quat=unit_norm()), max_examples=10,
                               rtol=1e-5, atol=1e-6)
    assert "load" in result.ran, result
    if backend == "onnx":
        assert "onnx-cpu-ep" in result.ran or "onnx-cpu-ep" in result.skipped, result
        if Path(sys.executable).with_name("leapp-run").is_file():
            assert "cpp-runner" in result.ran, result


@warp_cpu
def test_native_calls_from_many_threads_run_at_once_and_start_no_thread(cpu_bundle):
    """run_segment_cpu releases the GIL: 8 threads call it at once on one bundle (shared code and constants,
    their own scratch), each with its own inputs, and every result equals eager. A call starts no thread."""
    from leapp import _native

    bundle = _native.Bundle(cpu_bundle)

    def call(quat):
        norm, grav = torch.empty(BATCH), torch.empty(BATCH, 3)
        _native.run_segment_cpu(bundle, [quat.data_ptr()], [norm.data_ptr(), grav.data_ptr()], [BATCH * 16],
                                [BATCH * 4, BATCH * 12])
        return torch.cat([grav, norm[:, None]], dim=1) * 0.5

    _in_threads(call, calls=200, seed=200)
    quat = quats(BATCH, 1)
    norm, grav = torch.empty(BATCH), torch.empty(BATCH, 3)
    threads_before = len(os.listdir("/proc/self/task"))  # torch's own pools are up by now
    for _ in range(100):
        _native.run_segment_cpu(bundle, [quat.data_ptr()], [norm.data_ptr(), grav.data_ptr()], [BATCH * 16],
                                [BATCH * 4, BATCH * 12])
    assert len(os.listdir("/proc/self/task")) == threads_before


@warp_cpu
def test_leapp_run_runs_a_pt2_node_from_its_cpu_package(export, tmp_path):
    """A PT2 node's AOTInductor package for the CPU runs its segment through leapp's torch op, from the CPU code:
    `leapp aoti` has nothing to warn about and leapp-run runs the whole export without a GPU."""
    backend, _, folder = export
    if backend != "pt2":
        pytest.skip("the ONNX export runs in leapp-run without a package (test_leapp_run_runs_the_onnx_export...)")
    leapp_run = Path(sys.executable).with_name("leapp-run")
    from leapp.runtime.libraries import native_dir

    if not leapp_run.is_file() or not (native_dir() / "libleapp_pipeline_aoti.so").is_file():
        pytest.skip("leapp-run or its AOTInductor plugin was not built (ONNX Runtime's headers or torch missing)")
    import leapp.aoti

    copy = tmp_path / "export"
    shutil.copytree(folder, copy)
    leapp.aoti.package(copy, "obs")
    assert "aoti-cpu" in _leapp_run_equals_eager(leapp_run, copy, tmp_path, seed=9)


@warp_cpu
def test_the_cpu_kernel_names_a_wrong_dtype_shape_or_truncatedbundle_of(cpu_bundle):
    """The torch op's CPU kernel checks what its CUDA kernel checks, with the same words."""
    import json

    from leapp.bundle import read_bundle as read
    from leapp.bundle import signature_json
    from leapp.runtime import ops

    ops.ensure_registered()
    signature = signature_json(read(cpu_bundle))
    tensor = torch.frombuffer(bytearray(cpu_bundle), dtype=torch.uint8)
    segment = json.loads(signature)["segment"]
    with pytest.raises(ValueError, match=rf"'{segment}': input 0 'in0' expects float32\[16, 4\], got Double\[16, 4\]"):
        torch.ops.leapp.warp_segment([quats(BATCH, 0).double()], tensor, signature)
    with pytest.raises(ValueError, match=rf"'{segment}': input 0 'in0' expects float32\[16, 4\], got .*\[8, 4\]"):
        torch.ops.leapp.warp_segment([quats(8, 0)], tensor, signature)
    truncated = torch.frombuffer(bytearray(cpu_bundle[:-100]), dtype=torch.uint8)
    with pytest.raises((ValueError, RuntimeError), match=r"bundle"):
        torch.ops.leapp.warp_segment([quats(BATCH, 0)], truncated, signature)
