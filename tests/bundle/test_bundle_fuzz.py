"""Mutation fuzzing of the C++ reader (leapp._native) against the Python reader: bundles and signature strings.

Each case is a seeded mutation (tests/bundle/bundle_mutations.py) of a valid
bundle's manifest text or of its signature string. For every case: the C++
reader raises nothing but a ValueError whose text names the reader, the
Python reader nothing but a BundleError, both accept or both refuse, and what
both accept reads the same. CI runs a few thousand cases (seconds); a long run:

    LEAPP_FUZZ_CASES=100000 .venv/bin/python -m pytest -q -p no:cacheprovider tests/bundle/test_bundle_fuzz.py

under ASan/UBSan as docs/building.md shows. LEAPP_FUZZ_SEED picks another
sequence; a failure names the seed and case, and fuzz_case(seed, case)
rebuilds that input.
"""

from __future__ import annotations

import os
import random

import pytest
from bundle_mutations import mutate_bundle, mutate_text

from leapp.bundle import BundleError, parse_signature, read_bundle, signature_json
from leapp.bundle.testing import dynamic_example_manifest_and_blobs, example_manifest_and_blobs, write_unchecked
from leapp.bundle.format import min_reader_version_of
from leapp.bundle.writer import compress_binaries, encode_manifest

native = pytest.importorskip("leapp._native", reason="leapp._native is not built")

CASES = int(os.environ.get("LEAPP_FUZZ_CASES", "3000"))
SEED = int(os.environ.get("LEAPP_FUZZ_SEED", "1"))
SIGNATURE_SHARE = 4  # one case in 4 mutates a signature string


def _corpus() -> list[tuple[bytes, list[bytes], int]]:
    """(manifest text, blobs, the min_reader_version the manifest needs) of each valid starting point."""
    plain = example_manifest_and_blobs()
    cubins = example_manifest_and_blobs(1, block_dim=32, segment="obs/warp_segment_1",
                                        cubins={90: b"\x7fELF sm_90", 86: b"\x7fELF sm_86"})
    varied, blobs = example_manifest_and_blobs(7, segment="caf\u00e9/\U0001f600")
    varied["buffers"][1]["init"] = {"input": 0}
    del varied["kernels"][0]["key"]
    varied["future_key"] = {"ignored": [1, 2.5, None, "x"]}
    # format 2: binaries as LZ4 blocks, and a dynamic-batch segment's rules (compressed like an export's)
    compressed = compress_binaries(*example_manifest_and_blobs())
    dynamic = compress_binaries(*dynamic_example_manifest_and_blobs(8, lo=1, hi=64))
    return [(encode_manifest(m), b, min_reader_version_of(m))
            for m, b in (plain, cubins, (varied, blobs), compressed, dynamic)]


CORPUS = _corpus()
BUNDLES = [write_unchecked(manifest, blobs, version) for manifest, blobs, version in CORPUS]


def fuzz_case(seed: int, case: int) -> tuple[str, bytes | str, bytes]:
    """Case ``case`` of sequence ``seed``: ("bundle", file, file) or ("signature", text, the bundle it is checked against)."""
    rng = random.Random(f"{seed}/{case}")
    which = rng.randrange(len(CORPUS))
    if rng.randrange(SIGNATURE_SHARE) == 0:
        text = signature_json(read_bundle(BUNDLES[which])).encode()
        return "signature", mutate_text(rng, text).decode("utf-8", errors="replace"), BUNDLES[which]
    data = mutate_bundle(rng, *CORPUS[which])
    return "bundle", data, data


def bundle_problem(data: bytes) -> str | None:
    """None when both readers behave; otherwise what went wrong."""
    try:
        ref = read_bundle(data)
    except BundleError as e:
        ref, py = None, str(e)
    try:
        mine = native.Bundle(data)
    except ValueError as e:
        mine, cpp = None, str(e)
        if not cpp.startswith("leapp bundle"):
            return f"C++ message does not name the reader: {cpp!r}"
    if (ref is None) != (mine is None):
        return f"readers disagree: python {'accepts' if ref else repr(py)}, C++ {'accepts' if mine else repr(cpp)}"
    if ref is None:
        return None
    tensors = lambda ts: [(t["name"], t["dtype"], list(t["shape"]), t["buffer"]) for t in ts]  # noqa: E731
    same = (mine.digest == ref.digest and mine.segment == ref.segment and mine.source == ref.source
            and mine.producer == ref.producer and mine.blob_count == len(ref.blobs)
            and tensors(mine.inputs) == tensors(ref.inputs) and tensors(mine.outputs) == tensors(ref.outputs))
    return None if same else "both accept, but the C++ reader reads different fields"


def signature_problem(text: str, data: bytes) -> str | None:
    """The C++ check_signature accepts ``text`` exactly when parse_signature does and it describes the bundle
    (for a dynamic batch: the same range and the same batch_rule on every tensor)."""
    ref = read_bundle(data)
    try:
        sig = parse_signature(text)
        side = lambda ts: [(t["dtype"], list(t["shape"]), t.get("batch_rule")) for t in ts]  # noqa: E731
        batch = lambda b: b and {k: b[k] for k in ("min", "max", "traced")}  # noqa: E731
        expected = (sig["digest"] == ref.digest and side(sig["inputs"]) == side(ref.inputs)
                    and side(sig["outputs"]) == side(ref.outputs)
                    and batch(sig.get("batch")) == batch(ref.manifest.get("batch")))
        py = None if expected else "does not describe the bundle"
    except BundleError as e:
        py = str(e)
    try:
        native.Bundle(data).check_signature(text)
        cpp = None
    except ValueError as e:
        cpp = str(e)
        if not cpp.startswith(("leapp signature", "leapp segment")):
            return f"C++ message does not name the signature: {cpp!r}"
    if (py is None) != (cpp is None):
        return f"readers disagree: python {py!r}, C++ {cpp!r}"
    return None


def test_mutated_bundles_and_signatures():
    failures = []
    for case in range(CASES):
        kind, subject, data = fuzz_case(SEED, case)
        try:
            problem = bundle_problem(subject) if kind == "bundle" else signature_problem(subject, data)
        except Exception as e:  # noqa: BLE001 - any other exception is a finding
            problem = f"raised {type(e).__name__}: {e}"
        if problem:
            failures.append(f"fuzz_case({SEED}, {case}) [{kind}]: {problem}")
            if len(failures) == 10:
                break
    assert not failures, "\n".join(failures)
