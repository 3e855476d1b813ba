"""run_segment's per-call cost and same-stream correctness from C++, against the fake driver (no GPU needed).

Builds ``benchmarks/native/replay_threads.cpp`` with the runtime core
(``ext/core/src/*.cpp`` of ``--source``, default this checkout) and the fake
``libcuda.so.1`` of ``tests/runtime/mock_cuda``, then runs

  bench   one thread, run_segment alone in a loop (the example segment: a memset,
          one launch, a copy and an output init, n = 4): ns per call, best and
          median of 7 rounds. With the fake driver this is leapp's own host cost
          plus a few nanoseconds of emulated work.
  stress  8 threads replaying one segment on one shared stream, every output byte
          compared with a single-threaded reference (exit status 1 on any mismatch);
          the fake driver sleeps ``--delay-us`` after each memset/copy/launch;
          ``--release-every-ms`` adds a thread calling release_segments() meanwhile.

    python benchmarks/replay_threads.py                       # bench + stress, this checkout
    python benchmarks/replay_threads.py --source /tmp/old     # the same against another tree's core
    python benchmarks/replay_threads.py --sanitize thread --only stress   # ThreadSanitizer (docs/building.md)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from leapp.bundle.testing import example_bundle  # noqa: E402


def build(source: Path, out: Path, sanitize: str | None) -> Path:
    """Compiles the fake driver and the harness into ``out``; returns the harness."""
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not cxx or not cc:
        raise SystemExit("replay_threads.py needs a C and a C++ compiler")
    # pyproject.toml builds Release (-O3 -DNDEBUG); sanitizer builds keep frames and stay debuggable
    flags = ["-O1", "-g", "-fno-omit-frame-pointer", f"-fsanitize={sanitize}"] if sanitize else ["-O3", "-DNDEBUG"]
    flags.append("-pthread")
    subprocess.run([cc, "-shared", "-fPIC", *flags, "-o", str(out / "libcuda.so.1"),
                    str(ROOT / "tests/runtime/mock_cuda/mock_libcuda.c")], check=True)
    core = sorted((source / "ext/core/src").glob("*.cpp"))
    if "release_segments" in (source / "ext/core/include/leapp/runtime.h").read_text():
        flags.append("-DLEAPP_HAVE_RELEASE")

    def compile_one(src: Path) -> Path:
        obj = out / (src.stem + ".o")
        subprocess.run([cxx, "-std=c++17", *flags, "-I", str(source / "ext/core/include"), "-c", str(src),
                        "-o", str(obj)], check=True)
        return obj

    with ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        objects = list(pool.map(compile_one, core + [ROOT / "benchmarks/native/replay_threads.cpp"]))
    exe = out / "replay_threads"
    subprocess.run([cxx, *flags, "-o", str(exe), *map(str, objects), "-ldl"], check=True)
    return exe


def run(exe: Path, bundle: Path, *args: str, delay_us: int = 0) -> dict:
    env = dict(os.environ, LD_LIBRARY_PATH=f"{exe.parent}:{os.environ.get('LD_LIBRARY_PATH', '')}",
               MOCK_DEVICES="1", MOCK_STREAM_DELAY_US=str(delay_us))
    proc = subprocess.run([str(exe), str(bundle), *args], env=env, capture_output=True, text=True)
    sys.stderr.write(proc.stderr)  # sanitizer reports
    lines = proc.stdout.strip().splitlines()
    if not lines:
        raise SystemExit(f"replay_threads failed ({proc.returncode})")
    # 1: wrong outputs; a sanitizer's own exit status (e.g. TSan's 66) when it reported something
    return {**json.loads(lines[-1]), "exit_status": proc.returncode}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--source", type=Path, default=ROOT, help="tree whose ext/core is built (default: this checkout)")
    p.add_argument("--sanitize", choices=["thread", "address", "undefined"], help="build with -fsanitize=...")
    p.add_argument("--only", choices=["bench", "stress"])
    p.add_argument("--calls", type=int, default=0, help="bench: calls per round; stress: calls per thread")
    p.add_argument("--stream", default="shared", help="stress: shared|legacy|null|per-thread|own")
    p.add_argument("--delay-us", type=int, default=20, help="stress: the fake driver's sleep after each stream op")
    p.add_argument("--release-every-ms", type=int, default=0, help="stress: release_segments() every M ms meanwhile")
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="leapp-replay-threads-") as tmp:
        out = Path(tmp)
        exe = build(a.source.resolve(), out, a.sanitize)
        results = []
        if a.only in (None, "bench"):
            (out / "small.bundle").write_bytes(example_bundle(4, segment="bench/small"))
            results.append(run(exe, out / "small.bundle", "bench", "--calls", str(a.calls or 200000)))
        if a.only in (None, "stress"):
            (out / "stress.bundle").write_bytes(example_bundle(256, segment="bench/stress"))
            results.append(run(exe, out / "stress.bundle", "stress", "--threads", "8", "--calls",
                               str(a.calls or 300), "--stream", a.stream, "--release-every-ms",
                               str(a.release_every_ms), delay_us=a.delay_us))
        for r in results:
            print(json.dumps({"source": str(a.source), "sanitize": a.sanitize, **r}))
        return 1 if any(r.get("wrong") or r["exit_status"] for r in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
