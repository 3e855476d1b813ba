"""libleapp_warp_ort.so: loads into ONNX Runtime, and a WarpSegment node fails with a clear status, never a crash.

On a driverless machine every run ends at the driver; bundle, signature and
shape problems are reported before that, naming the node and the segment.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto
from runtime_helpers import build_mock_driver, mock_driver_env, ort_session, signature_of, warp_segment_model

from leapp import _native
from leapp.bundle.testing import example_bundle, reseal
from leapp.runtime import libraries

ort = pytest.importorskip("onnxruntime")
if not libraries.library_path("onnx").is_file():
    pytest.skip("libleapp_warp_ort.so is not built (ONNX Runtime headers missing)", allow_module_level=True)

BUNDLE = example_bundle(4)
WHERE = "leapp.warp.WarpSegment node 'seg0' (segment 'example/warp_segment_0')"
no_driver = pytest.mark.skipif(_native.driver_status()["available"], reason="a CUDA driver is present")


def _under_the_fake_driver(tmp_path, code: str) -> str:
    """``code``'s stdout, run by a fresh interpreter in this folder whose libcuda.so.1 is the fake driver."""
    mock = build_mock_driver(tmp_path)
    if mock is None:
        pytest.skip("no C compiler to build the fake libcuda.so.1")
    proc = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parent,
                          env=mock_driver_env(mock), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"exit status {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


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
    with pytest.raises(Exception, match=r"INVALID_ARGUMENT.*input 0 'x' expects float32\[4\], got float32\[5\]"):
        run(session, np.ones(5, np.float32))


def redeclared(model: bytes, value: str, elem_type: int | None = None, dims: list | None = None) -> bytes:
    """``model`` with the graph input or output named ``value`` declared with another element type and/or dims."""
    m = onnx.load_from_string(model)
    (info,) = [v for v in [*m.graph.input, *m.graph.output] if v.name == value]
    tensor = info.type.tensor_type
    if elem_type is not None:
        tensor.elem_type = elem_type
    if dims is not None:
        tensor.shape.ClearField("dim")
        for d in dims:
            dim = tensor.shape.dim.add()
            if isinstance(d, str):
                dim.dim_param = d
            else:
                dim.dim_value = d
    return m.SerializeToString()


@pytest.mark.parametrize(("value", "elem_type", "dims", "declared", "segment"), [
    ("y", TensorProto.UINT8, None, "uint8[4]", "writes float32[4]"),
    ("y", TensorProto.DOUBLE, ["n"], "float64[?]", "writes float32[4]"),
    ("y", None, [5], "float32[5]", "writes float32[4]"),
    ("y", None, [4, 1], "float32[4, 1]", "writes float32[4]"),
    ("y", TensorProto.INT32, [], "int32", "writes float32[4]"),
    ("x", TensorProto.FLOAT16, None, "float16[4]", "reads float32[4]"),
    ("x", None, [2, 2], "float32[2, 2]", "reads float32[4]"),
])
def test_declarations_contradicting_the_segment_fail_session_creation(value, elem_type, dims, declared, segment):
    """The graph's types decide the buffers ORT allocates: a contradiction is refused before any run."""
    role = {"x": "input", "y": "output"}[value]
    model = redeclared(warp_segment_model(BUNDLE), value, elem_type, dims)
    with pytest.raises(Exception, match="Exception during initialization") as info:
        ort_session(model)
    assert (f"{WHERE}: {role} 0 '{value}' (ONNX value '{value}') is declared {declared} in the graph, "
            f"the segment {segment}") in str(info.value)


def test_bundle_initializer_of_another_type_fails_session_creation():
    m = onnx.load_from_string(warp_segment_model(BUNDLE))
    m.graph.initializer[0].data_type = TensorProto.INT8
    with pytest.raises(Exception, match=re.escape(WHERE) + r": the last input 'bundle' is declared int8\[\d+\]; it "
                                        "must be the uint8 bundle tensor"):
        ort_session(m.SerializeToString())


def test_output_count_contradicting_the_signature_fails_session_creation():
    m = onnx.load_from_string(warp_segment_model(BUNDLE))
    m.graph.node[0].output.append("extra")
    m.graph.output.append(onnx.helper.make_tensor_value_info("extra", TensorProto.FLOAT, [4]))
    with pytest.raises(Exception, match=re.escape(f"{WHERE}: has 2 outputs, the segment produces 1")):
        ort_session(m.SerializeToString())


@pytest.mark.parametrize("dims", [["n"], [], None])
def test_symbolic_and_unknown_dims_are_accepted(dims):
    """Symbolic dims and values without a shape (ORT reports both as unknown) pass; run time checks the tensors."""
    m = onnx.load_from_string(redeclared(warp_segment_model(BUNDLE), "y", dims=dims or []))
    if dims is None:
        m.graph.output[0].type.tensor_type.ClearField("shape")
    assert [o.name for o in ort_session(m.SerializeToString()).get_outputs()] == ["y"]


_FAKE_DRIVER_RUN = textwrap.dedent(
    """
    import sys
    import numpy as np
    import onnx
    from onnx import TensorProto
    from runtime_helpers import ort_session, warp_segment_model
    from test_runtime_ort_op import redeclared
    from leapp.bundle.testing import example_bundle

    n = 100_000
    data = example_bundle(n, segment="mock/declared")
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    want = x * np.arange(1, n + 1, dtype=np.float32)
    # the graph says uint8[n] where the segment writes float32[n]: ORT would allocate n bytes for 4n
    try:
        session = ort_session(redeclared(warp_segment_model(data), "y", TensorProto.UINT8))
        (y,) = session.run(None, {"x": x})
        print("RAN", y.dtype, y.nbytes)
    except Exception as e:
        print("REFUSED", str(e).splitlines()[-1][-160:])
    for dims in (["n"], []):  # symbolic and unknown (rank-0) declarations replay with the segment's shape
        (y,) = ort_session(redeclared(warp_segment_model(data), "y", dims=dims)).run(None, {"x": x})
        assert y.dtype == np.float32 and y.shape == (n,) and np.array_equal(y, want), (dims, y.dtype, y.shape)
    print("DYNAMIC OK")
    """
)


def test_declared_output_type_under_the_fake_driver(tmp_path):
    """The CPU EP end to end (fake libcuda.so.1, in a subprocess: before the check this wrote 4n bytes into n)."""
    stdout = _under_the_fake_driver(tmp_path, _FAKE_DRIVER_RUN)
    lines = stdout.splitlines()
    assert lines[0].startswith("REFUSED") and lines[-1] == "DYNAMIC OK", stdout
    assert ("'mock/declared'): output 0 'y' (ONNX value 'y') is declared uint8[100000] in the graph, the segment "
            "writes float32[100000]") in lines[0]


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


@pytest.mark.cuda
@pytest.mark.parametrize("provider", ["CUDAExecutionProvider", "CPUExecutionProvider"])
def test_declared_types_on_the_gpu(provider):
    """Both EPs on a GPU: a contradicting declaration is refused, symbolic dims replay the segment's shape."""
    if provider not in ort.get_available_providers():
        pytest.skip(f"this onnxruntime has no {provider}")
    providers = (provider, "CPUExecutionProvider")
    n = 1000
    data = example_bundle(n)
    with pytest.raises(Exception, match=re.escape(f"{WHERE}: output 0 'y' (ONNX value 'y') is declared uint8[{n}] in "
                                                  f"the graph, the segment writes float32[{n}]")):
        ort_session(redeclared(warp_segment_model(data), "y", TensorProto.UINT8), providers=providers)
    session = ort_session(redeclared(warp_segment_model(data), "y", dims=["n"]), providers=providers)
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    (y,) = session.run(None, {"x": x})
    assert y.dtype == np.float32 and y.shape == (n,)
    np.testing.assert_allclose(y, x * np.arange(1, n + 1, dtype=np.float32), rtol=1e-6)


_DYNAMIC_BATCH_RUN = textwrap.dedent(
    """
    import numpy as np
    from runtime_helpers import ort_session, warp_segment_model
    from leapp.bundle.testing import dynamic_example_bundle

    data = dynamic_example_bundle(8, lo=1, hi=300)
    session = ort_session(warp_segment_model(data, dynamic=True))  # a symbolic dim 0, as leapp's ONNX export
    for n in (8, 1, 7, 300, 299):
        x = np.random.default_rng(n).standard_normal(n).astype(np.float32)
        (y,) = session.run(None, {"x": x})
        assert y.shape == (n,) and np.array_equal(y, x * x), (n, y.shape)
    try:
        session.run(None, {"x": np.ones(301, np.float32)})
        print("RAN 301")
    except Exception as e:
        print("REFUSED", str(e).splitlines()[-1][-200:])
    print("DYNAMIC BATCH OK")
    """
)


def test_dynamic_batch_on_the_cpu_ep_under_the_fake_driver(tmp_path):
    """One dynamic-batch bundle replayed by the ORT op (CPU EP, host staging) at several batches."""
    stdout = _under_the_fake_driver(tmp_path, _DYNAMIC_BATCH_RUN)
    lines = stdout.splitlines()
    assert lines[-1] == "DYNAMIC BATCH OK", stdout
    assert lines[-2].startswith("REFUSED") and "input 0 'x' has 301 rows" in lines[-2] and "1..300" in lines[-2], lines


_SESSION_CYCLES_RUN = textwrap.dedent(
    """
    import ctypes, gc
    import numpy as np
    from runtime_helpers import ort_session, warp_segment_model
    from leapp.bundle.testing import example_bundle

    mock = ctypes.CDLL("libcuda.so.1")

    def live():  # device allocations, device bytes, pinned allocations, modules, streams
        out = (ctypes.c_longlong * 9)()
        mock.mock_resources(out)
        return list(out)[:5]

    data = example_bundle(4)
    seen = []
    for _ in range(6):
        session = ort_session(warp_segment_model(data))
        (y,) = session.run(None, {"x": np.ones(4, np.float32)})
        assert np.array_equal(y, np.arange(1, 5, dtype=np.float32)), y
        del session
        gc.collect()
        seen.append(live())
    print("LIVE", seen)
    """
)


def test_sessions_opened_and_closed_in_turn_hold_one_segments_resources(tmp_path):
    """A server that opens and closes sessions of one model: the op library's runtime keeps one set of
    device resources for the segment (scratch, module, streams), it does not add a set per session."""
    stdout = _under_the_fake_driver(tmp_path, _SESSION_CYCLES_RUN)
    seen = json.loads(stdout.splitlines()[-1].removeprefix("LIVE "))
    assert seen[0][3] >= 1 and all(s == seen[0] for s in seen), seen
