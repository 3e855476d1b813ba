"""The C++ torch kernel (ext/torch) replaying through the fake driver; run by test_runtime_torch_cpu_replay.py.

The library under test is a build of ext/torch/leapp_warp_torch.cpp with
LEAPP_TORCH_TEST_CPU_AS_CUDA, which serves CPU tensors with the CUDA kernel
(the fake driver treats host memory as device memory). Everything else is the
production code: signature and bundle caches, input checks, output
allocation, run_segment. Not collected on its own; needs LEAPP_MOCK_CUDA=1.
"""

from __future__ import annotations

import json
import os
import threading

import pytest
import torch
from runtime_helpers import signature_of

if os.environ.get("LEAPP_MOCK_CUDA") != "1":
    pytest.skip("runs only under the fake driver (test_runtime_torch_cpu_replay.py)", allow_module_level=True)

from leapp import _native
from leapp.bundle.testing import example_bundle
from leapp.runtime import ops


@pytest.fixture(scope="module")
def op():
    assert ops.ensure_registered() is True, "the test build of libleapp_warp_torch.so must serve the op"
    return torch.ops.leapp.warp_segment


def bt(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


@pytest.mark.parametrize("n", [1, 100, 4097])
def test_example(op, n):
    data = example_bundle(n)
    x = torch.randn(n)
    (y,) = op([x], bt(data), signature_of(data))
    torch.testing.assert_close(y, x * torch.arange(1, n + 1, dtype=torch.float32), rtol=0, atol=0)


def test_non_contiguous_input(op):
    data = example_bundle(50)
    base = torch.randn(100)
    (y,) = op([base[::2]], bt(data), signature_of(data))
    torch.testing.assert_close(y, base[::2] * torch.arange(1, 51, dtype=torch.float32), rtol=0, atol=0)


def test_bundle_read_once_per_tensor(op):
    data = example_bundle(64, segment="mock/torch_once")
    tensor = bt(data)
    sig = signature_of(data)
    x = torch.ones(64)
    op([x], tensor, sig)
    loads = _native.allocation_count()
    for _ in range(10):
        op([x], tensor, sig)
    assert _native.allocation_count() == loads


def test_hot_path_reads_no_bytes(op):
    """After the first call per tensor nothing is read: bytes changed behind torch's back go unseen (documented)."""
    raw = [bytearray(example_bundle(24, segment=f"mock/torch_hot_{i}")) for i in range(3)]
    tensors = [torch.frombuffer(r, dtype=torch.uint8) for r in raw]
    sigs = [signature_of(bytes(r)) for r in raw]
    for t, s in zip(tensors, sigs):
        op([torch.ones(24)], t, s)
    for r in raw:
        r[300] ^= 1  # not a torch write: the version counter stays
    for i in range(9):
        (y,) = op([torch.ones(24)], tensors[i % 3], sigs[i % 3])
        torch.testing.assert_close(y, torch.arange(1, 25, dtype=torch.float32), rtol=0, atol=0)


def test_input_errors(op):
    data = example_bundle(8)
    sig = signature_of(data)
    with pytest.raises(ValueError, match=r"leapp::warp_segment 'example/warp_segment_0': input 0 'x' expects float32\[8\]"):
        op([torch.ones(8, dtype=torch.float64)], bt(data), sig)
    with pytest.raises(ValueError, match=r"input 0 'x' expects float32\[8\], got Float\[9\]"):
        op([torch.ones(9)], bt(data), sig)
    with pytest.raises(ValueError, match=r"expected 1 inputs, got 2"):
        op([torch.ones(8), torch.ones(8)], bt(data), sig)
    with pytest.raises(ValueError, match="the bundle must be a uint8 tensor"):
        op([torch.ones(8)], torch.zeros(8, dtype=torch.int32), sig)


def test_bundle_errors(op):
    data = example_bundle(8)
    other = example_bundle(8, segment="other/warp_segment_9")
    with pytest.raises(ValueError, match="belong to different segments"):
        op([torch.ones(8)], bt(other), signature_of(data))
    broken = bytearray(data)
    broken[100] ^= 1
    with pytest.raises(ValueError, match="leapp bundle: whole-file sha256 mismatch"):
        op([torch.ones(8)], bt(bytes(broken)), signature_of(data))
    with pytest.raises(ValueError, match="leapp signature: invalid JSON"):
        op([torch.ones(8)], bt(data), "{")


def test_warp_kernels(op, tmp_path):
    pytest.importorskip("warp")
    from cuda_bundles import WARP_K, WARP_OFFSET, WARP_SCALE, compile_warp_module, warp_bundle

    data = warp_bundle(compile_warp_module(tmp_path), 300, 4, 9)
    x, a, bias = torch.randn(300, 3), torch.randn(4, 9), torch.randn(9)
    y, hits, out = op([x, a, bias], bt(data), signature_of(data))
    torch.testing.assert_close(y, WARP_SCALE * x + torch.tensor(WARP_OFFSET))
    torch.testing.assert_close(out, a + bias * WARP_K)
    assert hits.dtype == torch.int32 and hits.tolist() == [300]


def test_signature_checked_on_every_call(op):
    """A good call must not let the same bundle tensor through with a signature that contradicts it."""
    data = example_bundle(8, segment="mock/torch_sig")
    tensor, sig = bt(data), signature_of(data)
    op([torch.ones(8)], tensor, sig)
    other = json.loads(sig)
    other["outputs"][0]["dtype"] = "int32"
    with pytest.raises(ValueError, match=r"signature outputs\[0\] 'y' differs from the bundle's 'y' \(dtype or shape\)"):
        op([torch.ones(8)], tensor, json.dumps(other))
    other["outputs"][0].update(dtype="float32", shape=[2, 4])
    with pytest.raises(ValueError, match=r"signature outputs\[0\] 'y' differs"):
        op([torch.ones(8)], tensor, json.dumps(other))
    (y,) = op([torch.ones(8)], tensor, sig)  # the good pair still passes
    assert y.dtype == torch.float32 and y.shape == (8,)


def test_in_place_write_to_the_bundle_is_seen(op):
    data = example_bundle(8, segment="mock/torch_write")
    tensor, sig = bt(data), signature_of(data)
    op([torch.ones(8)], tensor, sig)
    tensor[200] ^= 1  # torch bumps the tensor's version counter
    with pytest.raises(ValueError, match="leapp bundle: whole-file sha256 mismatch"):
        op([torch.ones(8)], tensor, sig)
    tensor[200] ^= 1
    (y,) = op([torch.ones(8)], tensor, sig)
    torch.testing.assert_close(y, torch.arange(1, 9, dtype=torch.float32), rtol=0, atol=0)


def test_reused_address_is_a_new_tensor(op):
    """A bundle tensor freed and another allocated at its address is read anew, not taken for the old one.

    The cache holds its tensors' storages (at most 64, oldest dropped first), so an address can only be
    reused once its entry is gone: 64 other bundle tensors push it out first."""
    data = example_bundle(5000, segment="mock/torch_reuse")
    sig = signature_of(data)
    broken = bytearray(data)
    broken[300] ^= 1
    for _ in range(20):
        first = torch.empty(len(data), dtype=torch.uint8)
        first.copy_(bt(data))
        address = first.data_ptr()
        op([torch.ones(5000)], first, sig)
        del first
        assert torch.empty(len(data), dtype=torch.uint8).data_ptr() != address, "the cache holds the storage"
        others = [bt(data) for _ in range(64)]
        for other in others:
            op([torch.ones(5000)], other, sig)
        del others
        second = torch.empty(len(data), dtype=torch.uint8)
        if second.data_ptr() == address:
            break
    else:
        if "libasan" in os.environ.get("LD_PRELOAD", ""):  # docs/building.md's sanitizer runs
            pytest.skip("AddressSanitizer's quarantine never hands a freed address out again: the case cannot occur")
        pytest.fail("the CPU allocator never reused the address; the case is not exercised")
    second.copy_(bt(bytes(broken)))
    with pytest.raises(ValueError, match="leapp bundle: whole-file sha256 mismatch"):
        op([torch.ones(5000)], second, sig)


def test_inference_mode_bundle(op):
    """Inference tensors have no version counter: read once per storage, still checked per signature."""
    data = example_bundle(16, segment="mock/torch_inference")
    sig = signature_of(data)
    with torch.inference_mode():
        tensor = bt(data)
        (y,) = op([torch.ones(16)], tensor, sig)
    assert tensor.is_inference()
    torch.testing.assert_close(y, torch.arange(1, 17, dtype=torch.float32), rtol=0, atol=0)
    (y,) = op([torch.full((16,), 2.0)], tensor, sig)
    torch.testing.assert_close(y, 2 * torch.arange(1, 17, dtype=torch.float32), rtol=0, atol=0)
    bad = json.loads(sig)
    bad["outputs"][0]["dtype"] = "float64"
    with pytest.raises(ValueError, match="differs from the bundle's"):
        op([torch.ones(16)], tensor, json.dumps(bad))


def test_bundle_tensor_without_bytes_is_refused(op):
    data = example_bundle(8)
    sig = signature_of(data)
    meta = torch.empty(len(data), dtype=torch.uint8, device="meta")
    # through the dispatcher: the meta kernel sees a real CPU input next to the meta bundle
    with pytest.raises(ValueError, match=r"leapp::warp_segment 'example/warp_segment_0': the bundle tensor is on the "
                                         r"meta device \(it holds no bytes\)"):
        op([torch.ones(8)], meta, sig)
    # straight to the replay kernel
    with pytest.raises(ValueError, match=r"'example/warp_segment_0': the bundle must be a 1-D dense uint8 tensor with "
                                         r"data, got a 1-D Strided tensor on meta \(meta tensors hold no bytes\)"):
        op.default.redispatch(torch._C.DispatchKeySet(torch._C.DispatchKey.CPU), [torch.ones(8)], meta, sig)
    with pytest.raises(ValueError, match=r"the bundle must be a 1-D dense uint8 tensor with data, got a 2-D"):
        op([torch.ones(8)], bt(data).reshape(1, -1), sig)


def test_threads_alternating_bundles(op):
    """Each thread's remembered pairs never mix two bundles up."""
    bundles = [example_bundle(n, segment=f"mock/torch_threads_{n}") for n in (32, 48, 64)]
    tensors = [(bt(d), signature_of(d), n) for d, n in zip(bundles, (32, 48, 64))]
    failures = []

    def worker(seed):
        for i in range(60):
            tensor, sig, n = tensors[(seed + i) % 3]
            x = torch.randn(n)
            (y,) = op([x], tensor, sig)
            if not torch.equal(y, x * torch.arange(1, n + 1, dtype=torch.float32)):
                failures.append((seed, i))

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


def test_dynamic_batch_outputs_follow_the_batch(op):
    from leapp.bundle.testing import dynamic_example_bundle

    data = dynamic_example_bundle(8, lo=1, hi=300)
    sig = signature_of(data)
    for n in (8, 1, 7, 300):
        x = torch.randn(n)
        (y,) = op([x], bt(data), sig)
        assert y.shape == (n,)
        torch.testing.assert_close(y, x * x, rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"input 0 'x' has 301 rows.*1\.\.300"):
        op([torch.randn(301)], bt(data), sig)
    with pytest.raises(ValueError, match=r"expects 1 dims"):
        op([torch.randn(4, 2)], bt(data), sig)
    # the fake (meta) kernel gives the same shapes, also for a symbolic batch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    with FakeTensorMode(shape_env=ShapeEnv()) as mode:
        x = mode.from_tensor(torch.randn(9))
        (y,) = ops._fake([x], mode.from_tensor(bt(data)), sig)
        assert y.shape == (9,)
