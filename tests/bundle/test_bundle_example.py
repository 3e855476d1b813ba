"""The example bundle of leapp.bundle.testing: valid, deterministic, and readable back exactly."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess

import pytest

from leapp.bundle import BundleError, read_bundle, signature_json, write_bundle
from leapp.bundle.format import HEADER, HEADER_SIZE, MAGIC
from leapp.bundle.testing import EXAMPLE_ENTRY, EXAMPLE_PTX, example_bundle, example_manifest_and_blobs, reseal


def test_example_round_trip():
    manifest, blobs = example_manifest_and_blobs()
    data = write_bundle(manifest, blobs)
    bundle = read_bundle(data)
    assert bundle.manifest == manifest
    assert bundle.blobs == blobs
    assert bundle.digest == hashlib.sha256(data[:-32]).hexdigest() == data[-32:].hex()
    assert (bundle.format_version, bundle.min_reader_version) == (2, 1)  # no compressed binary: v1 readers read it
    assert bundle.segment == "example/warp_segment_0"
    assert [k["entry"] for k in bundle.kernels] == [EXAMPLE_ENTRY]
    assert [t["name"] for t in bundle.inputs] == ["x"] and [t["name"] for t in bundle.outputs] == ["y"]
    assert bundle.blob(0) == EXAMPLE_PTX.encode() + b"\0"
    with pytest.raises(IndexError, match="blob 3 out of range"):
        bundle.blob(3)


def test_writer_is_deterministic_and_aligned():
    a = example_bundle(n=7)
    assert a == example_bundle(n=7)
    fields = HEADER.unpack(a[:HEADER_SIZE])
    assert fields[0] == MAGIC and fields[1:3] == (2, 1) and fields[3] == len(a)
    assert fields[7] % 8 == 0  # manifest_offset


def test_signature_json_exact():
    bundle = read_bundle(example_bundle())
    assert signature_json(bundle) == (
        '{"digest":"' + bundle.digest + '","inputs":[{"dtype":"float32","name":"x","shape":[4]}],'
        '"outputs":[{"dtype":"float32","name":"y","shape":[4]}],"segment":"example/warp_segment_0"}'
    )


def test_reseal_reaches_deeper_checks():
    data = bytearray(example_bundle())
    data[HEADER_SIZE + 8] ^= 1  # blob 0's length
    with pytest.raises(BundleError, match="whole-file sha256 mismatch"):
        read_bundle(bytes(data))
    with pytest.raises(BundleError, match="bundle: blob 0 "):
        read_bundle(reseal(data))


@pytest.mark.skipif(shutil.which("ptxas") is None, reason="ptxas (CUDA toolkit) not installed")
@pytest.mark.parametrize("arch", ["sm_75", "sm_90"])
def test_example_ptx_assembles(tmp_path, arch):
    ptx = tmp_path / "example.ptx"
    ptx.write_text(EXAMPLE_PTX)
    subprocess.run(["ptxas", f"-arch={arch}", str(ptx), "-o", str(tmp_path / "example.cubin")], check=True)
    assert (tmp_path / "example.cubin").stat().st_size > 0


def test_example_manifest_is_json_as_written():
    manifest, blobs = example_manifest_and_blobs()
    data = write_bundle(manifest, blobs)
    offset, size = HEADER.unpack(data[:HEADER_SIZE])[7:9]
    assert json.loads(data[offset:offset + size]) == manifest


def test_public_api():
    import leapp.bundle as bundle_pkg

    for name in bundle_pkg.__all__:
        obj = getattr(bundle_pkg, name)
        if callable(obj):
            assert obj.__module__ == "leapp.bundle", name
    assert issubclass(BundleError, ValueError)


def test_bundle_package_imports_neither_torch_nor_warp():
    """The reader must work where neither is installed: only the standard library and leapp.errors."""
    import ast
    import pathlib

    import leapp.bundle

    allowed_leapp = {"leapp.errors", "leapp.bundle"}
    for path in pathlib.Path(leapp.bundle.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                assert top not in ("torch", "warp", "numpy", "onnx"), f"{path.name} imports {name}"
                if top == "leapp":
                    assert any(name == a or name.startswith(a + ".") for a in allowed_leapp), f"{path.name}: {name}"
