"""First export in a fresh process: ``session.compile()`` of the gravity segment, cold and warm binary cache.

The workload is issue 13's segment: quaternions (N, 4) -> projected gravity -> normalize * scale
(N, 3), two Warp kernels in one ``annotate.warp_op()`` of a PT2 node. Each measurement is a new
Python process that imports leapp, traces the node (2 passes + 1 sample, not timed) and times
``session.compile()``; the log of that process gives the split (artifacts incl. NVRTC, validation)
and how many binaries NVRTC compiled or the binary cache served.

  cold        an empty cache folder per process: NVRTC compiles every target, the process and its worker
              processes (one per CPU) compiling a share each
  cold-1cpu   the same with the process pinned to one CPU (os.sched_setaffinity): the targets
              compile one after another in the process itself
  warm        the cache folder a cold run filled: the binaries are read, nothing is compiled, and the
              validation cache answers (the same node on the same seeded samples: no worker runs)
  warm-revalidate  the same binaries from the cache, the validation cache emptied first: the node is
              validated in a fresh process (what a re-export with new samples or a changed node pays)
  off         LEAPP_NO_CACHE=1: compiled, nothing read or written

On a GPU the node is traced on cuda:0 and ``compile()`` validates (the default); without one it is
traced on the CPU and compiled with ``validate=False`` (a CPU capture replays on CUDA only), so
there it measures the export part alone.

    python benchmarks/first_export.py                     # 5 processes per mode, Markdown on stdout
    python benchmarks/first_export.py --runs 3 --json out.json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODES = ("cold", "cold-1cpu", "warm", "warm-revalidate", "off")


def gravity_node():
    """Issue 13's gravity node (a function of ``quat`` (N, 4) -> ``grav`` (N, 3)): one PT2 node whose
    ``annotate.warp_op()`` launches two Warp kernels. Also used by tests/export/test_bundle_size.py."""
    import torch
    import warp as wp

    import leapp
    from leapp import annotate

    @wp.kernel
    def projected_gravity(q: wp.array(dtype=wp.quat), g: wp.vec3, out: wp.array(dtype=wp.vec3)):
        i = wp.tid()
        out[i] = wp.quat_rotate_inv(q[i], g)

    @wp.kernel
    def normalize_scale(v: wp.array(dtype=wp.vec3), s: float, out: wp.array(dtype=wp.vec3)):
        i = wp.tid()
        out[i] = wp.normalize(v[i]) * s

    def observe(quat: torch.Tensor) -> torch.Tensor:
        with leapp.node("obs", export_with="pt2"):
            quat = annotate.input_tensors("obs", {"quat": quat})
            grav = torch.empty(quat.shape[0], 3, device=quat.device)
            dev = str(quat.device)
            with annotate.warp_op():
                tmp = wp.empty(quat.shape[0], dtype=wp.vec3, device=dev)
                wp.launch(projected_gravity, dim=quat.shape[0], device=dev,
                          inputs=[wp.from_torch(quat, dtype=wp.quat), wp.vec3(0.0, 0.0, -1.0)], outputs=[tmp])
                wp.launch(normalize_scale, dim=quat.shape[0], device=dev, inputs=[tmp, 9.81],
                          outputs=[wp.from_torch(grav, dtype=wp.vec3)])
            annotate.output_tensors("obs", {"grav": grav})
        return grav

    return observe


def collect_log() -> list[str]:
    """The messages leapp logs at INFO from now on in this process (the measured child reads its split from
    them), appended to the returned list."""
    messages: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            messages.append(record.getMessage())

    logging.getLogger("leapp").addHandler(Collect())
    logging.getLogger("leapp").setLevel(logging.INFO)
    return messages


def child(n: int, device: str, validate: bool, out: str) -> dict:
    """Runs in the measured process: trace, then time session.compile()."""
    t0 = time.perf_counter()
    messages = collect_log()
    logging.getLogger("leapp._export.cuda_code").setLevel(logging.DEBUG)  # each target's build time

    import torch

    import leapp

    observe = gravity_node()

    imported = time.perf_counter()
    gen = torch.Generator().manual_seed(0)
    with leapp.trace("first_export", save_path=out) as session:
        for _ in range(3):
            observe(torch.nn.functional.normalize(torch.randn(n, 4, generator=gen), dim=-1).to(device))
    traced = time.perf_counter()
    report = session.compile(validate=validate)
    done = time.perf_counter()

    def seconds(pattern: str) -> float:
        return sum(float(m.group(1)) for line in messages for m in [re.search(pattern, line)] if m)

    compiled = [line for line in messages if re.search(r"\): compiled .* in [\d.]+ s", line)]
    cached = [line for line in messages if "read from the binary cache" in line]
    count = lambda lines, what: sum(len(re.findall(r"(?:PTX|cubin) sm_\d+", line.split(what)[0])) for line in lines)  # noqa: E731
    return {
        "import_s": imported - t0,
        "trace_s": traced - imported,
        "compile_s": done - traced,
        "artifacts_s": seconds(r"artifacts and pipeline.yaml written in ([\d.]+) s"),
        "nvrtc_s": seconds(r"\): compiled .* in ([\d.]+) s"),
        "validation_s": seconds(r"validation of \d+ node\(s\) in ([\d.]+) s"),
        "compiled": count(compiled, " in "),
        "from_cache": count(cached, " read from"),
        "targets": {f"{m.group(1)} sm_{m.group(2)}": float(m.group(3)) for line in messages
                    for m in [re.search(r"(PTX|cubin) sm_(\d+) built in ([\d.]+) s", line)] if m},
        "bundle_bytes": _bundle_bytes(out),
        "validation_cached": sum(n.validation.cached for n in report),
        "threads": max([int(m.group(1)) for line in compiled for m in [re.search(r"\((\d+) process", line)] if m],
                       default=0),
    }


def _bundle_bytes(folder: str) -> list[int]:
    """Sizes of the segment bundles in the export's .pt2 archives (the bundle is a stored tensor of the archive)."""
    import zipfile

    from leapp.bundle.format import MAGIC

    sizes = []
    for pt2 in sorted(Path(folder).rglob("*.pt2")):
        with zipfile.ZipFile(pt2) as z:
            sizes += [info.file_size for info in z.infolist() if z.read(info)[: len(MAGIC)] == MAGIC]
    return sizes


def run_child(mode: str, cache: Path, args) -> dict:
    env = dict(os.environ, LEAPP_CACHE_DIR=str(cache))
    env.pop("LEAPP_NO_CACHE", None)
    if mode == "off":
        env["LEAPP_NO_CACHE"] = "1"
    if mode == "warm-revalidate":
        shutil.rmtree(cache / "validation-v1", ignore_errors=True)
    cmd = [sys.executable, __file__, "--child", "--n", str(args.n), "--device", args.device]
    cmd += ["--validate"] if args.validate else []
    with tempfile.TemporaryDirectory(prefix="leapp-first-export-") as out:
        cmd += ["--out", out]
        pin = "import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); " if mode == "cold-1cpu" else ""
        if pin:
            cmd = [sys.executable, "-c", pin + "import runpy, sys; sys.argv = sys.argv[1:]; "
                   "runpy.run_path(sys.argv[0], run_name='__main__')", *cmd[1:]]
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"{mode}: the child failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=5, help="fresh processes per mode")
    p.add_argument("--n", type=int, default=4096, help="quaternions traced")
    p.add_argument("--device", default=None, help="cuda:0 when a GPU is usable, else cpu")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--json", help="write every number here")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--validate", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.n, args.device, args.validate, args.out)))
        return

    if args.device is None:
        from leapp import _native

        args.device = "cuda:0" if _native.driver_status()["available"] else "cpu"
    args.validate = args.device.startswith("cuda")
    modes = [m for m in args.modes.split(",") if m]
    results: dict[str, list[dict]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory(prefix="leapp-bench-cache-") as root:
        for r in range(args.runs):
            cold_cache = Path(root) / f"cold-{r}"
            for mode in modes:
                base = mode.partition("+")[0]
                cache = Path(root) / f"{mode}-{r}" if not base.startswith("warm") else Path(root) / "warm"
                if base.startswith("warm") and not cache.exists():
                    run_child("cold", cache, args)  # fills it; not counted
                results[mode].append(run_child(mode, cold_cache if mode == "cold" else cache, args))

    env = _environment(args)
    print(f"first export of the gravity segment (N = {args.n}, {args.device}, validate={args.validate}); "
          f"{args.runs} fresh process(es) per mode; {env['cpus']} CPU(s) usable, load {env['load']}; "
          f"bytecode: {env['bytecode']}")
    print()
    print("| mode | session.compile() s: median (min-max) | NVRTC s | validation s | binaries compiled / from cache "
          "| validations cached | processes | trace s | imports s | bundle B |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for mode in modes:
        rows = results[mode]
        total = [r["compile_s"] for r in rows]
        med = lambda key: statistics.median(r[key] for r in rows)  # noqa: E731
        print(f"| {mode} | {statistics.median(total):.2f} ({min(total):.2f}-{max(total):.2f}) | {med('nvrtc_s'):.2f} "
              f"| {med('validation_s'):.2f} | {rows[0]['compiled']} / {rows[0]['from_cache']} "
              f"| {sum(r['validation_cached'] for r in rows)}/{len(rows)} | {rows[0]['threads']} "
              f"| {med('trace_s'):.2f} | {med('import_s'):.2f} | {', '.join(map(str, rows[0]['bundle_bytes']))} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"environment": env, "n": args.n, "device": args.device,
                                               "results": results}, indent=1))


def _environment(args) -> dict:
    import platform

    import torch
    import warp

    import leapp

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).parent).stdout.strip()
    except OSError:
        commit = ""
    return {"python": platform.python_version(), "torch": torch.__version__, "warp": warp.__version__,
            "leapp": leapp.__version__ if hasattr(leapp, "__version__") else "", "commit": commit,
            "cpus": len(os.sched_getaffinity(0)), "load": " ".join(f"{x:.1f}" for x in os.getloadavg()),
            "machine": platform.machine(), "bytecode": _bytecode(torch)}


def _bytecode(torch) -> str:
    """Whether this interpreter's imports come from cached bytecode: every fresh process of the benchmark
    imports torch and its export machinery, and without .pyc files (``PYTHONDONTWRITEBYTECODE=1`` on an
    install that has none) it compiles each module from source (on the H200 machine: import torch 3.3 s
    instead of 1.5 s, torch.export's deserializer 3.8 s instead of 1.2 s)."""
    import importlib.util

    cached = importlib.util.cache_from_source(torch.__file__)
    state = "cached" if os.path.isfile(cached) else "none for torch"
    if sys.dont_write_bytecode:
        state += ", not written (PYTHONDONTWRITEBYTECODE)"
    if sys.pycache_prefix:
        state += f", prefix {sys.pycache_prefix}"
    return state


if __name__ == "__main__":
    main()
