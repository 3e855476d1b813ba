"""Check the PTX ISA leapp declares (leapp/_export/ptx_isa.py) on whole Warp modules, with any ptxas.

Each module is compiled to compute_75 PTX by Warp's NVRTC, declared as an export declares it (checked by
the first ptxas given), then assembled for sm_75 and sm_87 (Jetson Orin) by every ptxas given. A ptxas of
CUDA 12.2 is the JIT a JetPack 6.0 driver runs; NVIDIA's ``nvidia-cuda-nvcc-cu12==12.2.140`` wheel has one
(``nvidia/cuda_nvcc/bin/ptxas``). Prints one Markdown row per module. No GPU needed.

    python scripts/ptx_isa_corpus.py --ptxas /usr/local/cuda/bin/ptxas --ptxas /tmp/ptxas-12.2 \\
        warp.tests.test_atomic isaaclab_experimental.envs.mdp.observations mujoco_warp._src.smooth
"""

from __future__ import annotations

import argparse
import glob
import importlib
import os
import subprocess
import tempfile
import warnings

import warp as wp

from leapp._export import ptx_isa
from leapp.bundle.format import ptx_isa_of


def assemble(ptxas: ptx_isa.Ptxas, ptx: bytes, arch: str) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "m.ptx")
        with open(path, "wb") as f:
            f.write(ptx.rstrip(b"\0"))
        r = subprocess.run([ptxas.path, f"-arch={arch}", path, "-o", os.devnull], capture_output=True, text=True,
                           check=False)
    if r.returncode == 0:
        return "ok"
    return "FAIL: " + next((ln for ln in r.stderr.splitlines() if "error" in ln), r.stderr.strip())[:160]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ptxas", action="append", required=True, help="a ptxas (the first checks the export)")
    parser.add_argument("modules", nargs="+", help="Python modules whose Warp module is compiled whole")
    args = parser.parse_args()
    wp.config.quiet = True
    wp.init()
    assemblers = []
    for path in args.ptxas:
        found = ptx_isa._probe(path)
        if found is None:
            parser.error(f"{path} is not a ptxas that runs")
        assemblers.append(found)
    declaration = ptx_isa.Declaration(ptx_isa.DEFAULT_ISA, assemblers[0])
    columns = [f"ptxas {a.release} {arch}" for a in assemblers for arch in ("sm_75", "sm_87")]
    print(f"| module | PTX bytes | written | declared | {' | '.join(columns)} |")
    print("|---|---:|---|---|" + "---|" * len(columns))
    for name in args.modules:
        importlib.import_module(name)
        with tempfile.TemporaryDirectory() as out:
            wp.compile_aot_module(wp.get_module(name), arch=75, use_ptx=True, module_dir=out)
            (path,) = glob.glob(os.path.join(out, "**", "*.ptx"), recursive=True)
            with open(path, "rb") as f:
                ptx = f.read()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            declared = declaration.apply(ptx, name)
        results = [assemble(a, declared, arch) for a in assemblers for arch in ("sm_75", "sm_87")]
        note = f" ({caught[0].message})" if caught else ""
        dropped = " (hints dropped)" if b"used_bytes_mask" in ptx and b"used_bytes_mask" not in declared else ""
        print(f"| `{name}` | {len(ptx):,} | {ptx_isa_of(ptx)} | {ptx_isa_of(declared)}{dropped}{note} | "
              f"{' | '.join(results)} |", flush=True)


if __name__ == "__main__":
    main()
