"""Property tests: writer -> reader round trips, and every mutation is either read or rejected with BundleError."""

from __future__ import annotations

import json
import os

from bundle_strategies import json_paths, manifests, mutate_manifest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from leapp.bundle import BundleError, parse_signature, read_bundle, signature_json, write_bundle
from leapp.bundle.testing import example_bundle, reseal, reseal_blob, write_unchecked

EXAMPLE = example_bundle()
SCALE = int(os.environ.get("LEAPP_BUNDLE_EXAMPLES_SCALE", "1"))  # e.g. 20 for a long local fuzzing run


@settings(max_examples=150 * SCALE, suppress_health_check=[HealthCheck.too_slow])
@given(manifests())
def test_round_trip(case):
    manifest, blobs = case
    data = write_bundle(manifest, blobs)
    bundle = read_bundle(data)
    assert bundle.manifest == json.loads(json.dumps(manifest))
    assert bundle.blobs == blobs
    assert bundle.digest == data[-32:].hex()
    assert read_bundle(memoryview(bytearray(data))).digest == bundle.digest
    sig = parse_signature(signature_json(bundle))
    assert sig["digest"] == bundle.digest and sig["segment"] == manifest["segment"]
    assert [t["name"] for t in sig["outputs"]] == [t["name"] for t in manifest["signature"]["outputs"]]
    assert write_bundle(bundle.manifest, bundle.blobs) == data  # canonical: reading and writing again is stable


def _read_or_reject(data: bytes) -> None:
    """The only allowed outcomes on any input: a Bundle, or a BundleError."""
    try:
        read_bundle(data)
    except BundleError:
        pass


@settings(max_examples=300 * SCALE)
@given(st.data())
def test_flipped_bytes_are_rejected(data):
    position = data.draw(st.integers(0, len(EXAMPLE) - 1))
    mask = data.draw(st.integers(1, 255))
    flipped = bytearray(EXAMPLE)
    flipped[position] ^= mask
    try:
        read_bundle(bytes(flipped))
    except BundleError as e:
        assert "sha256 mismatch" in str(e) or "bad magic" in str(e) or "version" in str(e) or "file_size" in str(e)
    else:
        raise AssertionError(f"flipping byte {position} went unnoticed")
    _read_or_reject(reseal(flipped))  # deeper checks: header, ranges, blob hashes, manifest
    for index in range(3):
        try:
            _read_or_reject(reseal_blob(flipped, index))  # past the blob hashes: the manifest rules
        except Exception as e:  # reseal_blob itself may fail on a corrupt table; that is a test helper, not the reader
            if isinstance(e, BundleError):
                raise
            continue


@settings(max_examples=300 * SCALE, suppress_health_check=[HealthCheck.too_slow])
@given(manifests(), st.data())
def test_manifest_mutations_agree_between_writer_and_reader(case, data):
    """Replace or delete one field anywhere: reader and writer accept or reject it alike, with the same text."""
    manifest, blobs = case
    manifest = json.loads(json.dumps(manifest))
    paths = list(json_paths(manifest))
    path, _ = data.draw(st.sampled_from(paths))
    mutated = mutate_manifest(manifest, path, data)
    try:
        read_bundle(write_unchecked(mutated, blobs))
        reader_error = None
    except BundleError as e:
        reader_error = str(e)
    try:
        write_bundle(mutated, blobs)
        writer_error = None
    except BundleError as e:
        writer_error = str(e)
    assert reader_error == writer_error
