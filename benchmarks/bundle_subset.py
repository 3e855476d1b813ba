"""What a segment bundle carries: only the kernels it launches, against the whole Warp module of each (before).

The workload is MuJoCo Warp's forward kinematics and centre-of-mass positions (``kinematics`` + ``com_pos``)
on ``tests/realworld/hopper.xml`` (a floating base, a three-hinge leg, two sites; 4 worlds on device "cpu"),
in one ``annotate.warp_op()`` of a PT2 node: qpos is copied in with ``wp.to_torch(d.qpos).copy_(qpos)`` and
the node returns ``d.site_xpos``. Those kernels live in ``mujoco_warp._src.smooth``, a module of dozens of
kernels. Each mode is a new Python process with an empty binary cache (``LEAPP_CACHE_DIR`` a fresh folder),
which traces the node (3 passes, not timed) and times ``session.compile(validate=False)`` (a CPU capture
replays on CUDA only, so nothing is validated here):

  whole     LEAPP_BUNDLE_WHOLE_MODULES=1: every module variant a segment launches is compiled and carried
            whole, as leapp did before
  subset    the default: each module variant's launched kernels, with the functions and structs they use

Reported per mode: the bundle inside the .pt2 (stored bytes, LZ4-compressed binaries), the .pt2 file, the PTX
(decoded bytes, and the ``.entry`` symbols it defines: the kernels carried), the cubins (decoded bytes), the
kernels the manifest launches, and the first export's wall time with its NVRTC part (from leapp's log).

    python benchmarks/bundle_subset.py                         # default cubins (7) + PTX, one process per mode
    LEAPP_CUDA_ARCHS=90 python benchmarks/bundle_subset.py --runs 3 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

MJCF = Path(__file__).resolve().parents[1] / "tests" / "realworld" / "hopper.xml"
NWORLD = 4
MODES = {"whole": {"LEAPP_BUNDLE_WHOLE_MODULES": "1"}, "subset": {"LEAPP_BUNDLE_WHOLE_MODULES": "0"}}
_ENTRY = re.compile(rb"\.entry\s+([A-Za-z_$][\w$]*)")


def fk_node():
    """The traced node and a qpos maker: MuJoCo Warp's kinematics + com_pos in one Warp segment of a PT2 node."""
    import mujoco
    import mujoco_warp as mjw
    import torch
    import warp as wp

    import leapp
    from leapp import annotate

    mjm = mujoco.MjModel.from_xml_path(str(MJCF))
    with wp.ScopedDevice("cpu"):
        m = mjw.put_model(mjm)
        d = mjw.put_data(mjm, mujoco.MjData(mjm), nworld=NWORLD)

    @leapp.node("fk", export_with="pt2")
    def forward(qpos):
        wp.to_torch(d.qpos).copy_(qpos)
        with annotate.warp_op():
            mjw.kinematics(m, d)
            mjw.com_pos(m, d)
        return wp.to_torch(d.site_xpos).clone()

    def qpos(seed: int):
        g = torch.Generator().manual_seed(seed)
        q = torch.as_tensor(mjm.qpos0, dtype=torch.float32).repeat(NWORLD, 1)
        q[:, 3:7] = torch.nn.functional.normalize(torch.randn(NWORLD, 4, generator=g), dim=-1)
        q[:, 7:] = 2.0 * torch.rand(NWORLD, mjm.nq - 7, generator=g) - 1.0
        return q

    return forward, qpos


def child(out: str) -> dict:
    """Runs in the measured process: trace, then time session.compile(validate=False)."""
    from first_export import collect_log  # this folder's first-export benchmark reads the same log lines

    messages = collect_log()

    import leapp

    forward, qpos = fk_node()
    with leapp.trace("bundle_subset", save_path=out) as session:
        for seed in (1, 2, 3):
            forward(qpos(seed))
    start = time.perf_counter()
    session.compile(validate=False)
    wall = time.perf_counter() - start
    compiled = [m for line in messages for m in [re.search(r"\): compiled .* in ([\d.]+) s \((\d+) process", line)] if m]
    return {"export_s": wall, "nvrtc_s": sum(float(m.group(1)) for m in compiled),
            "processes": max((int(m.group(2)) for m in compiled), default=0), **bundle_stats(out)}


def bundle_stats(folder: str) -> dict:
    """Sizes and kernels of the (one) segment bundle in the export's .pt2 archive."""
    from leapp.bundle import read_bundle
    from leapp.bundle.format import MAGIC

    (pt2,) = sorted(Path(folder).rglob("*.pt2"))
    with zipfile.ZipFile(pt2) as z:
        (data,) = [blob for info in z.infolist() for blob in [z.read(info)] if blob[: len(MAGIC)] == MAGIC]
    bundle = read_bundle(data)
    ptx, cubins, entries = 0, 0, 0
    for m, module in enumerate(bundle.modules):
        for b, binary in enumerate(module["binaries"]):
            decoded = bundle.binary(m, b)
            if binary["kind"] == "ptx":
                ptx += len(decoded)
                entries += len(set(_ENTRY.findall(decoded)))
            else:
                cubins += len(decoded)
    return {"bundle_bytes": len(data), "pt2_bytes": pt2.stat().st_size, "ptx_bytes": ptx, "cubin_bytes": cubins,
            "ptx_entries": entries, "launched_kernels": len(bundle.kernels), "modules": len(bundle.modules),
            "cubins": sorted({bin_["arch"] for mod in bundle.modules for bin_ in mod["binaries"]
                              if bin_["kind"] == "cubin"})}


def run_child(mode: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="leapp-bundle-subset-") as tmp:
        env = dict(os.environ, LEAPP_CACHE_DIR=os.path.join(tmp, "cache"), **MODES[mode])
        env.pop("LEAPP_NO_CACHE", None)
        out = os.path.join(tmp, "export")
        done = subprocess.run([sys.executable, __file__, "--child", "--out", out], capture_output=True, text=True,
                              env=env, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"{mode}: the child failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=1, help="fresh processes per mode")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--json", help="write every number here")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.out)))
        return

    from first_export import _environment

    modes = [m for m in args.modes.split(",") if m]
    results: dict[str, list[dict]] = {m: [] for m in modes}
    for _ in range(args.runs):
        for mode in modes:
            results[mode].append(run_child(mode))
    env = _environment(args)
    archs = os.environ.get("LEAPP_CUDA_ARCHS", "").strip() or "default"
    print(f"MuJoCo Warp kinematics + com_pos on hopper.xml ({NWORLD} worlds, device cpu), first export with an "
          f"empty binary cache; {args.runs} fresh process(es) per mode; LEAPP_CUDA_ARCHS={archs}; "
          f"{env['cpus']} CPU(s) usable, load {env['load']}; commit {env['commit']}")
    print()
    print("| bundle carries | bundle B | .pt2 B | PTX B | PTX entries (kernels carried) | kernels launched "
          "| cubins B (archs) | first export s: median (min-max) | NVRTC s | processes |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for mode in modes:
        rows = results[mode]
        first, total = rows[0], [r["export_s"] for r in rows]
        print(f"| {mode} | {first['bundle_bytes']:,} | {first['pt2_bytes']:,} | {first['ptx_bytes']:,} "
              f"| {first['ptx_entries']} | {first['launched_kernels']} | {first['cubin_bytes']:,} "
              f"({', '.join(map(str, first['cubins']))}) | {statistics.median(total):.1f} "
              f"({min(total):.1f}-{max(total):.1f}) | {statistics.median(r['nvrtc_s'] for r in rows):.1f} "
              f"| {first['processes']} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"environment": env, "archs": archs, "results": results}, indent=1))


if __name__ == "__main__":
    main()
