"""leapp/_apic/merge.py: folding regions of a real .wrp; Warp's own loader replays the result."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import pytest
import warp as wp

from leapp._apic.merge import merge_regions
from leapp._apic.wrp import WrpError, parse_wrp

wp.init()


@wp.kernel
def _copy_scaled(src: wp.array(dtype=wp.float32), dst: wp.array(dtype=wp.float32)):
    i = wp.tid()
    dst[i] = src[i] * 3.0


def _capture(src, dst):
    with wp.ScopedCapture(device="cpu", apic=True) as capture:
        wp.launch(_copy_scaled, dim=dst.shape[0], inputs=[src], outputs=[dst], device="cpu")
    folder = tempfile.mkdtemp()
    stem = os.path.join(folder, "g")
    wp.capture_save(capture.graph, stem, inputs={"src": src, "dst": dst})
    modules = {name: Path(stem + "_modules", name).read_bytes() for name in os.listdir(stem + "_modules")}
    with open(stem + ".wrp", "rb") as f:
        return f.read(), modules


def test_a_view_folded_into_its_base_replays_through_the_base():
    base = wp.array(np.arange(8, dtype=np.float32), device="cpu")
    head = wp.array(ptr=base.ptr, dtype=wp.float32, shape=(4,), device="cpu")  # no _ref: a region of its own
    tail = wp.array(ptr=base.ptr + 16, dtype=wp.float32, shape=(4,), device="cpu")
    data, modules = _capture(head, tail)
    regions = parse_wrp(data).regions
    assert len(regions) == 2
    src_id, dst_id = parse_wrp(data).bindings["src"], parse_wrp(data).bindings["dst"]
    merged = merge_regions(data, {dst_id: (src_id, 16)}, {src_id: 32}, {src_id: base.numpy().tobytes()})
    wrp = parse_wrp(merged)
    assert list(wrp.regions) == [src_id] and wrp.regions[src_id].size == 32 and "dst" not in wrp.bindings
    graph = wp.capture_load_from_bytes(merged, modules, device="cpu")
    fresh = wp.array(np.arange(8, dtype=np.float32) + 10, device="cpu")
    graph.set_param("src", fresh)
    wp.capture_launch(graph)
    out = wp.zeros(8, dtype=wp.float32, device="cpu")
    graph.get_param("src", out)
    np.testing.assert_array_equal(out.numpy(), np.concatenate([np.arange(4) + 10, (np.arange(4) + 10) * 3]))


def test_bad_plans_are_refused():
    a = wp.array(np.ones(4, dtype=np.float32), device="cpu")
    b = wp.zeros(4, dtype=wp.float32, device="cpu")
    data, _ = _capture(a, b)
    ids = sorted(parse_wrp(data).regions)
    with pytest.raises(WrpError, match="not in the capture"):
        merge_regions(data, {ids[0]: (99, 0)}, {}, {})
    with pytest.raises(WrpError, match="cannot shrink"):
        merge_regions(data, {ids[1]: (ids[0], 0)}, {ids[0]: 4}, {})
    with pytest.raises(WrpError, match="initial bytes"):
        merge_regions(data, {ids[1]: (ids[0], 0)}, {ids[0]: 32}, {ids[0]: b"\0"})
    with pytest.raises(WrpError, match="at offset 17"):
        merge_regions(data, {ids[1]: (ids[0], 17)}, {}, {})  # past the end of the 16-byte target
