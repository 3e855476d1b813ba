"""Validation loads the export in a fresh process, as a user does, and survives that process dying.

An artifact that works only next to the exporting process's state must fail
validation: here a PT2/TorchScript node calls an op registered only in this
(the test's) process, which ``torch.export.load`` / ``torch.jit.load`` of a
fresh interpreter cannot resolve. The crash and hang cases load an op library
(``LEAPP_WARP_ONNX_CUSTOM_OP_LIBRARY``, which ``leapp.load`` honours when it opens
an ONNX node; the PT2 one is loaded by ``import leapp``, before any node) that
aborts or blocks while it is loaded.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.fx
from hypothesis import given, settings
from hypothesis import strategies as st

import compile_records as cr
from leapp._export import validate_process
from leapp._export.compile import compile_session
from leapp._export.validate import validate_node
from leapp._export.validate_worker import on_cpu
from leapp.errors import ValidationError
from leapp.runtime.io import IOSpec
from leapp.runtime.open_artifact import make_runner

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")


@pytest.fixture(autouse=True)
def _fresh_every_time(monkeypatch):
    """These tests are about the worker: no answer may come from the validation cache."""
    monkeypatch.setenv("LEAPP_NO_CACHE", "1")


@torch.library.custom_op("leapp_isolation_test::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    """An op that exists only in processes that imported this test module."""
    return x * 2


@twice.register_fake
def _twice_fake(x):
    return torch.empty_like(x)


class _UsesLocalOp(torch.nn.Module):
    def forward(self, x):
        return (torch.ops.leapp_isolation_test.twice(x) + 1.0,)


def local_op_node(backend: str):
    """A pure-torch node whose graph calls ``leapp_isolation_test::twice``; samples computed eagerly."""
    node = cr.mlp_node("local", backend, batch=2, n_in=3, n_out=3)
    node.graph = torch.fx.symbolic_trace(_UsesLocalOp())
    x = torch.randn(2, 3, generator=torch.Generator().manual_seed(1))
    node.samples = [cr.Sample(inputs=[x], outputs=[x * 2 + 1.0])]
    return node


@pytest.mark.parametrize("backend", ["pt2", "torchscript"])
def test_an_op_registered_only_in_the_exporting_process_fails_validation(tmp_path, backend):
    node = local_op_node(backend)
    record = cr.session(tmp_path, node, cr.mlp_node("policy", "onnx"))
    with pytest.raises(ValidationError) as info:
        compile_session(record)
    text = str(info.value)
    assert text.startswith("Model validation failed for 1 node(s): ['local']"), text
    assert "in a fresh process" in text and "compile_records.py" in text  # the node's source
    assert "leapp_isolation_test" in text, text  # the worker's own account of what it could not resolve
    report = info.value.report
    assert report["local"].status == "error" and report["policy"].status == "passed"
    # The same artifact passes when run in this process, where the op is registered: in-process
    # validation (what leapp did before) would have let it through.
    artifact = tmp_path / "demo" / report["local"].artifact
    specs = [IOSpec(s.name, s.dtype, tuple(s.shape)) for s in node.inputs]
    outs = [IOSpec(s.name, s.dtype, tuple(s.shape)) for s in node.outputs]
    got = make_runner(backend, artifact, specs, outs, "cpu")(list(node.samples[0].inputs))
    torch.testing.assert_close(got[0], node.samples[0].outputs[0])


def test_validate_node_of_an_artifact_outside_a_pipeline_runs_fresh(tmp_path):
    node = local_op_node("pt2")
    compile_session(cr.session(tmp_path, node), validate=False)
    result = validate_node(node, "pt2", tmp_path / "demo" / "local.pt2", rtol=1e-5, atol=1e-6)
    assert result.status == "error" and "could not load local.pt2 in a fresh process" in result.reason
    good = cr.mlp_node("policy", "pt2")
    compile_session(cr.session(tmp_path, good), validate=False)
    assert validate_node(good, "pt2", tmp_path / "demo" / "policy.pt2", rtol=1e-5, atol=1e-6).status == "passed"


def _op_library(tmp_path, body: str):
    """A library that misbehaves when loaded; only the validation process opens ONNX nodes, so only it
    loads it."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the test library")
    src = tmp_path / "lib.c"
    src.write_text(textwrap.dedent(body))
    lib = tmp_path / "libbroken.so"
    subprocess.run([cc, "-shared", "-fPIC", str(src), "-o", str(lib)], check=True)
    return lib


def test_a_worker_that_dies_fails_its_node_and_the_next_node_still_runs(tmp_path, monkeypatch):
    lib = _op_library(tmp_path, """
        #include <stdio.h>
        #include <stdlib.h>
        __attribute__((constructor)) static void die(void) { fputs("broken op library\\n", stderr); abort(); }
    """)
    monkeypatch.setenv("LEAPP_WARP_ONNX_CUSTOM_OP_LIBRARY", str(lib))  # read by leapp.load's ONNX path
    record = cr.session(tmp_path, cr.mlp_node("first", "onnx"), cr.mlp_node("second", "pt2"),
                        cr.mlp_node("third", "onnx", input_name="obs3"))
    with pytest.raises(ValidationError) as info:
        compile_session(record)
    text = str(info.value)
    assert text.startswith("Model validation failed for 2 node(s): ['first', 'third']"), text
    assert "was killed by signal SIGABRT while loading first.onnx" in text, text
    assert "broken op library" in text  # the worker's last output
    report = info.value.report
    assert report["second"].status == "passed", "a fresh worker goes on after the one that died"
    assert report["third"].status == "error" and "while loading third.onnx" in report["third"].validation.reason


def test_a_worker_that_hangs_is_stopped_and_its_node_named(tmp_path, monkeypatch):
    lib = _op_library(tmp_path, """
        #include <unistd.h>
        __attribute__((constructor)) static void hang(void) { for (;;) pause(); }
    """)
    monkeypatch.setenv("LEAPP_WARP_ONNX_CUSTOM_OP_LIBRARY", str(lib))
    record = cr.session(tmp_path, cr.mlp_node("stuck", "onnx"))
    with pytest.raises(ValidationError) as info:
        compile_session(record, validation_timeout=2.0)
    text = str(info.value)
    assert "['stuck']" in text and "made no progress for 2 s and was stopped while loading stuck.onnx" in text, text
    assert validate_process._KEPT is None and not validate_process._LIVE, "a stopped worker is killed, never kept"


def test_the_worker_imports_neither_warp_nor_the_recorder(tmp_path):
    compile_session(cr.session(tmp_path, cr.mlp_node("policy", "onnx"), cr.mlp_node("act", "pt2")), validate=False)
    job = tmp_path / "job"
    job.mkdir()
    code = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        import torch
        import leapp
        from leapp._export.validate_worker import main
        torch.save({{"leapp": str(Path(leapp.__file__).resolve().parent), "folder": {str(tmp_path / "demo")!r},
                     "nodes": [{{"name": "policy", "entry": None, "samples": [[torch.zeros(2, 5)]]}},
                               {{"name": "act", "entry": None, "samples": [[torch.zeros(2, 5)]]}}]}},
                   {str(job / "job.pt")!r})
        assert main([{str(job)!r}]) == 0
        print(sorted(m for m in sys.modules if m.split(".")[0] == "warp" or m.startswith("leapp._recorder")))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]"
    result = torch.load(job / "result-1.pt", weights_only=True)
    assert len(result["outputs"]) == 1 and result["outputs"][0][0].shape == (2, 3)


@settings(max_examples=40)
@given(st.integers(1, 6), st.integers(1, 6), st.integers(0, 5), st.booleans(),
       st.sampled_from([torch.float32, torch.int64, torch.uint8]))
def test_values_cross_to_the_worker_as_compact_cpu_tensors(rows, cols, start, transpose, dtype):
    """``on_cpu`` keeps a value and drops the rest of its storage (``torch.save`` would write all of it)."""
    base = torch.arange(rows * cols * 2 + start, dtype=torch.float64).to(dtype)
    t = base[start:start + rows * cols].reshape(rows, cols)
    t = t.t() if transpose else t
    got = on_cpu(t)
    assert torch.equal(got, t) and got.dtype == t.dtype and got.device.type == "cpu"
    assert got.is_contiguous() and got.untyped_storage().nbytes() == t.numel() * t.element_size()


def _kept_pid() -> int | None:
    worker = validate_process._KEPT
    return worker.proc.pid if worker is not None else None


def test_later_compiles_reuse_the_worker_and_it_runs_each_job_cleanly(tmp_path):
    validate_process.stop_kept_worker()
    spawned = validate_process._SPAWNED
    compile_session(cr.session(tmp_path / "a", cr.mlp_node("policy", "onnx")))
    pid = _kept_pid()
    assert pid is not None and validate_process._SPAWNED == spawned + 1
    # the same worker runs the second compile: a node that fails there still gets its own account
    node = local_op_node("pt2")
    with pytest.raises(ValidationError) as info:
        compile_session(cr.session(tmp_path / "b", cr.mlp_node("act", "pt2"), node))
    assert validate_process._SPAWNED == spawned + 1, "the kept worker was not reused"
    assert "leapp_isolation_test" in info.value.report["local"].validation.reason
    assert info.value.report["act"].status == "passed"
    # ... and a worker whose node raised is never kept: it stopped, the next compile gets a fresh one
    assert _kept_pid() is None
    compile_session(cr.session(tmp_path / "c", cr.mlp_node("policy", "onnx")))
    assert validate_process._SPAWNED == spawned + 2 and _kept_pid() not in (None, pid)


def test_a_reused_worker_quotes_the_native_output_of_the_job_it_is_on(tmp_path, monkeypatch):
    lib = _op_library(tmp_path, """
        #include <stdio.h>
        #include <stdlib.h>
        __attribute__((constructor)) static void die(void) { fputs("broken op library\\n", stderr); abort(); }
    """)
    monkeypatch.setenv("LEAPP_WARP_ONNX_CUSTOM_OP_LIBRARY", str(lib))  # only ONNX nodes load it
    validate_process.stop_kept_worker()
    spawned = validate_process._SPAWNED
    compile_session(cr.session(tmp_path / "a", cr.mlp_node("act", "pt2")))
    with pytest.raises(ValidationError) as info:
        compile_session(cr.session(tmp_path / "b", cr.mlp_node("first", "onnx")))
    reason = info.value.report["first"].validation.reason
    assert validate_process._SPAWNED == spawned + 1
    assert "was killed by signal SIGABRT while loading first.onnx" in reason and "broken op library" in reason, reason
    assert _kept_pid() is None


def test_a_changed_environment_or_a_dead_kept_worker_gets_a_fresh_worker(tmp_path, monkeypatch):
    validate_process.stop_kept_worker()
    spawned = validate_process._SPAWNED
    compile_session(cr.session(tmp_path / "a", cr.mlp_node("policy", "onnx")))
    first = validate_process._KEPT
    monkeypatch.setenv("LEAPP_VALIDATE_TEST_MARKER", "1")  # any variable: the worker would see it
    compile_session(cr.session(tmp_path / "b", cr.mlp_node("policy", "onnx")))
    assert validate_process._SPAWNED == spawned + 2 and first.proc.poll() is not None  # the old one is gone
    # a kept worker that died while idle is replaced without charging the next job's nodes
    os.kill(_kept_pid(), signal.SIGKILL)
    validate_process._KEPT.proc.wait()
    compile_session(cr.session(tmp_path / "c", cr.mlp_node("policy", "onnx")))
    assert validate_process._SPAWNED == spawned + 3 and _kept_pid() is not None


def test_the_kept_worker_serves_the_next_test_of_a_suite(tmp_path, monkeypatch):
    """pytest names the running test in PYTEST_CURRENT_TEST: a user's suite that exports in several tests takes
    the kept worker in each, as one script would, instead of starting one per test."""
    validate_process.stop_kept_worker()
    spawned = validate_process._SPAWNED
    compile_session(cr.session(tmp_path / "a", cr.mlp_node("policy", "onnx")))
    first = validate_process._KEPT
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "tests/test_user.py::test_next (call)")
    compile_session(cr.session(tmp_path / "b", cr.mlp_node("policy", "onnx")))
    assert validate_process._SPAWNED == spawned + 1 and validate_process._KEPT is first and first.proc.poll() is None


def _trace_double(tmp_path, name: str):
    """A one-node ONNX session traced through the public API; returns the session (not compiled)."""
    import leapp

    @leapp.node("double", export_with="onnx")
    def double(x):
        return x * 2

    with leapp.trace(name, save_path=str(tmp_path)) as session:
        started = validate_process._KEPT
        for _ in range(3):
            double(torch.randn(4, 3))
    return session, started


def test_a_trace_prestarts_the_worker_that_compile_then_uses(tmp_path, monkeypatch):
    monkeypatch.setenv(validate_process.PRESTART_ENV, "1")
    validate_process.stop_kept_worker()
    spawned = validate_process._SPAWNED
    session, started = _trace_double(tmp_path, "prestart")
    assert started is not None and validate_process._SPAWNED == spawned + 1  # started when the trace began
    session.compile()
    assert validate_process._SPAWNED == spawned + 1 and validate_process._KEPT is started  # it ran the job


@pytest.mark.parametrize("setting", ["0", None])
def test_no_prestart_when_turned_off_or_without_a_gpu(tmp_path, monkeypatch, setting):
    if setting is None:
        if torch.cuda.is_available():
            pytest.skip("the default prestarts where torch sees a CUDA device")
        monkeypatch.delenv(validate_process.PRESTART_ENV, raising=False)
    else:
        monkeypatch.setenv(validate_process.PRESTART_ENV, setting)
    validate_process.stop_kept_worker()
    spawned = validate_process._SPAWNED
    _, started = _trace_double(tmp_path, "no_prestart")
    assert started is None and validate_process._SPAWNED == spawned


def test_a_waiting_worker_has_paid_what_every_job_pays_first():
    """warm_up, run by a worker before its first job arrives, leaves torch.export's deserializer
    imported and pipeline.yaml's validator built (a fresh interpreter: this one built them long ago)."""
    code = textwrap.dedent("""
        import sys
        from leapp._export.validate_worker import warm_up
        from leapp.pipeline_format import reader
        assert reader._validator.cache_info().currsize == 0
        warm_up()
        assert reader._validator.cache_info().currsize == 1
        assert "torch._export.serde.serialize" in sys.modules
        print("warm")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "warm", done.stderr[-2000:]
