"""leapp/_contract/records.py: the plain data model the recorder hands to the exporter.

NOTE: field names are binding (tests build records by hand, as a second
recorder would); new fields get defaults, no field is renamed. The exporter
consumes these objects in the same process, right after tracing, so they hold
live objects (FX graphs, Warp kernels) and are never serialised.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from leapp.errors import TraceError

if TYPE_CHECKING:  # pragma: no cover - typing only
    import torch.fx
    import warp

__all__ = [
    "TensorSpec",
    "SegmentIO",
    "KernelRef",
    "SegmentRecord",
    "Sample",
    "Probe",
    "StateSpec",
    "NodeRecord",
    "SessionRecord",
    "warp_segment_call",
]


@dataclass
class TensorSpec:
    """How a value crosses a node or segment boundary, seen as a torch tensor.

    Compound Warp dtypes use the expanded scalar layout: a (2, 4) ``wp.vec3``
    array is a (2, 4, 3) float32 tensor; ``logical_shape`` keeps (2, 4).
    """

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    warp_dtype: str | None = None
    logical_shape: tuple[int, ...] | None = None
    # Added later: the user's metadata (annotate.input_tensors(..., metadata=)), written to pipeline.yaml.
    metadata: dict = field(default_factory=dict)


@dataclass
class SegmentIO:
    """One APIC memory region bound to a traced torch value.

    ``spec`` describes a contiguous tensor whose bytes are exactly the region's
    bytes (the whole storage of the traced tensor). ``undefined_before`` (an
    output only) says the region held only undefined bytes before the segment
    (a ``torch.empty``-like tensor nothing wrote): it is not an input, and the
    bundle's output starts with init "none" whatever the capture's snapshot was.
    """

    spec: TensorSpec
    region_id: int
    nbytes: int
    undefined_before: bool = False  # added later


@dataclass
class KernelRef:
    """A Warp kernel launched by a segment, as captured (export recompiles it)."""

    kernel: "warp.Kernel"
    block_dim: int
    key: str


@dataclass
class SegmentRecord:
    """One ``annotate.warp_op()`` block of a node, captured with APIC in pass 2.

    Invariant: a region both read and written appears in ``inputs`` and in
    ``outputs`` with the same ``region_id``.
    """

    id: str
    node: str
    index: int
    source: str
    device: str
    ops: list[str]
    wrp: bytes
    kernels: list[KernelRef]
    inputs: list[SegmentIO]
    outputs: list[SegmentIO]
    constants: dict[int, bytes]
    scratch: dict[int, int]
    # Added later (defaults keep the original constructor):
    captured_ops: list[str] = field(default_factory=list)  # every APIC op of pass 2, e.g. ["launch:k", "copy", "memset"]
    call_sites: list[str] = field(default_factory=list)  # "file:line" of each discovered launch, in ops order
    modules: dict[str, bytes] = field(default_factory=dict)  # files of capture_save's <stem>_modules/ folder


@dataclass
class Sample:
    """One recorded execution of a node: cloned inputs and eager outputs."""

    inputs: list[torch.Tensor]
    outputs: list[torch.Tensor]


@dataclass
class Probe:
    """A second capture of a ``dynamic_batch`` node at another batch size (docs/recorder.md section 1.0).

    ``segments`` are captured exactly like the capture pass's (same order), so
    the exporter can compare what each segment did at ``batch`` with the
    capture at the traced batch.
    """

    batch: int
    segments: list[SegmentRecord]
    graph: "torch.fx.GraphModule | None" = None  # the probe's FX graph (compared with the capture's at export)


@dataclass
class StateSpec:
    """One state of a node (docs/state.md): the node input ``input`` takes, at each step, what the node's
    output ``output`` returned at the step before; ``initial`` (a detached CPU tensor) is the value of
    ``input`` at the node's first traced call, what the runtimes start from and ``reset()`` restores."""

    input: str
    output: str
    initial: torch.Tensor


@dataclass
class NodeRecord:
    """Everything recorded for one ``leapp.node``.

    ``graph`` has one placeholder per input (in order) and returns a tuple of
    the outputs (in order). Each Warp segment is ONE call_function node
    ``warp_segment_call(segment_id, [inputs])`` followed by getitem nodes.
    """

    name: str
    export_with: str
    backend_params: dict
    source: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    graph: "torch.fx.GraphModule"
    segments: list[SegmentRecord]
    samples: list[Sample]
    # Added later: dynamic batch (docs/recorder.md section 1.0): (min, max) or None, and the probe captures.
    dynamic_batch: tuple[int, int] | None = None
    probes: list[Probe] = field(default_factory=list)
    # Added later: the node's states (annotate.state_tensors / update_state), in declaration order.
    state: list[StateSpec] = field(default_factory=list)


@dataclass
class SessionRecord:
    """The result of one ``leapp.trace`` session; nodes in order of first execution."""

    name: str
    save_path: str
    nodes: dict[str, NodeRecord] = field(default_factory=dict)
    edges: list[tuple[str, str, str, str]] = field(default_factory=list)
    constants_report: list[str] = field(default_factory=list)
    # Added later: pass errors that surface at compile time (docs/recorder.md section 2), and notes.
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def check_complete(self) -> None:
        """Raise the pass errors that surface at ``compile_graph()`` (node run once, segment skipped)."""
        if self.problems:
            raise TraceError("\n".join(self.problems))


def warp_segment_call(segment_id: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """FX leaf standing for one captured Warp segment.

    The exporter replaces it with ``torch.ops.leapp.warp_segment``; it has no
    eager meaning because the segment's code lives in the captured graph.
    """
    raise RuntimeError(
        f"leapp: warp_segment_call({segment_id!r}) is a placeholder in a recorded FX graph; "
        "replace it with the exported segment (leapp._export) or a replay function before running the graph."
    )


# FX must not trace into the placeholder when graphs are re-traced.
try:  # pragma: no cover - depends on torch version
    import torch.fx

    torch.fx.wrap("warp_segment_call")
except Exception:  # noqa: BLE001
    pass
