"""CUDA's fused GRU/LSTM cell kernels, decomposed for ONNX and PT2 exports (leapp/_export/rnn_cells.py).

On the CPU the decompositions are checked against torch.nn.GRUCell / LSTMCell (hypothesis over sizes and
values) and the graph rewrite on a graph holding the fused op; on a GPU a node with both cells, traced on cuda,
exports to ONNX and validates against eager (the fused kernels ran there).
"""

from __future__ import annotations

import operator

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import leapp
from leapp._export.rnn_cells import decompose_fused_rnn_cells, fused_gru_cell, fused_lstm_cell
from leapp.errors import ExportError

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning", "ignore::UserWarning")


def _gates(cell, x, h):
    return x @ cell.weight_ih.T, h @ cell.weight_hh.T


@settings(max_examples=25, deadline=None)
@given(batch=st.integers(1, 5), inputs=st.integers(1, 6), hidden=st.integers(1, 6), seed=st.integers(0, 2**16),
       scale=st.sampled_from([1e-3, 1.0, 30.0]), bias=st.booleans())
def test_the_decompositions_compute_what_the_cells_compute(batch, inputs, hidden, seed, scale, bias):
    torch.manual_seed(seed)
    x, h, c = (torch.randn(batch, n) * scale for n in (inputs, hidden, hidden))
    gru, lstm = torch.nn.GRUCell(inputs, hidden, bias=bias), torch.nn.LSTMCell(inputs, hidden, bias=bias)
    with torch.no_grad():
        (hy,) = fused_gru_cell(*_gates(gru, x, h), h, *((gru.bias_ih, gru.bias_hh) if bias else ()))
        torch.testing.assert_close(hy, gru(x, h))
        hy, cy = fused_lstm_cell(*_gates(lstm, x, h), c, *((lstm.bias_ih, lstm.bias_hh) if bias else ()))
        want_h, want_c = lstm(x, (h, c))
        torch.testing.assert_close(hy, want_h)
        torch.testing.assert_close(cy, want_c)


def _fused_graph(op, outputs: list[int], unread: list[int] = ()) -> torch.fx.GraphModule:
    """A graph calling ``op`` that returns its ``outputs`` and also takes (as the recorder does) but never reads
    its ``unread`` ones."""
    graph = torch.fx.Graph()
    args = [graph.placeholder(n) for n in ("ig", "hg", "state", "ib", "hb")]
    call = graph.call_function(op, tuple(args))
    for i in unread:
        graph.call_function(operator.getitem, (call, i))
    graph.output(tuple(graph.call_function(operator.getitem, (call, i)) for i in outputs))
    return torch.fx.GraphModule(torch.nn.Module(), graph)


def test_the_rewrite_replaces_every_fused_call_and_runs_on_the_cpu():
    aten = torch.ops.aten
    torch.manual_seed(0)
    x, h, c = torch.randn(2, 3), torch.randn(2, 4), torch.randn(2, 4)
    gru, lstm = torch.nn.GRUCell(3, 4), torch.nn.LSTMCell(3, 4)
    module = _fused_graph(aten._thnn_fused_gru_cell.default, [0], unread=[1])  # the workspace, taken and unread
    assert decompose_fused_rnn_cells(module, "node 'n'") == 1
    assert not any(n.target == aten._thnn_fused_gru_cell.default for n in module.graph.nodes)
    with torch.no_grad():
        (hy,) = module(*_gates(gru, x, h), h, gru.bias_ih, gru.bias_hh)
        torch.testing.assert_close(hy, gru(x, h))
        module = _fused_graph(aten._thnn_fused_lstm_cell.default, [0, 1], unread=[2])
        assert decompose_fused_rnn_cells(module, "node 'n'") == 1
        hy, cy = module(*_gates(lstm, x, h), c, lstm.bias_ih, lstm.bias_hh)
        torch.testing.assert_close((hy, cy), lstm(x, (h, c)))


def test_a_graph_that_reads_the_workspace_is_refused_by_node():
    module = _fused_graph(torch.ops.aten._thnn_fused_gru_cell.default, [0, 1])
    with pytest.raises(ExportError, match=r"node 'n': .*_thnn_fused_gru_cell.* output 1 \(its backward workspace\)"):
        decompose_fused_rnn_cells(module, "node 'n'")


class Recurrent(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.gru, self.lstm = torch.nn.GRUCell(5, 8), torch.nn.LSTMCell(8, 6)

    def forward(self, x, h, hc, cc):
        h = self.gru(x, h)
        hc, cc = self.lstm(h, (hc, cc))
        return h, hc, cc


@pytest.mark.cuda
@pytest.mark.parametrize("backend", ["onnx", "pt2"])
def test_gru_and_lstm_cells_traced_on_cuda_export_and_validate(tmp_path, backend):
    """The cells run their fused kernels on cuda; the export decomposes them and validates against eager."""
    model = Recurrent().cuda()
    node = leapp.node("cells", export_with=backend)(model.forward)
    with torch.no_grad(), leapp.trace("rnn", save_path=str(tmp_path)) as session:
        for seed in range(3):
            g = torch.Generator(device="cuda").manual_seed(seed)
            node(*(torch.randn(4, n, device="cuda", generator=g) for n in (5, 8, 6, 6)))
    session.compile(validate=True)
    pipeline = leapp.load(str(tmp_path / "rnn"))
    args = [torch.randn(4, n, device="cuda") for n in (5, 8, 6, 6)]
    got = pipeline(x=args[0], h=args[1], hc=args[2], cc=args[3])
    with torch.no_grad():
        want = model(*args)
    for g, w in zip(got.values(), want):
        torch.testing.assert_close(g.to(w.device), w, rtol=1e-4, atol=1e-5)
