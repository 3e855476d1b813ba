"""Issue 13's size target: the gravity segment's bundle <= 150 KB with a default export's full GPU coverage.

The node is benchmarks/first_export.py's (quaternions (N, 4) -> projected gravity -> normalize * scale, two Warp
kernels), traced on the CPU and compiled by Warp's NVRTC (no GPU needed) for every default target: PTX sm_75 and
the cubins of ``DEFAULT_CUBIN_ARCHS``. What keeps it small (docs/performance.md, "Bundle size"): forward kernels
only (``enable_backward=False`` in leapp's copy of the options) and LZ4-compressed binaries (format version 2).
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path

import pytest
import torch

import leapp
from leapp.bundle import read_bundle
from leapp.bundle.format import MAGIC
from leapp.runtime.binary_choice import DEFAULT_CUBIN_ARCHS

pytest.importorskip("warp")
native = pytest.importorskip("leapp._native", reason="leapp._native is not built")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from first_export import gravity_node  # noqa: E402 - the node the first-export benchmark times

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")

LIMIT = 150_000  # bytes (issue 13)


@pytest.fixture(scope="module")
def gravity_bundle(tmp_path_factory) -> bytes:
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("LEAPP_CUDA_ARCHS", raising=False)
        mp.delenv("LEAPP_BUNDLE_COMPRESSION", raising=False)
        mp.delenv("LEAPP_PTX_NVRTC", raising=False)
        out = tmp_path_factory.mktemp("gravity")
        observe = gravity_node()
        gen = torch.Generator().manual_seed(0)
        with leapp.trace("gravity", save_path=str(out)) as session:
            for _ in range(3):
                observe(torch.nn.functional.normalize(torch.randn(64, 4, generator=gen), dim=-1))
        session.compile(validate=False)
    found = []
    for pt2 in out.rglob("*.pt2"):
        with zipfile.ZipFile(pt2) as z:
            found += [data for data in map(z.read, z.infolist()) if data.startswith(MAGIC)]
    assert len(found) == 1, f"expected one bundle in the export, found {len(found)}"
    return found[0]


def test_gravity_bundle_is_at_most_150_kb_with_full_coverage(gravity_bundle):
    bundle = read_bundle(gravity_bundle)
    assert len(gravity_bundle) <= LIMIT, f"gravity bundle is {len(gravity_bundle)} bytes, the target is <= {LIMIT}"
    (module,) = bundle.modules
    kinds = [(b["kind"], b["arch"]) for b in module["binaries"]]
    assert kinds == [("ptx", 75)] + [("cubin", a) for a in DEFAULT_CUBIN_ARCHS]
    assert 110 in DEFAULT_CUBIN_ARCHS  # Jetson Thor keeps its cubin
    assert all(b.get("encoding") == "lz4-block" for b in module["binaries"])
    assert (bundle.format_version, bundle.min_reader_version) == (2, 2)


def test_gravity_binaries_hold_the_forward_entries_only(gravity_bundle):
    bundle, cpp = read_bundle(gravity_bundle), native.Bundle(gravity_bundle)
    entries = [k["entry"].encode() for k in bundle.kernels]
    assert len(entries) == 2 and all(e.endswith(b"_cuda_kernel_forward") for e in entries)
    for i, spec in enumerate(bundle.modules[0]["binaries"]):
        image = bundle.binary(0, i)
        assert image == cpp.binary_image(0, i) and len(image) == spec["decoded_bytes"]
        assert image.startswith(b"\x7fELF" if spec["kind"] == "cubin" else b"//")
        assert all(e in image for e in entries) and b"_cuda_kernel_backward" not in image
