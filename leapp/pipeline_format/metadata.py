"""leapp/pipeline_format/metadata.py: what a tensor's user metadata may hold (docs/pipeline-format.md, "Metadata").

Deployment frameworks route robot signals by fields such as ``kind: joint_positions``,
``units`` or joint names, so an input or output of pipeline.yaml may carry a mapping of
them. It must read back unchanged from YAML and JSON alike (pipeline.json, the C++ side):
string keys; values that are strings, integers, finite floats, booleans, or lists and
mappings of those; no null. Its size is bounded so that metadata stays a label, not a
payload. The recorder checks it where the user declares it, the writer before writing,
the Python reader on load; the C++ reader (ext/pipeline/src/description.cpp) checks the
types, the depth and the size alike, with the same texts.

One key is leapp's own: ``abs_max``, the largest magnitude the tensor's values may
hold, read by the ROS 2 node (docs/ros2.md), must be a positive finite number. Python
checks it; the C++ reader, which does not read it, does not.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

__all__ = ["ABS_MAX_KEY", "MAX_METADATA_BYTES", "MAX_METADATA_DEPTH", "metadata_problem"]

MAX_METADATA_BYTES = 16 << 10  # one tensor's metadata as compact JSON
MAX_METADATA_DEPTH = 8  # nesting of lists and mappings, the metadata mapping being 1
ABS_MAX_KEY = "abs_max"  # the largest |x| of the tensor's values (leapp.ros2.limits): a positive finite number


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _problem(value: Any, path: str, depth: int) -> str | None:
    if isinstance(value, bool | str | int):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{path}: {value!r} is not a finite number"
    if isinstance(value, list | dict):
        if depth > MAX_METADATA_DEPTH:
            return f"{path}: nested deeper than {MAX_METADATA_DEPTH} levels"
        if isinstance(value, list):
            items = ((f"{path}[{i}]", v) for i, v in enumerate(value))
        else:
            bad = next((k for k in value if not isinstance(k, str)), None)
            if bad is not None:
                return f"{path}: key {bad!r} is not a string"
            items = ((f"{path}.{k}", v) for k, v in value.items())
        for where, item in items:
            problem = _problem(item, where, depth + 1)
            if problem:
                return problem
        return None
    what = "null" if value is None else f"{_kind(value)} {value!r:.60}"
    return f"{path}: {what} is not a string, number, boolean, list or mapping"


def metadata_problem(metadata: Any, where: str = "metadata") -> str | None:
    """Why ``metadata`` cannot be a tensor's metadata in pipeline.yaml (naming the field under ``where``), else None."""
    if not isinstance(metadata, dict):
        return f"{where}: expected a mapping, got {_kind(metadata)}"
    problem = _problem(metadata, where, 1)
    if problem:
        return problem
    if ABS_MAX_KEY in metadata:
        bound = metadata[ABS_MAX_KEY]
        if isinstance(bound, bool) or not isinstance(bound, int | float) or not 0 < bound <= sys.float_info.max:
            return (f"{where}.{ABS_MAX_KEY}: {bound!r:.60} is not a positive finite number (the largest magnitude "
                    "of a value)")
    size = len(json.dumps(metadata, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))
    if size > MAX_METADATA_BYTES:
        return f"{where}: {size} bytes as JSON, more than {MAX_METADATA_BYTES} (metadata labels a tensor)"
    return None
