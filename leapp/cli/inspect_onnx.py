"""leapp/cli/inspect_onnx.py: ``leapp inspect`` of an ONNX model and its ``leapp.warp::WarpSegment`` nodes.

Read through the ``onnx`` package (no ONNX Runtime, no torch); each segment node's bundle
initializer is read and checked against the node's ``signature`` attribute.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from leapp.bundle.describe import format_bytes
from leapp.cli.inspect_bundle import check_signature, read_described
from leapp.cli.report import Report

__all__ = ["ONNX_DOMAIN", "ONNX_OP", "inspect_onnx"]

ONNX_DOMAIN = "leapp.warp"
ONNX_OP = "WarpSegment"


def _walk_graphs(graph) -> Iterator[Any]:
    """The graph and every subgraph of If/Loop/Scan attributes."""
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("g"):
                yield from _walk_graphs(attr.g)
            for sub in attr.graphs:
                yield from _walk_graphs(sub)


def _onnx_dtype(onnx, elem_type: int) -> str:
    """torch-style names (float32, not FLOAT) so ONNX and bundle dtypes read alike."""
    try:
        return str(onnx.helper.tensor_dtype_to_np_dtype(elem_type).name)
    except (KeyError, TypeError, ValueError):
        return onnx.TensorProto.DataType.Name(elem_type).lower() if elem_type else "?"


def _value_text(value, onnx) -> str:
    tensor = value.type.tensor_type
    dtype = _onnx_dtype(onnx, tensor.elem_type)
    dims = [d.dim_param or d.dim_value for d in tensor.shape.dim] if tensor.HasField("shape") else "?"
    return f"{value.name}: {dtype}{dims}"


def inspect_onnx(path: Path, report: Report, indent: int) -> None:
    try:
        import onnx
        from onnx import numpy_helper
    except ImportError as e:
        report.problem(f"{path}: the onnx package is needed to inspect ONNX models ({e})", indent)
        return
    try:
        model = onnx.load(str(path))  # external data is read from files next to the model
    except Exception as e:  # noqa: BLE001 - protobuf and external-data errors have no common base
        report.problem(f"{path}: corrupt or truncated: cannot load as ONNX: {type(e).__name__}: {e}", indent)
        return
    try:  # protobuf parses some truncations (an empty file is an empty model): the checker does not
        onnx.checker.check_model(str(path))
    except Exception as e:  # noqa: BLE001 - ValidationError, or the external data's own errors
        report.problem(f"{path}: corrupt or truncated: the ONNX checker refuses it: {type(e).__name__}: {e}", indent)
        return
    graphs = list(_walk_graphs(model.graph))
    nodes = [n for g in graphs for n in g.node]
    initializers = {t.name: t for g in graphs for t in g.initializer}
    opsets = ", ".join(f"{o.domain or 'ai.onnx'} {o.version}" for o in model.opset_import)
    producer = f"; producer {model.producer_name} {model.producer_version}".rstrip() if model.producer_name else ""
    report.line(
        f"{path.name}: ONNX model, {format_bytes(path.stat().st_size)} (ir_version {model.ir_version}; "
        f"opsets {opsets}{producer})",
        indent,
    )
    report.line("inputs: " + ("; ".join(_value_text(v, onnx) for v in model.graph.input) or "none"), indent + 1)
    report.line("outputs: " + ("; ".join(_value_text(v, onnx) for v in model.graph.output) or "none"), indent + 1)
    counts = Counter(f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in nodes)
    report.line(f"nodes: {len(nodes)} (" + ", ".join(f"{k} x{v}" for k, v in counts.most_common()) + ")", indent + 1)
    segments = [n for n in nodes if n.domain == ONNX_DOMAIN and n.op_type == ONNX_OP]
    if not segments:
        report.line(f"no {ONNX_DOMAIN} {ONNX_OP} nodes", indent + 1)
    for number, node in enumerate(segments):
        name = node.name or f"#{number}"
        where = f"{path.name}: node {name}"
        bundle_input = node.input[-1] if node.input else None
        report.line(
            f"node {name} ({ONNX_DOMAIN}::{ONNX_OP}): inputs {list(node.input[:-1])}, bundle '{bundle_input}', "
            f"outputs {list(node.output)}",
            indent + 1,
        )
        signature = next((a.s.decode("utf-8", "replace") for a in node.attribute if a.name == "signature"), None)
        tensor = initializers.get(bundle_input)
        bundle = None
        if tensor is None:
            report.problem(f"{where}: its last input '{bundle_input}' (the bundle) is not an initializer", indent + 2)
        elif tensor.data_type != onnx.TensorProto.UINT8:
            dtype = _onnx_dtype(onnx, tensor.data_type)
            report.problem(f"{where}: bundle initializer '{bundle_input}' is {dtype}, expected uint8", indent + 2)
        else:
            try:
                data = numpy_helper.to_array(tensor, base_dir=str(path.parent)).tobytes()
            except Exception as e:  # noqa: BLE001 - missing external data files, bad raw data
                report.problem(f"{where}: cannot read bundle initializer '{bundle_input}': {e}", indent + 2)
            else:
                bundle = read_described(report, where, data, indent + 2)
        check_signature(report, where, signature, bundle, indent + 2)
        if bundle is not None and (len(node.input) - 1, len(node.output)) != (len(bundle.inputs), len(bundle.outputs)):
            report.problem(
                f"{where}: {len(node.input) - 1} inputs and {len(node.output)} outputs, but the bundle has "
                f"{len(bundle.inputs)} and {len(bundle.outputs)}",
                indent + 2,
            )
