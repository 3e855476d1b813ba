"""PT2 export: segments stay leapp::warp_segment calls with a uint8 bundle buffer; load works in a fresh process."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from hypothesis import given, settings

import compile_records as cr
from leapp._export.exportable import build_exportable
from leapp._export.pt2_export import export_pt2, to_exported_program
from leapp._export.validate import validate_node
from leapp.errors import ExportError

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")


def _op_nodes(graph: torch.fx.Graph) -> list[torch.fx.Node]:
    return [n for n in graph.nodes if n.op == "call_function" and n.target is torch.ops.leapp.warp_segment.default]


def test_exported_program_calls_the_op_with_bundle_buffer_and_signature():
    node = cr.segment_node("obs", "pt2", n=5, segments=2)
    exp = build_exportable(node, cr.example_bundles)
    program = to_exported_program(exp)
    ops = _op_nodes(program.graph)
    assert len(ops) == 2
    buffers = dict(program.named_buffers())
    for op_node, seg in zip(ops, exp.segments):
        inputs, bundle, signature = op_node.args
        assert signature == seg.signature
        assert bundle.op == "placeholder"  # lifted buffer
        assert bytes(buffers[seg.buffer_name].numpy().tobytes()) == seg.bundle
        assert buffers[seg.buffer_name].dtype == torch.uint8
        (value,) = op_node.meta["val"]
        assert value.shape == (5,) and value.dtype == torch.float32


def test_recorded_graph_is_left_untouched():
    node = cr.segment_node("obs", "pt2", n=4)
    before = node.graph.code
    build_exportable(node, cr.example_bundles)
    assert node.graph.code == before
    assert not hasattr(node.graph, "warp_segment_0_bundle")


def test_bundle_signature_must_match_the_recording():
    node = cr.segment_node("obs", "pt2", n=4)
    with pytest.raises(ExportError, match=r"obs/warp_segment_0.*float32\[4\] in the recording but float32\[8\]"):
        build_exportable(node, lambda seg: cr.example_bundle(8, segment=seg.id))


def test_graph_calling_an_unknown_segment_names_it():
    node = cr.segment_node("obs", "pt2", n=4)
    node.segments[0].id = "obs/warp_segment_7"
    with pytest.raises(ExportError, match=r"'obs/warp_segment_0'.*not among the recorded segments"):
        build_exportable(node, cr.example_bundles)


_LOAD_IN_FRESH_PROCESS = textwrap.dedent(
    """
    import sys, torch
    import leapp
    from leapp.runtime.runners import load_pt2
    program = load_pt2(sys.argv[1])
    ops = [n for n in program.graph.nodes if n.op == "call_function" and n.target is torch.ops.leapp.warp_segment.default]
    bundle = dict(program.named_buffers())["warp_segment_0_bundle"]
    print(len(ops), bundle.dtype, bundle.numel(), ops[0].args[2][:11])
    # the fake kernel serves re-export of the loaded program
    again = torch.export.export(program.module(), (torch.zeros(4),))
    print(len([n for n in again.graph.nodes if n.op == "call_function" and n.target is torch.ops.leapp.warp_segment.default]))
    """
)


def test_save_and_load_in_a_fresh_process(tmp_path):
    node = cr.segment_node("obs", "pt2", n=4)
    path = export_pt2(build_exportable(node, cr.example_bundles), tmp_path)
    assert path == tmp_path / "obs.pt2" and path.stat().st_size > 0
    bundle_len = len(cr.example_bundles(node.segments[0]))
    out = subprocess.run(
        [sys.executable, "-c", _LOAD_IN_FRESH_PROCESS, str(path)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.split("\n")
    assert lines[0] == f'1 torch.uint8 {bundle_len} {{"digest":"', out.stdout
    assert lines[1] == "1"


def test_plain_torch_export_load_needs_the_op_registered(tmp_path):
    """Why leapp registers the op before loading: torch alone cannot resolve leapp::warp_segment."""
    path = export_pt2(build_exportable(cr.segment_node("obs", "pt2", n=4), cr.example_bundles), tmp_path)
    code = f"import torch; torch.export.load({str(path)!r})"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "warp_segment" in out.stderr


def test_pure_torch_node_has_no_op(tmp_path):
    node = cr.mlp_node("policy", "pt2")
    program = to_exported_program(build_exportable(node))
    assert not _op_nodes(program.graph)


@settings(max_examples=6)
@given(**cr.MLP_CASES)
def test_pure_torch_mlp_pt2_matches_eager(tmp_path_factory, batch, n_in, hidden, n_out, seed, scale):
    gen = torch.Generator().manual_seed(seed)
    samples = [torch.randn(batch, n_in, generator=gen) * scale for _ in range(2)]
    node = cr.mlp_node("policy", "pt2", batch, n_in, hidden, n_out, samples=samples, seed=seed)
    path = export_pt2(build_exportable(node), tmp_path_factory.mktemp("pt2"))
    result = validate_node(node, "pt2", path, rtol=1e-5, atol=1e-6)
    assert result.status == "passed", result.reason
    assert [o.name for o in result.outputs] == ["actions"]
