"""The chained-segments recording, repeated: a segment's recording must not depend on when Python collects.

On the H200 ``test_chained_segments_pass_block_created_arrays`` failed three times in whole-suite runs (never
alone): segment 1 got an extra output because a region it only reads changed while it replayed. This test
repeats that recording many times with collections and allocation churn between the passes and segments, so a
cause that depends on timing (graph destruction, memory reuse) shows up in one run.
"""

from __future__ import annotations

import gc
import logging

import pytest
import torch
import warp as wp
from recorder_helpers import chained_step, trace


wp.init()
REPEATS = 60


@pytest.mark.cuda
def test_chained_segments_record_the_same_every_time(caplog):
    device = "cuda:0"
    held = []

    def churn():
        held.append(wp.zeros(4096, dtype=float, device=device))  # allocations between the segments
        if len(held) > 8:
            del held[:4]
        gc.collect()

    shapes = set()
    for i in range(REPEATS):
        x = torch.arange(3.0 + i % 5, device=device)
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger="leapp._recorder.capture"):
            record, results = trace(chained_step(device, churn if i % 2 else gc.collect), x)
        torch.testing.assert_close(results[1], x * 12)
        seg0, seg1 = record.nodes["n"].segments
        shape = (len(seg0.inputs), len(seg0.outputs), len(seg1.inputs), len(seg1.outputs))
        changed = [r.getMessage() for r in caplog.records if "no launch passes it as an output" in r.getMessage()]
        regions = [r.getMessage() for r in caplog.records if ": regions " in r.getMessage()]
        assert shape == (1, 1, 2, 1) and not changed, (i, shape, changed, regions)  # regions: each piece's address
        shapes.add(shape)
        del record, results
        if i % 3 == 0:
            gc.collect()
    assert shapes == {(1, 1, 2, 1)}
