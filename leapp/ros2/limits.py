"""leapp/ros2/limits.py: what the ROS 2 node lets through, to the policy and to the robot, and what it keeps.

A node between a robot driver and a policy is where NaN, infinities and absurd
magnitudes must stop: the policy turns them into NaN joint targets, and a
robot fed NaN does not fail safely. So every value, both ways, is checked
(docs/ros2.md, "What is checked"):

- floating-point values are finite and at most ``abs_max`` in magnitude (the
  value's metadata ``abs_max``, else ``DEFAULT_ABS_MAX``); a stated
  ``abs_max`` bounds integer values too;
- an orientation is a unit quaternion within ``QUAT_NORM_TOLERANCE``.

Rates (metadata ``control_rate_hz``, ``--rate``) lie in ``[MIN_RATE_HZ,
MAX_RATE_HZ]``: beyond it a timer busy-loops or overflows. Refusals are kept
as the last ``MAX_ERRORS`` texts of at most ``MAX_ERROR_CHARS`` characters,
with long lists cut to ``MAX_LISTED`` items: a hostile message's 300 000
joint names must not live on in memory.
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["DEFAULT_ABS_MAX", "MAX_ERRORS", "MAX_ERROR_CHARS", "MAX_LISTED", "MAX_RATE_HZ", "MIN_RATE_HZ",
           "QUAT_NORM_TOLERANCE", "abs_max_of", "check_rate", "check_tolerance", "cut", "shown", "shown_list",
           "value_problem"]

DEFAULT_ABS_MAX = 1e6  # |x| of a floating-point value unless its metadata states abs_max
QUAT_NORM_TOLERANCE = 1e-3  # an orientation's | ||q|| - 1 |
MIN_RATE_HZ, MAX_RATE_HZ = 0.1, 10_000.0  # a control loop's rate: control_rate_hz and --rate
MAX_ERRORS = 100  # refusals kept in PolicyNode.errors (the latest)
MAX_ERROR_CHARS = 1000  # each one cut to this length
MAX_LISTED = 8  # items of a list shown in a refusal: "... (N more)"

_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = 60


def shown(value: Any) -> str:
    """``value``'s repr, cut to 60 characters (a hostile joint name may be a megabyte)."""
    return _repr.repr(value)


def shown_list(items: Sequence[Any], limit: int = MAX_LISTED) -> str:
    """``['a', 'b', ... (N more)]``: the first ``limit`` items of ``items``, each ``shown``."""
    head = [shown(item) for item in items[:limit]]
    more = f", ... ({len(items) - limit} more)" if len(items) > limit else ""
    return f"[{', '.join(head)}{more}]"


def cut(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """``text``, at most ``limit`` characters: a longer one ends in ``... (N characters cut)``."""
    if len(text) <= limit:
        return text
    tail = f"... ({len(text) - limit} characters cut)"
    return text[:limit - len(tail)] + tail


def check_rate(rate: Any, where: str) -> float:
    """``rate`` as a float, when it is a number in ``[MIN_RATE_HZ, MAX_RATE_HZ]``.

    Raises:
        ValueError: anything else (naming ``where`` and the range).
    """
    ok = not isinstance(rate, bool) and isinstance(rate, (int, float)) and MIN_RATE_HZ <= rate <= MAX_RATE_HZ
    if not ok:
        raise ValueError(f"{where} {rate!r:.60} is not a rate in [{MIN_RATE_HZ:g}, {MAX_RATE_HZ:g}] Hz (a control "
                         "loop's rate: slower is no loop, faster busy-loops the node)")
    return float(rate)


def check_tolerance(tolerance: Any, where: str) -> float:
    """``tolerance`` as a float, when it is a number in ``(0, 1)`` (an orientation's | ||q|| - 1 |).

    Raises:
        ValueError: anything else, naming ``where``.
    """
    ok = not isinstance(tolerance, bool) and isinstance(tolerance, (int, float)) and 0 < tolerance < 1
    if not ok:
        raise ValueError(f"{where} {tolerance!r:.60} is not a tolerance in (0, 1) on a quaternion's norm")
    return float(tolerance)


def abs_max_of(metadata: Mapping[str, Any], floating: bool) -> float | None:
    """The largest magnitude a value may hold: metadata ``abs_max`` (checked by leapp.pipeline_format.metadata
    when the export was written and read), else ``DEFAULT_ABS_MAX`` for floating-point values, else None."""
    stated = metadata.get("abs_max")
    if stated is not None:
        return float(stated)
    return DEFAULT_ABS_MAX if floating else None


def value_problem(values: np.ndarray, *, abs_max: float | None, labels: Sequence[str] = (),
                  quat_tolerance: float | None = None) -> str | None:
    """Why ``values`` (flat, float64) may not pass, naming the first bad element, else None.

    ``labels`` name the elements (joint names) where there are; ``quat_tolerance`` makes the four values an
    orientation, whose norm must be 1 within it.
    """
    def name(i: int) -> str:
        return f"joint {shown(labels[i])}" if i < len(labels) else f"element [{i}]"

    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
        return f"{name(int(bad[0]))} is {float(values[bad[0]])}, not a finite number ({bad.size} such)"
    if abs_max is not None:
        bad = np.flatnonzero(np.abs(values) > abs_max)
        if bad.size:
            return (f"{name(int(bad[0]))} is {float(values[bad[0]]):g}, beyond abs_max {abs_max:g} ({bad.size} such; "
                    "metadata abs_max states another limit)")
    if quat_tolerance is not None:
        norm = math.sqrt(float(np.dot(values, values)))
        if not abs(norm - 1.0) <= quat_tolerance:
            return f"the quaternion's norm is {norm:.6g}, not 1 within {quat_tolerance:g}"
    return None
