"""Large but valid manifests and signature strings parse in O(n log n) in both readers.

Each document here is near the value limit (2^20). A quadratic step (a
pairwise duplicate check: 200,000 keys took 198 s in the C++ reader) turns
these from well under a second into minutes; the bound asserted is generous
(10 s), so only such a regression fails it. Measured times belong in
benchmarks/, not here.
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
