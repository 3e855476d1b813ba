"""leapp/_export/exportable.py: a recorded node as a torch module that torch.export and ONNX can take.

Every ``warp_segment_call(segment_id, inputs)`` of ``NodeRecord.graph``
becomes ``torch.ops.leapp.warp_segment(inputs, <uint8 buffer>, signature)``:
the buffer holds the segment's bundle bytes and the signature is the compact
JSON (``leapp.bundle.signature_json``) that the fake kernel reads.

NOTE: the user's recorded GraphModule is never modified. The new module
shares its parameters and buffers (by reference) and only adds the bundle
buffers, which live on the CPU: the bundle is host data that the runtimes
parse, whatever device the segment's tensors are on.
"""

from __future__ import annotations

import copy
import json
import operator
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.fx

from leapp._contract.names import identifier
from leapp._contract.records import NodeRecord, SegmentRecord, TensorSpec, warp_segment_call
from leapp._export.rnn_cells import decompose_fused_rnn_cells
from leapp.errors import ExportError

__all__ = [
    "BundleProvider",
    "SegmentExport",
    "ExportableNode",
    "LoweredExport",
    "build_exportable",
    "example_inputs",
    "bundle_info",
]

BundleProvider = Callable[[SegmentRecord], bytes]


@dataclass
class SegmentExport:
    """One Warp segment as it is embedded: bundle bytes, digest and the op's signature string."""

    id: str
    source: str
    device: str
    buffer_name: str
    bundle: bytes
    digest: str
    signature: str
    manifest: dict


@dataclass
class LoweredExport:
    """One Warp segment written as standard ops in the node's graph (no bundle; docs/lowering.md)."""

    id: str
    source: str
    device: str
    kernels: list[str]


@dataclass
class ExportableNode:
    """What the backends export: the rewritten module and its example inputs."""

    record: NodeRecord
    module: torch.fx.GraphModule
    example_inputs: tuple[torch.Tensor, ...]
    segments: list[SegmentExport] = field(default_factory=list)
    lowered: list[LoweredExport] = field(default_factory=list)


def bundle_info(bundle: bytes) -> tuple[dict, str, str]:
    """(manifest, digest, signature JSON) of bundle bytes, read with ``leapp.bundle``'s checking reader."""
    from leapp import bundle as bundle_mod

    parsed = bundle_mod.read_bundle(bundle)
    digest = parsed.digest
    return parsed.manifest, digest, bundle_mod.signature_json(parsed, digest)


def example_inputs(record: NodeRecord) -> tuple[torch.Tensor, ...]:
    """The first recorded sample's inputs, else zeros shaped like the node's input specs (on the CPU)."""
    if record.samples:
        return tuple(t.detach() for t in record.samples[0].inputs)
    return tuple(torch.zeros(spec.shape, dtype=spec.dtype) for spec in record.inputs)


def _segment_calls(gm: torch.fx.GraphModule) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target is warp_segment_call]


def _dynamic_bundles(record: NodeRecord) -> BundleProvider:
    """Bundles with dynamic-batch rules learned from the node's probes (docs/recorder.md section 1.0)."""
    from leapp._export.dynamic_batch import build_dynamic_bundle

    traced = int(record.inputs[0].shape[0])

    def build(seg: SegmentRecord) -> bytes:
        probes = [(p.batch, p.segments[seg.index]) for p in record.probes if seg.index < len(p.segments)]
        return build_dynamic_bundle(seg, probes, record.dynamic_batch, traced)

    return build


def example_batch_inputs(record: NodeRecord) -> tuple[torch.Tensor, ...]:
    """Example inputs for torch.export of a dynamic node: a sample at a batch >= 2 (torch specializes 0 and 1)."""
    for sample in record.samples:
        if sample.inputs and sample.inputs[0].dim() and sample.inputs[0].shape[0] >= 2:
            return tuple(sample.inputs)
    return example_inputs(record)


def _check_side(record: NodeRecord, seg: SegmentRecord, side: str, specs: list[dict], expected: list[TensorSpec]) -> None:
    """The bundle's signature must describe the segment the recorder saw (count, dtype, shape per value)."""
    where = f"node '{record.name}' segment '{seg.id}' ({seg.source})"
    if len(specs) != len(expected):
        raise ExportError(
            f"{where}: the bundle's signature has {len(specs)} {side} but the recorded segment has "
            f"{len(expected)} ({[s.name for s in expected]})"
        )
    for i, (got, want) in enumerate(zip(specs, expected)):
        want_dtype = str(want.dtype).removeprefix("torch.")
        if got["dtype"] != want_dtype or tuple(got["shape"]) != tuple(want.shape):
            raise ExportError(
                f"{where}: {side[:-1]} {i} ('{want.name}') is {want_dtype}{list(want.shape)} in the recording but "
                f"{got['dtype']}{list(got['shape'])} in the bundle's signature"
            )


def _lower_call(gm: torch.fx.GraphModule, seg: SegmentRecord, lowering, call: torch.fx.Node,
                inputs) -> LoweredExport:
    """Replaces ``call`` with the segment's lowered torch function (docs/lowering.md); its constant regions and
    constant values become buffers of ``gm`` on the segment's device (not rebuilt at every call)."""
    from leapp._export.lower_segment import LoweredCall
    from leapp.lowering.torch_backend import const_tensor, constant_tensor, pick_index, table_tensor

    lowered, batch_input = lowering  # leapp._export.warp_route.lower_for_export's result
    buffers = [(f"lowered_{seg.index}_region{rid}", constant_tensor(lowered.graph.regions[rid]))
               for rid in lowered.constant_regions]
    buffers += [(f"lowered_{seg.index}_value{k}", (const_tensor if primitive == "Const" else table_tensor)(value, of))
                for k, (primitive, of, value) in enumerate(lowered.constant_values())]
    buffers += [(f"lowered_{seg.index}_pick{k}", pick_index(indices)) for k, indices in enumerate(lowered.pick_indices())]
    consts = []
    for name, tensor in buffers:
        gm.register_buffer(name, tensor.to(seg.device))
        with gm.graph.inserting_before(call):
            consts.append(gm.graph.get_attr(name))
    with gm.graph.inserting_before(call):
        new = gm.graph.call_function(LoweredCall(lowered, len(inputs), batch_input), (*inputs, *consts))
    new.meta.update(call.meta)
    call.replace_all_uses_with(new)
    gm.graph.erase_node(call)
    return LoweredExport(seg.id, seg.source, seg.device, list(lowered.kernels))


def build_exportable(record: NodeRecord, bundles: BundleProvider | None = None,
                     lowered: dict | None = None) -> ExportableNode:
    """Rewrites ``record.graph`` into an exportable module; ``bundles`` makes each segment's bundle bytes, and
    the segments in ``lowered`` (segment id -> ``warp_route.lower_for_export``'s result) are written as standard
    ops instead (docs/lowering.md).

    Args:
        record: the recorded node.
        bundles: called once per segment of the node; defaults to the Warp
            capture compiler (``leapp._export.segment_bundle.build_segment_bundle``).
            Tests pass hand-made bundles here.

    Raises:
        ExportError: a segment call names an unknown segment, or the bundle's
            signature disagrees with the recorded segment.
    """
    from leapp.runtime import ops

    ops.ensure_registered()
    src = record.graph
    gm = torch.fx.GraphModule(src, _copy_graph(src.graph), class_name=f"leapp_{identifier(record.name)}")
    gm.training = False  # inference export; root flag only: submodules are shared with the recording
    decompose_fused_rnn_cells(gm, f"node '{record.name}' ({record.source})")  # GRU/LSTM cells traced on CUDA
    if record.dynamic_batch is not None:  # sizes baked from the batch become expressions of input 0's dim 0
        from leapp._export.dynamic_batch import symbolize_batch_sizes

        symbolize_batch_sizes(gm, record)
    by_id = {seg.id: seg for seg in record.segments}
    exports: list[SegmentExport] = []
    lowered_exports: list[LoweredExport] = []
    calls = _segment_calls(gm)
    for call in list(calls):
        seg = by_id.get(call.args[0])
        if seg is not None and seg.id in (lowered or {}):
            lowered_exports.append(_lower_call(gm, seg, lowered[seg.id], call, list(call.args[1])))
            calls.remove(call)
    if calls and bundles is None and record.dynamic_batch is not None:
        bundles = _dynamic_bundles(record)
    if calls and bundles is None:
        from leapp._export.segment_bundle import build_segment_bundle

        bundles = build_segment_bundle
    for call in calls:
        segment_id, inputs = call.args[0], call.args[1]
        seg = by_id.get(segment_id)
        if seg is None:
            raise ExportError(
                f"node '{record.name}' ({record.source}): its graph calls Warp segment {segment_id!r}, "
                f"which is not among the recorded segments {sorted(by_id)}"
            )
        data = bytes(bundles(seg))
        manifest, digest, signature = bundle_info(data)
        sig = json.loads(signature)
        _check_side(record, seg, "inputs", sig["inputs"], [io.spec for io in seg.inputs])
        _check_side(record, seg, "outputs", sig["outputs"], [io.spec for io in seg.outputs])
        if len(inputs) != len(seg.inputs):
            raise ExportError(
                f"node '{record.name}' segment '{seg.id}' ({seg.source}): the graph passes {len(inputs)} "
                f"input(s) but the segment records {len(seg.inputs)}"
            )
        buffer_name = f"warp_segment_{seg.index}_bundle"
        gm.register_buffer(buffer_name, torch.frombuffer(bytearray(data), dtype=torch.uint8))
        with gm.graph.inserting_before(call):
            bundle_node = gm.graph.get_attr(buffer_name)
            op_node = gm.graph.call_function(
                torch.ops.leapp.warp_segment.default, (list(inputs), bundle_node, signature)
            )
        op_node.meta.update(call.meta)
        call.replace_all_uses_with(op_node)
        gm.graph.erase_node(call)
        _check_getitems(record, seg, op_node, len(sig["outputs"]))
        exports.append(
            SegmentExport(
                id=seg.id,
                source=seg.source,
                device=seg.device,
                buffer_name=buffer_name,
                bundle=data,
                digest=digest,
                signature=signature,
                manifest=manifest,
            )
        )
    missing = sorted(set(by_id) - {e.id for e in exports} - {e.id for e in lowered_exports})
    if missing:
        raise ExportError(
            f"node '{record.name}' ({record.source}): recorded segment(s) {missing} are not called by its graph"
        )
    gm.graph.lint()
    gm.recompile()
    return ExportableNode(record=record, module=gm, example_inputs=example_inputs(record), segments=exports,
                          lowered=lowered_exports)


def _check_getitems(record: NodeRecord, seg: SegmentRecord, op_node: torch.fx.Node, count: int) -> None:
    """Users of a segment's list may only index it within range (the op's list has a fixed length)."""
    for user in op_node.users:
        if user.op == "call_function" and user.target is operator.getitem:
            index = user.args[1]
            if isinstance(index, int) and not -count <= index < count:
                raise ExportError(
                    f"node '{record.name}' segment '{seg.id}' ({seg.source}): the graph reads output {index} "
                    f"of a segment with {count} output(s)"
                )


def _copy_graph(graph: torch.fx.Graph) -> torch.fx.Graph:
    """A node-for-node copy (codegen included), so that rewriting never touches the recorded graph."""
    return copy.deepcopy(graph)

