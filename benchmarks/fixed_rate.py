"""A policy step at a fixed rate, as a control loop runs it: latency percentiles and missed deadlines per route.

Routes, each on the same step and inputs, started at absolute times t0 + k / rate:

  leapp-run        `leapp-run EXPORT --rate HZ --duration S` (C++, no Python; ONNX Runtime threads as leapp sets them)
  leapp.load       the exported pipeline in Python
  eager            the step in PyTorch (plus Warp where the example has it), under torch.no_grad
  onnxruntime      the export's policy node alone in an onnxruntime.InferenceSession (ORT's defaults)

A step that ends after its period is a missed deadline. Default: examples/cpu_policy.py's step on the
CPU (three ONNX nodes, one robot). ``--device cuda``: examples/go2_pipeline.py's step (obs: PT2 with Warp,
run by leapp-run from its AOTInductor package; policy and action ONNX) for ``--envs`` robots on cuda:0, each
route synchronised at the end of its step; leapp-run runs it twice, as one CUDA graph and node by node
(``--no-graph``), and
ONNX Runtime alone runs the policy on its CUDA EP through an IOBinding on device tensors. The Python loops
sleep with time.sleep, so their wake-up jitter is part of what they measure, as it would be in a Python
control loop.

    python3 benchmarks/fixed_rate.py [--rate 1000] [--duration 60] [--device cuda [--envs 64]]
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]


def _example():
    spec = importlib.util.spec_from_file_location("cpu_policy", ROOT / "examples" / "cpu_policy.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _python_loop(step, rate: int, duration: float) -> dict:
    period = 1.0 / rate
    steps = max(1, int(rate * duration))
    latency = np.empty(steps)
    missed = 0
    t0 = time.perf_counter() + period
    for k in range(steps):
        due = t0 + k * period
        pause = due - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
        start = time.perf_counter()
        step()
        end = time.perf_counter()
        latency[k] = (end - start) * 1e6
        missed += end > due + period
    return {"steps": steps, "p50": np.percentile(latency, 50), "p99": np.percentile(latency, 99),
            "p99.9": np.percentile(latency, 99.9), "max": latency.max(), "missed": missed}


def _leapp_run(export: Path, inputs: Path, out: Path, rate: int, duration: float, *flags: str) -> dict:
    from leapp.testing.cpp_runner import leapp_run_env  # the onnxruntime this Python imports (onnxruntime-gpu)

    leapp_run = Path(sys.executable).with_name("leapp-run")
    r = subprocess.run([str(leapp_run), str(export), "--in", str(inputs), "--out", str(out), "--rate", str(rate),
                        "--duration", str(duration), *flags], capture_output=True, text=True, check=True,
                       env=leapp_run_env())
    m = re.search(r"(\d+) steps .* p50 ([\d.]+)  p99 ([\d.]+)  p99\.9 ([\d.]+)  max ([\d.]+); missed deadlines (\d+)",
                  r.stdout)
    steps, p50, p99, p999, worst, missed = (float(v) for v in m.groups())
    how = re.search(r"^step: (.*)$", r.stdout, re.M)  # on the device: one CUDA graph, or why not
    return {"steps": int(steps), "p50": p50, "p99": p99, "p99.9": p999, "max": worst, "missed": int(missed),
            "how": how.group(1) if how else ""}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=1000, help="steps per second")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds per route")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--envs", type=int, default=64, help="--device cuda: robots per step")
    parser.add_argument("--extra-duration", type=float, default=None,
                        help="--device cuda: seconds for the two comparison routes (leapp-run node by node, "
                        "leapp.load); default --duration")
    args = parser.parse_args(argv)
    rows, what = (_cuda_rows if args.device == "cuda" else _cpu_rows)(args)
    print(f"{args.rate} Hz for {args.duration:g} s per route, {what}; latency in us")
    print("| route | steps | p50 | p99 | p99.9 | max | missed deadlines |")
    print("|---|---|---|---|---|---|---|")
    for name, r in rows.items():
        print(f"| {name} | {r['steps']} | {r['p50']:.1f} | {r['p99']:.1f} | {r['p99.9']:.1f} | {r['max']:.1f} | "
              f"{r['missed']} |")
    for name, r in rows.items():
        if r.get("how"):
            print(f"{name}: step {r['how']}")
    return 0


def _cpu_rows(args) -> tuple[dict, str]:
    import onnxruntime as ort

    import leapp

    example = _example()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        subprocess.run([sys.executable, str(ROOT / "examples" / "cpu_policy.py"), "--out", str(tmp)], check=True,
                       capture_output=True)
        export = tmp / "go2_cpu"
        quat, joints = example.random_state(1, seed=7)
        (tmp / "in").mkdir()
        quat.numpy().tofile(tmp / "in" / "quat.bin")
        joints.numpy().tofile(tmp / "in" / "joints.bin")
        pipeline = leapp.load(export)
        session = ort.InferenceSession(str(export / "policy.onnx"), providers=["CPUExecutionProvider"])
        obs = {session.get_inputs()[0].name: torch.cat([example.projected_gravity(quat), joints], dim=-1).numpy()}

        def eager():
            with torch.no_grad():
                example.step(quat, joints)

        rows = {
            "leapp-run": _leapp_run(export, tmp / "in", tmp / "out", args.rate, args.duration),
            "leapp.load": _python_loop(lambda: pipeline(quat=quat, joints=joints), args.rate, args.duration),
            "eager": _python_loop(eager, args.rate, args.duration),
            "onnxruntime (policy alone)": _python_loop(lambda: session.run(None, obs), args.rate, args.duration),
        }
    return rows, "examples/cpu_policy.py's step on the CPU"


def _cuda_rows(args) -> tuple[dict, str]:
    import onnxruntime as ort

    from leapp.runtime.pipeline import load

    sys.path.insert(0, str(ROOT / "examples"))
    import go2_pipeline

    device = "cuda:0"
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        subprocess.run([sys.executable, str(ROOT / "examples" / "go2_pipeline.py"), "--envs", str(args.envs),
                        "--out", str(tmp)], check=True, capture_output=True)
        export = tmp / "go2"
        import leapp.aoti

        leapp.aoti.package(export, "obs")  # leapp-run runs a PT2 node from its AOTInductor package
        quat, joints = go2_pipeline.random_state(args.envs, device, seed=7)
        (tmp / "in").mkdir()
        quat.cpu().numpy().tofile(tmp / "in" / "quat.bin")
        joints.cpu().numpy().tofile(tmp / "in" / "joints.bin")
        robot = go2_pipeline.Go2(device)  # the example's network: the same seeded weights it exported
        pipeline = load(export, onnx_ep="cuda")  # the CUDA EP, as leapp-run
        with torch.no_grad():
            obs = pipeline.run_node("obs", quat=quat, joints=joints)["obs"].contiguous()
            raw = pipeline.run_node("policy", obs=obs)["output"].contiguous()
        session = ort.InferenceSession(str(export / "policy.onnx"),
                                       providers=[("CUDAExecutionProvider", {"device_id": 0, "use_tf32": 0})])
        binding = session.io_binding()
        binding.bind_input(session.get_inputs()[0].name, "cuda", 0, np.float32, list(obs.shape), obs.data_ptr())
        binding.bind_output(session.get_outputs()[0].name, "cuda", 0, np.float32, list(raw.shape), raw.data_ptr())

        def synced(step):
            def run():
                with torch.no_grad():
                    step()
                torch.cuda.synchronize()
            return run

        extra = args.extra_duration or args.duration
        rows = {
            "leapp-run, one CUDA graph": _leapp_run(export, tmp / "in", tmp / "out", args.rate, args.duration,
                                                    "--device", "cuda"),
            "leapp-run, node by node": _leapp_run(export, tmp / "in", tmp / "out", args.rate, extra,
                                                  "--device", "cuda", "--no-graph"),
            "leapp.load": _python_loop(synced(lambda: pipeline(quat=quat, joints=joints)), args.rate, extra),
            "eager (PyTorch + Warp)": _python_loop(synced(lambda: robot.step(quat, joints)), args.rate, args.duration),
            "onnxruntime (policy alone, CUDA EP)": _python_loop(lambda: session.run_with_iobinding(binding), args.rate,
                                                                args.duration),
        }
    return rows, f"examples/go2_pipeline.py's step, {args.envs} robots on {torch.cuda.get_device_name(0)}"


if __name__ == "__main__":
    sys.exit(main())
