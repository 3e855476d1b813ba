"""The process-wide bundle table (ext/core/src/bundle.cpp intern_bundle): one parse per digest while held, none kept.

No driver needed: ``leapp._native.Bundle(data)`` interns. ``interned_bundle_count()``
is the table's size; the table holds no bundle alive, so it counts the distinct
bundles something still holds.
"""

from __future__ import annotations

import gc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from leapp import _native
from leapp.bundle.testing import example_bundle, reseal

SMALL = [example_bundle(4, segment=f"table/s{k}") for k in range(4)]


def variants(n: int, count: int, name: str):
    """``count`` distinct bundles of the example at size ``n``: the segment name differs (same length), resealed."""
    data = example_bundle(n, segment=f"table/{name}_000000")
    token = f"{name}_000000".encode()
    for i in range(count):
        yield reseal(data.replace(token, f"{name}_{i:06d}".encode()))


def resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


@pytest.fixture
def base() -> int:
    gc.collect()
    return _native.interned_bundle_count()


def test_dropped_bundles_are_freed(base):
    """Distinct bundles interned and dropped (300 large ones in turn, 3,000 small ones at once): bounded table and memory."""
    big = variants(65536, 301, "big")  # a 256 KiB constant: each bundle is ~260 KiB
    _native.Bundle(next(big))
    before = resident_bytes()
    for data in big:
        b = _native.Bundle(data)
        assert _native.interned_bundle_count() == base + 1
        del b, data
        assert _native.interned_bundle_count() == base
    # the starting tree kept all 300 (+78 MiB); now at most a few are in flight
    assert resident_bytes() - before < 32 << 20
    many = [_native.Bundle(data) for data in variants(4, 3000, "many")]
    assert _native.interned_bundle_count() == base + 3000
    del many
    assert _native.interned_bundle_count() == base


def test_one_parse_per_digest_while_held(base):
    a = _native.Bundle(SMALL[0])
    b = _native.Bundle(bytes(SMALL[0]))  # other bytes object, same content: the same parsed bundle
    assert _native.interned_bundle_count() == base + 1
    assert a.digest == b.digest
    del a
    assert _native.interned_bundle_count() == base + 1  # b still holds it
    del b
    assert _native.interned_bundle_count() == base
    c = _native.Bundle(SMALL[0])  # parsed again after everything let go
    assert _native.interned_bundle_count() == base + 1 and c.segment == "table/s0"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, len(SMALL) - 1)), max_size=40))
def test_table_size_is_the_number_of_digests_held(ops):
    """Any sequence of interns and drops: the table holds exactly the digests something still holds."""
    gc.disable()  # only this example's own drops may change the count
    try:
        start = _native.interned_bundle_count()
        held: dict[int, list] = {k: [] for k in range(len(SMALL))}
        for intern, k in ops:
            if intern:
                held[k].append(_native.Bundle(SMALL[k]))
            elif held[k]:
                held[k].pop()
            assert _native.interned_bundle_count() == start + sum(1 for v in held.values() if v)
    finally:
        gc.enable()
