"""Parse time of large valid manifests and signature strings in both readers (CPU only, no driver).

Each shape grows one part of a valid document toward the 2^20-value limit of
docs/bundle-format.md: one object with N keys (the duplicate-key check), a
module with N binaries (unique (kind, arch)), a signature string with N
outputs (unique names) and with N unknown keys. The C++ reader runs through
leapp._native (Bundle(...) and Bundle.check_signature), the Python reader
through leapp.bundle (read_bundle, parse_signature). Best of ``--repeat`` runs.

Before the O(n log n) duplicate-key check, the C++ reader took 198 s for the
200,000-key manifest (3.7 s at 25,000 keys, 15.5 s at 50,000: quadratic).

    python benchmarks/manifest_parse.py                 # Markdown table on stdout
    python benchmarks/manifest_parse.py --sizes 1000 200000 --repeat 1
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from collections.abc import Callable

from leapp import _native
from leapp.bundle import parse_signature, read_bundle, signature_json
from leapp.bundle.testing import example_bundle, example_manifest_and_blobs, write_unchecked

MANIFEST, BLOBS = example_manifest_and_blobs()
EXAMPLE = example_bundle()


def keys_manifest(n: int, run: int) -> bytes:
    manifest = copy.deepcopy(MANIFEST)
    manifest["segment"] = f"bench/{run}"  # new bytes each run: leapp._native caches bundles by content
    manifest["zz_extra"] = {f"key{i:06d}": i for i in range(n)}
    return write_unchecked(manifest, BLOBS)


def binaries_manifest(n: int, run: int) -> bytes:
    manifest = copy.deepcopy(MANIFEST)
    manifest["segment"] = f"bench/{run}"
    manifest["modules"][0]["binaries"] += [{"kind": "cubin", "arch": 100 + i, "blob": 1} for i in range(n)]
    return write_unchecked(manifest, BLOBS)


def signature_text(n: int, what: str) -> str:
    sig = json.loads(signature_json(read_bundle(EXAMPLE)))
    if what == "keys":
        sig.update({f"key{i:06d}": i for i in range(n)})
    else:
        sig["outputs"] = [{"name": f"y{i}", "dtype": "float32", "shape": [4]} for i in range(n)]
    return json.dumps(sig)


def best(fn: Callable[[object], object], inputs: list, repeat: int) -> float:
    """The fastest of ``fn(inputs[r])`` over the runs (not counting building the input)."""
    times = []
    for r in range(repeat):
        start = time.perf_counter()
        try:
            fn(inputs[r])
        except ValueError:  # e.g. a signature of N outputs does not describe the 1-output bundle: parsed all the same
            pass
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 50_000, 200_000])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    bundle = _native.Bundle(EXAMPLE)
    print("| document | N | bytes | C++ (s) | Python (s) |")
    print("|---|---:|---:|---:|---:|")
    for n in args.sizes:
        for name, make in (("manifest, one object of N keys", keys_manifest),
                           ("manifest, a module of N binaries", binaries_manifest)):
            files = [make(n, r) for r in range(args.repeat)]
            cpp = best(_native.Bundle, files, args.repeat)
            py = best(read_bundle, files, args.repeat)
            print(f"| {name} | {n} | {len(files[0])} | {cpp:.3f} | {py:.3f} |")
        for name, what in (("signature, N unknown keys", "keys"), ("signature, N outputs", "outputs")):
            texts = [signature_text(n, what)] * args.repeat  # signatures are not cached
            cpp = best(bundle.check_signature, texts, args.repeat)
            py = best(parse_signature, texts, args.repeat)
            print(f"| {name} | {n} | {len(texts[0])} | {cpp:.3f} | {py:.3f} |")


if __name__ == "__main__":
    main()
