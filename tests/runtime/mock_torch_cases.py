"""The C++ torch kernel (ext/torch) replaying through the fake driver; run by test_runtime_torch_cpu_replay.py.

The library under test is a build of ext/torch/leapp_warp_torch.cpp with
LEAPP_TORCH_TEST_CPU_AS_CUDA, which serves CPU tensors with the CUDA kernel
(the fake driver treats host memory as device memory). Everything else is the
production code: signature and bundle caches, input checks, output
allocation, run_segment. Not collected on its own; needs LEAPP_MOCK_CUDA=1.
"""

from __future__ import annotations

import os

import pytest
import torch
from runtime_helpers import signature_of

if os.environ.get("LEAPP_MOCK_CUDA") != "1":
    pytest.skip("runs only under the fake driver (test_runtime_torch_cpu_replay.py)", allow_module_level=True)

from leapp import _native  # noqa: E402
from leapp.bundle.testing import example_bundle  # noqa: E402
from leapp.runtime import ops  # noqa: E402


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
