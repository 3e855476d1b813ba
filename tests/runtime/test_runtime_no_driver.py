"""Replay entry points on a machine without a CUDA driver: clear errors, never a crash.

Argument errors are found before the driver is needed, so they are ValueErrors
everywhere; everything that needs the GPU raises DriverUnavailable naming
libcuda.so.1 (the loader's own reason).
"""

from __future__ import annotations

import numpy as np
import pytest

from leapp import _native
from leapp.bundle.testing import example_bundle

pytestmark = pytest.mark.skipif(
    _native.driver_status()["available"], reason="a CUDA driver is present (these tests are for driverless machines)"
)

BUNDLE = _native.Bundle(example_bundle(4))


def test_driver_status_says_why():
    status = _native.driver_status()
    assert status["available"] is False
    assert "libcuda.so.1" in status["error"] or "cuInit" in status["error"]
    assert status["devices"] == []


def test_run_segment_without_driver():
    with pytest.raises(_native.DriverUnavailable, match=r"libcuda\.so\.1|cuInit"):
        _native.run_segment(BUNDLE, [0x1000], [0x2000], 0, 0)
    assert issubclass(_native.DriverUnavailable, RuntimeError)


def test_run_segment_host_without_driver():
    x = np.ones(4, np.float32)
    y = np.zeros(4, np.float32)
    with pytest.raises(_native.DriverUnavailable, match=r"libcuda\.so\.1|cuInit"):
        _native.run_segment_host(BUNDLE, [x], [y])
    assert (y == 0).all()


@pytest.mark.parametrize(
    ("inputs", "outputs", "kwargs", "message"),
    [
        ([], [0x2000], {}, r"leapp segment 'example/warp_segment_0': expected 1 inputs, got 0"),
        ([0x1000], [0x2000, 0x3000], {}, "expected 1 outputs, got 2"),
        ([0], [0x2000], {}, r"inputs\[0\] 'x' is a null device pointer"),
        ([0x1000], [0x2000], {"input_nbytes": [12]}, r"inputs\[0\] 'x' has 12 bytes, expected 16 \(float32 of shape \(4,\)\)"),
        ([0x1000], [0x2000], {"output_nbytes": [16, 16]}, "output_ptrs has 1 pointers but 2 sizes"),
    ],
)
def test_argument_errors_come_first(inputs, outputs, kwargs, message):
    with pytest.raises(ValueError, match=message):
        _native.run_segment(BUNDLE, inputs, outputs, 0, 0, **kwargs)


def test_host_argument_errors():
    with pytest.raises(ValueError, match=r"inputs\[0\] 'x' has 12 bytes, expected 16"):
        _native.run_segment_host(BUNDLE, [np.ones(3, np.float32)], [np.zeros(4, np.float32)])
    with pytest.raises(TypeError):  # an output that is not C-contiguous is refused, not silently copied
        _native.run_segment_host(BUNDLE, [np.ones(4, np.float32)], [np.zeros(8, np.float32)[::2]])


def test_nothing_allocated_and_no_capture():
    assert _native.allocation_count() == 0
    assert _native.stream_is_capturing(0) is False
