"""libleapp_warp_ort.so: loads into ONNX Runtime, and a WarpSegment node fails with a clear status, never a crash.

On a driverless machine every run ends at the driver; bundle, signature and
shape problems are reported before that, naming the node and the segment.
"""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest
from runtime_helpers import ort_session, signature_of, warp_segment_model

from leapp import _native
from leapp.bundle.testing import example_bundle, reseal
from leapp.runtime import libraries

ort = pytest.importorskip("onnxruntime")
if not libraries.library_path("onnx").is_file():
    pytest.skip("libleapp_warp_ort.so is not built (ONNX Runtime headers missing)", allow_module_level=True)

BUNDLE = example_bundle(4)
WHERE = "leapp.warp.WarpSegment node 'seg0' (segment 'example/warp_segment_0')"
no_driver = pytest.mark.skipif(_native.driver_status()["available"], reason="a CUDA driver is present")


def run(session, x):
    return session.run(None, {"x": x})


@no_driver
def test_loads_and_fails_cleanly_without_driver():
    session = ort_session(warp_segment_model(BUNDLE))
    for _ in range(2):  # the failure leaves the session usable
        with pytest.raises(Exception, match=r"no CUDA driver.*libcuda\.so\.1") as info:
            run(session, np.ones(4, np.float32))
        assert WHERE in str(info.value)


def test_bad_signature_attribute_fails_session_creation():
    with pytest.raises(Exception, match=r"WarpSegment node 'seg0': bad `signature` attribute: leapp signature"):
        ort_session(warp_segment_model(BUNDLE, json.dumps({"outputs": []})))


def test_corrupt_bundle_initializer():
    broken = bytearray(BUNDLE)
    broken[300] ^= 1
    session = ort_session(warp_segment_model(bytes(broken), signature_of(BUNDLE), like=BUNDLE))
    with pytest.raises(Exception, match="whole-file sha256 mismatch") as info:
        run(session, np.ones(4, np.float32))
    assert WHERE in str(info.value)
    session = ort_session(warp_segment_model(reseal(broken), signature_of(BUNDLE), like=BUNDLE))
    with pytest.raises(Exception, match="leapp bundle"):
        run(session, np.ones(4, np.float32))


def test_signature_of_another_bundle():
    other = example_bundle(4, segment="other/warp_segment_1")
    session = ort_session(warp_segment_model(other, signature_of(BUNDLE)))
    with pytest.raises(Exception, match="belong to different segments"):
        run(session, np.ones(4, np.float32))


def test_wrong_input_shape_is_invalid_argument():
    session = ort_session(warp_segment_model(BUNDLE, dynamic=True))
    with pytest.raises(Exception, match=r"INVALID_ARGUMENT.*input 0 'x' expects float32\[4\], got element type 1 \[5\]"):
        run(session, np.ones(5, np.float32))


@no_driver
def test_sessions_and_threads_at_once():
    sessions = [ort_session(warp_segment_model(BUNDLE)) for _ in range(2)]
    errors: list[str] = []

    def worker(session):
        for _ in range(10):
            try:
                run(session, np.ones(4, np.float32))
            except Exception as e:  # noqa: BLE001 - ORT raises its own types
                errors.append(str(e))

    threads = [threading.Thread(target=worker, args=(sessions[i % 2],)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(errors) == 60 and all("libcuda.so.1" in e for e in errors)
