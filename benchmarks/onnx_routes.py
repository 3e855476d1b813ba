"""Per-call latency of one exported 2-kernel Warp segment through each deployment route.

The segment is benchmarks/replay.py's (``tmp = x * 2``, ``y = tmp + x``), traced and exported by
its ``export`` into one folder with a PT2 node and an ONNX node. Measured per call with
timing.py's ``time_calls`` (CUDA events on torch's current stream and a host clock, each call
synchronised before the next: the latency a control loop sees), after a warm-up:

  onnx-cuda-ep          leapp.load(folder).run_node("seg_onnx", x=x): the ONNX node on ONNX Runtime's
                        CUDA EP, on torch's stream, no host synchronisation (leapp.runtime.onnx_runner)
  onnx-cuda-ep-handoff  the same call made on another torch stream than the session's: events hand
                        the work to the session's stream and back
  onnx-cpu-ep           the ONNX artifact in ORT's CPU EP with host tensors bound (the op stages them
                        through pinned memory onto the GPU and waits): replay.py's method
  pt2                   leapp.load(folder).run_node("seg_pt2", x=x)
  pt2-cuda-graphs       leapp.load(folder, cuda_graphs=True).run_node("seg_pt2", x=x), the same x every call
  floor                 the two kernels captured as one CUDA graph and replayed: replay.py's method
  onnx-cuda-ep-bare*    bare CUDA EP sessions (see bare_cuda_ep_sessions): ONNX Runtime's own cost
  aoti                  (--aoti) the PT2 node's AOTInductor package (leapp aoti), aoti_load_package

The ONNX routes through leapp.load are named by what the runner got: without a CUDA EP in the
installed onnxruntime the node runs on the CPU EP and the row says so. Every leapp.load route's
output is checked against ``x * 2 + x`` first.

    python benchmarks/onnx_routes.py                       # GPU: N=1024 and 262144, 1000 calls each
    python benchmarks/onnx_routes.py --quick --json r.json
    python benchmarks/onnx_routes.py --dry-run             # CPU: export and open both nodes, time nothing
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch
import warp as wp

import leapp
import replay
import timing

SIZES = (1024, 262144)


def ort_environment() -> dict:
    import onnxruntime as ort

    return {"onnxruntime": ort.__version__, "providers_available": ort.get_available_providers()}


def onnx_route_name(runner) -> str:
    """``onnx-cuda-ep`` when the runner runs on torch's stream; else the mode it fell back to."""
    return "onnx-cuda-ep" if runner.stream_mode == "torch-stream" else f"onnx-leapp.load ({runner.stream_mode})"


def expected(x: torch.Tensor) -> torch.Tensor:
    return x * replay.SCALE + x


def aoti_route(folder: Path, x: torch.Tensor) -> tuple[dict, dict]:
    """``leapp aoti``'s package of the PT2 node, loaded by ``torch._inductor.aoti_load_package``
    (its default multi-runner loader, as a user loads it): {"aoti": call}, {"aoti_compile_s": ...}."""
    import leapp.aoti

    start = time.perf_counter()
    path = leapp.aoti.package(folder, "seg_pt2")
    compile_s = time.perf_counter() - start
    model = torch._inductor.aoti_load_package(str(path))
    def call():
        out = model(x)
        return {"y": out if isinstance(out, torch.Tensor) else out[0]}

    return {"aoti": call}, {"aoti_compile_s": compile_s, "aoti_bytes": path.stat().st_size}


def routes(folder: Path, n: int, device: str, aoti: bool = False) -> tuple[dict, dict, dict]:
    """(name -> zero-argument call on torch's current stream, name -> call made on another stream,
    facts about the ONNX runner). Every input is prepared beforehand."""
    base = replay.methods(folder, n, device)  # floor and the ORT CPU EP session, as replay.py measures them
    x = torch.randn(n, device=device)
    pipeline = leapp.load(folder)
    graphed = leapp.load(folder, cuda_graphs=True)
    runner = pipeline.nodes["seg_onnx"].runner
    onnx = onnx_route_name(runner)
    on_current = {
        onnx: lambda: pipeline.run_node("seg_onnx", x=x),
        "onnx-cpu-ep": base["onnx-cpu-ep"],
        "pt2": lambda: pipeline.run_node("seg_pt2", x=x),
        "pt2-cuda-graphs": lambda: graphed.run_node("seg_pt2", x=x),
        "floor": base["floor"],
    }
    on_other = {}
    if runner.stream_mode == "torch-stream":
        on_other["onnx-cuda-ep-handoff"] = on_current[onnx]
        on_current.update(bare_cuda_ep_sessions(folder / "seg_onnx.onnx", x, runner.ort_stream))
    aoti_facts = {}
    if aoti:
        calls, aoti_facts = aoti_route(folder, x)
        on_current.update(calls)
    errors = {}
    for name in (onnx, "pt2", "pt2-cuda-graphs", *(["aoti"] if aoti else [])):
        for _ in range(3):  # pt2-cuda-graphs: a direct call, a capture, a replay
            y = on_current[name]()["y"]
        errors[name] = (y.to(x.device) - expected(x)).abs().max().item()
    facts = {"onnx_stream_mode": runner.stream_mode, "onnx_stream_reason": runner.stream_reason,
             "onnx_session_providers": runner.session.get_providers(), "max_abs_error": errors, **aoti_facts}
    return on_current, on_other, facts


def bare_cuda_ep_sessions(model: Path, x: torch.Tensor, ort_stream: int) -> dict:
    """Bare CUDA EP sessions of the ONNX node, with device tensors bound once, to split the
    runner's cost from ONNX Runtime's own:

    onnx-cuda-ep-bare              ORT's own stream, ORT's default run (it synchronises the stream at
                                   the end), torch's stream synchronised before each run
    onnx-cuda-ep-bare-user-stream  user_compute_stream = the runner's stream and
                                   disable_synchronize_execution_providers=1, as leapp.load runs it
    """
    import onnxruntime as ort

    from leapp.runtime import libraries
    from leapp.runtime.onnx_runner import cuda_ep_options, run_config, session_options

    y = torch.empty_like(x)
    out = {}
    for name, stream in (("onnx-cuda-ep-bare", None), ("onnx-cuda-ep-bare-user-stream", ort_stream)):
        options = session_options(ort, True, str(libraries.library_path("onnx")))
        session = ort.InferenceSession(str(model), options,
                                       providers=[("CUDAExecutionProvider", cuda_ep_options(x.device, stream))])
        binding = session.io_binding()
        binding.bind_input(session.get_inputs()[0].name, "cuda", x.device.index or 0, 1, [x.numel()], x.data_ptr())
        binding.bind_output(session.get_outputs()[0].name, "cuda", x.device.index or 0, 1, [y.numel()], y.data_ptr())
        run_options = ort.RunOptions()
        for key, value in run_config(host_sync=stream is None).items():
            run_options.add_run_config_entry(key, value)

        def call(session=session, binding=binding, run_options=run_options, own_stream=stream is None,
                 keep=(x, y)):
            if own_stream:
                torch.cuda.current_stream().synchronize()  # ORT's stream is not torch's
            session.run_with_iobinding(binding, run_options)

        out[name] = call
    return out


def timed(name: str, fn, calls: int, warmup: int) -> dict:
    """``timing.time_calls`` of one route; a failure names the route (CUDA errors surface at a later sync)."""
    try:
        return timing.time_calls(fn, calls, warmup)
    except Exception as e:
        raise RuntimeError(f"route {name!r}: {type(e).__name__}: {e}") from e


def measure(folder: Path, n: int, device: str, calls: int, warmup: int, only: set | None = None,
            aoti: bool = False) -> dict:
    on_current, on_other, facts = routes(folder, n, device, aoti)
    def wanted(name: str) -> bool:
        return only is None or name in only

    results = {name: timed(name, fn, calls, warmup) for name, fn in on_current.items() if wanted(name)}
    side = torch.cuda.Stream(device)
    with torch.cuda.stream(side):  # time_calls records its events on this stream, the call hands off
        results.update({name: timed(name, fn, calls, warmup) for name, fn in on_other.items() if wanted(name)})
    return {"routes": results, **facts}


def dry_run(folder: Path) -> list[str]:
    """CPU: what runs without a GPU: both nodes open through leapp.load (ORT session, PT2 program)."""
    pipeline = leapp.load(folder)
    runner = pipeline.nodes["seg_onnx"].runner
    assert runner.session.get_providers()[-1] == "CPUExecutionProvider"
    return [f"seg_onnx opened ({runner.stream_mode}: {runner.stream_reason})", "seg_pt2 opened"]


def table(results: dict) -> str:
    env = results["environment"]
    lines = [f"leapp ONNX/PT2 routes ({results['mode']}): " + ", ".join(f"{k} {v}" for k, v in env.items()), ""]
    lines += ["| N | route | median µs | p90 µs | host wall median µs | × floor | max abs error |",
              "|---:|---|---:|---:|---:|---:|---:|"]
    for n, entry in results["sizes"].items():
        if "routes" not in entry:
            lines.append(f"| {n} | (dry run: {'; '.join(entry['dry_run_checked'])}) | not measured | | | | |")
            continue
        floor = entry["routes"].get("floor", {}).get("median_us", float("nan"))  # --only may leave it out
        for name, m in entry["routes"].items():
            error = entry["max_abs_error"].get(name if name != "onnx-cuda-ep-handoff" else "onnx-cuda-ep")
            lines.append(f"| {n} | {name} | {m['median_us']:.1f} | {m['p90_us']:.1f} | {m['wall_median_us']:.1f} | "
                         f"{m['median_us'] / floor:.2f} | {'-' if error is None else f'{error:.3g}'} |")
    first = next(iter(results["sizes"].values()))
    if "onnx_stream_mode" in first:
        lines += ["", f"leapp.load's ONNX node: {first['onnx_stream_mode']} ({first['onnx_stream_reason']}); "
                      f"session providers {first['onnx_session_providers']}"]
    for n, entry in results["sizes"].items():
        if "aoti_compile_s" in entry:
            lines.append(f"N={n}: AOTInductor package {entry['aoti_bytes']} bytes, compiled in {entry['aoti_compile_s']:.1f} s")
    export_s = sum(e["export_s"] for e in results["sizes"].values())
    lines += ["", f"total {results['total_s']:.1f} s (exports {export_s:.1f} s)"]
    return "\n".join(lines)


def run(args) -> dict:
    started = time.perf_counter()
    device = "cpu" if args.dry_run else "cuda:0"
    wp.init()
    if not args.dry_run and not (torch.cuda.is_available() and wp.is_cuda_available()):
        raise SystemExit("onnx_routes.py: no CUDA device for torch and Warp; use --dry-run on machines without a GPU")
    out = Path(args.out or tempfile.mkdtemp(prefix="leapp-routes-"))
    env = {"torch": torch.__version__, "warp": wp.config.version, **ort_environment(), "device": device}
    if not args.dry_run:
        env["gpu"] = torch.cuda.get_device_name(device)
    results = {"mode": "dry-run" if args.dry_run else ("quick" if args.quick else "full"), "environment": env,
               "sizes": {}}
    print("onnxruntime", env["onnxruntime"], "providers available:", env["providers_available"], flush=True)
    for n in args.sizes:
        folder, export_s = replay.export(n, device, out)
        entry = {"export_s": export_s, "folder": str(folder)}
        if args.dry_run:
            entry["dry_run_checked"] = dry_run(folder)
        else:
            with wp.ScopedStream(wp.stream_from_torch(torch.cuda.current_stream())):  # the floor on torch's stream
                entry.update(measure(folder, n, device, args.calls, args.warmup, args.only, args.aoti))
        results["sizes"][str(n)] = entry
    results["total_s"] = time.perf_counter() - started
    return results


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smoke run: 100 calls and 20 warm-up calls per route")
    p.add_argument("--dry-run", action="store_true", help="CPU only: export and open both nodes; no timing")
    p.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    p.add_argument("--sizes", type=lambda s: [int(v) for v in s.split(",")], default=list(SIZES),
                   help="comma-separated N (default 1024,262144)")
    p.add_argument("--calls", type=int, default=None, help="timed calls per route (default 1000; --quick 100)")
    p.add_argument("--warmup", type=int, default=None, help="warm-up calls per route (default 100; --quick 20)")
    p.add_argument("--out", help="export folder (default: a new temporary folder)")
    p.add_argument("--aoti", action="store_true",
                   help="also time the PT2 node's AOTInductor package (leapp aoti; about a minute of compiling per size)")
    p.add_argument("--only", type=lambda s: set(s.split(",")), default=None,
                   help="comma-separated routes to time (default: all), e.g. onnx-cuda-ep,floor")
    args = p.parse_args(argv)
    args.calls = args.calls or (100 if args.quick else 1000)
    args.warmup = args.warmup or (20 if args.quick else 100)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    results = run(args)
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
