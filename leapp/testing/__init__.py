"""leapp.testing: property-based tests that an export still computes what the eager code computes.

Needs the ``testing`` extra (hypothesis): ``pip install leapp[testing]``. The user guide is
``docs/testing.md``; the pattern is::

    from leapp.testing import assert_equivalent, input_strategy, unit_norm

    def test_export_matches_eager():
        robot = Go2("cuda:0")
        assert_equivalent(robot.step, "exports/go2",
                          input_strategy("exports/go2", quat=unit_norm()), max_examples=50)

An export with state is checked on sequences of steps from its reset state: pass ``reset=``, the
callable that resets your eager code (docs/testing.md, "Exports with state").

Nothing here changes process-wide state: hypothesis runs under the caller's active settings
profile, and the node observation used to localise a failure is a context variable.
"""

from __future__ import annotations

try:
    import hypothesis  # noqa: F401
except ImportError as e:  # pragma: no cover - exercised in a subprocess by tests/testing
    raise ImportError(
        "leapp.testing needs hypothesis, which is not installed: pip install leapp[testing]"
    ) from e

from .equivalence import (
    DEFAULT_ATOL,
    DEFAULT_RTOL,
    DEFAULT_STATE_STEPS,
    EquivalenceResult,
    NoRunnableRoute,
    RouteSkippedWarning,
    assert_equivalent,
    replay_counterexample,
)
from .inputs import DEFAULT_BOUND, input_strategy, tensors, unit_norm, within
from .routes import ROUTES

__all__ = [
    "DEFAULT_ATOL",
    "DEFAULT_BOUND",
    "DEFAULT_RTOL",
    "DEFAULT_STATE_STEPS",
    "ROUTES",
    "EquivalenceResult",
    "NoRunnableRoute",
    "RouteSkippedWarning",
    "assert_equivalent",
    "input_strategy",
    "replay_counterexample",
    "tensors",
    "unit_norm",
    "within",
]
