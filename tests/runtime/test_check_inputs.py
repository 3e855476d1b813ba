"""leapp.runtime.io.check_inputs: what a pipeline call accepts and how it says what is wrong (fixed and dynamic batch)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from leapp.pipeline_format import PipelineError
from leapp.runtime.io import IOSpec, check_inputs

FIXED = [IOSpec("quat", torch.float32, (64, 4)), IOSpec("joints", torch.float32, (64, 12))]
DYNAMIC = [IOSpec("quat", torch.float32, (64, 4), batch=(1, 4096)),
           IOSpec("joints", torch.float32, (64, 12), batch=(1, 4096))]


def test_fixed_shapes_pass_in_spec_order():
    q, j = torch.zeros(64, 4), torch.zeros(64, 12)
    assert check_inputs(FIXED, {"joints": j, "quat": q}, "w") == [q, j]


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 4096))
def test_any_batch_in_the_range_passes(n):
    q, j = torch.zeros(n, 4), torch.zeros(n, 12)
    assert check_inputs(DYNAMIC, {"quat": q, "joints": j}, "w") == [q, j]


@pytest.mark.parametrize(("specs", "quat", "message"), [
    (FIXED, torch.zeros(63, 4), r"w: input 'quat' expects float32\[64, 4\], got float32\[63, 4\]$"),
    (FIXED, torch.zeros(64, 4, dtype=torch.float64), r"input 'quat' expects float32\[64, 4\], got float64\[64, 4\]"),
    (DYNAMIC, torch.zeros(4097, 4), r"got float32\[4097, 4\] \(batch 4097 is outside the exported range 1\.\.4096\)"),
    (DYNAMIC, torch.zeros(8, 5), r"input 'quat' expects .*got float32\[8, 5\]$"),
    (DYNAMIC, torch.zeros(8, 4, 1), r"input 'quat' expects .*got float32\[8, 4, 1\]$"),
])
def test_a_wrong_input_is_named_with_what_was_expected(specs, quat, message):
    joints = torch.zeros(quat.shape[0] if specs is DYNAMIC else 64, 12)
    with pytest.raises(PipelineError, match=message):
        check_inputs(specs, {"quat": quat, "joints": joints}, "w")


def test_dynamic_inputs_must_share_one_batch():
    with pytest.raises(PipelineError, match=r"w: the inputs' batches differ \(joints: 9, quat: 8\)"):
        check_inputs(DYNAMIC, {"quat": torch.zeros(8, 4), "joints": torch.zeros(9, 12)}, "w")


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5000), st.integers(3, 5)), min_size=1, max_size=300))
def test_remembered_shapes_give_the_same_verdict_as_the_rule(shapes):
    """A dynamic spec remembers shapes it accepted: the verdict never changes, refused shapes are never
    remembered, and the memory stays bounded however many batches a caller sweeps."""
    spec = IOSpec("quat", torch.float32, (64, 4), batch=(1, 4096))
    fresh = IOSpec("quat", torch.float32, (64, 4), batch=(1, 4096))
    for n, width in shapes * 2:  # every shape twice: the second verdict may come from the memory
        rule = 1 <= n <= 4096 and width == 4
        assert spec.accepts((n, width)) is rule
        assert spec.accepts(torch.Size([n, width])) is rule
        assert fresh.accepts((n, width)) is rule
        fresh._accepted.clear()
    assert all(1 <= s[0] <= 4096 and s[1:] == (4,) for s in spec._accepted)
    assert len(spec._accepted) <= 256
