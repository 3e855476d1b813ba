"""Lowered against replayed Warp segments (compile(warp="lower") vs "replay"), per deployment route.

Two cases, each traced and exported twice (warp="replay" and warp="lower") at every batch:

  go2   examples/go2_pipeline.py's step: obs (3 Warp kernels), policy (ONNX MLP), action (ONNX, one
        Warp kernel), chained by hand in pipeline.yaml's edge order. The route names how obs runs; policy
        and action are ONNX nodes and always run on ONNX Runtime (for the onnx route obs is traced as ONNX).
  seg   a 2-kernel segment alone: projected gravity of N quaternions, then a scale kernel (N vec3 out).

Routes, built the same way for both exports (only the artifacts differ):

  onnx  ONNX Runtime InferenceSession (CPU EP; with --device cuda the CUDA EP where the installed
        onnxruntime has it), outputs preallocated and bound once with io_binding; the replayed export's
        sessions register leapp's op library (the lowered ones need none)
  pt2   torch.export.load(...).module() (the replayed export's program needs leapp's torch op registered;
        both are loaded through leapp.runtime.runners.load_pt2, which checks the archive and registers it)
  aoti  the PT2 node compiled by leapp.aoti.package (same Inductor configs for both) and loaded with
        torch._inductor.aoti_load_package; skipped with --quick or --no-aoti
  inductor  the PT2 node's module through torch.compile (Inductor in process; not in the default --routes:
        it is where AOTInductor cannot load, as on a machine whose torch build crashes in aoti_load_package)

Each route's step is checked against eager first (the table's error column). Timing: after a warm-up,
``--repeats`` interleaved rounds (replayed, lowered, eager) of ``--calls`` calls; a row is the median of the
round medians. CPU: time.perf_counter per call, torch and ORT on ``--threads`` threads (default 1: the machine
is shared, and Warp's CPU launches and leapp's CPU code are single-threaded). CUDA: CUDA events on torch's
current stream, synchronised each call (benchmarks/timing.py's time_calls). ``eager ms`` is the case's own
Python step (Warp launches + torch). On the CPU the table also gives the calling thread's CPU time (median of
the round medians): other processes on a shared machine preempt the wall clock, not that; and each variant's
range of round medians (wall).

    python benchmarks/lowering.py                         # CPU: go2 and seg at 1, 64, 4096 robots, AOTI too
    python benchmarks/lowering.py --device cuda
    python benchmarks/lowering.py --quick                 # smoke: 64 robots, 50 calls, no AOTI
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
import warp as wp

import leapp
from leapp import annotate

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))
import go2_pipeline  # noqa: E402
from quiet_output import quiet_output  # noqa: E402

VARIANTS = ("replay", "lower")
ROUTES = ("onnx", "pt2", "aoti", "inductor")
DEFAULT_ROUTES = ("onnx", "pt2", "aoti")
CASES = ("go2", "seg")


@wp.kernel
def projected_gravity(q: wp.array(dtype=wp.quat), g: wp.vec3, out: wp.array(dtype=wp.vec3)):
    i = wp.tid()
    out[i] = wp.quat_rotate_inv(q[i], g)


@wp.kernel
def scale3(v: wp.array(dtype=wp.vec3), s: float, out: wp.array(dtype=wp.vec3)):
    i = wp.tid()
    out[i] = v[i] * s


def seg_eager(quat: torch.Tensor) -> torch.Tensor:
    """The 2-kernel segment as the user's Python runs it (eager Warp)."""
    n, device = quat.shape[0], str(quat.device)
    grav = wp.empty(n, dtype=wp.vec3, device=device)  # scratch between the kernels
    out = torch.empty(n, 3, device=quat.device)
    with annotate.warp_op():
        wp.launch(projected_gravity, dim=n, inputs=[wp.from_torch(quat, dtype=wp.quat), wp.vec3(0.0, 0.0, -1.0)],
                  outputs=[grav], device=device)
        wp.launch(scale3, dim=n, inputs=[grav, 0.5], outputs=[wp.from_torch(out, dtype=wp.vec3)], device=device)
    return out


def seg_node(fmt: str):
    def step(quat: torch.Tensor) -> torch.Tensor:
        with leapp.node("seg", export_with=fmt):
            quat = annotate.input_tensors("seg", {"quat": quat})
            out = seg_eager(quat)
            annotate.output_tensors("seg", {"grav": out})
        return out
    return step


def case_inputs(case: str, n: int, device: str, seed: int) -> dict[str, torch.Tensor]:
    quat, joints = go2_pipeline.random_state(n, device, seed)
    return {"quat": quat, "joints": joints} if case == "go2" else {"quat": quat.contiguous()}


EXPORTS: dict[tuple, tuple] = {}  # (case, format, warp, n) -> export(): the pt2 and aoti routes share one


def export(case: str, fmt: str, warp: str, n: int, device: str, out: Path):
    """(export folder, eager step taking the case's inputs as keywords) of one case traced at n robots."""
    key = (case, fmt, warp, n)
    if key not in EXPORTS:
        EXPORTS[key] = _export(case, fmt, warp, n, device, out)
    return EXPORTS[key]


def _export(case: str, fmt: str, warp: str, n: int, device: str, out: Path):
    name = f"{case}_{fmt}_{warp}_{n}"
    if case == "go2":
        robot = go2_pipeline.Go2(device, obs_with=fmt)
        step, eager = robot.step, robot.step
    else:
        step, eager = seg_node(fmt), seg_eager
    with leapp.trace(name, save_path=str(out)) as session:
        for seed in range(3):
            step(**case_inputs(case, n, device, seed))
    report = session.compile(warp=warp, validate=False)
    want = "lowered" if warp == "lower" else "replayed"
    for node, entry in ((k, report[k]) for k in (("obs", "action") if case == "go2" else ("seg",))):
        routes = set(entry.routes.values()) or {"replayed"}  # warp="replay" records no route
        assert all(r.startswith(want) for r in routes), f"{name}: node {node} routes {entry.routes}"
    return out / name, eager


def onnx_runner(path: Path, node: dict, device: str, replayed: bool):
    """ONNX Runtime session of one node: a call binds its inputs and returns preallocated outputs."""
    import onnxruntime as ort

    from leapp.runtime import libraries
    from leapp.runtime.onnx_runner import onnx_providers, session_options

    dev = torch.device(device)
    providers = onnx_providers(dev, ort.get_available_providers())
    cuda = providers[0] != "CPUExecutionProvider"
    options = session_options(ort, cuda, str(libraries.library_path("onnx")) if replayed else None)
    options.intra_op_num_threads = torch.get_num_threads()  # --threads, as torch's
    session = ort.InferenceSession(str(path), options, providers=providers)
    on = dev if cuda else torch.device("cpu")
    outs = [torch.empty(o["shape"], device=on) for o in node["outputs"]]
    binding = session.io_binding()
    kind, index = ("cuda", on.index or 0) if cuda else ("cpu", 0)
    for o, t in zip(node["outputs"], outs):
        binding.bind_output(o["name"], kind, index, 1, list(t.shape), t.data_ptr())

    def call(*tensors):
        keep = [t.to(on).contiguous() for t in tensors]
        for i, t in zip(node["inputs"], keep):
            binding.bind_input(i["name"], kind, index, 1, list(t.shape), t.data_ptr())
        if cuda:
            torch.cuda.current_stream().synchronize()  # ORT runs on its own stream and waits for it at the end
        session.run_with_iobinding(binding)
        return [t.to(dev) for t in outs] if not cuda else outs

    return call, session.get_providers()[0]


def pt2_runner(path: Path, route: str, node: str):
    from leapp.runtime.runners import load_pt2

    if route == "pt2":
        module = load_pt2(path).module()
        return (lambda *t: list(module(*t))), "torch.export module"
    if route == "inductor":
        module = torch.compile(load_pt2(path).module(), fullgraph=True)
        return (lambda *t: list(module(*t))), "torch.compile (Inductor)"
    import leapp.aoti

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        package = leapp.aoti.package(path.parent, node, record=False)
    model = torch._inductor.aoti_load_package(str(package))
    return (lambda *t: list(model(*t))), "AOTInductor"


def chain(folder: Path, route: str, device: str, replayed: bool):
    """The export's nodes run in pipeline.yaml's edge order, by hand: inputs dict -> outputs dict."""
    import yaml

    desc = yaml.safe_load((folder / "pipeline.yaml").read_text())
    source = {(c["node"], c["input"]): ("", i["name"]) for i in desc["inputs"] for c in i["consumers"]}
    source.update({(e["to_node"], e["to_input"]): (e["from_node"], e["from_output"]) for e in desc["edges"]})
    pending, steps, what, done = list(desc["nodes"]), [], set(), {""}
    while pending:
        node = next(n for n in pending if all(source[(n["name"], i["name"])][0] in done for i in n["inputs"]))
        pending.remove(node)
        done.add(node["name"])
        path = folder / node["artifact"]
        if node["backend"] == "onnx":
            fn, how = onnx_runner(path, node, device, replayed)
        else:
            fn, how = pt2_runner(path, route, node["name"])
        what.add(f"{node['backend']}: {how}")
        steps.append((node, fn))
    outputs = [(o["name"], o["node"], o["output"]) for o in desc["outputs"]]

    def run(inputs: dict) -> dict:
        values = {("", k): v for k, v in inputs.items()}
        for node, fn in steps:
            got = fn(*[values[source[(node["name"], i["name"])]] for i in node["inputs"]])
            values.update({(node["name"], o["name"]): t for o, t in zip(node["outputs"], got)})
        return {name: values[(n, o)] for name, n, o in outputs}

    return run, sorted(what)


def cpu_median_ms(fn, calls: int) -> tuple[float, float]:
    """(wall, thread CPU time) medians in ms. The wall clock is what a control loop waits; the calling thread's
    CPU time leaves out the time other processes of a shared machine took the core (every route here runs in
    the calling thread with --threads 1). The CPU clock is read outside the wall clock's interval."""
    wall, cpu = [], []
    for _ in range(calls):
        c0 = time.thread_time()
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        cpu.append(time.thread_time() - c0)
        wall.append(t1 - t0)
    return statistics.median(wall) * 1e3, statistics.median(cpu) * 1e3


def median_ms(fn, calls: int, device: str) -> tuple[float, float | None]:
    if device == "cpu":
        return cpu_median_ms(fn, calls)
    import timing

    return timing.time_calls(fn, calls, warmup=0)["median_us"] / 1e3, None


def measure(case: str, route: str, n: int, device: str, out: Path, args) -> dict:
    fmt = "onnx" if route == "onnx" else "pt2"
    inputs = case_inputs(case, n, device, seed=123)
    runs, eager_fn, notes = {}, None, set()
    for warp in VARIANTS:
        folder, eager_fn = export(case, fmt, warp, n, device, out)
        run, what = chain(folder, route, device, replayed=warp == "replay")
        runs[warp] = run
        notes.update(what)
    with torch.no_grad():
        want = eager_fn(**inputs)
        err = {w: float((next(iter(r(inputs).values())).to(want.device) - want).abs().max()) for w, r in runs.items()}
        calls = {w: (lambda r=r: r(inputs)) for w, r in runs.items()}
        calls["eager"] = lambda: eager_fn(**inputs)
        for fn in calls.values():
            for _ in range(args.warmup):
                fn()
        rounds = {w: [] for w in calls}
        for _ in range(args.repeats):
            for w, fn in calls.items():
                rounds[w].append(median_ms(fn, args.calls, device))
    ms = {w: statistics.median(r[0] for r in v) for w, v in rounds.items()}
    cpu = {w: statistics.median(r[1] for r in v) if v[0][1] is not None else None for w, v in rounds.items()}
    spread = {w: (min(r[0] for r in v), max(r[0] for r in v)) for w, v in rounds.items()}
    return {"route": route, "case": case, "batch": n, "replay": ms["replay"], "lower": ms["lower"],
            "eager": ms["eager"], "cpu": cpu, "spread": spread, "err": max(err.values()), "notes": sorted(notes)}


def machine_line(device: str) -> str:
    import onnxruntime as ort

    cpu = platform.processor() or "cpu"
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            names = [ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")]
        cpu = names[0] if names else cpu
    gpu = f", GPU {torch.cuda.get_device_name()}" if device == "cuda" else ""
    return (f"{cpu}, {os.cpu_count()} cores{gpu}; python {platform.python_version()}, torch {torch.__version__}, "
            f"onnxruntime {ort.__version__}, warp {wp.__version__}")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--batches", default="1,64,4096", help="numbers of robots (comma separated)")
    p.add_argument("--cases", default=",".join(CASES), help=f"of {CASES}")
    p.add_argument("--routes", default=",".join(DEFAULT_ROUTES), help=f"of {ROUTES}")
    p.add_argument("--calls", type=int, default=100, help="timed calls per round (at least 50)")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--repeats", type=int, default=5, help="interleaved rounds; a row is their median")
    p.add_argument("--threads", type=int, default=1,
                   help="torch's and each ORT session's intra-op threads (Warp's CPU launches and leapp's CPU "
                   "code run on one thread)")
    p.add_argument("--no-aoti", action="store_true", help="skip the AOTInductor route (its compile takes ~15 s)")
    p.add_argument("--quick", action="store_true", help="smoke: 64 robots, 50 calls, 5 warm-up, 1 round, no AOTI")
    p.add_argument("--verbose", action="store_true", help="also Warp's banner and torch's exporter notes")
    args = p.parse_args(argv)
    if args.quick:
        args.batches, args.calls, args.warmup, args.repeats, args.no_aoti = "64", 50, 5, 1, True
    if args.calls < 50:
        p.error(f"--calls {args.calls}: medians need at least 50 calls")
    for name, allowed in (("cases", CASES), ("routes", ROUTES)):
        bad = set(getattr(args, name).split(",")) - set(allowed)
        if bad:
            p.error(f"--{name}: unknown {sorted(bad)} (known: {', '.join(allowed)})")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    quiet_output(args.verbose)
    torch.set_num_threads(args.threads)
    wp.init()
    if args.device == "cuda" and not (torch.cuda.is_available() and wp.is_cuda_available()):
        raise SystemExit("--device cuda: no CUDA device for torch and Warp here")
    device = "cuda:0" if args.device == "cuda" else "cpu"
    routes = [r for r in args.routes.split(",") if not (r == "aoti" and args.no_aoti)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for case in args.cases.split(","):
            for route in routes:
                for n in (int(v) for v in args.batches.split(",")):
                    rows.append(measure(case, route, n, device, Path(tmp), args))
                    r = rows[-1]
                    print(f"  {route} {case} {n}: replay {r['replay']:.4f} ms, lowered {r['lower']:.4f} ms",
                          file=sys.stderr, flush=True)
    clock = "CUDA events" if args.device == "cuda" else "perf_counter"
    print(f"lowering ({args.device}, {clock}; median of {args.repeats} round medians of {args.calls} calls after "
          f"{args.warmup} warm-up; {args.threads} intra-op thread(s)): {machine_line(args.device)}")
    print("| route | case | batch | replay ms | lowered ms | ratio lowered/replay | replay cpu ms | lowered cpu ms | "
          "cpu ratio | eager ms | rounds' range replay / lowered ms | max abs err |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|")
    for r in rows:
        c, (a, b), (x, y) = r["cpu"], r["spread"]["replay"], r["spread"]["lower"]
        cpu = (f"{c['replay']:.4f} | {c['lower']:.4f} | {c['lower'] / c['replay']:.2f}" if c["replay"] is not None
               else "- | - | -")
        print(f"| {r['route']} | {r['case']} | {r['batch']} | {r['replay']:.4f} | {r['lower']:.4f} | "
              f"{r['lower'] / r['replay']:.2f} | {cpu} | {r['eager']:.4f} | {a:.3f}-{b:.3f} / {x:.3f}-{y:.3f} | "
              f"{r['err']:.1e} |")
    notes = sorted({note for r in rows for note in r["notes"]})
    print(f"\nnode runners: {'; '.join(notes)}")
    worst = max(r["err"] for r in rows)
    return 0 if worst <= 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
