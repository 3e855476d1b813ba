"""Replay latency of an exported 2-kernel Warp segment against eager Warp and a CUDA-graph floor.

For each size N the script traces one pipeline with the same segment in two
nodes (PT2 and ONNX), exports it (timed: ``session.compile(validate=False)``)
and measures per call, after a warm-up, with CUDA events and a host clock:

  eager           the node's Python function run eagerly: wp.from_torch, torch.empty,
                  a scratch wp.empty and two wp.launch on torch's stream
  eager-launches  the two wp.launch alone, on prebuilt arrays (eager's launch cost)
  pt2             the exported node's program as leapp.load runs it: its graph called
                  directly (leapp.runtime.pt2_program.Pt2Program)
  pt2-module      the same program through torch's wrapper: torch.export.load(...).module()
  pt2-pipeline    the whole user call: leapp.load(folder).run_node(...) with input checks
  pt2-op          the bare torch.ops.leapp.warp_segment call the graph makes (dispatcher + replay)
  pt2-cuda-graphs the direct call as leapp.load(..., cuda_graphs=True) runs it: captured on its
                  second call with the same input tensor, replayed as one CUDA graph after
  pt2-graph       the direct call captured once with torch.cuda.graph, then replayed
  native          the bundle through leapp._native.run_segment (core runtime, outputs prebuilt)
  onnx-cpu-ep     the ONNX artifact in ONNX Runtime's CPU EP: the op stages inputs and
                  outputs through pinned host memory (host tensors in and out)
  floor           the two kernels captured as a CUDA graph (wp.ScopedCapture) and replayed

Each call is synchronised before the next: the numbers are the latency of one
call (what a control loop sees), not back-to-back throughput. Also: the cold
first call of the PT2 op in a fresh process, and device allocations per call
after warm-up. ``--dry-run`` runs without a GPU: it traces and exports on the
CPU, opens the artifacts and checks the harness, and measures nothing on a GPU.

    python benchmarks/replay.py                 # full run (GPU), Markdown table on stdout
    python benchmarks/replay.py --quick --json results.json
    python benchmarks/replay.py --dry-run       # CPU: build and export only
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import warp as wp

import leapp
from leapp import annotate
from replay_report import markdown, targets
from timing import time_calls

SIZES = (1, 1024, 262144)
SCALE = 2.0
KERNELS = 2  # launches per segment (--kernels): scale_k, then add_k (K - 1) times; y = x * SCALE + (K - 1) * x


@wp.kernel
def scale_k(x: wp.array(dtype=float), s: float, tmp: wp.array(dtype=float)):
    i = wp.tid()
    tmp[i] = x[i] * s


@wp.kernel
def add_k(tmp: wp.array(dtype=float), x: wp.array(dtype=float), y: wp.array(dtype=float)):
    i = wp.tid()
    y[i] = tmp[i] + x[i]


def launch_chain(n: int, xw, tmp, tmp2, yw, device: str):
    """The segment's KERNELS launches: tmp = x * SCALE, then tmp' = tmp + x ping-ponging between the
    scratch arrays, the last one writing y."""
    wp.launch(scale_k, dim=n, inputs=[xw, SCALE], outputs=[tmp], device=device)
    cur, other = tmp, tmp2
    for _ in range(KERNELS - 2):
        wp.launch(add_k, dim=n, inputs=[cur, xw], outputs=[other], device=device)
        cur, other = other, cur
    wp.launch(add_k, dim=n, inputs=[cur, xw], outputs=[yw], device=device)


def expected(x: torch.Tensor) -> torch.Tensor:
    return x * SCALE + (KERNELS - 1) * x


def make_node(name: str, backend: str):
    """The user's node: a scratch array and two launches in one warp_op; eager outside a session."""

    def node(x: torch.Tensor) -> torch.Tensor:
        with leapp.node(name, export_with=backend):
            x = annotate.input_tensors(name, {"x": x})
            y = torch.empty_like(x)
            device = str(x.device)
            with annotate.warp_op():
                tmp = wp.empty(x.shape[0], dtype=float, device=device)
                tmp2 = wp.empty(x.shape[0], dtype=float, device=device) if KERNELS > 2 else None
                launch_chain(x.shape[0], wp.from_torch(x), tmp, tmp2, wp.from_torch(y), device)
            annotate.output_tensors(name, {"y": y})
        return y

    return node


NODES = {"pt2": make_node("seg_pt2", "pt2"), "onnx": make_node("seg_onnx", "onnx")}


def export(n: int, device: str, out: Path) -> tuple[Path, float]:
    """Traces both nodes at size n (2 passes + 1 sample) and exports; returns (folder, export seconds)."""
    name = f"replay_{n}"
    gen = torch.Generator().manual_seed(n)
    with leapp.trace(name, save_path=str(out)) as session:
        for _ in range(3):
            x = torch.randn(n, generator=gen).to(device)
            for node in NODES.values():
                node(x)
    t0 = time.perf_counter()
    session.compile(validate=False)
    return out / name, time.perf_counter() - t0


# --- measuring ------------------------------------------------------------------------------------


def cold_first_call(folder: Path, n: int, device: str, runs: int) -> dict:
    """Fresh processes: CUDA context first (not timed), then loading the program as leapp.load does
    (``Pt2Program(load_pt2(path))``) and the first call, wall clock.

    ``load_again_ms`` loads the same file once more in that process: the difference to ``load_ms`` is
    torch's one-time import of its export machinery.
    """
    code = (
        "import json, sys, time, torch\n"
        "from leapp.runtime.runners import load_pt2\n"
        "from leapp.runtime.pt2_program import Pt2Program\n"
        "path, n, device = sys.argv[1], int(sys.argv[2]), sys.argv[3]\n"
        "x = torch.randn(n, device=device)\n"
        "if device.startswith('cuda'): torch.cuda.synchronize()\n"
        "t0 = time.perf_counter(); module = Pt2Program(load_pt2(path)); t1 = time.perf_counter()\n"
        "first = None\n"
        "if device.startswith('cuda'):\n"
        "    module(x); torch.cuda.synchronize(); first = time.perf_counter() - t1\n"
        "t2 = time.perf_counter(); Pt2Program(load_pt2(path)); again = time.perf_counter() - t2\n"
        "print(json.dumps({'load_s': t1 - t0, 'first_call_s': first, 'load_again_s': again,\n"
        "                  'warp_imported': 'warp' in sys.modules}))\n"
    )
    loads, firsts, agains, warp_imported = [], [], [], False
    for _ in range(runs):
        proc = subprocess.run([sys.executable, "-c", code, str(folder / "seg_pt2.pt2"), str(n), device],
                              capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            raise RuntimeError(f"cold-start process failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        loads.append(result["load_s"] * 1e3)
        agains.append(result["load_again_s"] * 1e3)
        warp_imported |= result["warp_imported"]
        if result["first_call_s"] is not None:
            firsts.append(result["first_call_s"] * 1e3)
    return {
        "runs": runs,
        "load_ms": statistics.median(loads),
        "load_again_ms": statistics.median(agains),
        "first_call_ms": statistics.median(firsts) if firsts else None,
        "load_plus_first_call_ms": statistics.median([a + b for a, b in zip(loads, firsts)]) if firsts else None,
        "warp_imported": warp_imported,
    }


# --- the methods ----------------------------------------------------------------------------------


def methods(folder: Path, n: int, device: str) -> dict:
    """name -> zero-argument callable running one call at size n (every input prepared beforehand)."""
    from leapp import _native
    from leapp.runtime import libraries
    from leapp.runtime.runners import load_pt2
    from leapp.runtime.cuda_graphs import CudaGraphCall
    from leapp.runtime.pt2_program import Pt2Program

    x = torch.randn(n, device=device)
    node = NODES["pt2"]
    xw, tmp, y = wp.from_torch(x), wp.empty(n, dtype=float, device=device), wp.from_torch(torch.empty_like(x))
    tmp2 = wp.empty(n, dtype=float, device=device)

    def launches():
        launch_chain(n, xw, tmp, tmp2, y, device)

    launches()  # module loaded before any capture
    replay_stream = wp.get_stream(device)  # torch's current stream (run() scopes it)
    with wp.ScopedStream(wp.Stream(device)), wp.ScopedCapture(device=device) as capture:
        launches()  # captured on a stream of its own: torch's default stream is the legacy one, which cannot capture
    floor_graph = capture.graph

    program = load_pt2(folder / "seg_pt2.pt2")
    module = program.module()
    direct = Pt2Program(program)
    assert direct.direct, direct.reason
    pipeline = leapp.load(folder)
    bundle_tensor = next(v for k, v in program.state_dict.items() if k.endswith("_bundle"))
    bundle = _native.Bundle(bundle_tensor.numpy().tobytes())
    native_in, native_out = native_buffers(bundle, x)

    import onnxruntime as ort

    options = ort.SessionOptions()
    options.register_custom_ops_library(str(libraries.library_path("onnx")))
    session = ort.InferenceSession(str(folder / "seg_onnx.onnx"), options, providers=["CPUExecutionProvider"])
    host_x, host_y = x.cpu(), torch.empty(n)
    binding = session.io_binding()
    binding.bind_input(session.get_inputs()[0].name, "cpu", 0, 1, [n], host_x.data_ptr())
    binding.bind_output(session.get_outputs()[0].name, "cpu", 0, 1, [n], host_y.data_ptr())

    out = {
        "eager": lambda: node(x),
        "eager-launches": launches,
        "pt2": lambda: direct(x),
        "pt2-module": lambda: module(x),
        "pt2-pipeline": lambda: pipeline.run_node("seg_pt2", x=x),
    }
    if device.startswith("cuda"):
        (call,) = [c for c in program.graph.nodes if c.op == "call_function" and "warp_segment" in str(c.target)]
        op_bundle, signature = bundle_tensor, call.args[2]  # what the graph passes
        out["pt2-op"] = lambda: torch.ops.leapp.warp_segment.default([x], op_bundle, signature)
        graphed = CudaGraphCall(direct, "seg_pt2")
        out["pt2-cuda-graphs"] = lambda: graphed(x)
        out["pt2-graph"] = _graphed(direct, x)
        index = torch.device(device).index or 0
        in_ptrs, out_ptrs = [t.data_ptr() for t in native_in], [t.data_ptr() for t in native_out]
        stream = torch.cuda.current_stream().cuda_stream
        out["native"] = lambda: _native.run_segment(bundle, in_ptrs, out_ptrs, stream, index)
    # The binding holds raw pointers: the lambda keeps the host tensors alive (a dangling binding
    # corrupted the heap once they were collected).
    out["onnx-cpu-ep"] = lambda host=(host_x, host_y): session.run_with_iobinding(binding)
    # The graph holds raw addresses too: keep its buffers alive with it (a caller that kept only this
    # entry freed tmp into Warp's mempool and the replay faulted: illegal address, onnx_routes.py on the H200).
    out["floor"] = lambda keep=(x, xw, tmp, tmp2, y): wp.capture_launch(floor_graph, stream=replay_stream)
    return out


def native_buffers(bundle, x: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Inputs and outputs for ``leapp._native.run_segment``: ``x`` for each real input, a fresh tensor for an
    input that only seeds an output (``init: {"input": j}``: the node's torch.empty output, allocated before
    the warp_op block), and prebuilt outputs."""
    manifest = json.loads(bundle.manifest_json)
    seeds = {b["init"]["input"] for b in manifest["buffers"]
             if b["role"] == "output" and isinstance(b.get("init"), dict) and "input" in b["init"]}
    inputs = [torch.empty_like(x) if j in seeds else x for j in range(len(bundle.inputs))]
    outputs = [torch.empty(tuple(o["shape"]), dtype=getattr(torch, o["dtype"]), device=x.device)
               for o in bundle.outputs]
    return inputs, outputs


def _graphed(module, x):
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            module(x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        module(x)
    return graph.replay


def check_results(folder: Path, n: int, device: str) -> float:
    """Largest |pt2 - eager| at size n over the PT2 callables (direct, .module(), and replayed from a
    CUDA graph: direct, capture, replay): the benchmark times the right computation."""
    from leapp.runtime.cuda_graphs import CudaGraphCall
    from leapp.runtime.runners import load_pt2
    from leapp.runtime.pt2_program import Pt2Program

    x = torch.randn(n, device=device)
    program = load_pt2(folder / "seg_pt2.pt2")
    errors = []
    graphed = CudaGraphCall(Pt2Program(program), "seg_pt2")
    for result in (Pt2Program(program)(x), program.module()(x), *[graphed(x) for _ in range(3)]):
        got = result[0] if isinstance(result, (list, tuple)) else result
        errors.append((got - expected(x)).abs().max().item())
    return max(errors)


# --- the run --------------------------------------------------------------------------------------


def environment(device: str) -> dict:
    import onnxruntime

    env = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "warp": wp.config.version,
        "onnxruntime": onnxruntime.__version__,
        "leapp": _version("leapp"),
        "device": device,
    }
    if device.startswith("cuda"):
        from leapp import _native
        from leapp.runtime import ops

        props = torch.cuda.get_device_properties(device)
        status = _native.driver_status()
        env.update(gpu=props.name, compute_capability=f"{props.major}.{props.minor}",
                   cuda_driver=status.get("version"), torch_cuda=torch.version.cuda,
                   op_served_by="libleapp_warp_torch.so" if ops.native_library_loaded()
                   else "Python kernels (leapp._native)")
    return env


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "unknown"


def run(args) -> dict:
    global KERNELS
    KERNELS = args.kernels
    device = "cpu" if args.dry_run else "cuda:0"
    wp.init()
    if not args.dry_run and not (torch.cuda.is_available() and wp.is_cuda_available()):
        raise SystemExit("replay.py: no CUDA device for torch and Warp; use --dry-run on machines without a GPU")
    out = Path(args.out or tempfile.mkdtemp(prefix="leapp-bench-"))
    results = {"mode": "dry-run" if args.dry_run else ("quick" if args.quick else "full"), "kernels": KERNELS,
               "segment_graphs": os.environ.get("LEAPP_SEGMENT_GRAPHS", "1") != "0", "sizes": {}}
    if not args.dry_run:
        from leapp.runtime import ops

        ops.ensure_registered()  # before environment(): it reports which library serves the op
    results["environment"] = environment(device)
    for n in args.sizes:
        folder, export_s = export(n, device, out)
        entry = {"export_s": export_s, "folder": str(folder)}
        if args.dry_run:
            calls = methods_dry(folder, n)
            entry["dry_run_checked"] = calls
        else:
            entry["max_abs_error_pt2"] = check_results(folder, n, device)
            with wp.ScopedStream(wp.stream_from_torch(torch.cuda.current_stream())):
                entry["methods"] = {name: time_calls(fn, args.calls, args.warmup)
                                    for name, fn in methods(folder, n, device).items()}
        results["sizes"][str(n)] = entry
    first = Path(results["sizes"][str(args.sizes[0])]["folder"])
    results["cold_start"] = cold_first_call(first, args.sizes[0], device, runs=1 if args.quick or args.dry_run else 5)
    results["targets"] = targets(results)
    return results


def methods_dry(folder: Path, n: int) -> list[str]:
    """CPU: what can run without a GPU: the eager node and the graph floor on CPU Warp, opening both artifacts."""
    import onnxruntime as ort

    from leapp.runtime import libraries
    from leapp.runtime.runners import load_pt2

    done = []
    x = torch.randn(n)
    y = NODES["pt2"](x)
    assert torch.allclose(y, expected(x)), "eager node computes the wrong thing"
    done.append("eager")
    xw, tmp, yw = wp.from_torch(x), wp.empty(n, dtype=float, device="cpu"), wp.from_torch(torch.empty_like(x))
    tmp2 = wp.empty(n, dtype=float, device="cpu")
    with wp.ScopedCapture(device="cpu") as capture:
        launch_chain(n, xw, tmp, tmp2, yw, "cpu")
    wp.capture_launch(capture.graph)
    assert torch.allclose(wp.to_torch(yw), expected(x)), "graph floor computes the wrong thing"
    done.append("floor")
    from leapp import _native

    from leapp.runtime.pt2_program import Pt2Program

    program = load_pt2(folder / "seg_pt2.pt2")
    program.module()
    direct = Pt2Program(program)
    assert direct.direct, f"leapp.load would not call this program directly: {direct.reason}"
    done.append("pt2 (loaded)")
    bundle = _native.Bundle(next(v for k, v in program.state_dict.items() if k.endswith("_bundle")).numpy().tobytes())
    inputs, outputs = native_buffers(bundle, x)
    # y = torch.empty_like(x) holds undefined bytes: not a segment input (docs/recorder.md section 4)
    assert len(inputs) == 1 and inputs[0] is x and len(outputs) == 1, "unexpected segment I/O"
    done.append("native (buffers built)")
    options = ort.SessionOptions()
    options.register_custom_ops_library(str(libraries.library_path("onnx")))
    ort.InferenceSession(str(folder / "seg_onnx.onnx"), options, providers=["CPUExecutionProvider"])
    done.append("onnx-cpu-ep (session created)")
    return done


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smoke run: 200 calls and 20 warm-up calls per method")
    p.add_argument("--dry-run", action="store_true", help="CPU only: trace, export and open the artifacts; no timing")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.add_argument("--sizes", type=lambda s: [int(v) for v in s.split(",")], default=list(SIZES),
                   help="comma-separated N (default 1,1024,262144)")
    p.add_argument("--calls", type=int, default=None, help="timed calls per method (default 2000; --quick 200)")
    p.add_argument("--warmup", type=int, default=None, help="warm-up calls per method (default 100; --quick 20)")
    p.add_argument("--out", help="export folder (default: a new temporary folder)")
    p.add_argument("--kernels", type=int, default=2, help="launches in the segment (default 2; at least 2)")
    args = p.parse_args(argv)
    if args.kernels < 2:
        p.error("--kernels must be at least 2")
    args.calls = args.calls or (200 if args.quick else 2000)
    args.warmup = args.warmup or (20 if args.quick else 100)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    results = run(args)
    print(markdown(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
