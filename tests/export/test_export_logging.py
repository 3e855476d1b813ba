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


def test_load_logs_the_runner_of_each_node(tmp_path, caplog):
    record = cr.session(tmp_path, cr.mlp_node("policy", "torchscript"), name="pure")
    compile_session(record, validate=False)
    with caplog.at_level(logging.INFO, logger="leapp"):
        leapp.load(tmp_path / "pure")
    assert _messages(caplog, "leapp.runtime.pipeline") == [
        "pipeline 'pure' node 'policy': torchscript runner for policy.pt on cpu; no Warp segments"
    ]


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
    first, second, third = _messages(caplog, "leapp._export.cuda_code")
    assert re.fullmatch(r"module '.+' \(\w{7}, block_dim 256\): compiled PTX sm_75, cubin sm_90 in \d+\.\d\d s "
                        r"\(\d thread\(s\)\)", first)
    assert re.fullmatch(r"module '.+' \(\w{7}, block_dim 256\): compiled code reused", second)
    assert re.fullmatch(r"module '.+' \(\w{7}, block_dim 256\): compiled cubin sm_80 in \d+\.\d\d s \(1 thread\(s\)\)",
                        third)
