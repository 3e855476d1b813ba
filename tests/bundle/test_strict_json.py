"""leapp.bundle.strict_json: the JSON rules both readers apply, and the text-based depth/value count."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from leapp.bundle.strict_json import measure_json

# Strings full of what the text-based count must not mistake for structure.
TRICKY_TEXT = st.text(alphabet=st.sampled_from(list('"\\[]{},:0 \n\t/u') + ["\u00e9", "\U0001f600", "\x00"]),
                      max_size=8)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False)
    | TRICKY_TEXT,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(TRICKY_TEXT, children, max_size=4),
    max_leaves=30,
)


def tree_measure(value, depth: int = 0) -> tuple[int, int]:
    if isinstance(value, (dict, list)):
        children = list(value.values()) if isinstance(value, dict) else value
        measured = [tree_measure(child, depth + 1) for child in children]
        return max([depth + 1] + [d for d, _ in measured]), 1 + sum(n for _, n in measured)
    return depth, 1


@settings(max_examples=400)
@given(JSON_VALUES, st.booleans(), st.sampled_from([None, 0, 2]), st.sampled_from([(",", ":"), (", ", ": ")]))
def test_measure_json_counts_like_a_tree_walk(value, ascii_only, indent, separators):
    text = json.dumps(value, ensure_ascii=ascii_only, indent=indent, separators=separators)
    assert measure_json(text) == tree_measure(value)
