"""Which plain ``leapp.load`` calls replay as one CUDA graph (``plain_call_graph``), checked without a GPU.

Every refusal names its reason in ``pipeline.plain_graphs_reason``; the GPU behaviour is in
test_pipeline_copy_graph_gpu.py.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

import compile_records as cr
import leapp
from leapp._export.compile import compile_session
from leapp.runtime import pipeline as pipeline_module
from leapp.runtime.cuda_graphs import IN_PLACE_GRAPHS_ENV
from leapp.runtime.pipeline import PIPELINE_GRAPH_ENV, plain_call_graph

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory):
    """obs (PT2) -> act (ONNX), both with Warp segments, exported on the CPU (no validation: no GPU to replay)."""
    pytest.importorskip("onnxscript", reason="onnxscript is not installed (torch.onnx.export(dynamo=True) needs it)")
    folder = tmp_path_factory.mktemp("copy_graph_rules")
    obs = cr.segment_node("obs", "pt2", n=16, segments=2)
    act = cr.segment_node("act", "onnx", n=16, segments=1)
    compile_session(cr.session(folder, obs, act, edges=[("obs", "out", "act", "x")]), validate=False,
                    bundles=cr.example_bundles)
    return folder / "demo"


def test_nodes_off_cuda_have_no_plain_call_graph(two_nodes):
    pipeline = leapp.load(two_nodes)
    assert pipeline.plain_graphs is None
    assert pipeline.plain_graphs_reason == "the nodes are not all on one CUDA device that torch sees"


def test_the_environment_turns_it_off_first(two_nodes, monkeypatch):
    monkeypatch.setenv(PIPELINE_GRAPH_ENV, "0")
    assert leapp.load(two_nodes).plain_graphs_reason == f"{PIPELINE_GRAPH_ENV}=0"


def test_a_bad_in_place_graph_limit_is_refused_at_load(two_nodes, monkeypatch):
    monkeypatch.setenv(IN_PLACE_GRAPHS_ENV, "lots")
    with pytest.raises(ValueError, match=f"{IN_PLACE_GRAPHS_ENV}='lots': expected a number of graphs"):
        leapp.load(two_nodes)


def test_cuda_graphs_true_leaves_it_to_the_whole_pipeline_graph(two_nodes):
    pipeline = leapp.load(two_nodes, cuda_graphs=True)
    assert pipeline.plain_graphs is None and pipeline.plain_graphs_reason.startswith("cuda_graphs=True")


def test_reasons_on_one_cuda_device(two_nodes, monkeypatch):
    """With the nodes taken to be on cuda:0: one node is left to its own call; an ONNX node without a node
    graph (here: ONNX Runtime's CPU EP) refuses, naming the node and its own reason; a dynamic batch refuses."""
    monkeypatch.setattr(pipeline_module, "_one_cuda_device", lambda entries: torch.device("cuda", 0))
    pipeline = leapp.load(two_nodes)
    assert pipeline.plain_graphs is None
    act = pipeline.nodes["act"].runner
    assert pipeline.plain_graphs_reason == f"node 'act': no node graph ({act.no_graphs_reason})"
    alone = dataclasses.replace(pipeline, nodes={"obs": pipeline.nodes["obs"]})
    assert plain_call_graph(alone)[1].startswith("one node")
    (name, spec), = pipeline.inputs.items()
    dynamic = dataclasses.replace(pipeline, inputs={name: dataclasses.replace(spec, batch=(1, 64))})
    assert plain_call_graph(dynamic) == (None, "a dynamic batch (the graph's buffers have one shape)")
