"""Backend: the IR to an ONNX model of standard ops only (default domain, opset ``OPSET``).

Arrays enter as graph inputs of shape [n] (float32) or [n, 3]/[n, 4]
(vec3f/quatf) with one symbolic batch ``n`` (the launch dimension); each
written array leaves as ``<name>_out`` with its input's shape. Inside, every
value is [n, width] or a [1, 1] constant, so broadcasting does the rest.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from leapp.lowering.ir import KIND_WIDTH, Graph

__all__ = ["OPSET", "PRIMITIVES", "to_onnx"]

OPSET = 17

# IR primitives that are one ONNX operator of the same name
PRIMITIVES = frozenset(
    {"Add", "Sub", "Mul", "Div", "Neg", "Sqrt", "Sin", "Cos", "Abs", "Min", "Max", "Greater", "Where", "Identity"}
)
BATCH = "n"


def _array_shape(kind: str) -> list:
    return [BATCH] if kind == "float32" else [BATCH, KIND_WIDTH[kind]]


def _int64(name: str, values) -> onnx.TensorProto:
    return helper.make_tensor(name, TensorProto.INT64, [len(values)], list(values))


def to_onnx(graph: Graph) -> onnx.ModelProto:
    """One ONNX model computing ``graph`` for every thread of a 1-D launch at once."""
    nodes: list[onnx.NodeProto] = []
    inits: list[onnx.TensorProto] = [_int64("axis_last", [-1]), _int64("width_1", [1])]
    first = graph.arrays[0][0]
    nodes.append(helper.make_node("Shape", [first], ["batch"], start=0, end=1))
    nodes.append(helper.make_node("Concat", ["batch", "width_1"], ["batch_1"], axis=0))

    for op in graph.ops:
        ins = [v.name for v in op.inputs]
        out = op.output.name
        attrs = dict(op.attrs)
        if op.primitive in PRIMITIVES:
            nodes.append(helper.make_node(op.primitive, ins, [out]))
        elif op.primitive == "Const":
            value = np.full((1, 1), attrs["value"], dtype=np.float32)
            nodes.append(helper.make_node("Constant", [], [out], value=onnx.numpy_helper.from_array(value)))
        elif op.primitive == "SumLast":
            nodes.append(helper.make_node("ReduceSum", [ins[0], "axis_last"], [out], keepdims=1))
        elif op.primitive == "Pick":
            inits.append(_int64(f"{out}_idx", attrs["indices"]))
            nodes.append(helper.make_node("Gather", [ins[0], f"{out}_idx"], [out], axis=-1))
        elif op.primitive == "Concat":
            wide = []
            for i, name in enumerate(ins):  # constants are [1, 1]: widen to [n, 1] first
                nodes.append(helper.make_node("Expand", [name, "batch_1"], [f"{out}_in{i}"]))
                wide.append(f"{out}_in{i}")
            nodes.append(helper.make_node("Concat", wide, [out], axis=-1))
        elif op.primitive == "LoadArray":
            if op.output.kind == "float32":
                nodes.append(helper.make_node("Unsqueeze", [attrs["name"], "axis_last"], [out]))
            else:
                nodes.append(helper.make_node("Identity", [attrs["name"]], [out]))
        elif op.primitive == "LoadScalar":
            nodes.append(helper.make_node("Reshape", [attrs["name"], "width_1"], [f"{out}_flat"]))
            nodes.append(helper.make_node("Unsqueeze", [f"{out}_flat", "axis_last"], [out]))
        else:
            raise ValueError(f"IR primitive {op.primitive!r} has no ONNX form")

    outputs = []
    kinds = dict(graph.arrays)
    for name, value in graph.stores.items():
        kind = kinds[name]
        width = KIND_WIDTH[kind]
        shape = f"{name}_shape"
        inits.append(_int64(f"{name}_width", [width]))
        nodes.append(helper.make_node("Concat", ["batch", f"{name}_width"], [shape], axis=0))
        full = f"{name}_full" if kind == "float32" else f"{name}_out"
        nodes.append(helper.make_node("Expand", [value.name, shape], [full]))
        if kind == "float32":
            nodes.append(helper.make_node("Squeeze", [full, "axis_last"], [f"{name}_out"]))
        outputs.append(helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, _array_shape(kind)))

    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, _array_shape(k)) for n, k in graph.arrays]
    inputs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, []) for n, _ in graph.scalars]
    body = helper.make_graph(nodes, graph.name, inputs, outputs, initializer=inits)
    model = helper.make_model(body, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="leapp.lowering")
    model.ir_version = 8
    return model
