"""Per-step latency of the C++ runner (``leapp-run --time N``) next to ``leapp.load`` on the same export.

    python benchmarks/cpp_runner.py EXPORT_DIR --device cuda [--steps 300] [--warmup 50]
    python benchmarks/cpp_runner.py --demo --device cpu          # records a small ONNX export first

Both sides get the same seeded inputs (random normal, per pipeline.yaml's dtypes and shapes). The C++
side is ``leapp-run EXPORT --in IN --out OUT --time N --device D``: its per-node medians (host wall
clock; with ``--device cuda`` each node is synchronised when timing) and its total (median over runs of
the per-node sum), run with ``--no-graph``; on CUDA a second run without it gives the whole step replayed as
one CUDA graph (docs/deploy.md, "A step as one CUDA graph"; a PT2 node keeps it node by node). The Python side is ``leapp.load(EXPORT, onnx_ep=D)`` on tensors on D: per node,
``run_node`` on the values a full run produced; per step, ``pipeline(**inputs)``; each call timed with
``time.perf_counter`` around the call and a ``torch.cuda.synchronize()`` (the latency a control loop
sees). The table gives medians in µs; the last line the largest difference between the two outputs.
Routes differ for PT2 nodes: leapp-run runs their AOTInductor package (``leapp aoti``), leapp.load the
exported program. Nothing here is a measurement until it is run: see docs/deploy.md for recorded ones.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import leapp
from leapp.runtime.pipeline import load as leapp_load  # leapp.load with onnx_ep (the execution provider leapp-run uses)


def leapp_run_binary() -> Path:
    path = Path(sys.executable).with_name("leapp-run")
    if not path.is_file():
        raise SystemExit(f"{path} is missing: leapp was built without ONNX Runtime's headers (docs/deploy.md)")
    return path


def demo_export(folder: Path) -> Path:
    """A CPU export of two ONNX nodes (an MLP policy and a clamp) for trying the script without a GPU."""
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(48, 256), torch.nn.ELU(), torch.nn.Linear(256, 128), torch.nn.ELU(),
                              torch.nn.Linear(128, 12))

    @leapp.node("policy", export_with="onnx")
    def policy(obs):
        return mlp(obs)

    @leapp.node("post", export_with="onnx")
    def post(raw):
        return torch.clamp(raw, -1.0, 1.0) * 0.25

    obs = torch.randn(64, 48)
    with leapp.trace("demo", save_path=folder) as session, torch.no_grad():
        for _ in range(3):
            post(policy(obs))
    session.compile(validate=False)
    return folder / "demo"


def make_inputs(pipeline, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, spec in pipeline.inputs.items():
        if spec.dtype.is_floating_point:
            out[name] = torch.randn(spec.shape, generator=g).to(spec.dtype)
        else:
            out[name] = torch.randint(0, 4, spec.shape, generator=g).to(spec.dtype)
    return out


def run_cpp(export: Path, inputs: dict[str, torch.Tensor], device: str, steps: int, work: Path,
            graph: bool = False) -> tuple[dict, dict]:
    """(node -> median ms incl. 'total', output name -> tensor) from leapp-run; ``graph``: the whole step's median
    as 'step' when leapp-run replays it as one CUDA graph (per-node times need it off: --no-graph)."""
    from leapp.testing.cpp_runner import value_file

    in_dir, out_dir = work / "in", work / ("out-graph" if graph else "out")
    in_dir.mkdir(exist_ok=True)
    for name, t in inputs.items():
        value_file(in_dir, name).write_bytes(t.contiguous().numpy().tobytes())
    cmd = [str(leapp_run_binary()), str(export), "--in", str(in_dir), "--out", str(out_dir), "--time", str(steps),
           "--device", device] + ([] if graph else ["--no-graph"])
    from leapp.testing.cpp_runner import leapp_run_env  # the ORT leapp.load runs here

    r = subprocess.run(cmd, capture_output=True, text=True, env=leapp_run_env())
    if r.returncode != 0:
        raise SystemExit(f"leapp-run failed (exit {r.returncode}): {r.stderr.strip()}")
    medians = {}
    for line in r.stdout.splitlines():
        m = re.match(r"^\s{2}(\S+)\s+([0-9.]+)(?:\s+\((\S+)\))?$", line)
        if m:
            medians[m.group(1)] = (float(m.group(2)), m.group(3) or "")
    return medians, {p.stem: p for p in out_dir.glob("*.bin")}


def timed(fn, steps: int, warmup: int, cuda: bool) -> float:
    """Median seconds of ``fn()`` over ``steps`` calls after ``warmup`` calls, synchronised each call on CUDA."""
    for _ in range(warmup):
        fn()
    if cuda:
        torch.cuda.synchronize()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def run_python(export: Path, inputs: dict[str, torch.Tensor], device: str, steps: int, warmup: int):
    """(node -> median s, step median s, outputs) from leapp.load."""
    pipeline = leapp_load(export, onnx_ep=device)
    dev = torch.device("cuda:0" if device == "cuda" else "cpu")
    args = {k: v.to(dev) for k, v in inputs.items()}
    cuda = dev.type == "cuda"
    with torch.no_grad():
        outputs = pipeline(**args)
        produced: dict[tuple[str, str], torch.Tensor] = {}
        per_node = {}
        for node in pipeline.nodes.values():
            kwargs = {spec.name: (produced[src] if isinstance(src, tuple) else args[src])
                      for spec in node.inputs for src in [node.sources[spec.name]]}
            result = pipeline.run_node(node.name, **kwargs)
            produced.update({(node.name, k): v for k, v in result.items()})
            per_node[node.name] = timed(lambda n=node.name, kw=kwargs: pipeline.run_node(n, **kw), steps, warmup, cuda)
        step = timed(lambda: pipeline(**args), steps, warmup, cuda)
    return per_node, step, outputs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("export", nargs="?", help="an export folder (PT2 nodes need `leapp aoti` first)")
    parser.add_argument("--demo", action="store_true", help="record a small two-node ONNX export and use it")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=50, help="leapp.load's warm-up calls (leapp-run warms up once)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not args.export and not args.demo:
        parser.error("give EXPORT_DIR or --demo")
    with tempfile.TemporaryDirectory(prefix="leapp-cpp-bench-") as tmp:
        work = Path(tmp)
        export = demo_export(work / "export") if args.demo else Path(args.export)
        pipeline = leapp_load(export, onnx_ep=args.device)
        inputs = make_inputs(pipeline, args.seed)
        cpp, cpp_outputs = run_cpp(export, inputs, args.device, args.steps, work)
        graphed = run_cpp(export, inputs, args.device, args.steps, work, graph=True)[0] if args.device == "cuda" else {}
        py_nodes, py_step, py_outputs = run_python(export, inputs, args.device, args.steps, args.warmup)

        print(f"export {export}: device {args.device}, {args.steps} timed runs, torch {torch.__version__}")
        print("| node | leapp-run median (µs) | runs as | leapp.load median (µs) |")
        print("|---|---:|---|---:|")
        for name in pipeline.nodes:
            ms, how = cpp.get(name, (float("nan"), "?"))
            print(f"| {name} | {1e3 * ms:.1f} | {how} | {1e6 * py_nodes[name]:.1f} |")
        total = cpp.get("total", (float("nan"), ""))[0]
        print(f"| whole step | {1e3 * total:.1f} (sum of nodes) | | {1e6 * py_step:.1f} (one call) |")
        if "step" in graphed:
            print(f"| whole step, one CUDA graph | {1e3 * graphed['step'][0]:.1f} | cuda-graph | |")
        worst = 0.0
        for name, want in py_outputs.items():
            got = torch.frombuffer(bytearray(cpp_outputs[name].read_bytes()), dtype=want.dtype).reshape(want.shape)
            worst = max(worst, (got.double() - want.cpu().double()).abs().max().item() if want.numel() else 0.0)
        print(f"max |leapp-run - leapp.load| over the outputs: {worst:.3e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
