"""Hypothesis strategies for valid (manifest, blobs) pairs covering every role, init, op kind and binary kind."""

from __future__ import annotations

import copy
import math

from hypothesis import strategies as st

from leapp.bundle.format import DTYPE_ITEMSIZE

NAMES = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",), exclude_characters="\0"), min_size=1,
                max_size=8)


def texts(max_size: int):
    """Manifest strings: any text but NUL, which both readers refuse (a name ends at it in C)."""
    return st.text(alphabet=st.characters(exclude_categories=("Cs",), exclude_characters="\0"), max_size=max_size)
SMALL = st.integers(min_value=0, max_value=64)


@st.composite
def manifests(draw) -> tuple[dict, list[bytes]]:
    blobs: list[bytes] = []

    def add_blob(data: bytes) -> int:
        blobs.append(data)
        return len(blobs) - 1

    modules = []
    for m in range(draw(st.integers(0, 3))):
        pairs = draw(st.lists(st.tuples(st.sampled_from(["ptx", "cubin"]), st.sampled_from([75, 80, 86, 87, 89, 90, 100, 120])),
                              min_size=1, max_size=4, unique=True))
        binaries = []
        for kind, arch in pairs:
            if kind == "ptx":
                data = draw(st.text(max_size=40)).encode("utf-8", "surrogatepass").replace(b"\0", b"") + b"\0"
            else:
                data = draw(st.binary(max_size=40))
            binaries.append({"kind": kind, "arch": arch, "blob": add_blob(data)})
        modules.append({"name": draw(NAMES), "binaries": binaries})

    kernels = []
    if modules:
        for _ in range(draw(st.integers(0, 3))):
            kernel = {"module": draw(st.integers(0, len(modules) - 1)), "entry": draw(NAMES),
                      "block_dim": draw(st.sampled_from([1, 32, 64, 128, 256, 1024])),
                      "smem_bytes": draw(st.integers(0, 2**32 - 1))}
            if draw(st.booleans()):
                kernel["key"] = draw(texts(8))
            kernels.append(kernel)

    def tensors(count: int) -> list[dict]:
        names = draw(st.lists(NAMES, min_size=count, max_size=count, unique=True))
        out = []
        for name in names:
            dtype = draw(st.sampled_from(sorted(DTYPE_ITEMSIZE)))
            shape = draw(st.lists(st.integers(1, 5), max_size=3))
            entry = {"name": name, "dtype": dtype, "shape": shape}
            if draw(st.booleans()):
                entry["warp_dtype"] = draw(st.sampled_from(["float32", "vec3f", "quatf", "int32"]))
                entry["logical_shape"] = shape[:1]
            out.append(entry)
        return out

    inputs = tensors(draw(st.integers(0, 3)))
    outputs = tensors(draw(st.integers(0, 3)))
    nbytes = lambda t: math.prod(t["shape"]) * DTYPE_ITEMSIZE[t["dtype"]]  # noqa: E731

    specs: list[dict] = []  # buffers before their final position is known
    for j, t in enumerate(inputs):
        specs.append({"bytes": nbytes(t), "role": "input", "io": j, "init": "none"})
    for j, t in enumerate(outputs):
        same = [i for i, s in enumerate(inputs) if nbytes(s) == nbytes(t)]
        choices = ["none", "zero"] + [{"input": i} for i in same]
        specs.append({"bytes": nbytes(t), "role": "output", "io": j, "init": draw(st.sampled_from(choices))})
    for _ in range(draw(st.integers(0, 2))):
        specs.append({"bytes": draw(st.integers(1, 4096)), "role": "scratch", "init": draw(st.sampled_from(["none", "zero"]))})
    for _ in range(draw(st.integers(0, 2))):
        data = draw(st.binary(min_size=1, max_size=64))
        specs.append({"bytes": len(data), "role": "constant", "init": {"blob": add_blob(data)}})
    order = draw(st.permutations(range(len(specs))))
    buffers = []
    for position, spec_index in enumerate(order):
        buffers.append({"id": position, **specs[spec_index]})
    for position, buffer in enumerate(buffers):
        side = inputs if buffer["role"] == "input" else outputs if buffer["role"] == "output" else None
        if side is not None:
            side[buffer["io"]]["buffer"] = position

    writable = [i for i, b in enumerate(buffers) if b["role"] in ("output", "scratch")]
    ops = []
    for _ in range(draw(st.integers(0, 5))):
        kinds = (["launch"] if kernels else []) + (["memset", "copy"] if writable else [])
        if not kinds:
            break
        kind = draw(st.sampled_from(kinds))
        if kind == "launch":
            k = draw(st.integers(0, len(kernels) - 1))
            bd = kernels[k]["block_dim"]
            sizes = draw(st.lists(st.integers(1, 72), min_size=1, max_size=5))
            offsets, cursor = [], 0
            for size in sizes:
                offsets.append(cursor)
                cursor += size
            params = draw(st.binary(min_size=cursor, max_size=cursor + 16))
            relocs = []
            if buffers:
                for p in draw(st.lists(st.integers(0, len(sizes) - 1), max_size=4)):
                    if sizes[p] < 8:
                        continue
                    b = draw(st.integers(0, len(buffers) - 1))
                    relocs.append({"param": p, "offset": draw(st.integers(0, sizes[p] - 8)), "buffer": b,
                                   "buffer_offset": draw(st.integers(0, buffers[b]["bytes"]))})
            ops.append({"op": "launch", "kernel": k, "grid": [draw(st.integers(1, 2**31 - 1)), 1, 1],
                        "block": [bd, 1, 1], "smem": draw(SMALL),
                        "params": {"blob": add_blob(params), "offsets": offsets, "sizes": sizes}, "relocs": relocs})
        elif kind == "memset":
            b = draw(st.sampled_from(writable))
            size = buffers[b]["bytes"]
            offset = draw(st.integers(0, size - 1))
            ops.append({"op": "memset", "buffer": b, "offset": offset, "bytes": draw(st.integers(1, size - offset)),
                        "value": draw(st.integers(0, 255))})
        else:
            dst = draw(st.sampled_from(writable))
            src = draw(st.integers(0, len(buffers) - 1))
            count = draw(st.integers(1, min(buffers[dst]["bytes"], buffers[src]["bytes"])))
            dst_offset = draw(st.integers(0, buffers[dst]["bytes"] - count))
            src_offset = draw(st.integers(0, buffers[src]["bytes"] - count))
            if src == dst and abs(src_offset - dst_offset) < count:
                continue  # overlapping self-copies are invalid
            ops.append({"op": "copy", "dst": dst, "dst_offset": dst_offset, "src": src, "src_offset": src_offset,
                        "bytes": count})

    written = {op.get("buffer", op.get("dst")) for op in ops} | {r["buffer"] for op in ops for r in op.get("relocs", ())}
    for i, buffer in enumerate(buffers):  # every output is written or filled: both readers refuse one that is not
        if buffer["role"] == "output" and buffer["init"] == "none" and i not in written:
            ops.append({"op": "memset", "buffer": i, "offset": 0, "bytes": buffer["bytes"], "value": draw(st.integers(0, 255))})

    for _ in range(draw(st.integers(0, 2))):  # unreferenced blobs, possibly empty
        add_blob(draw(st.binary(max_size=24)))
    manifest = {
        "format": "leapp.warp.bundle",
        "segment": draw(texts(20)),
        "source": draw(texts(20)),
        "producer": draw(st.dictionaries(texts(8), texts(8), max_size=3)),
        "modules": modules,
        "kernels": kernels,
        "buffers": buffers,
        "ops": ops,
        "signature": {"inputs": inputs, "outputs": outputs},
    }
    if draw(st.booleans()):
        manifest["future_key"] = {"ignored": [1, 2.5, None]}  # unknown keys are ignored
    return manifest, blobs


def json_paths(value, prefix=()):
    """Every (path, value) of a JSON document, the root included."""
    yield prefix, value
    if isinstance(value, dict):
        for key, item in value.items():
            yield from json_paths(item, prefix + (key,))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from json_paths(item, prefix + (i,))


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 2**64) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=4),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=4), children, max_size=3),
    max_leaves=6,
)


def mutate_manifest(manifest: dict, path: tuple, data) -> object:
    """A deep copy of ``manifest`` with the value at ``path`` replaced or deleted (drawn from ``data``);
    the empty path replaces the whole manifest by an arbitrary JSON value."""
    if not path:
        return data.draw(JSON_VALUES)
    mutated = copy.deepcopy(manifest)
    parent = mutated
    for key in path[:-1]:
        parent = parent[key]
    if data.draw(st.booleans()):
        parent[path[-1]] = data.draw(JSON_VALUES | st.integers(0, 300))
    elif isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent.pop(path[-1])
    return mutated
