"""leapp/_export/rnn_cells.py: CUDA's fused RNN cell kernels as plain torch ops, for ONNX and PT2 exports.

On CUDA, ``torch.nn.GRUCell`` and ``LSTMCell`` dispatch to ``aten._thnn_fused_gru_cell`` and
``aten._thnn_fused_lstm_cell``, and the recorder keeps the ops that ran. ONNX has no translation for
them (``torch.onnx.export``: "No ONNX function found"), so a recurrent policy traced on a GPU could
not export to ONNX. ``decompose_fused_rnn_cells`` replaces each call in a node's graph with the gate
equations ATen's unfused path computes (aten/src/ATen/native/RNN.cpp, ``GRUCell`` / ``LSTMCell``),
over the fused op's own arguments: the two gate products, the state and the optional biases. The
PT2 route needs the same (the fused ops have no fake kernel, so AOTInductor cannot compile them), so
``build_exportable`` rewrites the node's graph once, for every route.
"""

from __future__ import annotations

import operator

import torch

from leapp.errors import ExportError

__all__ = ["fused_gru_cell", "fused_lstm_cell", "decompose_fused_rnn_cells"]


def _biased(gates: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return gates if bias is None else gates + bias


def fused_gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None) -> tuple[torch.Tensor]:
    """``_thnn_fused_gru_cell``'s new hidden state: reset, update and new gates in that order (r, z, n)."""
    i_r, i_z, i_n = _biased(input_gates, input_bias).chunk(3, 1)
    h_r, h_z, h_n = _biased(hidden_gates, hidden_bias).chunk(3, 1)
    reset = torch.sigmoid(i_r + h_r)
    update = torch.sigmoid(i_z + h_z)
    new = torch.tanh(i_n + reset * h_n)
    return ((hx - new) * update + new,)


def fused_lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``_thnn_fused_lstm_cell``'s (hy, cy): input, forget, cell and output gates in that order (i, f, g, o)."""
    gates = _biased(input_gates, input_bias) + _biased(hidden_gates, hidden_bias)
    i, f, g, o = gates.chunk(4, 1)
    cy = torch.sigmoid(f) * cx + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(cy), cy


def _table() -> dict:
    aten = torch.ops.aten
    return {aten._thnn_fused_gru_cell.default: (fused_gru_cell, 1),  # outputs it computes; the last is the workspace
            aten._thnn_fused_lstm_cell.default: (fused_lstm_cell, 2)}


def decompose_fused_rnn_cells(module: torch.fx.GraphModule, where: str) -> int:
    """Rewrites ``module`` in place: every fused RNN cell call becomes a call of its decomposition. Returns how
    many were rewritten.

    Raises:
        ExportError: a call whose workspace output (used only by the backward pass) is read, naming ``where``.
    """
    table = _table()
    count = 0
    for fx_node in list(module.graph.nodes):
        if fx_node.op != "call_function" or fx_node.target not in table:
            continue
        decomposition, computed = table[fx_node.target]
        for user in list(fx_node.users):  # the recorder reads every output: an unread workspace is dropped
            if user.op == "call_function" and user.target is operator.getitem and not user.users \
                    and user.args[1] >= computed:
                module.graph.erase_node(user)
        for user in fx_node.users:
            if not (user.op == "call_function" and user.target is operator.getitem and user.args[1] < computed):
                raise ExportError(f"{where}: {fx_node.target} output {user.args[1] if len(user.args) > 1 else '?'} "
                                  "(its backward workspace) is read; the ONNX route has no equivalent")
        fx_node.target = decomposition
        count += 1
    if count:
        module.graph.lint()
        module.recompile()
    return count
