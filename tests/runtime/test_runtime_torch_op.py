"""leapp::warp_segment in torch: the native op library loads and registers the op; the Python kernels' checks.

CUDA replay itself is tested in test_runtime_cuda.py; here: the schema, the
fake kernel (meta tensors), the CPU kernels' errors, and the Python fallback
kernels (replay.py) that serve the op when the native library is absent.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from leapp.bundle import read_bundle, signature_json
from leapp.bundle.testing import example_bundle
from leapp.runtime import libraries, ops, replay

BUNDLE = example_bundle(4)
SIG = signature_json(read_bundle(BUNDLE))
SCHEMA = "leapp::warp_segment(Tensor[] inputs, Tensor bundle, str signature) -> Tensor[]"

needs_library = pytest.mark.skipif(
    not libraries.library_path("pt2").is_file(), reason="libleapp_warp_torch.so is not built (torch missing at build)"
)


def bundle_tensor(data: bytes = BUNDLE) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


@needs_library
def test_native_library_registers_the_op():
    assert ops.ensure_registered() is True
    assert ops.native_library_loaded()
    assert str(torch.ops.leapp.warp_segment.default._schema) == SCHEMA


@needs_library
def test_cpu_inputs_are_refused_by_the_native_kernel():
    ops.ensure_registered()
    with pytest.raises(RuntimeError, match=r"'example/warp_segment_0' holds no CPU code for this machine \(\w+\): it was exported for CUDA "
                                             r"devices only .*; the inputs are on the CPU: move them to a CUDA device"):
        torch.ops.leapp.warp_segment([torch.ones(4)], bundle_tensor(), SIG)


def test_fake_kernel_gives_output_shapes():
    ops.ensure_registered()
    outs = torch.ops.leapp.warp_segment([torch.empty(4, device="meta")], torch.empty(len(BUNDLE), dtype=torch.uint8,
                                                                                    device="meta"), SIG)
    assert [(o.shape, o.dtype, o.device.type) for o in outs] == [(torch.Size([4]), torch.float32, "meta")]


def test_python_cpu_kernel_error():
    with pytest.raises(RuntimeError, match=r"'example/warp_segment_0' holds no CPU code for this machine \(\w+\): it was exported for CUDA "
                                             r"devices only .*; the inputs are on the CPU: move them to a CUDA device"):
        replay.warp_segment_cpu([torch.ones(4)], bundle_tensor(), SIG)


def test_python_cuda_kernel_checks_device_before_anything():
    with pytest.raises(ValueError, match=r"'example/warp_segment_0': expects CUDA inputs, got cpu"):
        replay.warp_segment_cuda([torch.ones(4)], bundle_tensor(), SIG)


def test_load_bundle_caches_by_tensor_and_checks_pairing():
    replay.clear_cache()
    tensor = bundle_tensor()
    first = replay.load_bundle(tensor, SIG)
    assert replay.load_bundle(tensor, SIG) is first
    assert replay.load_bundle(bundle_tensor(), SIG).digest == first.digest == json.loads(SIG)["digest"]

    other = example_bundle(4, segment="other/warp_segment_1")
    with pytest.raises(ValueError, match="belong to different segments"):
        replay.load_bundle(bundle_tensor(other), SIG.replace(json.loads(SIG)["digest"], read_bundle(BUNDLE).digest[::-1]))
    with pytest.raises(ValueError, match="the bundle must be a uint8 tensor"):
        replay.load_bundle(torch.zeros(4, dtype=torch.int32), signature_json(read_bundle(other)))
    broken = bytearray(other)
    broken[200] ^= 1
    with pytest.raises(ValueError, match="whole-file sha256 mismatch"):
        replay.load_bundle(bundle_tensor(bytes(broken)), signature_json(read_bundle(other)))


def test_python_defined_op_when_library_missing(tmp_path):
    """Without libleapp_warp_torch.so, ops.py defines the schema in Python and replay.py serves it."""
    code = (
        "import torch\n"
        "from leapp.runtime import ops\n"
        "from leapp.bundle.testing import example_bundle\n"
        "from leapp.bundle import read_bundle, signature_json\n"
        "assert ops.ensure_registered() is False\n"
        "print(torch.ops.leapp.warp_segment.default._schema)\n"
        "b = example_bundle(4)\n"
        "try:\n"
        "    torch.ops.leapp.warp_segment([torch.ones(4)], torch.frombuffer(bytearray(b), dtype=torch.uint8),\n"
        "                                 signature_json(read_bundle(b)))\n"
        "except RuntimeError as e:\n"
        "    print('ERR', e)\n"
    )
    env = dict(os.environ, LEAPP_WARP_PT2_CUSTOM_OP_LIBRARY=str(tmp_path / "missing.so"))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert SCHEMA in proc.stdout
    assert "ERR leapp segment 'example/warp_segment_0' holds no CPU code for this machine" in proc.stdout


def test_fake_kernel_refuses_a_meta_bundle_with_real_inputs():
    """The fake kernel also serves the Meta dispatch key, which wins when any argument is on meta."""
    ops.ensure_registered()
    meta = torch.empty(len(BUNDLE), dtype=torch.uint8, device="meta")
    with pytest.raises(ValueError, match=r"leapp::warp_segment 'example/warp_segment_0': the bundle tensor is on the "
                                         r"meta device \(it holds no bytes\) while input 0 is on cpu"):
        torch.ops.leapp.warp_segment([torch.ones(4)], meta, SIG)
    with pytest.raises(ValueError, match=r"input 0 is on the meta device \(it holds no bytes\) while the bundle "
                                         r"tensor is on cpu"):
        torch.ops.leapp.warp_segment([torch.empty(4, device="meta")], bundle_tensor(), SIG)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():  # tracing: fake tensors on a device are fine
        (out,) = torch.ops.leapp.warp_segment([torch.empty(4)], torch.empty(len(BUNDLE), dtype=torch.uint8), SIG)
    assert out.shape == (4,) and out.dtype == torch.float32


def _signature_with(**output0) -> str:
    sig = json.loads(SIG)
    sig["outputs"][0].update(output0)
    return json.dumps(sig)


def test_python_load_bundle_checks_the_signature_on_every_call():
    replay.clear_cache()
    tensor = bundle_tensor()
    replay.load_bundle(tensor, SIG)
    for wrong in (_signature_with(dtype="int32"), _signature_with(shape=[2, 2])):
        with pytest.raises(ValueError, match=r"signature outputs\[0\] 'y' differs from the bundle's 'y'"):
            replay.load_bundle(tensor, wrong)
    assert replay.load_bundle(tensor, SIG).digest == json.loads(SIG)["digest"]


def test_python_load_bundle_sees_in_place_writes():
    replay.clear_cache()
    tensor = bundle_tensor()
    replay.load_bundle(tensor, SIG)
    tensor[200] ^= 1
    with pytest.raises(ValueError, match="whole-file sha256 mismatch"):
        replay.load_bundle(tensor, SIG)
    tensor[200] ^= 1
    assert replay.load_bundle(tensor, SIG).digest == json.loads(SIG)["digest"]


def test_python_load_bundle_reads_each_tensor_once(monkeypatch):
    from leapp import _native

    replay.clear_cache()
    reads = []
    real = _native.Bundle
    monkeypatch.setattr(_native, "Bundle", lambda data: reads.append(len(data)) or real(data))
    tensor = bundle_tensor()
    with torch.inference_mode():
        inference = bundle_tensor()
    for _ in range(5):
        replay.load_bundle(tensor, SIG)
        replay.load_bundle(inference, SIG)  # no version counter: read once per tensor all the same
    assert reads == [len(BUNDLE)] * 2


def test_python_load_bundle_new_tensor_with_an_old_id():
    """A tensor object freed and another created at its address (same id()) is read anew."""
    replay.clear_cache()
    broken = bytearray(BUNDLE)
    broken[200] ^= 1
    tensor = bundle_tensor()
    replay.load_bundle(tensor, SIG)
    old_id = id(tensor)
    del tensor
    for _ in range(1000):
        candidate = bundle_tensor(bytes(broken))
        if id(candidate) == old_id:
            break
    else:
        pytest.skip("CPython never reused the tensor's address")
    with pytest.raises(ValueError, match="whole-file sha256 mismatch"):
        replay.load_bundle(candidate, SIG)


def test_python_load_bundle_refuses_tensors_without_bytes():
    replay.clear_cache()
    with pytest.raises(ValueError, match=r"'example/warp_segment_0': the bundle must be a 1-D dense uint8 tensor with "
                                         r"data, got a 1-D torch.strided tensor on meta \(meta tensors hold no bytes\)"):
        replay.load_bundle(torch.empty(len(BUNDLE), dtype=torch.uint8, device="meta"), SIG)
    with pytest.raises(ValueError, match=r"got a 2-D torch.strided tensor on cpu"):
        replay.load_bundle(bundle_tensor().reshape(1, -1), SIG)


class _SegmentNode(torch.nn.Module):
    """A node as leapp exports it: the op with its bundle as a buffer."""

    def __init__(self):
        super().__init__()
        self.register_buffer("bundle", bundle_tensor())

    def forward(self, x):
        return torch.ops.leapp.warp_segment([x], self.bundle, SIG)[0]


_EXPORT_LOAD = (
    "import sys\n"
    "import torch\n"
    "import leapp\n"
    "program = torch.export.load(sys.argv[1])\n"
    "print(sum(n.target is torch.ops.leapp.warp_segment.default for n in program.graph.nodes),\n"
    "      'warp' in sys.modules, 'leapp._recorder' in sys.modules)\n"
)


def test_import_leapp_then_torch_export_load(tmp_path):
    """`import leapp` registers the op (like torchvision), so torch.export.load resolves it without leapp.load."""
    ops.ensure_registered()
    path = tmp_path / "node.pt2"
    torch.export.save(torch.export.export(_SegmentNode(), (torch.ones(4),)), str(path))
    for code in (_EXPORT_LOAD, _EXPORT_LOAD.replace("import torch\nimport leapp\n", "import leapp\nimport torch\n")):
        proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert proc.stdout.split() == ["1", "False", "False"], proc.stdout  # the op; no Warp, no recorder


def test_import_leapp_without_torch():
    """Without torch (no site-packages here), `import leapp` still works and imports nothing of torch."""
    root = str(Path(__file__).resolve().parents[2])
    code = f"import sys; sys.path.insert(0, {root!r}); import leapp; print('torch' in sys.modules, callable(leapp.trace))"
    proc = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["False", "True"]


def test_import_leapp_with_a_broken_op_library_warns(tmp_path):
    """A library that fails to load must not break `import leapp` (leapp-build-warp-runtime imports it)."""
    broken = tmp_path / "libleapp_warp_torch.so"
    broken.write_text("not a shared library")
    code = (
        "import warnings\n"
        "warnings.simplefilter('always')\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    import leapp\n"
        "print([str(w.message) for w in caught if w.category is RuntimeWarning])\n"
        "from leapp.runtime import ops\n"
        "try:\n"
        "    ops.ensure_registered()\n"
        "except OSError as e:\n"
        "    print('RAISES', type(e).__name__)\n"
    )
    env = dict(os.environ, LEAPP_WARP_PT2_CUSTOM_OP_LIBRARY=str(broken))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "leapp: torch.ops.leapp.warp_segment is not registered (OSError: " in proc.stdout
    assert proc.stdout.strip().endswith("RAISES OSError"), proc.stdout


def test_registration_is_idempotent_across_a_reload():
    import importlib

    ops.ensure_registered()
    kernel = torch._library.simple_registry.singleton.find(ops.OP_NAME).fake_impl.kernel
    importlib.reload(ops).ensure_registered()
    assert torch._library.simple_registry.singleton.find(ops.OP_NAME).fake_impl.kernel is kernel
    outs = torch.ops.leapp.warp_segment([torch.empty(4, device="meta")],
                                        torch.empty(len(BUNDLE), dtype=torch.uint8, device="meta"), SIG)
    assert [(o.shape, o.device.type) for o in outs] == [(torch.Size([4]), "meta")]


@pytest.mark.cuda
@pytest.mark.parametrize("kernel", ["native", "python"])
def test_cuda_bundle_writes_and_signatures_are_checked(kernel):
    """On a GPU, with the bundle tensor on the GPU: in-place writes are seen and every signature is checked."""
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    ops.ensure_registered()
    if kernel == "native" and not ops.native_library_loaded():
        pytest.skip("libleapp_warp_torch.so is not built")
    call = torch.ops.leapp.warp_segment if kernel == "native" else replay.warp_segment_cuda
    replay.clear_cache()
    n = 512
    data = example_bundle(n, segment=f"cuda/checks_{kernel}")
    sig = signature_json(read_bundle(data))
    bundle = bundle_tensor(data).cuda()
    x = torch.randn(n, device="cuda")
    want = x * torch.arange(1, n + 1, dtype=torch.float32, device="cuda")
    torch.testing.assert_close(call([x], bundle, sig)[0], want)
    wrong = json.loads(sig)
    wrong["outputs"][0]["shape"] = [n // 2, 2]
    with pytest.raises(ValueError, match=r"signature outputs\[0\] 'y' differs from the bundle's 'y'"):
        call([x], bundle, json.dumps(wrong))
    bundle[300] ^= 1  # a torch write on the GPU: the version counter moves
    with pytest.raises(ValueError, match="whole-file sha256 mismatch"):
        call([x], bundle, sig)
    bundle[300] ^= 1
    torch.testing.assert_close(call([x], bundle, sig)[0], want)


@pytest.mark.parametrize(("edit", "field"), [
    (lambda s: s["outputs"][0].update(dtype="manual_seed"), r"outputs\[0\]\.dtype must be one of"),
    (lambda s: s["outputs"][0].update(shape=[-4]), r"outputs\[0\]\.shape must be an array of non-negative"),
    (lambda s: s.update(batch={"min": 1, "traced": 4}), r"batch must be \{min, traced, max\}"),
    (lambda s: s["outputs"][0].update(batch_rule="x"), r"outputs\[0\]\.batch_rule must be \[a, b\]"),
])
def test_fake_kernel_refuses_a_malformed_signature_naming_the_field(edit, field):
    """The fake kernel (tracing, torch.export.load, AOTInductor) sizes outputs from the signature alone: a
    hostile string is refused with the field it breaks, not with a KeyError or a torch.empty of a function."""
    import json

    sig = json.loads(SIG)
    edit(sig)
    meta = torch.empty(len(BUNDLE), dtype=torch.uint8, device="meta")
    with pytest.raises(ValueError, match=r"leapp::warp_segment: malformed signature .*" + field):
        torch.ops.leapp.warp_segment([torch.empty(4, device="meta")], meta, json.dumps(sig))
