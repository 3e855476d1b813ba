"""The robot step through the existing export tool (LEAPP 0.7.2): its export and its InferenceManager.

Issue 13 asks for the existing tool's InferenceManager on the robot pipeline that ``pipeline_step.py`` times
for this project, with the same harness. Both packages import as ``leapp``, so this script runs in an
interpreter whose ``leapp`` is the existing tool (installed into a folder of its own that comes first on
``PYTHONPATH``, its Warp runtime built once; on the GPU machine scripts/fetch-existing-tool.sh and
scripts/gpu-existing-tool.sh do both) and never imports this project's package. The step is
examples/go2_pipeline.py's, the same kernels, policy weights (seed 0) and robot states, annotated with the
existing tool's API:

  obs     export_with="pt2"   projected gravity, joint offsets through a scratch array and a scaling, in one
                              ``annotate.warp_op("obs")`` block, then ``torch.cat``
  policy  export_with="onnx"  the example's MLP
  action  export_with="onnx"  the clamp-and-scale kernel in ``annotate.warp_op("action")``, as the example

``--variants`` are tried in order until one exports: ``torch/onnx`` is the example as written (Warp writes into
torch tensors made before each block), ``warp/onnx`` the same values with Warp allocating its outputs and torch
reading them through ``wp.to_torch`` (``Go2``), ``warp/pt2`` that with the action node as PT2; the table lists
each attempt's outcome. Per number of robots and variant, fresh processes: one traces the step (two passes and
one more sample, as the example does) and times ``leapp.compile_graph(visualize=False)``, which validates (a
refusal by its validation is reported; the artifacts are saved before it). For the variant that exported,
another process loads the export as a deployment does (tracing with the existing tool switches torch's caching
allocator off for the rest of its process, so timing there would measure that) and times with timing.py's
harness, as pipeline_step.py does:

  eager                  the step with the annotations inactive (outside ``leapp.start``)
  InferenceManager       ``InferenceManager(yaml)({"obs/quat": quat, "obs/joints": joints})``
  floor                  robot_step.floor_route, pipeline_step.py's floor: the step's kernels as one CUDA graph
  InferenceManager-graph the InferenceManager call captured once with ``torch.cuda.graph`` and replayed, tried after
                         the routes above (a failed capture can spoil the process) and timed, with the floor again
                         (``floor (again)``), only when the capture works; the table says why not otherwise

    PYTHONPATH=/path/to/leapp-0.7.2:$PYTHONPATH python benchmarks/existing_tool_step.py --envs 256,4096
    bash scripts/gpu-existing-tool.sh python3 benchmarks/existing_tool_step.py --envs 256,4096   # GPU machine
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch
import warp as wp

import timing
from robot_step import add_step_arguments, floor_route, route_rows, table_head

EXISTING_VERSION = "0.7.2"
# How the step is written (Go2's ``outputs``) and the action node's backend, in the order tried
VARIANTS = ("torch/onnx", "warp/onnx", "warp/pt2")
NUM_JOINTS = 12
POLICY_NET: list = []  # floor_route reads the policy here, as it reads the example's


def existing_leapp():
    """The existing tool's package, refusing this project's (both are ``leapp``)."""
    import leapp

    if not hasattr(leapp, "InferenceManager") or getattr(leapp, "__version__", None) != EXISTING_VERSION:
        raise SystemExit(f"existing_tool_step.py: `import leapp` gave {getattr(leapp, '__file__', '?')} "
                         f"(version {getattr(leapp, '__version__', '?')}), not the existing tool {EXISTING_VERSION}; "
                         "put a folder holding it first on PYTHONPATH")
    return leapp


def without_this_projects_leapp() -> None:
    """An editable install of this project resolves ``leapp`` through an import hook that comes before PYTHONPATH
    (scikit-build-core's redirecting finder in ``sys.meta_path``): drop it in this interpreter, whose ``leapp``
    must be the existing tool. Only ``main`` calls it: the tests import this module next to this project's leapp."""
    sys.meta_path[:] = [f for f in sys.meta_path if "leapp" not in getattr(f, "known_source_files", {})]


# The kernels, policy and state of examples/go2_pipeline.py, written again because that file imports this
# project's leapp (tests/e2e/test_existing_tool_step.py checks that they stay the same).
@wp.kernel
def projected_gravity(q: wp.array(dtype=wp.quat), g: wp.vec3, out: wp.array(dtype=wp.vec3)):
    i = wp.tid()
    out[i] = wp.quat_rotate_inv(q[i], g)


@wp.kernel
def joint_offsets(pos: wp.array2d(dtype=float), rest: wp.array(dtype=float), offsets: wp.array2d(dtype=float)):
    i, j = wp.tid()
    offsets[i, j] = pos[i, j] - rest[j]


@wp.kernel
def scale(src: wp.array2d(dtype=float), factor: float, out: wp.array2d(dtype=float)):
    i, j = wp.tid()
    out[i, j] = src[i, j] * factor


@wp.kernel
def clamp_scale(a: wp.array2d(dtype=float), lo: float, hi: float, factor: float, out: wp.array2d(dtype=float)):
    i, j = wp.tid()
    out[i, j] = wp.clamp(a[i, j], lo, hi) * factor


def policy_net(device: str):
    torch.manual_seed(0)  # the example's Go2.__init__
    net = torch.nn.Sequential(torch.nn.Linear(3 + NUM_JOINTS, 64), torch.nn.ELU(), torch.nn.Linear(64, 64),
                              torch.nn.ELU(), torch.nn.Linear(64, NUM_JOINTS))
    return net.to(device).eval()


def random_state(n: int, device: str, seed: int):
    g = torch.Generator().manual_seed(seed)
    quat = torch.nn.functional.normalize(torch.randn(n, 4, generator=g), dim=-1)
    joints = torch.randn(n, NUM_JOINTS, generator=g)
    return quat.to(device), joints.to(device)


class Go2:
    """The example's step with the existing tool's annotations (pass-through outside ``leapp.start``).

    ``outputs="torch"`` is the example as written: Warp writes into torch tensors made before each block.
    ``outputs="warp"`` makes the same values with Warp allocating its outputs inside the block and torch reading
    them after it through ``wp.to_torch``, the other way to write it (the existing tool refuses some of the first).
    """

    def __init__(self, device: str, annotate, outputs: str, action_backend: str):
        self.device = device
        self.annotate = annotate
        self.outputs = outputs
        self.action_backend = action_backend
        self.default_pose = wp.array([0.1, 0.8, -1.5] * 4, dtype=float, device=device)
        POLICY_NET.append(policy_net(device))

    def step(self, quat, joints):
        annotate, dev, by_torch = self.annotate, self.device, self.outputs == "torch"
        quat, joints = annotate.input_tensors("obs", {"quat": quat, "joints": joints})
        n = quat.shape[0]
        if by_torch:
            grav_t = torch.empty(n, 3, device=quat.device)
            joint_t = torch.empty(n, NUM_JOINTS, device=quat.device)
        with annotate.warp_op("obs"):
            offsets = wp.empty((n, NUM_JOINTS), dtype=float, device=dev)  # scratch
            grav = wp.from_torch(grav_t, dtype=wp.vec3) if by_torch else wp.empty(n, dtype=wp.vec3, device=dev)
            joint_obs = wp.from_torch(joint_t) if by_torch else wp.empty((n, NUM_JOINTS), dtype=float, device=dev)
            wp.launch(projected_gravity, dim=n, inputs=[wp.from_torch(quat, dtype=wp.quat), wp.vec3(0.0, 0.0, -1.0)],
                      outputs=[grav], device=dev)
            wp.launch(joint_offsets, dim=(n, NUM_JOINTS), inputs=[wp.from_torch(joints), self.default_pose],
                      outputs=[offsets], device=dev)
            wp.launch(scale, dim=(n, NUM_JOINTS), inputs=[offsets, 0.5], outputs=[joint_obs], device=dev)
        if not by_torch:
            grav_t, joint_t = wp.to_torch(grav), wp.to_torch(joint_obs)
        obs = torch.cat([grav_t, joint_t], dim=-1)
        annotate.output_tensors("obs", {"obs": obs}, export_with="pt2")

        obs = annotate.input_tensors("policy", {"obs": obs})
        raw = POLICY_NET[-1](obs)
        annotate.output_tensors("policy", {"output": raw}, export_with="onnx")

        raw = annotate.input_tensors("action", {"raw": raw})
        if by_torch:
            action = torch.empty_like(raw)
        with annotate.warp_op("action"):
            out = wp.from_torch(action) if by_torch else wp.empty(tuple(raw.shape), dtype=float, device=dev)
            wp.launch(clamp_scale, dim=raw.shape, inputs=[wp.from_torch(raw), -1.0, 1.0, 0.25], outputs=[out],
                      device=dev)
        if not by_torch:
            action = wp.to_torch(out)
        annotate.output_tensors("action", {"action": action}, export_with=self.action_backend)
        return action


def export_child(envs: int, out: Path, variant: str) -> dict:
    """Traces and exports the step at ``envs`` robots (this process only)."""
    leapp = existing_leapp()

    wp.init()
    robot = Go2("cuda:0", leapp.annotate, *variant.split("/"))
    start = time.perf_counter()
    leapp.start("go2", save_path=str(out))
    for seed in range(3):  # discovery, capture, one more sample
        robot.step(*random_state(envs, "cuda:0", seed))
    leapp.stop()
    traced = time.perf_counter()
    try:
        validated = str(bool(leapp.compile_graph(visualize=False)))
    except Exception as e:  # noqa: BLE001 - its own validation: the artifacts are saved before it runs
        validated = f"no, {type(e).__name__}: {str(e)[:300]}"
    done = time.perf_counter()
    folder = out / "go2"
    if not (folder / "go2.yaml").is_file():
        raise RuntimeError(f"compile_graph wrote no go2.yaml (validation: {validated})")
    return {"trace_s": traced - start, "compile_graph_s": done - traced, "validated": validated,
            "files": {p.name: p.stat().st_size for p in sorted(folder.iterdir()) if p.is_file()}}


def time_child(envs: int, folder: Path, variant: str, n_calls: int, warmup: int, repeats: int) -> dict:
    """Loads the export in this fresh process and times the routes of the module docstring."""
    leapp = existing_leapp()

    wp.init()
    robot = Go2("cuda:0", leapp.annotate, *variant.split("/"))
    quat, joints = random_state(envs, "cuda:0", 7)  # pipeline_step.py's state
    with torch.no_grad():
        expected = robot.step(quat, joints)
    begin = time.perf_counter()
    manager = leapp.InferenceManager(str(folder / "go2.yaml"))
    feed = {"obs/quat": quat, "obs/joints": joints}
    with torch.no_grad():
        first = manager(feed)["action/action"]
    torch.cuda.synchronize()
    facts = {"load_and_first_call_s": time.perf_counter() - begin, "max_abs_error": {}}
    facts["max_abs_error"]["InferenceManager"] = (first.to(expected.device) - expected).abs().max().item()
    facts["output_device"] = str(first.device)
    replay_floor, floor_out = floor_route(sys.modules[__name__], robot, quat, joints)
    facts["max_abs_error"]["floor"] = (floor_out - expected).abs().max().item()
    calls = {"eager": lambda: robot.step(quat, joints), "InferenceManager": lambda: manager(feed),
             "floor": replay_floor}
    with wp.ScopedStream(wp.stream_from_torch(torch.cuda.current_stream())):  # eager Warp on torch's stream
        facts["routes"] = timing.measure_interleaved(calls, n_calls, warmup, repeats)
    # after the other routes: a capture that fails may leave this process's CUDA state unusable
    graph = graphed(manager, feed, expected, facts)
    if graph is not None:  # timed with the floor again, in rounds of their own
        facts["routes"].update(timing.measure_interleaved({"InferenceManager-graph": graph, "floor (again)": replay_floor},
                                                          n_calls, warmup, repeats))
    return facts


def graphed(manager, feed: dict, expected, facts: dict):
    """``manager(feed)`` captured with torch.cuda.graph (warm-up on the capture stream first), or None with the
    reason in ``facts["graph"]``."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.no_grad():
            with torch.cuda.stream(side):
                for _ in range(3):
                    manager(feed)
            side.synchronize()
            with torch.cuda.graph(graph, stream=side):
                out = manager(feed)["action/action"]
        graph.replay()
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - reported in the table instead of a number
        facts["graph"] = f"capture failed: {type(e).__name__}: {str(e)[:300]}"
        return None
    facts["graph"] = "captured"
    facts["max_abs_error"]["InferenceManager-graph"] = (out.to(expected.device) - expected).abs().max().item()
    return graph.replay


def child(args) -> int:
    out = Path(args.result)
    try:
        if args.child == "export":
            result = export_child(args.envs[0], Path(args.out), args.variant)
        else:
            result = time_child(args.envs[0], Path(args.out) / "go2", args.variant, args.calls, args.warmup,
                                args.repeats)
    except Exception as e:  # noqa: BLE001 - the parent reports it in the table
        traceback.print_exc()
        result = {"error": f"{type(e).__name__}: {str(e)[:500]}"}
    out.write_text(json.dumps(result, default=str))
    return 0


def run_child(kind: str, envs: int, folder: Path, variant: str, args) -> dict:
    """One fresh process of ``kind`` (export or time) in ``folder``; its result, or the error that ended it."""
    result = folder / f"{kind}.json"
    cmd = [sys.executable, __file__, "--child", kind, "--envs", str(envs), "--out", str(folder), "--result", str(result),
           "--variant", variant, "--calls", str(args.calls), "--warmup", str(args.warmup), "--repeats", str(args.repeats)]
    begin = time.perf_counter()
    with open(folder / f"{kind}.log", "w") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=args.timeout)
    if not result.is_file():
        tail = (folder / f"{kind}.log").read_text(errors="replace")[-1500:]
        return {"error": f"the {kind} process exited {proc.returncode} without a result; its log ends:\n{tail}"}
    return {**json.loads(result.read_text()), "process_s": time.perf_counter() - begin}


def measure(envs: int, out: Path, args) -> dict:
    """Each variant in turn, in a folder of its own, until one exports; that one is timed."""
    entry: dict = {"attempts": {}}
    for variant in args.variants:
        folder = out / str(envs) / variant.replace("/", "-")
        shutil.rmtree(folder, ignore_errors=True)  # an earlier run's go2.yaml would pass for this one's
        folder.mkdir(parents=True)
        exported = run_child("export", envs, folder, variant, args)
        entry["attempts"][variant] = exported.get("error", "exported")
        if "error" not in exported:
            entry.update(variant=variant, export=exported, time=run_child("time", envs, folder, variant, args))
            break
    return entry


def environment() -> dict:
    """Versions and the GPU, from the existing tool's interpreter."""
    import onnxruntime as ort

    leapp = existing_leapp()
    return {"existing_tool": leapp.__version__, "torch": torch.__version__, "warp": wp.config.version,
            "onnxruntime": ort.__version__, "ort_providers": ort.get_available_providers(),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def table(results: dict) -> str:
    lines = table_head("robot pipeline step through the existing tool", results["environment"])
    for envs, entry in results["sizes"].items():
        for variant, outcome in entry["attempts"].items():
            lines.append(f"| {envs} | (export as {variant}: {outcome[:400]!r}) | | | | | | | |")
        exported, timed = entry.get("export"), entry.get("time", {})
        if exported is None or "error" in timed:
            lines.append(f"| {envs} | failed: {timed.get('error', 'no variant exported')[:400]!r} | | | | | | | |")
            continue
        lines += route_rows(envs, timed["routes"], timed["max_abs_error"])
        files = ", ".join(f"{k} {v:,} B" for k, v in exported["files"].items())
        lines.append(f"| {envs} | (trace {exported['trace_s']:.1f} s, compile_graph {exported['compile_graph_s']:.1f} s "
                     f"validated {exported['validated']}; load + first call {timed['load_and_first_call_s']:.2f} s; "
                     f"outputs on {timed['output_device']}; graph {timed['graph']}; {files}) | | | | | | | |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_step_arguments(p)
    p.add_argument("--variants", type=lambda s: s.split(","), default=list(VARIANTS),
                   help="OUTPUTS/ACTION_BACKEND pairs tried in order until one exports (default: %(default)s)")
    p.add_argument("--variant", help=argparse.SUPPRESS)
    p.add_argument("--timeout", type=float, default=900, help="seconds each child process may take")
    p.add_argument("--child", choices=("export", "time"), help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    without_this_projects_leapp()
    if args.child:
        return child(args)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    out = Path(args.out or tempfile.mkdtemp(prefix="leapp-existing-"))
    results = {"environment": environment(), "sizes": {}}
    for envs in args.envs:
        results["sizes"][str(envs)] = measure(envs, out, args)
        print(f"{envs} robots: done", file=sys.stderr)
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
