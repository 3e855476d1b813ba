"""benchmarks/verify.py: what checking a signature costs at load (docs/signing.md), CPU wall clock, medians.

For a small export (two ONNX nodes, ~20 KB) and a large one (one ONNX node with ~100 MB of weights), each signed
with a P-256 key: ``leapp.load`` without trust, ``leapp.load(trust=...)``, and the native ``verify_folder`` alone
(which hashes every file once; the read-once checks reuse the loader's own hash of each artifact). Needs the
signing extra (``leapp sign``). Writes a Markdown table to stdout, or to ``--out``.

    python benchmarks/verify.py --repeat 7 --out benchmarks/results/verify-YYYY-MM-DD.md
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import tempfile
import time
from pathlib import Path


def _export(folder: Path, name: str, width: int, depth: int) -> Path:
    import torch

    import leapp

    torch.manual_seed(0)
    layers = [torch.nn.Linear(width, width) for _ in range(depth)]
    mlp = torch.nn.Sequential(*layers)

    @leapp.node("policy", export_with="onnx")
    def policy(obs):
        return mlp(obs)

    obs = torch.randn(1, width)
    with leapp.trace(name, save_path=folder) as session, torch.no_grad():
        for _ in range(3):
            policy(obs)
    session.compile(validate=False)
    return folder / name


def _median_ms(fn, repeat: int) -> float:
    fn()  # warm: the page cache and imports, as a robot's second start would have
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    os.environ.pop("LEAPP_TRUST", None)

    import leapp
    from leapp.signing import verify_folder
    from leapp.signing.sign import sign_folder

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        subprocess.run(["openssl", "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", tmp / "k.pem"],
                       check=True)
        subprocess.run(["openssl", "ec", "-in", tmp / "k.pem", "-pubout", "-out", tmp / "k.pub.pem"], check=True,
                       capture_output=True)
        public = str(tmp / "k.pub.pem")
        for label, width, depth in [("small", 64, 2), ("large", 2896, 3)]:
            folder = _export(tmp, label, width, depth)
            sign_folder(folder, tmp / "k.pem")
            files = [p for p in folder.rglob("*") if p.is_file() and p.name != "model.sig"]
            size = sum(p.stat().st_size for p in files)
            plain = _median_ms(lambda f=folder: leapp.load(f), args.repeat)
            trusted = _median_ms(lambda f=folder: leapp.load(f, trust=public), args.repeat)
            verify = _median_ms(lambda f=folder: verify_folder(f, [public]), args.repeat)
            rows.append((label, len(files), size, plain, trusted, verify))
    lines = [f"# Signature verification at load ({datetime.date.today()})", "",
             f"CPU wall clock, median of {args.repeat} after one warm-up; {platform.processor() or platform.machine()}, "
             f"{os.cpu_count()} cores; `python benchmarks/verify.py`. P-256 key, files in the page cache. `added` is the "
             "difference of two medians and carries the run-to-run noise of opening ONNX Runtime sessions (tens of ms "
             "for the large export); `verify_folder alone` is the check's own cost (every file hashed once).", "",
             "| export | files | bytes | leapp.load (ms) | leapp.load(trust=) (ms) | added (ms) | verify_folder alone (ms) "
             "| verify MB/s |", "|---|---|---|---|---|---|---|---|"]
    for label, n, size, plain, trusted, verify in rows:
        lines.append(f"| {label} | {n} | {size} | {plain:.1f} | {trusted:.1f} | {trusted - plain:+.1f} | {verify:.1f} "
                     f"| {size / 1e6 / (verify / 1e3):.0f} |")
    text = "\n".join(lines) + "\n"
    if args.out:
        Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
