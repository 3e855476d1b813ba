"""Hand-made recorder output (NodeRecord / SessionRecord) for the compile-step tests.

Segment nodes use ``leapp.bundle.testing``'s example bundle, which computes
``y = x * c`` with ``c = [1, 2, ..., n]`` when replayed on a GPU; their
samples hold that value, so the same records validate on a CUDA machine.
"""

from __future__ import annotations

import operator

import torch
import torch.fx
from hypothesis import strategies as st

from leapp._contract.records import (
    NodeRecord,
    Sample,
    SegmentIO,
    SegmentRecord,
    SessionRecord,
    TensorSpec,
    warp_segment_call,
)
from leapp.bundle.testing import example_bundle


def spec(name: str, shape, dtype=torch.float32) -> TensorSpec:
    return TensorSpec(name, dtype, tuple(shape))


class MLP(torch.nn.Module):
    def __init__(self, n_in: int, hidden: int, n_out: int, seed: int = 0):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.l1 = torch.nn.Linear(n_in, hidden)
        self.l2 = torch.nn.Linear(hidden, n_out)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)

    def forward(self, obs):
        return (torch.tanh(self.l2(torch.relu(self.l1(obs)))),)


def mlp_node(
    name: str = "policy",
    export_with: str = "onnx",
    batch: int = 2,
    n_in: int = 5,
    hidden: int = 8,
    n_out: int = 3,
    samples: list[torch.Tensor] | None = None,
    seed: int = 0,
    input_name: str = "obs",
    output_name: str = "actions",
) -> NodeRecord:
    """A pure-torch node (no segment): ``actions = tanh(l2(relu(l1(obs))))``, samples computed eagerly."""
    module = MLP(n_in, hidden, n_out, seed).eval()
    gm = torch.fx.symbolic_trace(module)
    if samples is None:
        samples = [torch.randn(batch, n_in, generator=torch.Generator().manual_seed(seed + 1))]
    recorded = []
    with torch.no_grad():
        for x in samples:
            recorded.append(Sample(inputs=[x.clone()], outputs=[module(x)[0].clone()]))
    return NodeRecord(
        name=name,
        export_with=export_with,
        backend_params={},
        source="tests/export/compile_records.py:60",
        inputs=[spec(input_name, (batch, n_in))],
        outputs=[spec(output_name, (batch, n_out))],
        graph=gm,
        segments=[],
        samples=recorded,
    )


def segment_record(node: str, n: int, index: int = 0, device: str = "cpu") -> SegmentRecord:
    return SegmentRecord(
        id=f"{node}/warp_segment_{index}",
        node=node,
        index=index,
        source=f"tests/export/compile_records.py:{100 + index}",
        device=device,
        ops=["launch:example_scale"],
        wrp=b"",
        kernels=[],
        inputs=[SegmentIO(spec("x", (n,)), region_id=0, nbytes=4 * n)],
        outputs=[SegmentIO(spec("y", (n,)), region_id=1, nbytes=4 * n)],
        constants={},
        scratch={},
    )


def segment_graph(node: str, segments: int) -> torch.fx.GraphModule:
    """``h = x + 1``, then ``segments`` chained segment calls (each ``y = h * c``), then ``out = y * 2`` and ``h``.

    Outputs: (out, h).
    """
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    h = graph.call_function(torch.add, (x, 1.0))
    value = h
    for i in range(segments):
        outs = graph.call_function(warp_segment_call, (f"{node}/warp_segment_{i}", [value]))
        value = graph.call_function(operator.getitem, (outs, 0))
    out = graph.call_function(torch.mul, (value, 2.0))
    graph.output((out, h))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def expected_segment_outputs(x: torch.Tensor, segments: int) -> list[torch.Tensor]:
    """What ``segment_graph`` computes when every segment is the example bundle (``y = h * [1..n]``)."""
    h = x + 1.0
    c = torch.arange(1, x.shape[0] + 1, dtype=x.dtype, device=x.device)
    value = h
    for _ in range(segments):
        value = value * c
    return [value * 2.0, h]


def segment_node(
    name: str = "obs",
    export_with: str = "pt2",
    n: int = 4,
    segments: int = 1,
    device: str = "cpu",
    samples: int = 1,
) -> NodeRecord:
    """A node whose graph calls ``segments`` example Warp segments (captured on ``device``)."""
    recorded = []
    for i in range(samples):
        x = torch.linspace(-1.0, 1.0 + i, n, device=device)
        recorded.append(Sample(inputs=[x.clone()], outputs=expected_segment_outputs(x, segments)))
    return NodeRecord(
        name=name,
        export_with=export_with,
        backend_params={},
        source="tests/export/compile_records.py:140",
        inputs=[spec("x", (n,))],
        outputs=[spec("out", (n,)), spec("h", (n,))],
        graph=segment_graph(name, segments),
        segments=[segment_record(name, n, i, device) for i in range(segments)],
        samples=recorded,
    )


def example_bundles(segment: SegmentRecord) -> bytes:
    """A bundle provider: the example bundle sized and named for ``segment``."""
    n = segment.inputs[0].spec.shape[0]
    return example_bundle(n, segment=segment.id)


def session(tmp_path, *nodes: NodeRecord, edges=(), name: str = "demo") -> SessionRecord:
    return SessionRecord(
        name=name,
        save_path=str(tmp_path),
        nodes={n.name: n for n in nodes},
        edges=list(edges),
        constants_report=[],
    )


def two_output_bundles(segment: SegmentRecord) -> bytes:
    """The example bundle plus a second output ``count`` (int32, shape (2, 2), zero-initialized)."""
    from leapp.bundle import write_bundle
    from leapp.bundle.testing import example_manifest_and_blobs

    n = segment.inputs[0].spec.shape[0]
    manifest, blobs = example_manifest_and_blobs(n, segment=segment.id)
    manifest["buffers"].append({"id": 4, "bytes": 16, "role": "output", "io": 1, "init": "zero"})
    manifest["signature"]["outputs"].append(
        {"name": "count", "buffer": 4, "dtype": "int32", "shape": [2, 2], "warp_dtype": "int32", "logical_shape": [2, 2]}
    )
    return write_bundle(manifest, blobs)


def two_output_node(name: str = "multi", export_with: str = "onnx", n: int = 4) -> NodeRecord:
    """One segment with outputs (y float32[n], count int32[2, 2]); node outputs (y * 2, count + 1)."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    outs = graph.call_function(warp_segment_call, (f"{name}/warp_segment_0", [x]))
    y = graph.call_function(operator.getitem, (outs, 0))
    count = graph.call_function(operator.getitem, (outs, 1))
    graph.output((graph.call_function(torch.mul, (y, 2.0)), graph.call_function(torch.add, (count, 1))))
    seg = segment_record(name, n)
    seg.outputs.append(SegmentIO(spec("count", (2, 2), torch.int32), region_id=4, nbytes=16))
    return NodeRecord(
        name=name,
        export_with=export_with,
        backend_params={},
        source="tests/export/compile_records.py:200",
        inputs=[spec("x", (n,))],
        outputs=[spec("y2", (n,)), spec("count1", (2, 2), torch.int32)],
        graph=torch.fx.GraphModule(torch.nn.Module(), graph),
        segments=[seg],
        samples=[],
    )


# Shapes and values of the pure-torch MLP node, for the backends' hypothesis tests.
MLP_CASES = dict(
    batch=st.integers(1, 4),
    n_in=st.integers(1, 6),
    hidden=st.integers(1, 8),
    n_out=st.integers(1, 4),
    seed=st.integers(0, 1000),
    scale=st.floats(0.01, 10.0),
)
