"""Per-step latency of the README's robot pipeline (examples/go2_pipeline.py): eager, leapp.load, CUDA graphs.

The example's ``Go2.step`` (obs: PT2 node with a 3-kernel Warp segment; policy: ONNX MLP; action:
ONNX node with a Warp segment) is traced on cuda:0 and exported for each number of robots, then
one step is timed per route with timing.py's ``time_calls`` (CUDA events on torch's stream and a
host clock, each call synchronised before the next: what a control loop sees):

  eager              Go2.step on the inputs, under torch.no_grad (annotations are no-ops)
  leapp.load         leapp.load(export)(quat=..., joints=...): PT2 through torch, ONNX nodes on ORT's
                     CUDA EP when onnxruntime-gpu is installed (else the CPU EP; the row says which);
                     the whole call replayed as one CUDA graph with its outputs cloned (the pipeline's
                     PlainCallGraphs) when every node can be captured; the same input tensors every step, so
                     the graph reads them in place
  leapp.load-copies  the same with LEAPP_IN_PLACE_GRAPHS=0: the inputs copied into the graph's own
                     buffers every step (what calls with new input addresses every step pay)
  leapp.load-node-graphs
                     the same with LEAPP_PIPELINE_GRAPH=0: node by node, each ONNX node replayed from
                     a CUDA graph of its own (its PlainCallGraphs)
  leapp.load-no-node-graphs
                     with LEAPP_PIPELINE_GRAPH=0 and LEAPP_ONNX_GRAPHS=0: ORT runs each ONNX node
                     kernel by kernel
  leapp.load-graphs  leapp.load(export, cuda_graphs=True), the same input tensors every step: the whole
                     step replayed as one CUDA graph when every node can be captured (ONNX nodes on
                     the CUDA EP), else node by node (the table says which)
  floor              the step's kernels (Warp launches and torch's MLP) captured once as one CUDA graph
                     (torch.cuda.graph, Warp on the capture stream, its scratch preallocated) and
                     replayed: every kernel of the step, nothing else
  leapp-graph-bare   the whole-pipeline graph of leapp.load-graphs replayed alone on the calling
                     stream (no input checks, no Python per node, no hand-off): the exported step's floor
  node:NAME[-no-node-graph]
                     with --nodes: each node alone, ``run_node`` on the step's own intermediate values,
                     from the node-graphs load and from the LEAPP_ONNX_GRAPHS=0 one (where the step's time goes)

Each route is timed ``--repeats`` times (interleaved); the table gives the median of the per-run
medians, the p90 of the pooled calls, and the spread (min-max) of the per-run medians.

    python benchmarks/pipeline_step.py                      # GPU: 256 and 4096 robots
    python benchmarks/pipeline_step.py --envs 256 --calls 300 --repeats 3
    python benchmarks/pipeline_step.py --dry-run            # CPU: trace and export only
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

import torch
import warp as wp

import leapp
import timing
from robot_step import add_step_arguments, floor_route, route_rows, table_head

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "go2_pipeline.py"


def example():
    """examples/go2_pipeline.py as a module (Warp finds a kernel's module by its name)."""
    module = sys.modules.get("go2_pipeline")
    if module is None:
        spec = importlib.util.spec_from_file_location("go2_pipeline", EXAMPLE)
        module = importlib.util.module_from_spec(spec)
        sys.modules["go2_pipeline"] = module
        spec.loader.exec_module(module)
    return module


def export(module, robot, envs: int, device: str, out: Path) -> tuple[Path, float]:
    start = time.perf_counter()
    with leapp.trace("go2", save_path=str(out)) as session:
        for seed in range(3):
            robot.step(*module.random_state(envs, device, seed))
    session.compile(validate=False)
    return out / "go2", time.perf_counter() - start


def node_calls(pipeline, no_node_graphs, inputs: dict) -> dict:
    """``run_node`` of every node on the values a plain step feeds it, in both loads."""
    values = dict(inputs)  # pipeline input name or (node, output) -> tensor
    calls = {}
    for name, node in pipeline.nodes.items():
        args = {spec.name: values[node.sources[spec.name]] for spec in node.inputs}
        values.update({(name, k): v for k, v in pipeline.run_node(name, **args).items()})
        calls[f"node:{name}"] = lambda n=name, a=args: pipeline.run_node(n, **a)
        calls[f"node:{name}-no-node-graph"] = lambda n=name, a=args: no_node_graphs.run_node(n, **a)
    return calls


def routes(module, robot, folder: Path, envs: int, device: str, nodes: bool = False) -> tuple[dict, dict]:
    quat, joints = module.random_state(envs, device, 7)
    with torch.no_grad():
        expected = robot.step(quat, joints)
    pipeline = leapp.load(folder)
    with mock.patch.dict(os.environ, {"LEAPP_IN_PLACE_GRAPHS": "0"}):  # read at load
        copies = leapp.load(folder)
    with mock.patch.dict(os.environ, {"LEAPP_PIPELINE_GRAPH": "0"}):
        node_graphs = leapp.load(folder)
        with mock.patch.dict(os.environ, {"LEAPP_ONNX_GRAPHS": "0"}):
            no_node_graphs = leapp.load(folder)
    graphed = leapp.load(folder, cuda_graphs=True)
    ep = {n.name: getattr(n.runner, "stream_mode", n.backend)
          + ("" if getattr(n.runner, "graph", None) is None else " + node graph") for n in pipeline.nodes.values()}
    calls = {
        "eager": lambda: robot.step(quat, joints),
        "leapp.load": lambda: pipeline(quat=quat, joints=joints),
        "leapp.load-copies": lambda: copies(quat=quat, joints=joints),
        "leapp.load-node-graphs": lambda: node_graphs(quat=quat, joints=joints),
        "leapp.load-no-node-graphs": lambda: no_node_graphs(quat=quat, joints=joints),
        "leapp.load-graphs": lambda: graphed(quat=quat, joints=joints),
    }
    facts = {"nodes": ep, "max_abs_error": {},
             "whole_graph": "on" if graphed.graph is not None else f"off: {graphed.graph_reason}",
             "plain_graph": "on" if pipeline.plain_graphs is not None else f"off: {pipeline.plain_graphs_reason}"}
    with torch.no_grad():
        for name in ("leapp.load", "leapp.load-copies", "leapp.load-node-graphs", "leapp.load-no-node-graphs",
                     "leapp.load-graphs"):
            for _ in range(3):  # cuda_graphs: a direct call, a capture, a replay
                got = calls[name]()["action"]
            facts["max_abs_error"][name] = (got.to(expected.device) - expected).abs().max().item()
    if graphed.graph is not None and graphed.graph._graphs:  # the graph leapp.load-graphs replays, launched bare
        entry = next(reversed(graphed.graph._graphs.values()))
        calls["leapp-graph-bare"] = lambda: entry[0](entry[1])
    if nodes:
        calls.update(node_calls(node_graphs, no_node_graphs, {"quat": quat, "joints": joints}))
    try:
        replay_floor, out = floor_route(module, robot, quat, joints)
        calls["floor"] = replay_floor
        facts["max_abs_error"]["floor"] = (out - expected).abs().max().item()
    except Exception as e:  # noqa: BLE001 - reported in the table instead of a number
        facts["floor_failed"] = f"{type(e).__name__}: {e}"
    return calls, facts


def table(results: dict) -> str:
    lines = table_head("robot pipeline step (examples/go2_pipeline.py)", results["environment"])
    for envs, entry in results["sizes"].items():
        if "routes" not in entry:
            lines.append(f"| {envs} | (dry run: exported in {entry['export_s']:.1f} s) | | | | | | | |")
            continue
        lines += route_rows(envs, entry["routes"], entry["max_abs_error"])
        if "floor_failed" in entry:
            lines.append(f"| {envs} | floor | capture failed: {entry['floor_failed']} | | | | | | |")
        lines.append(f"| {envs} | (nodes: {entry['nodes']}; plain-call graph {entry.get('plain_graph')}; "
                     f"whole-pipeline graph {entry.get('whole_graph')}) | | | | | | | |")
    return "\n".join(lines)


def run(args) -> dict:
    wp.init()
    gpu = torch.cuda.is_available() and wp.is_cuda_available()
    if not gpu and not args.dry_run:
        raise SystemExit("pipeline_step.py: no CUDA device for torch and Warp; use --dry-run on machines without a GPU")
    device = "cuda:0" if gpu and not args.dry_run else "cpu"
    module = example()
    robot = module.Go2(device)
    import onnxruntime as ort

    env = {"torch": torch.__version__, "warp": wp.config.version, "onnxruntime": ort.__version__,
           "ort_providers": ort.get_available_providers(), "device": device}
    if device != "cpu":
        env["gpu"] = torch.cuda.get_device_name(device)
    results = {"environment": env, "sizes": {}}
    out = Path(args.out or tempfile.mkdtemp(prefix="leapp-step-"))
    for envs in args.envs:
        folder, export_s = export(module, robot, envs, device, out / str(envs))
        entry = {"export_s": export_s}
        if not args.dry_run:
            calls, facts = routes(module, robot, folder, envs, device, nodes=args.nodes)
            entry.update(facts)
            with wp.ScopedStream(wp.stream_from_torch(torch.cuda.current_stream())):  # eager Warp on torch's stream
                entry["routes"] = timing.measure_interleaved(calls, args.calls, args.warmup, args.repeats)
        results["sizes"][str(envs)] = entry
    return results


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_step_arguments(p)
    p.add_argument("--dry-run", action="store_true", help="CPU only: trace and export; time nothing")
    p.add_argument("--nodes", action="store_true", help="also time each node alone (run_node), node graphs on and off")
    args = p.parse_args(argv)
    results = run(args)
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
