"""Control flow and memory lowered by lower_wp_launch equal Warp eager on the CPU (tolerance: lowering_harness).

Branches on data, early returns, loops with bounds known when lowering
(constants, shapes, wp.tid(), constant-derived while loops), break/continue,
wp.func calls, wp.static, gathers and scatters, 2-D to 4-D launches and
in-place component updates.
"""

from __future__ import annotations

import numpy as np
import pytest

wp = pytest.importorskip("warp")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import lowering_harness as harness  # noqa: E402
from lowering_harness import Case  # noqa: E402
from control_flow_kernels import CASES, k_while_data_break, k_gather_scatter, k_2d, k_3d, k_4d  # noqa: E402


def _perm(n: int):
    return st.permutations(list(range(n))).map(lambda p: np.array(p, dtype=np.int32))


@pytest.mark.parametrize("kernel", list(CASES), ids=lambda k: k.key)
@settings(max_examples=20, deadline=None)
@given(data=st.data(), n=st.integers(1, 7))
def test_control_flow_equals_warp_eager(kernel, data, n):
    case = CASES[kernel]
    harness.check(kernel, n, harness.draw(data, kernel, case, n), case.tol)


@settings(max_examples=20, deadline=None)
@given(data=st.data(), n=st.integers(1, 7))
def test_gathers_and_scatters_equal_warp_eager(data, n):
    feeds = harness.draw(data, k_gather_scatter, Case("gathers"), n)
    feeds["idx"] = data.draw(_perm(n))  # a permutation: no two threads store to one element
    harness.check(k_gather_scatter, n, feeds)


@pytest.mark.parametrize("kernel, shape", [(k_2d, (3, 4)), (k_3d, (2, 3, 4)), (k_4d, (2, 1, 3, 2))],
                         ids=["2d", "3d", "4d"])
@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_multi_dimensional_launches_equal_warp_eager(kernel, shape, data):
    from hypothesis.extra.numpy import arrays

    a = data.draw(arrays(np.float32, shape, elements=harness.FLOATS))
    harness.check(kernel, shape, {"a": a, "out": np.zeros(shape, np.float32)})


@pytest.mark.xfail(strict=True, raises=Exception,
                   reason="frontend: a while loop with a constant-derived condition and a break on data is refused "
                          "(its `going` mask folds in the data-dependent break mask, so it is never known)")
def test_while_with_constant_condition_and_data_break():
    a = np.array([0.5, 60.0, -3.0], np.float32)
    harness.check(k_while_data_break, 3, {"a": a, "out": np.zeros(3, np.float32)})
