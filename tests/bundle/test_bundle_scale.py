"""Large but valid manifests and signature strings parse in O(n log n) in both readers.

Each document here is near the value limit (2^20). A quadratic step (a
pairwise duplicate check: 200,000 keys took 198 s in the C++ reader) turns
these from well under a second into minutes; the bound asserted is generous
(10 s), so only such a regression fails it. Measured times belong in
benchmarks/, not here. (The Python reader's side of these sizes is covered by
its dict/set checks; tests/bundle/test_bundle_cross_reader.py checks that both
readers agree near the value limit.)
"""

from __future__ import annotations

import copy
import json
import time

import pytest

from leapp.bundle import parse_signature, read_bundle, signature_json
from leapp.bundle.testing import example_bundle, example_manifest_and_blobs, write_unchecked
from leapp.bundle.writer import encode_manifest

native = pytest.importorskip("leapp._native", reason="leapp._native is not built")

EXAMPLE = example_bundle()
MANIFEST, BLOBS = example_manifest_and_blobs()
BOUND_S = 10.0


def timed(fn, *args):
    start = time.perf_counter()
    result = fn(*args)
    return result, time.perf_counter() - start


def test_200k_keys_in_one_manifest_object():
    manifest = copy.deepcopy(MANIFEST)
    manifest["zz_extra"] = {f"key{i:06d}": i for i in range(200_000)}
    data = write_unchecked(manifest, BLOBS)
    assert len(data) > 2_000_000
    bundle, seconds = timed(native.Bundle, data)
    assert seconds < BOUND_S, f"the C++ reader took {seconds:.1f} s for 200,000 keys"
    assert bundle.segment == read_bundle(data).segment


def test_200k_keys_with_a_duplicate_at_the_end():
    keys = b",".join(b'"key%06d":0' % i for i in range(200_000))
    raw = encode_manifest(MANIFEST)[:-1] + b',"zz_extra":{' + keys + b',"key000007":1}}'
    with pytest.raises(ValueError, match=r'duplicate key "key000007" at byte \d+ in zz_extra$') as info:
        timed(native.Bundle, write_unchecked(raw, BLOBS))
    assert int(str(info.value).split("at byte ")[1].split()[0]) == raw.rindex(b'"key000007"')


def test_200k_keys_in_a_signature_string():
    sig = json.loads(signature_json(read_bundle(EXAMPLE)))
    sig.update({f"key{i:06d}": i for i in range(200_000)})
    text = json.dumps(sig)
    parse_signature(text)
    _, seconds = timed(native.Bundle(EXAMPLE).check_signature, text)
    assert seconds < BOUND_S, f"the C++ signature parser took {seconds:.1f} s for 200,000 keys"


def test_200k_tensors_in_a_signature_string():
    """Unique names per side: one lookup per entry, not a scan of the earlier ones."""
    sig = json.loads(signature_json(read_bundle(EXAMPLE)))
    sig["outputs"] = [{"name": f"y{i}", "dtype": "float32", "shape": [4]} for i in range(200_000)]
    text = json.dumps(sig)
    with pytest.raises(ValueError, match="the signature lists 200000 outputs, the bundle 1"):
        start = time.perf_counter()
        try:
            native.Bundle(EXAMPLE).check_signature(text)
        finally:
            seconds = time.perf_counter() - start
    assert seconds < BOUND_S, f"the C++ signature parser took {seconds:.1f} s for 200,000 outputs"


def test_200k_binaries_in_one_module():
    """(kind, arch) unique per module: one lookup per binary."""
    manifest = copy.deepcopy(MANIFEST)
    manifest["modules"][0]["binaries"] += [{"kind": "cubin", "arch": 100 + i, "blob": 1} for i in range(200_000)]
    data = write_unchecked(manifest, BLOBS)
    _, seconds = timed(native.Bundle, data)
    assert seconds < BOUND_S, f"the C++ reader took {seconds:.1f} s for 200,000 binaries"


def test_75k_signature_inputs_of_a_manifest():
    """Unique input names of the manifest's signature: one lookup per entry."""
    manifest = copy.deepcopy(MANIFEST)
    count = 75_000
    first = len(manifest["buffers"])
    manifest["buffers"] += [{"id": first + j, "bytes": 4, "role": "input", "io": j + 1, "init": "none"}
                            for j in range(count)]
    manifest["signature"]["inputs"] += [{"name": f"x{j}", "buffer": first + j, "dtype": "float32", "shape": [1]}
                                        for j in range(count)]
    data = write_unchecked(manifest, BLOBS)
    bundle, seconds = timed(native.Bundle, data)
    assert seconds < BOUND_S, f"the C++ reader took {seconds:.1f} s for {count} signature inputs"
    assert len(bundle.inputs) == count + 1
