"""leapp/_recorder/fx_graph.py: record the torch work of one node execution into an FX graph.

A ``TorchDispatchMode`` is pushed when a node is entered and popped when it
exits, so only aten ops issued inside the node are seen; nothing global is
patched. Live tensors map to FX values by identity (weak references, checked
so a recycled ``id()`` never aliases), and by storage pointer for tensors that
share memory with a traced value without having passed through an op
(``wp.to_torch`` of a traced array, ``torch.from_numpy`` of its buffer).

NOTE: in-place and view ops are kept as they are (``torch.export``
functionalizes them later); a tensor that is neither a node input nor produced
in the node becomes a ``get_attr`` buffer of the GraphModule (a snapshot of
module parameters and captured constants).
NOTE: a storage made by an uninitialized factory (``torch.empty``...) and not
written by any recorded op since holds undefined bytes; a segment that writes
it needs no copy of them (``is_uninitialized``), see docs/recorder.md section 4.
NOTE: inside an open segment, views of tensors the recorder does not know are
left unrecorded (they may be memory the segment allocates, undefined until
it runs) and other ops reading such memory are refused: no constant is ever a
snapshot of undefined bytes (docs/recorder.md section 3).
"""

from __future__ import annotations

import contextlib
import operator
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.fx
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map_only

from leapp._contract.records import SegmentIO, SegmentRecord, TensorSpec
from leapp.errors import TraceError

from .dtypes import check_boundary_dtype
from .source import user_location

__all__ = ["GraphRecorder", "OwnerMap", "PendingOutput", "UNINITIALIZED_FACTORIES", "storage_ptr"]

_aten = torch.ops.aten

# Tensor attributes wp.from_torch and friends read without touching values.
_METADATA_FUNCS = frozenset(
    {
        "__get__",
        "__set__",
        "stride",
        "size",
        "dim",
        "ndimension",
        "data_ptr",
        "untyped_storage",
        "storage_offset",
        "element_size",
        "is_contiguous",
        "numel",
        "nelement",
        "get_device",
        "__len__",
        "__hash__",
        "__dlpack__",
        "__dlpack_device__",
        "requires_grad_",
    }
)
# Factories whose result holds undefined bytes (torch.empty, empty_like, new_empty, empty_strided...).
UNINITIALIZED_FACTORIES = frozenset(
    {
        _aten.empty.memory_format,
        _aten.empty_like.default,
        _aten.empty_strided.default,
        _aten.new_empty.default,
        _aten.new_empty_strided.default,
    }
)
_READBACK_FUNCS = frozenset(
    {"numpy", "item", "tolist", "cpu", "__array__", "__float__", "__int__", "__bool__", "__index__",
     "__repr__", "__str__", "__format__"}
)


def storage_ptr(t: torch.Tensor) -> int:
    """Base pointer of a tensor's storage (the key APIC uses for torch memory)."""
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return 0


def _storage_nbytes(t: torch.Tensor) -> int:
    return t.untyped_storage().nbytes()


def _covers_storage(t: torch.Tensor) -> bool:
    return t.is_contiguous() and t.storage_offset() == 0 and t.numel() * t.element_size() == _storage_nbytes(t)


class OwnerMap:
    """Session-wide: which node traced the tensor that owns a storage pointer."""

    def __init__(self) -> None:
        self._owners: dict[int, tuple[str, weakref.ref]] = {}

    def register(self, ptr: int, node: str, t: torch.Tensor) -> None:
        if ptr:
            self._owners[ptr] = (node, weakref.ref(t))
            if len(self._owners) > 8192:
                self._owners = {p: e for p, e in self._owners.items() if e[1]() is not None}

    def owner_of(self, ptr: int) -> str | None:
        entry = self._owners.get(ptr)
        if entry is None or entry[1]() is None:
            return None
        return entry[0]


@dataclass
class PendingOutput:
    """An array created inside a Warp segment; it becomes an output when used after the block."""

    segment: SegmentRecord
    call: torch.fx.Node | None
    region_id: int
    nbytes: int
    spec: TensorSpec
    array: Any  # the wp.array (kept alive so its pointer is not reused)
    warp_dtype: Any
    node: torch.fx.Node | None = None

    def materialize(self, graph: torch.fx.Graph | None) -> torch.fx.Node | None:
        if self.node is None:
            check_boundary_dtype(
                self.warp_dtype,
                f"the {self.spec.logical_shape} wp.array (region {self.region_id}) created in Warp segment "
                f"'{self.segment.id}' and used after it",
                self.segment.source,
            )
            index = len(self.segment.outputs)
            self.spec.name = f"out{index}"
            self.segment.outputs.append(SegmentIO(self.spec, self.region_id, self.nbytes))
            self.segment.scratch.pop(self.region_id, None)
            if graph is not None and self.call is not None:
                self.node = graph.call_function(operator.getitem, (self.call, index))
        return self.node


@dataclass
class _Binding:
    ref: weakref.ref
    node: torch.fx.Node | None
    constant: bool = False


@dataclass
class GraphRecorder:
    """The tensors and FX graph of one execution of one node.

    ``build`` is true only in the capture pass; the other passes keep the
    bookkeeping (what is traced, who owns it) that the guards need.
    """

    node_name: str
    build: bool
    owners: OwnerMap
    graph: torch.fx.Graph | None = None
    root: torch.nn.Module = field(default_factory=torch.nn.Module)
    paused: bool = False
    block: Any = None  # the open segment (segment._Block) while a warp_op block is open
    notes: list[str] = field(default_factory=list)
    pending: dict[int, PendingOutput] = field(default_factory=dict)
    _by_id: dict[int, _Binding] = field(default_factory=dict)
    _by_storage: dict[int, list[_Binding]] = field(default_factory=dict)
    _n_constants: int = 0
    _uninitialized: dict[int, weakref.ref] = field(default_factory=dict)  # storage ptr -> the factory's tensor
    _truncated: set[int] = field(default_factory=set)  # storage ptrs whose binding bucket dropped live aliases
    # tensors that in-place ops wrote, kept alive for the execution: ``wp.to_torch(state).copy_(x)`` writes
    # persistent memory through a temporary, and the storage must stay traced after the temporary is gone
    _written: list[torch.Tensor] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.build and self.graph is None:
            self.graph = torch.fx.Graph()

    # ---- bookkeeping ----

    @contextlib.contextmanager
    def paused_recording(self):
        """Let leapp's own torch calls (clones, byte snapshots) run unrecorded."""
        previous, self.paused = self.paused, True
        try:
            yield
        finally:
            self.paused = previous

    def _bind(self, t: torch.Tensor, node: torch.fx.Node | None, constant: bool = False) -> None:
        binding = _Binding(weakref.ref(t), node, constant)
        self._by_id[id(t)] = binding
        if constant:
            return
        ptr = storage_ptr(t)
        if ptr:
            bucket = self._by_storage.setdefault(ptr, [])
            bucket[:] = [b for b in bucket if b.ref() is not None]
            if len(bucket) > 15:
                self._truncated.add(ptr)
                del bucket[:-15]
            bucket.append(binding)
            self.owners.register(ptr, self.node_name, t)

    def _lookup(self, t: torch.Tensor) -> _Binding | None:
        binding = self._by_id.get(id(t))
        if binding is not None and binding.ref() is t:
            return binding
        return None

    def live_storage(self, ptr: int) -> list[tuple[torch.Tensor, torch.fx.Node | None]]:
        """Traced tensors (newest last) whose storage starts at ``ptr``."""
        out = []
        for b in self._by_storage.get(ptr, ()):
            t = b.ref()
            if t is not None and storage_ptr(t) == ptr:
                out.append((t, b.node))
        return out

    def traced_ranges(self) -> list[tuple[int, int, torch.Tensor]]:
        """(storage pointer, storage bytes, a traced tensor over it) of every live traced storage."""
        out = []
        for ptr in self._by_storage:
            live = self.live_storage(ptr)
            if live:
                out.append((ptr, _storage_nbytes(live[-1][0]), live[-1][0]))
        return out

    def is_uninitialized(self, ptr: int) -> bool:
        """True while the storage at ``ptr`` holds only the undefined bytes of an uninitialized factory.

        The factory's tensor must still be alive (so ``ptr`` was not reused) and
        no recorded op may have been given the storage as a mutable argument;
        segments that write it call ``mark_written``. Writes torch does not
        dispatch (numpy views, raw pointers) are not seen, as they are not recorded.
        """
        ref = self._uninitialized.get(ptr)
        t = ref() if ref is not None else None
        return t is not None and storage_ptr(t) == ptr

    def mark_written(self, ptr: int) -> None:
        self._uninitialized.pop(ptr, None)

    def sole_binding(self, ptr: int, t: torch.Tensor) -> _Binding | None:
        """The binding of ``t`` if it is the only live traced tensor over the storage at ``ptr``."""
        binding = self._lookup(t)
        if binding is None or binding.constant or ptr in self._truncated:
            return None
        live = [b for b in self._by_storage.get(ptr, ()) if (o := b.ref()) is not None and storage_ptr(o) == ptr]
        return binding if live == [binding] else None

    def is_traced(self, t: torch.Tensor) -> bool:
        binding = self._lookup(t)
        if binding is not None:
            return not binding.constant
        ptr = storage_ptr(t)
        return bool(ptr) and (ptr in self.pending or bool(self.live_storage(ptr)))

    # ---- FX values ----

    def placeholder(self, name: str, t: torch.Tensor, spec: TensorSpec) -> None:
        node = None
        if self.build:
            node = self.graph.placeholder(_fx_name(name))
            node.meta["leapp_spec"] = spec
        self._bind(t, node)

    def value_of(self, t: torch.Tensor) -> torch.fx.Node | None:
        """The FX value of a live tensor, creating aliases or constants as needed."""
        binding = self._lookup(t)
        if binding is not None:
            return binding.node
        ptr = storage_ptr(t)
        pending = self.pending.get(ptr)
        if pending is not None:
            base = pending.materialize(self.graph)
            node = self._alias(base, pending.spec.dtype, tuple(pending.spec.shape), t)
            self._bind(t, node)
            return node
        live = self.live_storage(ptr)
        if live:
            t0, n0 = self._pick_base(live)
            node = self._alias(n0, t0.dtype, None, t, base_tensor=t0)
            self._bind(t, node)
            return node
        node = self._constant(t, ptr)
        self._bind(t, node, constant=True)
        return node

    def _pick_base(self, live):
        for t0, n0 in reversed(live):
            if _covers_storage(t0):
                return t0, n0
        return live[-1]

    def _alias(self, base, base_dtype, base_shape, t: torch.Tensor, base_tensor=None):
        """FX view of ``t`` over the storage that ``base`` (a node) holds."""
        if not self.build:
            return None
        if base_tensor is not None and base_tensor is t:
            return base
        same_layout = (
            t.dtype == base_dtype
            and t.storage_offset() == 0
            and t.is_contiguous()
            and (
                (base_shape is not None and tuple(t.shape) == base_shape)
                or (base_tensor is not None and _covers_storage(base_tensor) and t.shape == base_tensor.shape)
            )
        )
        if same_layout:
            return base
        src = base
        if t.dtype != base_dtype:
            elem = base_dtype.itemsize
            flat = self.graph.call_function(_aten.as_strided.default, (src, [_storage_nbytes(t) // elem], [1], 0))
            src = self.graph.call_function(_aten.view.dtype, (flat, t.dtype))
        return self.graph.call_function(
            _aten.as_strided.default, (src, list(t.shape), list(t.stride()), t.storage_offset())
        )

    def _constant(self, t: torch.Tensor, ptr: int) -> torch.fx.Node | None:
        owner = self.owners.owner_of(ptr)
        if owner is not None and owner != self.node_name:
            self.notes.append(
                f"node '{self.node_name}': a {tuple(t.shape)} {t.dtype} tensor traced in node '{owner}' is used at "
                f"{user_location()} without annotate.input_tensors; it is baked into the graph as a constant"
            )
        if not self.build:
            return None
        name = f"_leapp_constant_{self._n_constants}"
        self._n_constants += 1
        with self.paused_recording(), torch.no_grad():
            self.root.register_buffer(name, t.detach().clone())
        return self.graph.get_attr(name)

    def storage_value(self, ptr: int, nbytes: int) -> tuple[torch.fx.Node | None, TensorSpec, torch.Tensor | None]:
        """A contiguous FX value holding the whole storage at ``ptr`` (a segment's view of a region)."""
        live = self.live_storage(ptr)
        t0, n0 = self._pick_base(live)
        if _covers_storage(t0):
            return n0, TensorSpec("", t0.dtype, tuple(t0.shape)), t0
        elem = t0.element_size()
        if nbytes % elem:
            raise TraceError(
                f"node '{self.node_name}': storage of {nbytes} bytes is not a whole number of {t0.dtype} elements"
            )
        node = None
        if self.build:
            node = self.graph.call_function(_aten.as_strided.default, (n0, [nbytes // elem], [1], 0))
        return node, TensorSpec("", t0.dtype, (nbytes // elem,)), None

    def record_op(self, func, args, kwargs) -> Any:
        """Run one aten op and add it to the graph (called by the dispatch mode)."""
        if self.block is not None:
            if not func.is_view:
                self.block.check_torch_op(str(func), args, kwargs)
            if self._unknown_in_block(func, args, kwargs):
                return func(*args, **kwargs)
        fx_args = fx_kwargs = None
        if self.build:
            fx_args = tree_map_only(torch.Tensor, self.value_of, args)
            fx_kwargs = tree_map_only(torch.Tensor, self.value_of, kwargs)
            self._track_initialization(func, args, kwargs)
        out = func(*args, **kwargs)
        node = self.graph.call_function(func, tuple(fx_args), dict(fx_kwargs)) if self.build else None
        if isinstance(out, torch.Tensor):
            self._bind(out, node)
            schema = getattr(func, "_schema", None)
            if schema is not None and schema.is_mutable:
                self._written.append(out)
            if self.build and func in UNINITIALIZED_FACTORIES:
                ptr = storage_ptr(out)
                if ptr:
                    self._uninitialized[ptr] = weakref.ref(out)
        elif isinstance(out, (tuple, list)):
            for i, o in enumerate(out):
                if isinstance(o, torch.Tensor):
                    self._bind(o, self.graph.call_function(operator.getitem, (node, i)) if self.build else None)
        return out

    def _unknown_in_block(self, func, args, kwargs) -> bool:
        """Inside an open segment: True for a view of tensors the recorder does not know (left unrecorded).

        Such a view (``torch.as_tensor`` in ``wp.to_torch``, the gradient that
        ``wp.from_torch`` allocates for a tensor that requires grad) may be of
        memory the segment itself allocates, whose bytes are undefined until the
        captured work runs: it gets its FX value on first use after the block,
        by storage (a segment output, or a snapshot of what is there then).
        Any other op reading memory the segment allocated is refused, since the
        recorder would have to snapshot undefined bytes as a constant.
        """
        tensors = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, torch.Tensor)]
        unknown = [t for t in tensors if self._lookup(t) is None and not self.is_traced(t)]
        if not unknown:
            return False
        if func.is_view and len(unknown) == len(tensors):
            return True
        if self.build:
            for t in unknown:
                if self.block.allocates(storage_ptr(t)):
                    block = self.block
                    raise TraceError(
                        f"{func} at {user_location()} in Warp segment {block.segment_id} (opened at {block.source}) "
                        f"of node '{self.node_name}' reads a {tuple(t.shape)} {t.dtype} tensor over Warp memory "
                        "allocated inside the segment (wp.empty/wp.zeros/wp.clone there, or the gradient "
                        "wp.from_torch allocates for a tensor that requires grad). Its bytes are undefined until the "
                        "captured segment runs, so leapp cannot bake them as a constant; use it after the block."
                    )
        return False

    def _track_initialization(self, func, args, kwargs) -> None:
        """A mutating op may write any tensor it is given: their storages are no longer uninitialized."""
        schema = getattr(func, "_schema", None)
        if not self._uninitialized or (schema is not None and not schema.is_mutable):
            return
        for leaf in tree_flatten((args, kwargs))[0]:
            if isinstance(leaf, torch.Tensor):
                self._uninitialized.pop(storage_ptr(leaf), None)

    def finish(self, outputs: list[torch.fx.Node | None], class_name: str) -> torch.fx.GraphModule | None:
        if not self.build:
            return None
        self.graph.output(tuple(outputs))
        self.graph.lint()
        return torch.fx.GraphModule(self.root, self.graph, class_name=class_name)


def _fx_name(name: str) -> str:
    cleaned = "".join(c if c.isalnum() or c == "_" else "_" for c in name)
    return cleaned if cleaned and not cleaned[0].isdigit() else f"input_{cleaned}"


class NodeDispatchMode(TorchDispatchMode):
    """Scoped to one node execution: every aten op goes through the recorder."""

    def __init__(self, recorder: GraphRecorder) -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.recorder.paused:
            return func(*args, **kwargs)
        return self.recorder.record_op(func, args, kwargs)


class BlockGuardMode(TorchFunctionMode):
    """Scoped to one open Warp segment: torch work on traced tensors is an error there.

    Host readbacks (``.numpy()``, ``.item()``...) are refused here, by name;
    other torch calls are let through to the dispatch mode, which refuses every
    non-view aten op on a traced tensor (views touch no data, so
    ``wp.from_torch(x[:, :3])`` stays legal). ``current`` names the torch call
    for that error.
    """

    def __init__(self, recorder: GraphRecorder, check: Callable[[str, tuple, dict], None]) -> None:
        super().__init__()
        self.recorder = recorder
        self.check = check
        self.current: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in _METADATA_FUNCS or self.recorder.paused:
            return func(*args, **kwargs)
        qualname = f"Tensor.{name}" if _is_tensor_method(func) else f"torch.{name}"
        if name in _READBACK_FUNCS:
            self.check(f"host readback {qualname}", args, kwargs)
        self.current.append(qualname)
        try:
            return func(*args, **kwargs)
        finally:
            self.current.pop()


def _is_tensor_method(func) -> bool:
    qual = getattr(func, "__qualname__", "")
    return qual.startswith("TensorBase.") or qual.startswith("Tensor.") or qual.startswith("_TensorBase.")


def traced_tensors(recorder: GraphRecorder, args, kwargs) -> list[torch.Tensor]:
    leaves, _ = tree_flatten((args, kwargs))
    return [x for x in leaves if isinstance(x, torch.Tensor) and recorder.is_traced(x)]
