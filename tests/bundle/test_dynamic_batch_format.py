"""Dynamic-batch manifest fields (docs/bundle-format.md, "Dynamic batch"): round trip, and hostile manifests
refused by the Python reader and, when leapp._native is built, by the C++ reader, each naming the field."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from leapp.bundle import BundleError, read_bundle, signature_json, write_bundle
from leapp.bundle.format import HEADER
from leapp.bundle.testing import dynamic_example_manifest_and_blobs, example_bundle, write_unchecked

try:
    from leapp import _native
except ImportError:  # pragma: no cover - the C++ reader is optional here
    _native = None


def native_error(data: bytes) -> str | None:
    if _native is None:
        return None
    try:
        _native.Bundle(data)
    except ValueError as e:
        return str(e)
    return "accepted"


def python_error(data: bytes) -> str | None:
    try:
        read_bundle(data)
    except BundleError as e:
        return str(e)
    return "accepted"


def test_round_trip_and_versions():
    manifest, blobs = dynamic_example_manifest_and_blobs(8, lo=1, hi=64)
    data = write_bundle(manifest, blobs)
    fields = HEADER.unpack_from(data, 0)
    assert fields[1:3] == (2, 2)  # format_version, min_reader_version: an old reader must not misread the rules
    back = read_bundle(data)
    assert back.manifest["batch"] == {"traced": 8, "min": 1, "max": 64}
    assert back.manifest["ops"][1]["patches"][1] == {"param": 0, "offset": 8, "width": 8, "rule": [1, 0]}
    assert native_error(data) in (None, "accepted")
    sig = signature_json(back)
    assert '"batch":{"max":64,"min":1,"traced":8}' in sig and '"batch_rule":[1,0]' in sig
    # a bundle without rules (or compressed binaries) keeps min_reader_version 1
    static = example_bundle(4)
    assert HEADER.unpack_from(static, 0)[2] == 1
    assert python_error(static) == "accepted" and native_error(static) in (None, "accepted")


def mutate(fn):
    manifest, blobs = dynamic_example_manifest_and_blobs(8, lo=1, hi=64)
    m = copy.deepcopy(manifest)
    fn(m)
    return write_unchecked(m, blobs)


def _set(path, value):
    def fn(m):
        obj = m
        for key in path[:-1]:
            obj = obj[key]
        obj[path[-1]] = value
    return fn


def _delete(path):
    def fn(m):
        obj = m
        for key in path[:-1]:
            obj = obj[key]
        del obj[path[-1]]
    return fn


HOSTILE = [
    ("rule-not-traced", _set(["buffers", 0, "bytes_rule"], [4, 4]), "buffers[0].bytes_rule"),
    ("rule-negative-at-min", _set(["buffers", 2, "bytes_rule"], [8, -32]), "buffers[2].bytes_rule"),
    ("rule-huge", _set(["buffers", 2, "bytes_rule"], [2**41, 0]), "buffers[2].bytes_rule[0]"),
    ("rule-not-array", _set(["buffers", 2, "bytes_rule"], 4), "buffers[2].bytes_rule"),
    ("rule-float", _set(["buffers", 2, "bytes_rule"], [4.0, 0]), "buffers[2].bytes_rule[0]"),
    ("rule-three", _set(["buffers", 2, "bytes_rule"], [4, 0, 0]), "buffers[2].bytes_rule"),
    ("no-batch", _delete(["batch"]), "bytes_rule"),
    ("min-above-max", _set(["batch", "min"], 65), "batch"),
    ("max-too-large", _set(["batch", "max"], 2**31), "batch.max"),
    ("traced-outside", _set(["batch", "traced"], 100), "batch"),
    ("patch-over-reloc", lambda m: m["ops"][1]["patches"].append({"param": 1, "offset": 4, "width": 4,
                                                                   "rule": [0, 0]}), "patches[5]"),
    ("patch-width", _set(["ops", 1, "patches", 0, "width"], 3), "patches[0].width"),
    ("patch-out-of-param", _set(["ops", 1, "patches", 0, "offset"], 22), "patches[0]"),
    ("patch-not-traced", _set(["ops", 1, "patches", 2, "rule"], [1, 1]), "patches[2].rule"),
    ("patch-overflow-u32", _set(["ops", 1, "patches", 2, "rule"], [2**33, 8 - 8 * 2**33]), "patches[2].rule"),
    ("patch-bad-param", _set(["ops", 1, "patches", 0, "param"], 9), "patches[0].param"),
    ("launch-keys-partial", _delete(["ops", 1, "patches"]), "ops[1]"),
    ("grid-stride-not-bool", _set(["ops", 1, "grid_stride"], 1), "ops[1].grid_stride"),
    ("grid-mismatch", _set(["ops", 1, "size_rule"], [1, 1000]), "ops[1]"),
    ("size-negative", _set(["ops", 1, "size_rule"], [9, -64]), "ops[1]"),
    ("memset-past-end", _set(["ops", 0, "bytes_rule"], [8, -32]), "ops[0]"),
    ("copy-past-end", _set(["ops", 2, "dst_offset_rule"], [1, -8]), "ops[2]"),
    ("signature-rule-mismatch", _set(["signature", "outputs", 0, "batch_rule"], [2, -8]), "signature.outputs[0]"),
    ("signature-no-rule", _delete(["signature", "inputs", 0, "batch_rule"]), "signature.inputs"),
    ("constant-rule", lambda m: (m["buffers"].append({"id": 3, "bytes": 4, "bytes_rule": [0, 4], "role": "constant",
                                                        "init": {"blob": 1}})), "buffers[3]"),
]


@pytest.mark.parametrize(("make", "field"), [(m, f) for _, m, f in HOSTILE], ids=[n for n, _, _ in HOSTILE])
def test_hostile_rules_are_refused_by_both_readers(make, field):
    data = mutate(make)
    py = python_error(data)
    assert py != "accepted" and field.split("[")[0].split(".")[0] in py, py
    cpp = native_error(data)
    if cpp is not None:
        assert cpp != "accepted", f"C++ accepted what Python refused: {py}"
        assert field.split("[")[0].split(".")[0] in cpp, cpp


def test_rules_in_a_file_an_old_reader_would_read_are_refused():
    """min_reader_version 1 with "batch": a version-1 reader would ignore the rules; both readers refuse it."""
    manifest, blobs = dynamic_example_manifest_and_blobs(8)
    data = write_unchecked(manifest, blobs, min_reader_version=1)
    py, cpp = python_error(data), native_error(data)
    assert "batch is used by a file whose min_reader_version is 1" in py, py
    assert cpp is None or ("batch" in cpp and "min_reader_version is 1" in cpp), cpp


@settings(max_examples=60, deadline=None)
@given(target=st.sampled_from(["buffer", "patch", "size", "memset", "copy", "reloc", "batch"]),
       a=st.integers(-2**41, 2**41), b=st.integers(-2**41, 2**41))
def test_readers_agree_on_any_rule(target, a, b):
    """Any rule value: both readers accept or both refuse (a reader must never crash or disagree)."""
    def fn(m):
        if target == "buffer":
            m["buffers"][2]["bytes_rule"] = [a, b]
        elif target == "patch":
            m["ops"][1]["patches"][3]["rule"] = [a, b]
        elif target == "size":
            m["ops"][1]["size_rule"] = [a, b]
        elif target == "memset":
            m["ops"][0]["offset_rule"] = [a, b]
        elif target == "copy":
            m["ops"][2]["src_offset_rule"] = [a, b]
        elif target == "reloc":
            m["ops"][1]["relocs"][2]["buffer_offset_rule"] = [a, b]
        else:
            m["batch"] = {"traced": 8, "min": max(1, min(a, 8)), "max": max(8, min(b, 2**32))}
    data = mutate(fn)
    py = python_error(data)
    cpp = native_error(data)
    if cpp is not None:
        assert (py == "accepted") == (cpp == "accepted"), (py, cpp)


# --- the op's signature string: its batch fields are checked like the rest, and must be the bundle's own ----------

def _signature_cases():
    import json

    manifest, blobs = dynamic_example_manifest_and_blobs(8, lo=1, hi=64)
    data = write_bundle(manifest, blobs)
    good = json.loads(signature_json(read_bundle(data)))

    def edit(fn):
        sig = copy.deepcopy(good)
        fn(sig)
        return json.dumps(sig)

    return data, json.dumps(good), edit


def _native_check(data: bytes, text: str) -> str:
    try:
        _native.Bundle(data).check_signature(text)
    except ValueError as e:
        return str(e)
    return "accepted"


MALFORMED = [  # parse_signature refuses each; the C++ reader must too
    ("rule-not-a-pair", lambda s: s["outputs"][0].update(batch_rule="float32")),
    ("rule-string-coefficient", lambda s: s["inputs"][0].update(batch_rule=[1, "1"])),
    ("rule-too-large", lambda s: s["inputs"][0].update(batch_rule=[2**53 + 1, 0])),
    ("batch-missing-min", lambda s: s.update(batch={"mmin": 1, "traced": 8, "max": 64})),
    ("batch-traced-past-max", lambda s: s.update(batch={"min": 1, "traced": 65, "max": 64})),
    ("batch-past-2^31", lambda s: s.update(batch={"min": 1, "traced": 8, "max": 2**32})),
    ("batch-without-input-rule", lambda s: [t.pop("batch_rule") for t in s["inputs"]]),
]


@pytest.mark.skipif(_native is None, reason="leapp._native is not built")
@pytest.mark.parametrize("fn", [f for _, f in MALFORMED], ids=[n for n, _ in MALFORMED])
def test_malformed_signature_batch_fields_are_refused_by_both(fn):
    from leapp.bundle import parse_signature

    data, _, edit = _signature_cases()
    text = edit(fn)
    with pytest.raises(BundleError, match="signature: "):
        parse_signature(text)
    assert _native_check(data, text).startswith("leapp signature"), _native_check(data, text)


MISMATCHED = [  # well-formed, but not this bundle's: torch's fake kernel would size the outputs otherwise
    ("other-range", lambda s: s["batch"].update(max=63), "declares dynamic batch 1..63 (traced 8), the bundle dynamic "
                                                          "batch 1..64"),
    ("no-batch", lambda s: s.pop("batch"), "declares a fixed batch, the bundle dynamic batch 1..64"),
    ("other-output-rule", lambda s: s["outputs"][0].update(batch_rule=[2, -8]),
     "outputs[0] 'y' has batch_rule [2, -8], the bundle's 'y' batch_rule [1, 0]"),
    ("rule-dropped", lambda s: s["outputs"][0].pop("batch_rule"), "outputs[0] 'y' has no batch_rule"),
]


@pytest.mark.skipif(_native is None, reason="leapp._native is not built")
@pytest.mark.parametrize(("fn", "message"), [(f, m) for _, f, m in MISMATCHED], ids=[n for n, _, _ in MISMATCHED])
def test_signature_with_other_batch_fields_than_the_bundle_is_refused(fn, message):
    data, good, edit = _signature_cases()
    assert _native_check(data, good) == "accepted"
    got = _native_check(data, edit(fn))
    assert message in got and "leapp segment 'example/warp_segment_0'" in got, got


@pytest.mark.skipif(_native is None, reason="leapp._native is not built")
def test_fixed_bundle_refuses_a_signature_that_declares_a_batch():
    import json

    data = example_bundle(4)
    sig = json.loads(signature_json(read_bundle(data)))
    sig["batch"] = {"min": 1, "traced": 4, "max": 8}
    sig["inputs"][0]["batch_rule"] = [1, 0]
    assert "declares dynamic batch 1..8 (traced 4), the bundle a fixed batch" in _native_check(data, json.dumps(sig))
