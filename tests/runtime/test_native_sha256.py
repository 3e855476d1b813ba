"""leapp's own C++ SHA-256 (ext/core/src/sha256.cpp) against hashlib: every tail length, random data, large input."""

from __future__ import annotations

import hashlib
import os

from hypothesis import given, settings
from hypothesis import strategies as st

from leapp import _native


def test_known_vectors():
    assert _native.sha256(b"") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    assert _native.sha256(b"abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    two_blocks = b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"
    assert _native.sha256(two_blocks) == "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"


def test_every_length_around_the_block_boundaries():
    data = os.urandom(300)
    for n in range(len(data) + 1):  # covers 55/56/63/64/119/120 byte padding cases
        assert _native.sha256(data[:n]) == hashlib.sha256(data[:n]).hexdigest(), n


def test_large_input():
    data = os.urandom(3 * 1024 * 1024 + 17)
    assert _native.sha256(data) == hashlib.sha256(data).hexdigest()


@settings(max_examples=500)
@given(st.binary(max_size=5000))
def test_random_inputs(data):
    assert _native.sha256(data) == hashlib.sha256(data).hexdigest()
