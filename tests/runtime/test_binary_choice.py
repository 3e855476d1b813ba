"""The runtime's binary choice as Python sees it: leapp._native's Bundle.binary_choice / binary_choice_for (the
loader's own code), leapp.runtime.binary_choice's report lines, and the optional manifest field
``binaries[b].ptx_isa`` in both readers (docs/bundle-format.md sections 2 and 3). No GPU needed."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from leapp import _native
from leapp.bundle import BundleError, read_bundle, write_bundle
from leapp.bundle.format import ptx_isa_of
from leapp.bundle.testing import EXAMPLE_PTX, example_bundle, example_manifest_and_blobs
from leapp.runtime.binary_choice import NAMED_GPUS, describe_binary_choice, describe_machine_binaries

PTX_90 = EXAMPLE_PTX.replace(".version 7.5", ".version 9.0").encode() + b"\0"
PTX_94 = EXAMPLE_PTX.replace(".version 7.5", ".version 9.4").encode() + b"\0"


def bundle_with(binaries: list[tuple[str, int, bytes, str | None]], toolkit: str = "13.4") -> bytes:
    """The example bundle with its module's binaries replaced: (kind, arch, bytes, ptx_isa field or None)."""
    manifest, blobs = example_manifest_and_blobs(8)
    manifest["producer"]["cuda_toolkit"] = toolkit
    entries = []
    for kind, arch, data, isa in binaries:
        entry = {"kind": kind, "arch": arch, "blob": len(blobs)}
        if isa is not None:
            entry["ptx_isa"] = isa
        entries.append(entry)
        blobs.append(data)
    manifest["modules"][0]["binaries"] = entries
    return write_bundle(manifest, blobs)


def no_driver() -> bool:
    return not _native.driver_status()["available"]


# --- the native choice ----------------------------------------------------------------------------------------


def test_choice_reports_load_order_reasons_and_exclusions():
    b = _native.Bundle(bundle_with([("ptx", 75, PTX_94, "9.4"), ("cubin", 80, b"x", None), ("cubin", 86, b"x", None),
                                    ("cubin", 90, b"x", None)]))
    c = b.binary_choice(0, 8, 7, 13000, "Jetson Orin")
    assert [(o["kind"], o["arch"], o["expected"]) for o in c["candidates"]] == [
        ("cubin", 86, True), ("cubin", 80, True), ("ptx", 75, False)]
    assert c["chosen"] == 0 and c["summary"] == "cubin sm_86: SASS for 8.6 runs on 8.7 (same major, lower minor)"
    assert "the CUDA 13.0 driver reads PTX up to ISA 9.0 (ISA 9.4 needs CUDA 13.4 or later)" in c["candidates"][2]["reason"]
    assert [(o["kind"], o["arch"]) for o in c["excluded"]] == [("cubin", 90)]
    assert "runs only on compute capability 9.x with minor >= 0" in c["excluded"][0]["reason"]
    assert c["holdings"] == "ptx sm_75 (PTX ISA 9.4), cubin sm_80, cubin sm_86, cubin sm_90"
    # the arch-only order (binary_candidates) is the same list before the driver is considered
    assert b.binary_candidates(0, 8, 7) == [("cubin", 86), ("cubin", 80), ("ptx", 75)]


def test_no_binary_fits_names_gpu_driver_holdings_and_both_isas():
    b = _native.Bundle(bundle_with([("ptx", 75, PTX_94, None), ("cubin", 86, b"x", None)]))
    c = b.binary_choice(0, 9, 0, 13000, "NVIDIA H200")
    assert c["chosen"] == -1
    assert [(o["kind"], o["expected"]) for o in c["candidates"]] == [("ptx", False)]  # still tried, last
    text = c["summary"]
    for part in ("no binary fits NVIDIA H200 (compute capability 9.0) with the CUDA 13.0 driver",
                 "the bundle holds ptx sm_75 (PTX ISA 9.4), cubin sm_86",
                 "Its PTX is ISA 9.4, this driver reads PTX up to ISA 9.0",
                 "Update the driver to CUDA 13.4 or later", "re-export with a cubin for sm_90"):
        assert part in text, (part, text)
    none = b.binary_choice(0, 7, 0, 13000, "V100")
    assert none["candidates"] == [] and "compute capability 7.5 and later" in none["summary"]


def test_unknown_driver_predicts_nothing_and_module_range_is_checked():
    b = _native.Bundle(bundle_with([("ptx", 75, PTX_94, "9.4")]))
    c = b.binary_choice(0, 9, 0)
    assert c["chosen"] == 0 and c["candidates"][0]["expected"] and "reads" not in c["summary"]
    with pytest.raises(ValueError, match=r"module 1 out of range \(1 modules\)"):
        b.binary_choice(1, 9, 0)


def test_isa_of_each_ptx_comes_from_its_text():
    """Old bundles (no ptx_isa field, producer.ptx_isa for all) still get the per-binary ISA from the text."""
    manifest, blobs = example_manifest_and_blobs(8)
    blobs[0] = PTX_90
    manifest["producer"]["ptx_isa"] = "9.4"  # a stale producer value does not decide
    c = _native.Bundle(write_bundle(manifest, blobs)).binary_choice(0, 9, 0, 13000)
    assert c["candidates"][0]["ptx_isa"] == "9.0" and c["candidates"][0]["expected"]


@pytest.mark.parametrize(("version", "isa"), [
    (0, (0, 0)), (11080, (7, 8)), (12000, (8, 0)), (12060, (8, 5)), (12080, (8, 7)), (12090, (8, 8)),
    (13000, (9, 0)), (13010, (9, 1)), (13040, (9, 4)), (13090, (9, 9)), (14000, (99, 99)),
])
def test_driver_ptx_isa_table(version, isa):
    assert _native.driver_ptx_isa(version) == isa


@pytest.mark.parametrize(("isa", "driver"), [((8, 8), 12090), ((9, 0), 13000), ((9, 4), 13040), ((8, 6), 12080),
                                             ((7, 5), 11050), ((10, 0), 0)])
def test_ptx_isa_min_driver(isa, driver):
    assert _native.ptx_isa_min_driver(*isa) == driver


# --- the report ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["bytes", "path", "bundle", "native"])
def test_describe_accepts_every_form(form, tmp_path):
    data = bundle_with([("ptx", 75, PTX_94, "9.4"), ("cubin", 80, b"x", None), ("cubin", 110, b"x", None)])
    path = tmp_path / "seg.bundle"
    path.write_bytes(data)
    given = {"bytes": data, "path": path, "bundle": read_bundle(data), "native": _native.Bundle(data)}[form]
    lines = describe_binary_choice(given, (11, 0), 13000)
    assert lines == ["binary choice (docs/portability.md):", "  with a CUDA 13.0 (13000) driver:",
                     "  compute capability 11.0: loads cubin sm_110: exact match for compute capability 11.0",
                     "    then tries ptx sm_75 (expected to fail)"]


def test_describe_no_fit_and_named_gpus_without_a_driver():
    data = bundle_with([("ptx", 75, PTX_94, "9.4"), ("cubin", 90, b"x", None)])
    lines = describe_binary_choice(data, (11, 0), 13000)
    assert lines[-1].startswith("  compute capability 11.0: no binary fits a GPU (compute capability 11.0) with "
                                "the CUDA 13.0 driver")
    if not no_driver():
        pytest.skip("a driver is present: the report shows this machine's GPUs")
    lines = describe_binary_choice(data)
    assert "this machine: no CUDA GPU here" in lines[1]
    robots = lines.index("  on robots (whatever this machine is):")
    firsts = [line for line in lines[2:robots] if not line.startswith("    ")]
    assert [line.split(" (")[0].strip() for line in firsts] == [name for name, _ in NAMED_GPUS]
    assert "  H200 (9.0): loads cubin sm_90: exact match for compute capability 9.0" in firsts
    assert firsts[-1].startswith("  GB10 / DGX Spark (12.1): no binary fits GB10 / DGX Spark")
    # its PTX is ISA 9.4 and its cubin is for 9.0: a JetPack 6 Orin loads nothing, and the report says so
    assert lines[robots + 1].startswith("    Jetson Orin, JetPack 6.0 (8.7, CUDA 12.2 (12020) driver): no binary "
                                        "fits Jetson Orin, JetPack 6.0 (compute capability 8.7) with the CUDA 12.2 "
                                        "driver"), lines


def test_describe_judges_the_robots_of_a_default_export():
    """`leapp inspect` of a bundle holding what a default export holds: Orin on JetPack 6.0 and 6.1/6.2 JIT its
    ISA 8.0 PTX; Thor on JetPack 7 loads its sm_110 cubin."""
    from leapp.runtime.binary_choice import ROBOT_TARGETS

    data = bundle_with([("ptx", 75, PTX_94.replace(b".version 9.4", b".version 8.0"), "8.0"),
                        ("cubin", 110, b"x", None)])
    lines = describe_binary_choice(data)
    robots = lines.index("  on robots (whatever this machine is):")
    firsts = [line for line in lines[robots + 1:] if not line.startswith("    then")]
    assert [line.split(" (")[0].strip() for line in firsts] == [name for name, _, _ in ROBOT_TARGETS]
    assert firsts[0].endswith("loads ptx sm_75: driver JIT of compute_75 PTX (ISA 8.0) for 8.7; the CUDA 12.2 "
                              "driver reads PTX up to ISA 8.2"), firsts
    assert "CUDA 12.6 (12060) driver): loads ptx sm_75:" in firsts[1]
    assert "loads cubin sm_110: exact match for compute capability 11.0" in firsts[2]


def test_describe_a_bundle_without_modules():
    manifest, blobs = example_manifest_and_blobs(8)
    manifest["modules"], manifest["kernels"] = [], []
    manifest["ops"] = [op for op in manifest["ops"] if op["op"] != "launch"]
    assert describe_binary_choice(write_bundle(manifest, blobs))[-1] == "  no Warp modules: nothing to load"


def test_machine_report_without_a_driver():
    if not no_driver():
        pytest.skip("a driver is present")
    line, *robots = describe_machine_binaries()
    assert line.startswith("binaries: no CUDA driver here; a default export (cubins sm_75")
    assert "needs a CUDA 13.0 driver for its cubins and CUDA 12.0 or later for its PTX" in line
    assert robots[0] == "  on robots (whatever this machine is):"
    assert robots[1].startswith("    Jetson Orin, JetPack 6.0 (8.7, CUDA 12.2 (12020) driver): loads ptx sm_75: ")


def test_example_bundle_choice_still_loads_ptx():
    assert _native.Bundle(example_bundle(4)).binary_choice(0, 9, 0, 13000)["summary"].startswith("ptx sm_75")


# --- binaries[b].ptx_isa in both readers ----------------------------------------------------------------------


def test_ptx_isa_field_round_trips():
    data = bundle_with([("ptx", 75, PTX_90, "9.0")])
    assert read_bundle(data).modules[0]["binaries"][0]["ptx_isa"] == "9.0"
    assert _native.Bundle(data).binary_choice(0, 9, 0)["candidates"][0]["ptx_isa"] == "9.0"


@pytest.mark.parametrize(("binaries", "python", "native"), [
    ([("ptx", 75, PTX_90, "9.4")], r"binaries\[0\]\.ptx_isa '9\.4' differs from the PTX text's \.version 9\.0",
     r"binaries\[0\]\.ptx_isa \"9\.4\" differs from the PTX text's \.version 9\.0"),
    ([("cubin", 90, b"x", "9.0")], r"binaries\[0\]\.ptx_isa is given for a cubin",
     r"binaries\[0\]\.ptx_isa is given for a cubin"),
    ([("ptx", 75, PTX_90, "v9")], r"binaries\[0\]\.ptx_isa 'v9' \(str\) is not a PTX ISA version",
     r"binaries\[0\]\.ptx_isa \"v9\" is not a PTX ISA version"),
    ([("ptx", 75, b"no version here\0", "9.0")], r"differs from the PTX text's \.version \(none in its first 4096",
     r"differs from the PTX text's \.version \(none in its first 4096"),
])
def test_ptx_isa_field_is_checked_by_both_readers(binaries, python, native):
    manifest, blobs = example_manifest_and_blobs(8)
    entries = []
    for kind, arch, data, isa in binaries:
        entries.append({"kind": kind, "arch": arch, "blob": len(blobs), "ptx_isa": isa})
        blobs.append(data)
    manifest["modules"][0]["binaries"] = entries
    from leapp.bundle.testing import write_unchecked

    data = write_unchecked(manifest, blobs)
    with pytest.raises(BundleError, match=python):
        read_bundle(data)
    with pytest.raises(ValueError, match=native):
        _native.Bundle(data)


def test_ptx_isa_field_must_be_a_string():
    manifest, blobs = example_manifest_and_blobs(8)
    manifest["modules"][0]["binaries"][0]["ptx_isa"] = 9.0
    from leapp.bundle.testing import write_unchecked

    data = write_unchecked(manifest, blobs)
    with pytest.raises(BundleError, match=r"binaries\[0\]\.ptx_isa must be a string"):
        read_bundle(data)
    with pytest.raises(ValueError, match=r"binaries\[0\]\.ptx_isa must be a string"):
        _native.Bundle(data)


@pytest.mark.parametrize(("text", "isa"), [
    (b".version 9.4\n", "9.4"), (b"// c\n.version\t8.8\n.target sm_75", "8.8"), (b".version9.0", ""),
    (b".version 9.4.1", ""), (b".version 1234.0", ""), (b"x" * 4090 + b".version 9.0", ""), (b"", ""),
])
def test_ptx_isa_of_matches_the_native_reading(text, isa):
    assert ptx_isa_of(text) == isa
    manifest, blobs = example_manifest_and_blobs(8)
    blobs[0] = text + b"\0"
    assert _native.Bundle(write_bundle(manifest, blobs)).binary_choice(0, 9, 0)["candidates"][0]["ptx_isa"] == isa


def test_default_cubins_cover_every_named_gpu_with_a_cubin():
    """With a CUDA 13.0 driver (Thor's JetPack 7, the H200's R580) every named family loads SASS, no JIT."""
    from leapp._export.cuda_code import DEFAULT_CUBIN_ARCHS

    binaries = [("ptx", 75, "9.4")] + [("cubin", a, "") for a in DEFAULT_CUBIN_ARCHS]
    expected = {"RTX 4090": 86, "Jetson Orin": 86, "H200": 90, "B300": 100, "Jetson Thor": 110, "GB10 / DGX Spark": 120}
    for name, (major, minor) in NAMED_GPUS:
        c = _native.binary_choice_for(binaries, major, minor, 13000, name, "13.4")
        chosen = c["candidates"][c["chosen"]]
        assert (chosen["kind"], chosen["arch"]) == ("cubin", expected[name]), (name, c["summary"])


def test_without_the_native_module_the_report_says_so(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_native(name, globals=None, locals=None, fromlist=(), level=0):
        if name == "leapp" and fromlist and "_native" in fromlist:
            raise ImportError("simulated")
        return real_import(name, globals, locals, fromlist, level)

    monkeypatch.setattr(builtins, "__import__", no_native)
    assert describe_binary_choice(b"anything") == [
        "binary choice: not available, leapp._native cannot be imported (simulated)"]
    assert describe_machine_binaries() == ["binaries: not available, leapp._native cannot be imported (simulated)"]


@settings(max_examples=300)
@given(field=st.one_of(st.sampled_from(["9.0", "9.4", "8.8", "7.5", "10.0", "9.", ".9", "9.0 ", "1234.0", "009.000"]),
                       st.text(alphabet="0123456789. v\t", max_size=8)),
       version=st.one_of(st.sampled_from(["9.0", "9.4", "8.8", "009.000", "9.0.1", ""]),
                         st.text(alphabet="0123456789.", max_size=6)),
       sep=st.sampled_from([" ", "\t", "  ", ""]), kind=st.sampled_from(["ptx", "cubin"]))
def test_both_readers_agree_on_the_ptx_isa_field(field, version, sep, kind):
    """Accept or refuse alike, for any field value, PTX .version text and binary kind."""
    from leapp.bundle.testing import write_unchecked

    manifest, blobs = example_manifest_and_blobs(8)
    blobs.append(f"//\n.version{sep}{version}\n.target sm_75\n".encode() + b"\0")
    manifest["modules"][0]["binaries"] = [{"kind": kind, "arch": 75, "blob": len(blobs) - 1, "ptx_isa": field}]
    data = write_unchecked(manifest, blobs)
    try:
        read_bundle(data)
        python_ok = True
    except BundleError:
        python_ok = False
    try:
        _native.Bundle(data)
        native_ok = True
    except ValueError:
        native_ok = False
    assert python_ok == native_ok, (field, version, sep, kind)
    assert python_ok == (kind == "ptx" and field == ptx_isa_of(blobs[-1]) != "")
