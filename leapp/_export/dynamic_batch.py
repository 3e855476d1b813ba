"""leapp/_export/dynamic_batch.py: one bundle for every batch size of a ``dynamic_batch`` node.

The recorder captures each segment at the traced batch and at (up to) two
probe batches (docs/recorder.md section 1.0). Each capture is built into a
manifest with ``segment_bundle.segment_builder``; the manifests and parameter
blobs are then compared field by field. What is equal is a constant; what
differs must be ``a * batch + b`` with integers ``a``, ``b`` fitting every
sample, and becomes a rule of the traced manifest (docs/bundle-format.md,
"Dynamic batch"). Anything else is refused with an ExportError naming the
segment, the op (kernel, argument, byte offset) and the launch's ``file:line``.

NOTE: grids are not compared; the runtime recomputes them from the launch
size (``size_rule``) as Warp does. Kernel parameters are compared as 4-byte
little-endian words (Warp's ``array_t`` shapes/strides and launch-bounds
shapes are 32-bit; a word whose 8-byte pair also changes is patched as 8 bytes).
"""

from __future__ import annotations

from collections.abc import Sequence

from leapp._export import segment_bundle as sb
from leapp.errors import ExportError

__all__ = ["build_dynamic_bundle", "fit_affine", "RULE_LIMIT"]

RULE_LIMIT = 2**40  # |a|, |b| of a rule (docs/bundle-format.md)


def fit_affine(batches: Sequence[int], values: Sequence[int]) -> tuple[int, int] | None:
    """(a, b) with integers such that ``a * batch + b == value`` for every sample, else None."""
    b0, v0 = batches[0], values[0]
    b1, v1 = batches[1], values[1]
    if (v1 - v0) % (b1 - b0):
        return None
    a = (v1 - v0) // (b1 - b0)
    b = v0 - a * b0
    if any(a * x + b != v for x, v in zip(batches, values)):
        return None
    if abs(a) > RULE_LIMIT or abs(b) > RULE_LIMIT:
        return None
    return a, b


class _Learner:
    def __init__(self, segment, batches: list[int], builders: list, batch_range: tuple[int, int]):
        self.segment = segment
        self.batches = batches
        self.builders = builders
        self.manifests = [b.manifest() for b in builders]
        self.lo, self.hi = batch_range
        self.where = sb._where(segment.id, segment.source)

    def fail(self, message: str) -> ExportError:
        return ExportError(f"{self.where}: {message} (dynamic_batch: compared the captures at batch "
                           f"{', '.join(map(str, self.batches))})")

    def shown(self, values) -> str:
        return ", ".join(f"{v} at batch {b}" for v, b in zip(values, self.batches))

    def same(self, values: list, what: str) -> None:
        if any(v != values[0] for v in values[1:]):
            raise self.fail(f"{what} differs between batch sizes ({self.shown(values)}); only sizes may depend "
                            "on the batch")

    def rule(self, values: list[int], what: str) -> list[int] | None:
        """None for a constant, else [a, b]; refused when not affine."""
        if all(v == values[0] for v in values):
            return None
        fit = fit_affine(self.batches, values)
        if fit is None:
            raise self.fail(f"{what} is {self.shown(values)}: not affine in the batch (a * batch + b with "
                            "integers a, b)")
        return list(fit)

    # ------------------------------------------------------------------------------------------------

    def learn(self) -> dict:
        ms = self.manifests
        m = ms[0]
        for key in ("format", "segment", "source", "producer", "modules", "kernels"):
            self.same([x[key] for x in ms], key)
        self.same([len(x["buffers"]) for x in ms], "the number of buffers")
        self.same([len(x["ops"]) for x in ms], "the number of ops (a launch of size 0 at one batch is dropped)")
        self.same([len(b.blobs) for b in self.builders], "the number of blobs")
        for i in range(len(m["buffers"])):
            self.buffer(i)
        for side in ("inputs", "outputs"):
            self.same([len(x["signature"][side]) for x in ms], f"the number of segment {side}")
            for j in range(len(m["signature"][side])):
                self.signature_entry(side, j)
        if not any(e.get("batch_rule", [0])[0] for e in m["signature"]["inputs"]):
            raise self.fail("no segment input follows the batch (dim 0 = a * batch + b, a != 0), so the runtime "
                            "could not tell the batch from its inputs; give the segment a batch-sized input")
        for k in range(len(m["ops"])):
            self.op(k)
        m["batch"] = {"traced": self.batches[0], "min": self.lo, "max": self.hi}
        return m

    def buffer(self, i: int) -> None:
        bufs = [x["buffers"][i] for x in self.manifests]
        b = bufs[0]
        for key in ("id", "role", "io"):
            self.same([x.get(key) for x in bufs], f"buffers[{i}].{key}")
        self.same([x["init"] for x in bufs], f"buffers[{i}].init")
        sizes = [x["bytes"] for x in bufs]
        if b["role"] == "constant":
            if len(set(sizes)) > 1:
                raise self.fail(f"buffers[{i}] is a constant (an array the segment reads but nobody traced: "
                                f"{self.constant_origin(i)}) of {self.shown(sizes)} bytes: a constant would "
                                "have to change size. Pass it to the node as an input, or make it in the "
                                "warp_op block")
            blob = b["init"]["blob"]
            contents = [bytes(bl.blobs[blob]) for bl in self.builders]
            if len(set(contents)) > 1:
                raise self.fail(f"buffers[{i}] is a constant ({self.constant_origin(i)}) whose bytes differ between "
                                "batch sizes; a constant cannot depend on the batch. Pass it to the node as an input")
            return
        rule = self.rule(sizes, f"buffers[{i}].bytes ({b['role']})")
        if rule is not None:
            b["bytes_rule"] = rule

    def constant_origin(self, i: int) -> str:
        """Which launch reads constant buffer ``i``: kernel, argument and the launch's file:line."""
        from leapp import _warp_private as wpp

        region = next((r for r, bi in self.builders[0].region_buffer.items() if bi == i), None)
        what = f"region {region}" if region is not None else "a constant"
        for op in self.manifests[0]["ops"]:
            facts = self.builders[0].launch_facts.get(id(op))
            if op["op"] != "launch" or facts is None:
                continue
            for reloc in op["relocs"]:
                if reloc["buffer"] == i:
                    labels = [a.label for a in wpp.kernel_args(facts["kernel"])]
                    p = reloc["param"] - 1
                    arg = f"argument '{labels[p]}'" if 0 <= p < len(labels) else f"parameter {reloc['param']}"
                    sites = self.segment.call_sites
                    site = sites[facts["ordinal"]] if facts["ordinal"] < len(sites) else self.segment.source
                    return f"{what}, {arg} of the launch of '{facts['kernel'].key}' at {site}"
        return what

    def signature_entry(self, side: str, j: int) -> None:
        entries = [x["signature"][side][j] for x in self.manifests]
        e = entries[0]
        path = f"signature.{side}[{j}]"
        for key in ("name", "buffer", "dtype", "warp_dtype"):
            self.same([x.get(key) for x in entries], f"{path}.{key}")
        shapes = [x["shape"] for x in entries]
        self.same([len(s) for s in shapes], f"{path}.shape's rank")
        for d in range(1, len(e["shape"])):
            self.same([s[d] for s in shapes], f"dim {d} of segment {side[:-1]} {e['name']!r} ({path}.shape[{d}])")
        if not e["shape"]:
            return
        rule = self.rule([s[0] for s in shapes], f"dim 0 of segment {side[:-1]} {e['name']!r}")
        if rule is not None:
            e["batch_rule"] = rule
            row = e["shape"][1:]
            buf = self.manifests[0]["buffers"][e["buffer"]]
            from leapp.bundle.format import DTYPE_ITEMSIZE

            r = DTYPE_ITEMSIZE[e["dtype"]]
            for dim in row:
                r *= dim
            if buf.get("bytes_rule") != [rule[0] * r, rule[1] * r]:
                raise self.fail(f"{path}: dim 0 follows {rule} but its buffer's size follows "
                                f"{buf.get('bytes_rule')}")

    def op(self, k: int) -> None:
        ops = [x["ops"][k] for x in self.manifests]
        o = ops[0]
        self.same([x["op"] for x in ops], f"ops[{k}].op")
        if o["op"] == "memset":
            self.same([x["buffer"] for x in ops], f"ops[{k}].buffer")
            self.same([x["value"] for x in ops], f"ops[{k}].value")
            self.op_rules(ops, k, ("offset", "bytes"))
        elif o["op"] == "copy":
            self.same([(x["src"], x["dst"]) for x in ops], f"ops[{k}] (copy source and destination)")
            self.op_rules(ops, k, ("src_offset", "dst_offset", "bytes"))
        else:
            self.launch(ops, k)

    def op_rules(self, ops: list[dict], k: int, keys: tuple[str, ...]) -> None:
        for key in keys:
            rule = self.rule([x[key] for x in ops], f"ops[{k}].{key} ({ops[0]['op']})")
            if rule is not None:
                ops[0][f"{key}_rule"] = rule

    def launch(self, ops: list[dict], k: int) -> None:
        o = ops[0]
        facts = [b.launch_facts[id(x)] for b, x in zip(self.builders, ops)]
        f0 = facts[0]
        kernel = f0["kernel"]
        sites = self.segment.call_sites
        site = sites[f0["ordinal"]] if f0["ordinal"] < len(sites) else self.segment.source
        what = f"launch of '{kernel.key}' at {site} (ops[{k}])"
        for key in ("kernel", "block", "smem"):
            self.same([x[key] for x in ops], f"{what} {key}")
        self.same([(f["grid_stride"], f["max_blocks"], f["ndim"]) for f in facts], f"{what} grid kind")
        self.same([x["params"]["offsets"] for x in ops], f"{what} parameter layout")
        self.same([x["params"]["sizes"] for x in ops], f"{what} parameter sizes")
        self.same([[(r["param"], r["offset"], r["buffer"]) for r in x["relocs"]] for x in ops], f"{what} relocations")
        size_rule = self.rule([f["size"] for f in facts], f"{what}: launch size")
        for r, reloc in enumerate(o["relocs"]):
            rule = self.rule([x["relocs"][r]["buffer_offset"] for x in ops], f"{what}: relocs[{r}].buffer_offset")
            if rule is not None:
                reloc["buffer_offset_rule"] = rule
        patches = self.param_patches(ops, what, kernel)
        if size_rule is None and not patches:
            return
        o["size_rule"] = size_rule if size_rule is not None else [0, f0["size"]]
        o["grid_stride"] = bool(f0["grid_stride"])
        o["max_blocks"] = int(f0["max_blocks"])
        o["patches"] = patches

    def param_patches(self, ops: list[dict], what: str, kernel) -> list[dict]:
        from leapp import _warp_private as wpp

        blobs = [bytes(b.blobs[x["params"]["blob"]]) for b, x in zip(self.builders, ops)]
        offsets, sizes = ops[0]["params"]["offsets"], ops[0]["params"]["sizes"]
        labels = [a.label for a in wpp.kernel_args(kernel)]
        reloc_slots = {(r["param"], r["offset"] + i) for r in ops[0]["relocs"] for i in range(8)}
        patches: list[dict] = []
        for p, (off, size) in enumerate(zip(offsets, sizes)):
            name = "the launch bounds" if p == 0 else f"argument '{labels[p - 1]}'" if p - 1 < len(labels) \
                else f"parameter {p}"
            w = 0
            while w < size:
                width = min(4, size - w)
                words = [blob[off + w: off + w + width] for blob in blobs]
                if len(set(words)) == 1:
                    w += width
                    continue
                if any((p, w + i) in reloc_slots for i in range(width)):
                    raise self.fail(f"{what}: {name} has a device pointer slot at byte {w} that differs "
                                    "between batch sizes")
                field_name = _field_name(p, w, name)
                values = [int.from_bytes(x, "little") for x in words]
                fit = fit_affine(self.batches, values) if width == 4 else None
                wide = w % 8 == 0 and w + 8 <= size
                if fit is None and wide:
                    wide_values = [int.from_bytes(blob[off + w: off + w + 8], "little") for blob in blobs]
                    fit = fit_affine(self.batches, wide_values)
                    if fit is not None:
                        patches.append({"param": p, "offset": w, "width": 8, "rule": list(fit)})
                        w += 8
                        continue
                if fit is None:
                    raise self.fail(f"{what}: {field_name} bytes [{w}, {w + width}) are {self.shown(values)} "
                                    "(as little-endian unsigned integers): not affine in the batch. Values that "
                                    "depend on the batch must be sizes (a * batch + b), not e.g. 1.0 / batch")
                patches.append({"param": p, "offset": w, "width": 4, "rule": list(fit)})
                w += width
        return patches


def _field_name(p: int, w: int, name: str) -> str:
    if p == 0:
        return name
    if 16 <= w < 32:
        return f"{name} (shape[{(w - 16) // 4}] if it is a Warp array)"
    if 32 <= w < 48:
        return f"{name} (strides[{(w - 32) // 4}] if it is a Warp array)"
    return name


def build_dynamic_bundle(segment, probes: Sequence, batch_range: tuple[int, int], traced_batch: int, *,
                         cuda_block_dim: int | None = None, archs: tuple[int, ...] | None = None) -> bytes:
    """The bundle of ``segment`` (captured at ``traced_batch``) with the rules learned from ``probes``.

    Args:
        segment: the SegmentRecord of the capture pass.
        probes: ``(batch, SegmentRecord)`` of the same segment at other batch sizes (at least one).
        batch_range: the node's ``dynamic_batch`` (min, max).
    """
    from leapp.bundle import BundleError, write_bundle

    if not probes:
        raise ExportError(f"{sb._where(segment.id, segment.source)}: dynamic_batch needs a capture at a second "
                          "batch size")
    records = [segment] + [s for _, s in probes]
    batches = [traced_batch] + [int(b) for b, _ in probes]
    builders = [sb.segment_builder(r, cuda_block_dim=cuda_block_dim, archs=archs) for r in records]
    learner = _Learner(segment, batches, builders, batch_range)
    manifest = learner.learn()
    try:
        return write_bundle(manifest, builders[0].blobs, compress=sb.compress_binaries())
    except BundleError as e:
        raise ExportError(f"{learner.where}: the dynamic-batch bundle breaks the format: {e}") from e


# ------------------------------------------------------------------------------------------------------------
# The torch side: sizes the recorder baked into the FX graph (torch.zeros(n, 3), x.view(n, -1), ...).


def symbolize_batch_sizes(gm, record) -> int:
    """Rewrite integer arguments of ``gm`` (a copy of ``record.graph``) that follow the batch into FX expressions
    of the first input's dim 0, by comparing the graph with the probes' graphs node by node; returns how many.

    Raises:
        ExportError: the graphs differ in structure, or an integer differs between batch sizes without being
            affine in the batch (naming the aten op).
    """
    import operator

    import torch

    probes = [p for p in record.probes if p.graph is not None]
    if not probes:
        return 0
    graphs = [gm.graph] + [p.graph.graph for p in probes]
    batches = [int(record.inputs[0].shape[0])] + [p.batch for p in probes]
    nodes = [list(g.nodes) for g in graphs]
    where = f"node '{record.name}' ({record.source})"
    if len({len(n) for n in nodes}) != 1:
        raise ExportError(f"{where}: dynamic_batch: the recorded torch graph has {len(nodes[0])} nodes at batch "
                          f"{batches[0]} but {', '.join(str(len(n)) for n in nodes[1:])} at batch "
                          f"{', '.join(map(str, batches[1:]))}; the node must run the same torch ops at every batch")
    placeholders = [n for n in nodes[0] if n.op == "placeholder"]
    if not placeholders:
        return 0
    replaced = 0
    batch_node = None
    cache: dict[tuple[int, int], object] = {}

    def expr(a: int, b: int, before):
        nonlocal batch_node
        if (a, b) in cache:
            return cache[a, b]
        with gm.graph.inserting_after(placeholders[-1]):
            if batch_node is None:
                batch_node = gm.graph.call_function(torch.ops.aten.sym_size.int, (placeholders[0], 0))
        with gm.graph.inserting_before(before):
            value = batch_node
            if a != 1:
                value = gm.graph.call_function(operator.mul, (value, a))
            if b:
                value = gm.graph.call_function(operator.add, (value, b))
        cache[a, b] = value
        return value

    def merge(values, what: str, node):
        nonlocal replaced
        first = values[0]
        if isinstance(first, (list, tuple)) and all(isinstance(v, (list, tuple)) and len(v) == len(first)
                                                    for v in values):
            out = [merge([v[i] for v in values], f"{what}[{i}]", node) for i in range(len(first))]
            return type(first)(out) if isinstance(first, tuple) else out
        if isinstance(first, int) and not isinstance(first, bool) and all(
                type(v) is type(first) for v in values):
            if all(v == first for v in values):
                return first
            fit = fit_affine(batches, values)
            if fit is None:
                shown = ", ".join(f"{v} at batch {b}" for v, b in zip(values, batches))
                raise ExportError(f"{where}: dynamic_batch: {node.target} ({what}) is {shown}: not affine in the "
                                  "batch, so the exported program cannot compute it")
            replaced += 1
            return expr(fit[0], fit[1], node)
        return first

    for group in zip(*nodes):
        node = group[0]
        if len({(n.op, str(n.target)) for n in group}) != 1:
            raise ExportError(f"{where}: dynamic_batch: the recorded torch graph differs between batch sizes "
                              f"({node.op} {node.target} at batch {batches[0]}, "
                              f"{[f'{n.op} {n.target}' for n in group[1:]]} at batch {batches[1:]})")
        if node.op != "call_function":
            continue
        args = [_args_of(n) for n in group]
        kwargs = [dict(n.kwargs) for n in group]
        new_args = merge(args, "args", node)
        new_kwargs = {k: merge([kw.get(k) for kw in kwargs], k, node) for k in kwargs[0]}
        node.args = tuple(new_args)
        node.kwargs = new_kwargs
    if replaced:
        gm.graph.lint()
        gm.recompile()
    return replaced


def _args_of(node) -> list:
    """A node's args with FX nodes replaced by their position marker (only ints are compared)."""
    import torch

    def walk(v):
        if isinstance(v, torch.fx.Node):
            return v
        if isinstance(v, (list, tuple)):
            out = [walk(x) for x in v]
            return type(v)(out) if isinstance(v, tuple) else out
        return v

    return list(walk(a) for a in node.args)
