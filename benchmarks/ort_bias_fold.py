"""Kernel time of the robot policy (15-64-64-12 MLP, ELU) on ONNX Runtime's CUDA EP, per way of adding the bias.

The exported step's CUDA graph loses to the floor in the policy: ORT runs each linear
layer as MatMul then a broadcasting Add (its Gemm with a bias is slower: the bias is
broadcast by a GEMM of its own), where torch's addmm adds the bias in cuBLASLt's
epilogue. This script measures whether folding the bias into the GEMM helps ORT:

  matmul-add     MatMul + Add + Elu per layer (what leapp exports; MatMulAddFusion off)
  gemm           Gemm(x, W, b) + Elu (what torch's exporter writes; ORT's default fusions)
  ones-K         the input padded with a column of ones (one Pad), each weight given the
                 bias as an extra row and each hidden layer an extra output column that stays
                 1 (ELU(1) = 1), so every layer is one MatMul (+ Elu); hidden width padded to
                 K columns (65: just the ones column; 68/72: aligned, the rest zeros)
  torch          nn.Sequential of the same weights, the floor's policy (addmm + elu)

For each: kernels per run and kernel µs per run (torch.profiler, device time summed over
``--runs`` runs), the median of per-call CUDA-event times of the whole run replayed as a
CUDA graph (ORT's enable_cuda_graph; torch.cuda.graph for torch), and the largest
difference from a float64 reference.

    python benchmarks/ort_bias_fold.py --rows 256,4096

It needs torch and onnxruntime-gpu only (no Warp, no leapp build); per-call times come from
timing.py's ``time_calls``, the harness of the other benchmarks, which needs torch alone.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import torch

from timing import time_calls

SIZES = (15, 64, 64, 12)
FORMS = ("matmul-add", "gemm", "ones-65", "ones-68", "ones-72")  # the ONNX forms (``model``); torch is timed too


def weights(seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [((rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32), (rng.standard_normal(n) * 0.1).astype(np.float32))
            for k, n in zip(SIZES[:-1], SIZES[1:])]


def model(form: str, layers, rows: int):
    """The ONNX model of the MLP in ``form`` (``matmul-add``, ``gemm``, ``ones-K``)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    nodes, inits = [], []
    x = "x"
    last = len(layers) - 1
    width = int(form.split("-")[1]) if form.startswith("ones-") else None
    if width is not None:
        inits.append(numpy_helper.from_array(np.array([0, 0, 0, 1], dtype=np.int64), "pads"))
        inits.append(numpy_helper.from_array(np.array(1.0, dtype=np.float32), "one"))
        nodes.append(helper.make_node("Pad", ["x", "pads", "one"], ["x1"], mode="constant"))
        x = "x1"
    for i, (w, b) in enumerate(layers):
        y = f"h{i}" if i < last else "y"
        pre = f"p{i}" if i < last else y  # before the ELU
        if width is None:
            inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
            if form == "gemm":
                nodes.append(helper.make_node("Gemm", [x, f"w{i}", f"b{i}"], [pre]))
            else:
                nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [f"m{i}"]))
                nodes.append(helper.make_node("Add", [f"m{i}", f"b{i}"], [pre]))
        else:
            k_in = w.shape[0] + 1 if i == 0 else width
            n_out = width if i < last else w.shape[1]
            folded = np.zeros((k_in, n_out), dtype=np.float32)
            folded[: w.shape[0], : w.shape[1]] = w
            folded[w.shape[0], : w.shape[1]] = b  # the row the input's ones column meets
            if i < last:
                folded[w.shape[0], w.shape[1]] = 1.0  # carries the ones column to the next layer
            inits.append(numpy_helper.from_array(folded, f"w{i}"))
            nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [pre]))
        if i < last:
            nodes.append(helper.make_node("Elu", [pre], [y]))
        x = y
    graph = helper.make_graph(nodes, "policy", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, SIZES[0]])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, SIZES[-1]])], inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)  # what ORT 1.20+ reads
    onnx.checker.check_model(m)
    return m


def ort_call(m, x: torch.Tensor, y: torch.Tensor, graph: bool, form: str):
    import onnx
    import onnxruntime as ort

    path = Path(tempfile.mkdtemp(prefix="leapp-bias-")) / "m.onnx"
    onnx.save(m, path)
    options = ort.SessionOptions()
    if form == "matmul-add":  # as leapp.runtime.onnx_runner.CUDA_SESSION_CONFIG (leapp is not imported here)
        options.add_session_config_entry("optimization.disable_specified_optimizers", "MatMulAddFusion")
    cuda = {"device_id": "0", "use_tf32": "0", "enable_cuda_graph": "1" if graph else "0"}
    session = ort.InferenceSession(str(path), options, providers=[("CUDAExecutionProvider", cuda)])
    binding = session.io_binding()
    binding.bind_input("x", "cuda", 0, np.float32, list(x.shape), x.data_ptr())
    binding.bind_output("y", "cuda", 0, np.float32, list(y.shape), y.data_ptr())
    run = session.run_with_iobinding
    for _ in range(3):
        run(binding)
    torch.cuda.synchronize()
    return lambda: run(binding), session


def torch_call(layers, x: torch.Tensor, graph: bool):
    mods = []
    for i, (w, b) in enumerate(layers):
        lin = torch.nn.Linear(*w.shape)
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(w.T.copy()))
            lin.bias.copy_(torch.from_numpy(b))
        mods.append(lin)
        if i < len(layers) - 1:
            mods.append(torch.nn.ELU())
    net = torch.nn.Sequential(*mods).cuda().eval()
    with torch.no_grad():
        for _ in range(3):
            net(x)
        torch.cuda.synchronize()
        if not graph:
            return lambda: net(x), None
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = net(x)
    return g.replay, out


def kernel_time(call, runs: int) -> tuple[float, float]:
    """(kernels per run, kernel µs per run), from torch.profiler's device events."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(runs):
            call()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return len(kernels) / runs, sum(e.device_time for e in kernels) / runs


def reference(layers, x: torch.Tensor) -> torch.Tensor:
    h = x.double().cpu()
    for i, (w, b) in enumerate(layers):
        h = h @ torch.from_numpy(w).double() + torch.from_numpy(b).double()
        if i < len(layers) - 1:
            h = torch.nn.functional.elu(h)
    return h


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default="256,4096")
    parser.add_argument("--forms", default=",".join(FORMS))
    parser.add_argument("--runs", type=int, default=200, help="profiled runs per form")
    parser.add_argument("--calls", type=int, default=1000, help="timed graph replays per form")
    args = parser.parse_args()
    import onnxruntime as ort

    ort.preload_dlls()
    layers = weights()
    print(f"policy {'-'.join(map(str, SIZES))} float32, ELU; torch {torch.__version__}, onnxruntime {ort.__version__}, "
          f"{torch.cuda.get_device_name()}\n")
    print("| rows | form | kernels/run | kernel µs/run (profiler) | graph replay µs (events, median) | max abs error vs float64 |")
    print("|---:|---|---:|---:|---:|---:|")
    for rows in [int(r) for r in args.rows.split(",")]:
        x = torch.randn(rows, SIZES[0], device="cuda", generator=torch.Generator("cuda").manual_seed(1))
        want = reference(layers, x)
        for form in [*args.forms.split(","), "torch"]:
            y = torch.empty(rows, SIZES[-1], device="cuda")
            if form == "torch":
                plain, _ = torch_call(layers, x, graph=False)
                replay, out = torch_call(layers, x, graph=True)
                replay()
                torch.cuda.synchronize()
                got = out
            else:
                m = model(form, layers, rows)
                plain, _keep = ort_call(m, x, y, graph=False, form=form)
                replay, _keep2 = ort_call(m, x, y, graph=True, form=form)
                replay()
                torch.cuda.synchronize()
                got = y
            err = (got.double().cpu() - want).abs().max().item()
            med = time_calls(replay, args.calls, warmup=0)["median_us"]
            n, us = kernel_time(plain, args.runs)
            print(f"| {rows} | {form} | {n:.1f} | {us:.1f} | {med:.1f} | {err:.3g} |", flush=True)


if __name__ == "__main__":
    main()
