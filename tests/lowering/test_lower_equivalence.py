"""Every builtin family the table lowers equals Warp eager on the CPU, on random inputs (lowering_harness).

Tolerance: |lowered - warp| <= 1e-5 + 8e-5 * |warp| elementwise for every
family (the table follows Warp's native formulas term by term, in Warp's order,
so most results are bit-equal; the bound covers libm-vs-torch transcendental
ulps and the fmaf in Warp's mat*mat, whose family draws inputs in [-4, 4]);
nan and inf exactly where Warp has them; ints and bools equal.
"""

from __future__ import annotations

import pytest

wp = pytest.importorskip("warp")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import lowering_harness as harness  # noqa: E402
from lowering_kernels import CASES  # noqa: E402


@pytest.mark.parametrize("kernel", list(CASES), ids=lambda k: k.key)
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), n=st.integers(1, 6))
def test_lowered_equals_warp_eager(kernel, data, n):
    case = CASES[kernel]
    harness.check(kernel, n, harness.draw(data, kernel, case, n), case.tol)


@settings(max_examples=20, deadline=None)
@given(data=st.data(), n=st.integers(1, 6))
def test_matrix_products_of_large_magnitudes_within_the_fma_bound(data, n):
    """Warp's mat*mat accumulates with fmaf; the lowering rounds each product once more, so with large
    magnitudes the error is bounded by 2^-23 * sum_k |a_ik * b_kj| (at most the largest such sum)."""
    import numpy as np

    from lowering_kernels import k_matmul

    feeds = harness.draw(data, k_matmul, CASES[k_matmul], n)
    for name in ("m", "n", "a", "b", "c", "d"):
        feeds[name] = feeds[name] * np.float32(2500.0)  # |entries| up to 1e4
    scale = max(float((np.abs(x) @ np.abs(y)).max()) for x, y in
                ((feeds["m"], feeds["n"]), (feeds["a"], feeds["b"]), (feeds["c"], feeds["d"])))
    harness.check(k_matmul, n, feeds, tol=(1e-5 + 2.0 ** -23 * scale * 4, 8e-5))


def test_round_halves_away_from_zero_and_rint_to_even():
    """Exact halves, where torch.round (to even) and Warp's roundf differ."""
    import numpy as np

    from lowering_kernels import k_math

    b = np.array([0.5, 1.5, 2.5, -0.5, -2.5, 3.0], dtype=np.float32)
    feeds = {"a": np.ones(6, np.float32), "b": b, "out": np.zeros((6, 25), np.float32)}
    want = harness.check(k_math, 6, feeds)["out"]
    assert want[:, 20].tolist() == [1.0, 2.0, 3.0, -1.0, -3.0, 4.0]  # round(floor(b) + 0.5)
    assert want[:, 21].tolist() == [0.0, 2.0, 2.0, -0.0, -2.0, 4.0]

