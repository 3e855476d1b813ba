"""The recorder's .wrp reader: ops and regions of a real capture, and no crash on bad bytes."""

from __future__ import annotations

import os
import tempfile

import pytest
import recorder_kernels as K
import torch
import warp as wp
from hypothesis import given, settings
from hypothesis import strategies as st

from leapp._recorder import wrp

wp.init()


@pytest.fixture(scope="module")
def wrp_bytes() -> bytes:
    x, y = torch.arange(4.0), torch.zeros(4)
    with wp.ScopedCapture(device="cpu", apic=True) as capture:
        wp.launch(K.scale, dim=4, inputs=[wp.from_torch(x), 2.0], outputs=[wp.from_torch(y)], device="cpu")
        wp.copy(wp.from_torch(x), wp.from_torch(y))
        wp.from_torch(y).zero_()
    with tempfile.TemporaryDirectory() as folder:
        wp.capture_save(capture.graph, os.path.join(folder, "g"))
        with open(os.path.join(folder, "g.wrp"), "rb") as f:
            return f.read()


def test_reads_ops_and_regions(wrp_bytes):
    ops = wrp.read_ops(wrp_bytes)
    assert [op.kind for op in ops] == ["launch", "copy", "memset"]
    assert ops[0].kernel_key == "scale" and ops[0].dst_region is None
    regions = wrp.read_regions(wrp_bytes)
    assert sorted(r.size for r in regions) == [16, 16]
    assert ops[1].dst_region in {r.region_id for r in regions}


@settings(max_examples=200)
@given(st.data())
def test_damaged_bytes_raise_a_format_error_or_parse(wrp_bytes, data):
    blob = bytearray(wrp_bytes)
    cut = data.draw(st.integers(0, len(blob)))
    for _ in range(data.draw(st.integers(0, 4))):
        blob[data.draw(st.integers(0, len(blob) - 1))] = data.draw(st.integers(0, 255))
    damaged = bytes(blob[:cut])
    for reader in (wrp.read_ops, wrp.read_regions):
        try:
            reader(damaged)
        except wrp.WrpFormatError:
            pass
