"""What ``import leapp`` costs on top of ``import torch`` (it imports torch and registers ``leapp::warp_segment``).

Runs fresh interpreters, interleaved so load from other processes falls on every case alike,
and prints medians (milliseconds):

  python -c pass                   the interpreter alone
  import torch                     wall time of a process that imports torch
  import leapp                     wall time of a process that imports leapp (and so torch)
  leapp after torch                in-process: ``import torch`` first, then the clock around ``import leapp``
                                   (the op library, the fake kernel, leapp's own modules)

The target is ``import leapp`` ≤ ``import torch`` + 100 ms.

    python benchmarks/import_time.py [--runs 15]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

CASES = {
    "python -c pass": "pass",
    "import torch": "import torch",
    "import leapp": "import leapp",
}
_INCREMENT = "import time, torch\nt = time.perf_counter()\nimport leapp\nprint((time.perf_counter() - t) * 1e3)"


def wall_ms(code: str) -> float:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    return (time.perf_counter() - t) * 1e3


def increment_ms() -> float:
    out = subprocess.run([sys.executable, "-c", _INCREMENT], check=True, capture_output=True, text=True).stdout
    return float(out.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=15, help="fresh interpreters per case (default 15)")
    args = p.parse_args(argv)
    wall_ms("import leapp")  # warm the file cache once
    times: dict[str, list[float]] = {name: [] for name in [*CASES, "leapp after torch"]}
    for _ in range(args.runs):
        for name, code in CASES.items():
            times[name].append(wall_ms(code))
        times["leapp after torch"].append(increment_ms())
    med = {name: statistics.median(v) for name, v in times.items()}
    print("| case | median (ms) | min (ms) |\n|---|---|---|")
    for name, v in times.items():
        print(f"| {name} | {med[name]:.0f} | {min(v):.0f} |")
    extra = med["import leapp"] - med["import torch"]
    print(f"\nimport leapp - import torch: {extra:.0f} ms (medians of {args.runs} runs; target <= 100 ms); "
          f"leapp after torch in-process: {med['leapp after torch']:.0f} ms. python {sys.version.split()[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
