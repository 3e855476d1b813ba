"""leapp's log: export steps with timings, compile-cache decisions and the runners chosen at load (CPU)."""

from __future__ import annotations

import logging
import re

import pytest

import compile_records as cr
import leapp
from leapp._export.compile import compile_session

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")


def _messages(caplog, logger: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == logger]


def test_export_logs_each_step_with_its_time(tmp_path, caplog):
    record = cr.session(tmp_path, cr.segment_node("obs", "pt2", n=5), cr.mlp_node("policy", "onnx"), name="go2")
    with caplog.at_level(logging.INFO, logger="leapp"):
        compile_session(record, validate=False, bundles=cr.example_bundles)
    lines = _messages(caplog, "leapp._export.compile")
    assert lines[0] == f"session 'go2': exporting 2 node(s) into {tmp_path / 'go2'}"
    assert re.fullmatch(r"node 'obs': 1 Warp segment\(s\) built in \d+\.\d\d s, obs\.pt2 written in \d+\.\d\d s",
                        lines[1]), lines
    assert re.fullmatch(r"node 'policy': 0 Warp segment\(s\) built in \d+\.\d\d s, policy\.onnx written in \d+\.\d\d s",
                        lines[2]), lines
    assert re.fullmatch(r"session 'go2': artifacts and pipeline.yaml written in \d+\.\d\d s", lines[3]), lines


@pytest.mark.parametrize("backend, line", [
    ("torchscript", "pipeline 'pure' node 'policy': torchscript runner for policy.pt on cpu; no Warp segments"),
    # an ONNX node's line also says whether it replays from a node graph, and why not
    ("onnx", "pipeline 'pure' node 'policy': onnx runner for policy.onnx on cpu; ONNX Runtime cpu-ep, "
             "no node graph (not on ONNX Runtime's CUDA EP), no Warp segments"),
])
def test_load_logs_the_runner_of_each_node(tmp_path, caplog, backend, line):
    if backend == "onnx":
        pytest.importorskip("onnxruntime")
        pytest.importorskip("onnxscript", reason="onnxscript is not installed (torch.onnx.export(dynamo=True) needs it)")
    record = cr.session(tmp_path, cr.mlp_node("policy", backend), name="pure")
    compile_session(record, validate=False)
    with caplog.at_level(logging.INFO, logger="leapp"):
        leapp.load(tmp_path / "pure")
    assert _messages(caplog, "leapp.runtime.pipeline") == [
        line, "pipeline 'pure': plain calls run node by node: one node (an ONNX node on the CUDA EP replays from "
              "its own node graph)"]


def test_compile_cache_decisions_are_logged(caplog):
    wp = pytest.importorskip("warp")
    from leapp._export import cuda_code

    @wp.kernel
    def k_logged(a: wp.array(dtype=float)):
        a[wp.tid()] = 1.0

    cuda_code.clear_cache()
    with caplog.at_level(logging.DEBUG, logger="leapp._export.cuda_code"):
        cuda_code.compile_module(k_logged, 256, archs=(90,))
        cuda_code.compile_module(k_logged, 256, archs=(90,))
        cuda_code.compile_module(k_logged, 256, archs=(80, 90))
    messages = _messages(caplog, "leapp._export.cuda_code")
    built = [m for m in messages if " built in " in m]  # one DEBUG line per target, with its time and process
    assert all(re.fullmatch(r"module '.+': (PTX|cubin) sm_\d+ built in \d+\.\d{3} s \(.+\)", m) for m in built), built
    assert sorted(re.search(r"(PTX|cubin) sm_\d+", m).group(0) for m in built) == ["PTX sm_75", "cubin sm_80",
                                                                                    "cubin sm_90"]
    first, second, third = [m for m in messages if " built in " not in m]
    assert re.fullmatch(r"module '.+' \(\w{7}, block_dim 256\): compiled PTX sm_75, cubin sm_90 in \d+\.\d\d s "
                        r"\(\d process\(es\)\)", first)
    assert re.fullmatch(r"module '.+' \(\w{7}, block_dim 256\): compiled code reused", second)
    assert re.fullmatch(r"module '.+' \(\w{7}, block_dim 256\): compiled cubin sm_80 in \d+\.\d\d s \(1 process\(es\)\)",
                        third)


def test_binary_cache_logs_each_decision(tmp_path, monkeypatch, caplog):
    from leapp._export import binary_cache as bc

    key = bc.CacheKey(warp="1.19.0", warp_native="1:1", nvrtc="13.4", module="m", module_hash="ab" * 32,
                      block_dim=256, kind="ptx", arch=75, bundle_format=1)
    cache = bc.BinaryCache(tmp_path / "cache", 1 << 20)
    with caplog.at_level(logging.DEBUG, logger="leapp._export.binary_cache"):
        assert cache.get(key) is None
        cache.put(key, bc.Entry(b".version 9.4\n.target sm_75\n\0", {}))
        assert cache.get(key) is not None
        monkeypatch.setenv(bc.DISABLE_ENV, "1")
        assert bc.default_cache() is None
    assert _messages(caplog, "leapp._export.binary_cache") == [
        f"cache {tmp_path / 'cache' / bc.SUBDIR} in use (limit 1 MB)",
        "cache cuda-v1: ptx sm_75 of module 'm' not cached",
        f"cache cuda-v1: ptx sm_75 of module 'm' written to {key.filename()}",
        f"cache cuda-v1: ptx sm_75 of module 'm' read from {key.filename()}",
        "binary cache off (LEAPP_NO_CACHE=1): compiling every binary",
    ]


@pytest.fixture(scope="module")
def segment_export(tmp_path_factory):
    """A PT2 and an ONNX node with one example segment each (PTX sm_75 only), exported on the CPU."""
    tmp = tmp_path_factory.mktemp("binaries")
    record = cr.session(tmp, cr.segment_node("obs", "pt2", n=5), cr.segment_node("act", "onnx", n=5),
                        edges=[("obs", "out", "act", "x")], name="seg")
    compile_session(record, validate=False, bundles=cr.example_bundles)
    return tmp / "seg"


def test_load_logs_the_binary_each_warp_module_tries_first(segment_export, caplog, monkeypatch):
    from leapp.runtime import binary_choice
    from leapp.runtime import pipeline as rt

    with caplog.at_level(logging.DEBUG, logger="leapp.runtime.pipeline"):
        pipeline = leapp.load(segment_export)
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG and r.name == "leapp.runtime.pipeline"]
    assert debug == [f"pipeline 'seg' node '{n}': Warp segments recorded on cpu without CPU code for this machine; "
                     "they replay on CUDA devices only" for n in ("obs", "act")]  # the example bundles have none
    # the same nodes as if recorded on a GPU: the bundles are read back from each artifact
    for capability, expected in (((9, 0), "on sm_90: loads ptx sm_75: driver JIT of compute_75 PTX"),
                                 ((7, 0), "on sm_70: no binary fits a GPU (compute capability 7.0)")):
        monkeypatch.setattr(binary_choice, "device_capability", lambda device, c=capability: c)
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger="leapp.runtime.pipeline"):
            for node in pipeline.nodes.values():
                entry = {"device": "cuda:0", "backend": node.backend}
                rt._log_binary_choice("seg", node.name, entry, node.artifact, node.runner)
        messages = _messages(caplog, "leapp.runtime.pipeline")
        for n in ("obs", "act"):  # the native choose_binary's words, one module per node
            prefix = f"pipeline 'seg' node '{n}': segment {n}/warp_segment_0 module leapp_example_module {expected}"
            assert sum(m.startswith(prefix) for m in messages) == 1, (prefix, messages)
    monkeypatch.setattr(binary_choice, "device_capability", lambda device: None)
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="leapp.runtime.pipeline"):
        rt._log_binary_choice("seg", "obs", {"device": "cuda:1", "backend": "pt2"}, pipeline.nodes["obs"].artifact,
                              pipeline.nodes["obs"].runner)
    assert _messages(caplog, "leapp.runtime.pipeline") == [
        "pipeline 'seg' node 'obs': no CUDA device cuda:1 visible here; binary choice deferred to the first call"]


def test_binary_choice_prefers_the_devices_cubin_then_older_cubins_then_ptx():
    from leapp.bundle.testing import example_bundle
    from leapp.runtime.binary_choice import binary_choices

    bundle = example_bundle(4, segment="a/warp_segment_0", cubins={80: b"x" * 64, 90: b"y" * 64})
    where = "segment a/warp_segment_0 module leapp_example_module"
    assert binary_choices([bundle], (9, 0), 13000) == [
        f"{where} on sm_90: loads cubin sm_90: exact match for compute capability 9.0", "    then tries ptx sm_75"]
    assert binary_choices([bundle], (8, 6), 13000) == [
        f"{where} on sm_86: loads cubin sm_80: SASS for 8.0 runs on 8.6 (same major, lower minor)",
        "    then tries ptx sm_75"]