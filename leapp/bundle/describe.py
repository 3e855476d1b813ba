"""leapp/bundle/describe.py: a bundle in words, for ``leapp inspect`` and error reports."""

from __future__ import annotations

from collections import Counter

from leapp.bundle.reader import Bundle

__all__ = ["describe_bundle", "format_bytes"]


def format_bytes(n: int) -> str:
    """'812 B', '4.2 KiB', '3.1 MiB': sizes a person reads at a glance."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _rule(rule) -> str:
    """'12*batch', '3*batch+4', '16' (a constant rule)."""
    a, b = rule
    if a == 0:
        return str(b)
    head = "batch" if a == 1 else f"{a}*batch"
    return head if b == 0 else f"{head}{'+' if b > 0 else '-'}{abs(b)}"


def _tensor(t: dict) -> str:
    shape = list(t["shape"])
    if "batch_rule" in t:
        shape = "[" + ", ".join([_rule(t["batch_rule"])] + [str(d) for d in shape[1:]]) + "]"
    text = f"{t['name']}: {t['dtype']}{shape}"
    if "warp_dtype" in t:
        logical = t.get("logical_shape")
        text += f" (warp {t['warp_dtype']}{'' if logical is None else list(logical)})"
    return text


def _init(init) -> str:
    if isinstance(init, dict):
        key = "blob" if "blob" in init else "input"
        return f"init {key} {init[key]}"
    return f"init {init}"


def _binary(bundle: Bundle, b: dict, name: str | None = None) -> str:
    """"cubin sm_90 (8.2 KiB lz4-block of 20.4 KiB)"; ``name`` instead of kind and arch (CPU code)."""
    stored = len(bundle.blobs[b["blob"]])
    name = name or f"{b['kind']} sm_{b['arch']}"
    if "encoding" not in b:
        return f"{name} ({format_bytes(stored)})"
    return f"{name} ({format_bytes(stored)} {b['encoding']} of {format_bytes(b['decoded_bytes'])})"


def describe_bundle(bundle: Bundle, size: int | None = None) -> list[str]:
    """Lines (no trailing newline) describing segment, producer, binaries, kernels, buffers, ops and I/O."""
    lines = [f"segment {bundle.segment}" + (f" (source {bundle.source})" if bundle.source else "")]
    size_text = f", {format_bytes(size)}" if size is not None else ""
    readers = f", readers v{bundle.min_reader_version}+" if bundle.min_reader_version > 1 else ""
    lines.append(f"  digest {bundle.digest} (format v{bundle.format_version}{readers}{size_text}, {len(bundle.blobs)} blobs)")
    if bundle.producer:
        lines.append("  producer: " + ", ".join(f"{k} {v}" for k, v in bundle.producer.items()))
    lines.append(f"  modules: {len(bundle.modules)}")
    for i, module in enumerate(bundle.modules):
        binaries = ", ".join(_binary(bundle, b) for b in module["binaries"])
        lines.append(f"    [{i}] {module['name']}: {binaries}")
        stored = sum(len(bundle.blobs[b["blob"]]) for b in module["binaries"])
        decoded = sum(b["decoded_bytes"] if "encoding" in b else len(bundle.blobs[b["blob"]]) for b in module["binaries"])
        if stored != decoded:
            lines.append(f"        binaries: {format_bytes(stored)} stored, {format_bytes(decoded)} decoded "
                         f"({stored / decoded:.0%})")
    codes = bundle.manifest.get("cpu_code", [])
    if codes:
        lines.append("  CPU code: " + ", ".join(_binary(bundle, c, f"{c['machine']} shared object") for c in codes))
    lines.append(f"  kernels: {len(bundle.kernels)}")
    for k, kernel in enumerate(bundle.kernels):
        key = f" ({kernel['key']})" if kernel.get("key") else ""
        cpu = f", CPU entry {kernel['cpu_entry']}" if "cpu_entry" in kernel else ""
        lines.append(
            f"    [{k}] {kernel['entry']}{key}: module {kernel['module']}, block_dim {kernel['block_dim']}, "
            f"smem {kernel['smem_bytes']} B{cpu}"
        )
    roles = Counter(b["role"] for b in bundle.buffers)
    total = sum(b["bytes"] for b in bundle.buffers)
    summary = ", ".join(f"{roles[r]} {r}" for r in ("input", "output", "scratch", "constant") if roles[r])
    lines.append(f"  buffers: {len(bundle.buffers)} ({summary}{', ' if summary else ''}{format_bytes(total)} in all)")
    names = {}
    for entries in (bundle.inputs, bundle.outputs):
        for t in entries:
            names[t["buffer"]] = t["name"]
    for buffer in bundle.buffers:
        name = f" '{names[buffer['id']]}'" if buffer["id"] in names else ""
        rule = f" ({_rule(buffer['bytes_rule'])} B)" if "bytes_rule" in buffer else ""
        lines.append(f"    [{buffer['id']}] {buffer['role']}{name}: {buffer['bytes']} B{rule}, {_init(buffer['init'])}")
    kinds = Counter(op["op"] for op in bundle.ops)
    per_kind = ", ".join(f"{kinds[k]} {k}" for k in ("launch", "memset", "copy") if kinds[k])
    lines.append(f"  ops: {len(bundle.ops)}" + (f" ({per_kind})" if per_kind else ""))
    batch = bundle.manifest.get("batch")
    if batch is not None:
        lines.append(f"  dynamic batch: {batch['min']}..{batch['max']} (traced at {batch['traced']}); rules:")
        for i, op in enumerate(bundle.ops):
            lines.extend(f"    ops[{i}] {text}" for text in _op_rules(op, bundle.kernels))
    lines.append("  inputs: " + ("; ".join(_tensor(t) for t in bundle.inputs) or "none"))
    lines.append("  outputs: " + ("; ".join(_tensor(t) for t in bundle.outputs) or "none"))
    return lines


def _op_rules(op: dict, kernels: list[dict]) -> list[str]:
    """One line per rule of an op (docs/bundle-format.md, "Dynamic batch")."""
    out = []
    if op["op"] == "launch":
        name = kernels[op["kernel"]].get("key") or kernels[op["kernel"]]["entry"]
        if "size_rule" in op:
            kind = "grid-stride" if op["grid_stride"] else "lean"
            cap = f", max_blocks {op['max_blocks']}" if op["max_blocks"] else ""
            out.append(f"launch '{name}': size {_rule(op['size_rule'])} ({kind} grid{cap})")
            for p in op["patches"]:
                where = "launch bounds" if p["param"] == 0 else f"param {p['param']}"
                out.append(f"  {where} byte {p['offset']} ({p['width']} B) = {_rule(p['rule'])}")
        for r, reloc in enumerate(op["relocs"]):
            if "buffer_offset_rule" in reloc:
                out.append(f"  relocs[{r}] buffer {reloc['buffer']} + {_rule(reloc['buffer_offset_rule'])}")
    else:
        keys = [k for k in ("offset_rule", "src_offset_rule", "dst_offset_rule", "bytes_rule") if k in op]
        if keys:
            out.append(f"{op['op']}: " + ", ".join(f"{k.removesuffix('_rule')} {_rule(op[k])}" for k in keys))
    return out
