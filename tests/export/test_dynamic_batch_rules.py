"""The affine fit behind every dynamic-batch rule (leapp._export.dynamic_batch.fit_affine)."""

from __future__ import annotations

from hypothesis import assume, given
from hypothesis import strategies as st

from leapp._export.dynamic_batch import RULE_LIMIT, fit_affine

batches = st.lists(st.integers(1, 2**31 - 1), min_size=2, max_size=3, unique=True)
coef = st.integers(-(2**20), 2**20)


@given(bs=batches, a=coef, b=coef)
def test_affine_values_give_back_their_rule(bs, a, b):
    assert fit_affine(bs, [a * x + b for x in bs]) == (a, b)


@given(bs=st.lists(st.integers(1, 4096), min_size=3, max_size=3, unique=True), c=st.integers(1, 64))
def test_values_that_are_not_affine_are_refused(bs, c):
    """ceil(batch / c) (a grid), batch^2, 1 / batch as float bits: no integer a, b fits three batches."""
    values = [x * x * c for x in bs]
    assert fit_affine(bs, values) is None
    grid = [-(-x // (c + 1)) for x in bs]
    if fit_affine(bs, grid) is not None:
        a, b = fit_affine(bs, grid)
        assert all(a * x + b == g for x, g in zip(bs, grid))  # only when it really is affine on these points


@given(bs=batches, v=st.integers(0, 2**32))
def test_constants_and_limits(bs, v):
    assert fit_affine(bs, [v] * len(bs)) == ((0, v) if v <= RULE_LIMIT else None)
    assume(len(bs) == 2)
    assert fit_affine(bs, [0, (RULE_LIMIT + 1) * (bs[1] - bs[0])]) is None  # a slope beyond the format's limit
