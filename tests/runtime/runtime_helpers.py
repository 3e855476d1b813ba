"""Helpers shared by the runtime tests: ONNX models with a WarpSegment node, library lookups."""

from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from leapp.bundle import read_bundle, signature_json

ONNX_TYPES = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "float64": TensorProto.DOUBLE,
              "int8": TensorProto.INT8, "int16": TensorProto.INT16, "int32": TensorProto.INT32,
              "int64": TensorProto.INT64, "uint8": TensorProto.UINT8, "bool": TensorProto.BOOL}


def signature_of(bundle: bytes) -> str:
    return signature_json(read_bundle(bundle))


def warp_segment_model(bundle: bytes, signature: str | None = None, *, dynamic: bool = False,
                       node_name: str = "seg0", like: bytes | None = None) -> bytes:
    """A serialized ONNX model: graph inputs = the segment's inputs, one WarpSegment node, outputs = the segment's.

    The graph's structure follows ``like`` (default: ``bundle``, which may then not be corrupt);
    ``signature`` (default: the bundle's) is only the node attribute.
    """
    sig = json.loads(signature_of(like if like is not None else bundle))
    signature = signature if signature is not None else signature_of(bundle)

    def dims(shape):
        return [f"d{i}" for i in range(len(shape))] if dynamic else list(shape)

    inputs = [helper.make_tensor_value_info(t["name"], ONNX_TYPES[t["dtype"]], dims(t["shape"])) for t in sig["inputs"]]
    outputs = [helper.make_tensor_value_info(t["name"], ONNX_TYPES[t["dtype"]], dims(t["shape"])) for t in sig["outputs"]]
    init = numpy_helper.from_array(np.frombuffer(bundle, dtype=np.uint8), "bundle")
    node = helper.make_node("WarpSegment", [t["name"] for t in sig["inputs"]] + ["bundle"],
                            [t["name"] for t in sig["outputs"]], domain="leapp.warp", name=node_name,
                            signature=signature)
    graph = helper.make_graph([node], "g", inputs, outputs, [init])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("leapp.warp", 1)])
    model.ir_version = 9
    return model.SerializeToString()


def ort_session(model: bytes, providers=("CPUExecutionProvider",), config: dict | None = None):
    """A session with leapp's op library; ``config``: session config entries (``session.disable_cpu_ep_fallback``)."""
    import onnxruntime as ort

    from leapp.runtime import libraries

    options = ort.SessionOptions()
    options.register_custom_ops_library(str(libraries.require_library("onnx")))
    for key, value in (config or {}).items():
        options.add_session_config_entry(key, value)
    return ort.InferenceSession(model, options, providers=list(providers))


__all__ = ["warp_segment_model", "ort_session", "signature_of", "onnx"]


def build_mock_driver(out_dir):
    """Compiles tests/runtime/mock_cuda/mock_libcuda.c into ``out_dir``/libcuda.so.1; None without a C compiler."""
    import shutil
    import subprocess
    from pathlib import Path

    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        return None
    source = Path(__file__).resolve().parent / "mock_cuda" / "mock_libcuda.c"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-pthread", "-o", str(Path(out_dir) / "libcuda.so.1"), str(source)],
                   check=True, capture_output=True, text=True)
    return Path(out_dir)


def mock_driver_env(mock_dir, **extra) -> dict:
    """The environment of a subprocess whose dlopen("libcuda.so.1") finds the fake driver."""
    import os

    env = dict(os.environ)
    for name in ("LEAPP_CUDA_DEVICE", "LEAPP_WARP_PT2_CUSTOM_OP_LIBRARY", "LEAPP_WARP_ONNX_CUSTOM_OP_LIBRARY"):
        env.pop(name, None)
    env.update(LD_LIBRARY_PATH=f"{mock_dir}:{env.get('LD_LIBRARY_PATH', '')}", LEAPP_MOCK_CUDA="1",
               MOCK_DEVICES="2", MOCK_CC="90", MOCK_MAX_PTX="90", MOCK_DRIVER_VERSION="13000")
    env.update({k: str(v) for k, v in extra.items()})
    return env


def build_torch_test_library(out_path, source=None, opt: str = "-O0"):
    """Compiles ext/torch/leapp_warp_torch.cpp (or ``source``) + ext/core with LEAPP_TORCH_TEST_CPU_AS_CUDA.

    The library serves CPU tensors with the op's CUDA kernel, for the fake driver. Returns the
    compiler's CompletedProcess; raises LookupError without a C++ compiler or torch's C++ headers.
    """
    import shutil
    import subprocess
    from pathlib import Path

    import torch

    ext = Path(__file__).resolve().parents[2] / "ext"
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        raise LookupError("no C++ compiler")
    root = Path(torch.__file__).parent
    if not (root / "include" / "torch" / "library.h").is_file():
        raise LookupError("this torch ships no C++ headers")
    abi = int(torch.compiled_with_cxx11_abi())
    cmd = [cxx, "-std=c++20", opt, "-shared", "-fPIC", "-DLEAPP_TORCH_TEST_CPU_AS_CUDA",
           f"-D_GLIBCXX_USE_CXX11_ABI={abi}", f"-I{ext / 'core' / 'include'}", f"-I{root / 'include'}",
           f"-I{root / 'include' / 'torch' / 'csrc' / 'api' / 'include'}",
           str(source or ext / "torch" / "leapp_warp_torch.cpp"),
           *map(str, sorted((ext / "core" / "src").glob("*.cpp"))), f"-L{root / 'lib'}", "-ltorch", "-ltorch_cpu",
           "-lc10", "-ldl", f"-Wl,-rpath,{root / 'lib'}", "-o", str(out_path)]
    return subprocess.run(cmd, capture_output=True, text=True)


def record_mlp(save_path, dynamic_batch=None):
    """Two ONNX nodes recorded on the CPU into ``save_path/mlp``: policy (obs[16, 48] -> [16, 12], an MLP) and post
    (clamp, scale and offset by default_pos[16, 12]); the C++ runner's tests share it."""
    import torch

    import leapp

    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(48, 64), torch.nn.ELU(), torch.nn.Linear(64, 12))

    @leapp.node("policy", export_with="onnx", dynamic_batch=dynamic_batch)
    def policy(obs):
        return mlp(obs)

    @leapp.node("post", export_with="onnx", dynamic_batch=dynamic_batch)
    def post(actions, default_pos):
        return torch.clamp(actions, -5.0, 5.0) * 0.25 + default_pos

    obs, default_pos = torch.randn(16, 48), torch.randn(16, 12)
    with leapp.trace("mlp", save_path=save_path) as session, torch.no_grad():
        for _ in range(3):
            post(policy(obs), default_pos)
    session.compile(validate=False)
    return save_path / "mlp"
