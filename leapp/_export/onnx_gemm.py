"""leapp/_export/onnx_gemm.py: a linear layer's ``Gemm`` written as ``MatMul`` + ``Add`` in an exported ONNX node.

torch's ONNX exporter writes ``nn.Linear`` on a 2-D input as ``Gemm(x, W, b)``. ONNX
Runtime's CUDA EP runs a ``Gemm`` with a bias as two cuBLAS GEMMs: one broadcasts the bias
into the output, the second accumulates ``x @ W`` onto it. ``MatMul`` then ``Add`` is one
GEMM and one elementwise kernel, less kernel time for the same layer (figures for the robot
example's MLP: benchmarks/results/performance-history.md).

ORT's ``MatMulAddFusion`` would fuse the pair back into a ``Gemm``, so leapp's CUDA EP
sessions switch that one optimizer off (``leapp.runtime.onnx_runner.CUDA_SESSION_CONFIG``).
A CPU EP session, or any other ORT user of the file, fuses it back into the ``Gemm`` torch's
exporter writes. Both forms add the bias to the float32 product and round once; cuBLAS
may pick another GEMM kernel (another summation order) for the pair, so results can differ
in the last bits, as between any two GEMM kernels.

Only the linear-layer case is rewritten: a float32 ``Gemm`` with ``alpha = beta = 1``,
``transA = 0`` and a constant 1-D bias; with ``transB = 1`` only when ``W`` is a constant
(its transpose is stored). Anything else is left as the exporter wrote it.
"""

from __future__ import annotations

__all__ = ["split_gemm_bias"]


def _constant(value):
    """The value's tensor when it is an initializer with data that no graph input can override, else None."""
    if value is None or not value.is_initializer() or value.is_graph_input():
        return None
    return value.const_value


def _fresh(name: str, taken: set[str]) -> str:
    """``name``, or ``name`` with the first free numeric suffix; reserved in ``taken``."""
    candidate, k = name, 1
    while candidate in taken:
        candidate, k = f"{name}_{k}", k + 1
    taken.add(candidate)
    return candidate


def split_gemm_bias(model) -> int:
    """Rewrites every linear-layer ``Gemm`` of ``model``'s main graph (an ``onnx_ir.Model``) in place;
    returns how many."""
    import onnx_ir as ir

    graph = model.graph
    rewritten = 0
    transposed = {}  # a shared weight's transpose, stored once
    taken = {v.name for v in graph.inputs} | set(graph.initializers)
    taken |= {v.name for n in graph for v in n.outputs} | {n.name for n in graph if n.name}
    for node in list(graph):
        if node.domain not in ("", "ai.onnx") or node.op_type != "Gemm" or len(node.inputs) != 3:
            continue
        a, w, bias = node.inputs
        attrs = node.attributes
        if a is None or w is None or attrs.get_float("alpha", 1.0) != 1.0 or attrs.get_float("beta", 1.0) != 1.0:
            continue
        if attrs.get_int("transA", 0) != 0:
            continue
        bias_data = _constant(bias)
        if bias_data is None or bias_data.dtype != ir.DataType.FLOAT or len(bias_data.shape) != 1:
            continue
        given_w = None
        if attrs.get_int("transB", 0) != 0:
            w_data = _constant(w)
            if w_data is None or len(w_data.shape) != 2:
                continue
            given_w = w
            w = transposed.get(given_w.name)
            if w is None:
                w = ir.Value(name=_fresh(f"{given_w.name}_transposed", taken), const_value=ir.tensor(w_data.numpy().T.copy()))
                w.shape, w.type = ir.Shape(w.const_value.shape), ir.TensorType(w_data.dtype)
                graph.register_initializer(w)
                transposed[given_w.name] = w
        old = node.outputs[0]
        name = old.name
        old.name = _fresh(f"{name}_gemm", taken)
        stem = node.name or name
        matmul = ir.Node("", "MatMul", [a, w], name=_fresh(f"{stem}_matmul", taken), num_outputs=1)
        add = ir.Node("", "Add", [matmul.outputs[0], bias], name=_fresh(f"{stem}_bias", taken), num_outputs=1)
        matmul.outputs[0].name = _fresh(f"{name}_matmul", taken)
        for value in (matmul.outputs[0], add.outputs[0]):
            value.type, value.shape = old.type, old.shape
        add.outputs[0].name = name
        old.replace_all_uses_with(add.outputs[0], replace_graph_outputs=True)
        graph.insert_before(node, [matmul, add])
        graph.remove(node, safe=True)
        if given_w is not None and not given_w.uses() and not given_w.is_graph_output():
            del graph.initializers[given_w.name]  # only its transpose is used now
        rewritten += 1
    return rewritten
