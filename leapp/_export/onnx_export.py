"""leapp/_export/onnx_export.py: a node as an ONNX model (``<node>.onnx``).

Each ``torch.ops.leapp.warp_segment`` call becomes ONE node of domain
``leapp.warp``, op ``WarpSegment``: inputs are the segment's tensors followed
by the bundle (a uint8 initializer, LAST), attribute ``signature`` (string),
one output per signature output with static shape and dtype.

NOTE: torch's dynamo exporter (torch 2.11-2.13) hands a ``Tensor[]`` argument
to a custom translation as a Python list and maps the op's list output onto
the node's outputs through the ``getitem`` nodes, so no fixed-arity wrapper op
is needed. What it does need is an ONNX ``OpSchema`` to count the outputs: we
build one per output count and give it to an ``onnxscript`` ``Op`` directly,
without registering it in ONNX's process-wide schema registry.
"""

from __future__ import annotations

import functools
import json
import logging
from pathlib import Path

import torch

from leapp._export.exportable import ExportableNode
from leapp._export.onnx_gemm import split_gemm_bias
from leapp._export.paths import artifact_path
from leapp.errors import ExportError

__all__ = [
    "DOMAIN",
    "OP_TYPE",
    "DOMAIN_VERSION",
    "EXTERNAL_DATA_THRESHOLD",
    "export_onnx",
    "to_onnx_program",
    "translation_table",
    "clone_copied_constants",
]

log = logging.getLogger(__name__)

DOMAIN = "leapp.warp"
OP_TYPE = "WarpSegment"
DOMAIN_VERSION = 1
EXTERNAL_DATA_THRESHOLD = 1_500_000_000  # bytes of initializers; protobuf stops at 2 GB
_TENSOR_TYPES = [
    "tensor(float)",
    "tensor(float16)",
    "tensor(bfloat16)",
    "tensor(double)",
    "tensor(int8)",
    "tensor(int16)",
    "tensor(int32)",
    "tensor(int64)",
    "tensor(uint8)",
    "tensor(bool)",
]


@functools.lru_cache(maxsize=None)
def _schema(num_outputs: int):
    """The WarpSegment schema with ``num_outputs`` outputs (variadic inputs: tensors then the bundle)."""
    from onnx.defs import OpSchema

    param = OpSchema.FormalParameter
    variadic = OpSchema.FormalParameterOption.Variadic
    return OpSchema(
        OP_TYPE,
        DOMAIN,
        DOMAIN_VERSION,
        doc="A Warp segment replayed by leapp's runtime; the last input is the bundle (uint8).",
        inputs=[param("inputs", "T", param_option=variadic, is_homogeneous=False, min_arity=1)],
        outputs=[param(f"output_{i}", f"O{i}") for i in range(num_outputs)],
        type_constraints=[("T", _TENSOR_TYPES, "segment tensors and the uint8 bundle")]
        + [(f"O{i}", _TENSOR_TYPES, f"output {i}") for i in range(num_outputs)],
        attributes=[OpSchema.Attribute("signature", OpSchema.AttrType.STRING, "compact JSON segment signature")],
    )


def _warp_segment(inputs, bundle, signature: str):
    """onnxscript translation of ``leapp::warp_segment``."""
    import onnxscript

    count = len(json.loads(signature)["outputs"])
    opset = onnxscript.values.Opset(DOMAIN, DOMAIN_VERSION)
    op = onnxscript.values.Op(opset, OP_TYPE, _schema(count))
    outputs = op(*inputs, bundle, signature=signature)
    return [outputs] if count == 1 else list(outputs)


def translation_table() -> dict:
    """``custom_translation_table`` entry for ``torch.onnx.export``."""
    from leapp.runtime import ops

    ops.ensure_registered()
    return {torch.ops.leapp.warp_segment.default: _warp_segment}


_COPIES = (torch.ops.aten.copy_.default, torch.ops.aten.copy.default)


def clone_copied_constants(gm: torch.fx.GraphModule) -> int:
    """Gives each ``aten.copy_`` whose source is a constant (a ``get_attr``) a clone of it as its source;
    returns how many it changed.

    torch's ONNX exporter before 2.13 writes a copy between tensors of one dtype as its source value itself
    and renames that value after the copy. When the source is an initializer the export then fails ("Key
    'b_<constant>' does not match the name of the value 'copy'", pytorch/pytorch#178868). A node that copies
    a constant into simulator memory does this: MuJoCo Warp's world rows put back into ``Data``. The clone
    computes the same values and is a node of its own, so no initializer is renamed; the ONNX optimizer
    removes the Identity it becomes.
    """
    changed = 0
    for call in list(gm.graph.nodes):
        if call.op != "call_function" or call.target not in _COPIES or len(call.args) < 2:
            continue
        source = call.args[1]
        if isinstance(source, torch.fx.Node) and source.op == "get_attr":
            with gm.graph.inserting_before(call):
                clone = gm.graph.call_function(torch.ops.aten.clone.default, (source,))
            call.replace_input_with(source, clone)
            changed += 1
    if changed:
        gm.recompile()
    return changed


def to_onnx_program(node: ExportableNode):
    """``torch.onnx.export(..., dynamo=True)`` of the node; graph inputs/outputs carry the node's names."""
    record = node.record
    clone_copied_constants(node.module)
    params = record.backend_params
    kwargs = {}
    if params.get("opset_version") is not None:
        kwargs["opset_version"] = int(params["opset_version"])
    args = node.example_inputs
    if record.dynamic_batch is not None:  # dim 0 of every input and output: one symbolic "batch" dimension
        from leapp._export.exportable import example_batch_inputs
        from leapp._export.pt2_export import batch_dynamic_shapes

        args = example_batch_inputs(record)
        kwargs["dynamic_shapes"] = batch_dynamic_shapes(record, args)
    try:
        program = torch.onnx.export(
            node.module,
            args,
            dynamo=True,
            input_names=[s.name for s in record.inputs],
            output_names=[s.name for s in record.outputs],
            custom_translation_table=translation_table(),
            optimize=bool(params.get("optimize", True)),
            verbose=False,
            **kwargs,
        )
    except Exception as e:  # the exporter wraps everything; keep its text, name our node
        raise ExportError(
            f"node '{record.name}' ({record.source}): torch.onnx.export failed: {type(e).__name__}: {e}"
        ) from e
    _check_segment_nodes(node, program.model)
    return program


def _check_segment_nodes(node: ExportableNode, model) -> None:
    """One WarpSegment per segment, each with its bundle initializer as the last input (``model``: onnx_ir)."""
    found = [n for n in model.graph.all_nodes() if n.domain == DOMAIN and n.op_type == OP_TYPE]
    if len(found) != len(node.segments):
        raise ExportError(
            f"node '{node.record.name}': the ONNX graph has {len(found)} {DOMAIN}::{OP_TYPE} node(s) "
            f"for {len(node.segments)} Warp segment(s)"
        )
    initializers = set(model.graph.initializers)
    for onnx_node in found:
        last = onnx_node.inputs[-1] if onnx_node.inputs else None
        if last is None or last.name not in initializers:
            raise ExportError(
                f"node '{node.record.name}': {OP_TYPE} node {onnx_node.name!r} does not take its bundle "
                f"from an initializer (last input {None if last is None else last.name!r})"
            )


def export_onnx(node: ExportableNode, out_dir: Path) -> tuple[Path, list[Path]]:
    """Writes ``<out_dir>/<node>.onnx`` (plus external data when large); returns (model path, data files).

    ``backend_params``: ``external_data`` (bool, default: only above 1.5 GB of
    initializers), ``opset_version`` (default: torch's), ``optimize`` (default True: also writes a
    linear layer's ``Gemm`` as ``MatMul`` + ``Add``, ``onnx_gemm.py``).
    """
    import onnx

    record = node.record
    path = artifact_path(out_dir, record.name, ".onnx", f"node '{record.name}' ({record.source})")
    program = to_onnx_program(node)
    if bool(record.backend_params.get("optimize", True)):  # onnx_gemm.py: what ORT's CUDA EP runs faster
        count = split_gemm_bias(program.model)
        if count:
            log.debug("node '%s': %d linear-layer Gemm(s) written as MatMul + Add", record.name, count)
    size = sum(
        v.const_value.nbytes for v in program.model.graph.initializers.values() if v.const_value is not None
    )
    external = bool(record.backend_params.get("external_data", False)) or size > EXTERNAL_DATA_THRESHOLD
    program.save(path, external_data=external)
    try:
        onnx.checker.check_model(str(path), full_check=False)
    except Exception as e:
        raise ExportError(f"node '{record.name}': onnx.checker rejected {path}: {e}") from e
    return path, external_data_files(path)


def external_data_files(path: Path) -> list[Path]:
    """The files an ONNX model keeps its external initializers in (next to it), sorted."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    names = set()
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == "location":
                names.add(entry.value)
    return sorted(Path(path).parent / n for n in names)
