"""leapp/runtime/build.py: ``leapp-build-warp-runtime``, (re)building the native op libraries.

pip builds ``libleapp_warp_torch.so`` (and the C++ runner's AOTInductor plugin
``libleapp_pipeline_aoti.so``) only when torch was installed before leapp, and
``libleapp_warp_ort.so`` only when the ONNX Runtime headers were there. This command builds them later with CMake, against the torch of the
running interpreter, and installs them next to ``leapp._native`` (where
``leapp.runtime.libraries`` looks). ``--status`` reports what exists and the
CUDA driver state without building anything.

NOTE: the C++ sources come from the checkout in editable installs, else from
``leapp/_native_src`` (installed with the package by ext/core/CMakeLists.txt),
or from ``--source-dir`` / ``$LEAPP_SOURCE_DIR``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from leapp.runtime import libraries

__all__ = ["main", "status_lines", "find_sources", "build", "install_built", "PLUGIN_NAMES"]

# built next to the op libraries when torch is found; found by libleapp_pipeline.so beside it (docs/deploy.md)
PLUGIN_NAMES = ("libleapp_pipeline_aoti.so",)


def find_sources(explicit: str | None = None) -> Path:
    """The ``ext/`` folder to build from; FileNotFoundError lists the places tried."""
    candidates = []
    if explicit:
        candidates.append(Path(explicit))
    if os.environ.get("LEAPP_SOURCE_DIR"):
        candidates.append(Path(os.environ["LEAPP_SOURCE_DIR"]))
    checkout = Path(__file__).resolve().parents[2]
    candidates += [checkout / "ext", checkout, libraries.native_dir() / "_native_src"]
    for c in candidates:
        if (c / "CMakeLists.txt").is_file() and (c / "core" / "CMakeLists.txt").is_file():
            return c
        if (c / "ext" / "CMakeLists.txt").is_file() and (c / "ext" / "core").is_dir():
            return c / "ext"
    tried = ", ".join(str(c) for c in candidates)
    raise FileNotFoundError(
        f"leapp-build-warp-runtime: the native sources (ext/) were not found; tried {tried}. "
        "Pass --source-dir <leapp checkout>/ext or set LEAPP_SOURCE_DIR."
    )


def _ort_include(sources: Path, explicit: str | None) -> Path | None:
    for c in (explicit, os.environ.get("ORT_INCLUDE_DIR"), sources.parent / "third_party" / "onnxruntime" / "include"):
        if c and (Path(c) / "onnxruntime_cxx_api.h").is_file():
            return Path(c)
    return None


def status_lines() -> list[str]:
    """Which op libraries exist, where, and the driver state (never raises)."""
    lines = []
    try:
        lines.append(f"native dir: {libraries.native_dir()}")
    except ImportError as e:
        return [f"leapp._native cannot be imported ({e}); rebuild leapp: pip install -e ."]
    for backend in ("pt2", "onnx"):
        path = libraries.library_path(backend)
        env = libraries.ENV_OVERRIDES[backend]
        origin = f" (from ${env})" if os.environ.get(env) else ""
        state = "present" if path.is_file() else "MISSING"
        lines.append(f"{backend}: {state} {path}{origin}")
    from leapp import _native

    status = _native.driver_status()
    if status["available"]:
        v = status["version"]
        lines.append(f"CUDA driver: {v // 1000}.{(v % 1000) // 10}")
        for dev in status["devices"]:
            major, minor = dev["compute_capability"]
            lines.append(f"  device {dev['ordinal']}: {dev['name']} (compute capability {major}.{minor})")
    else:
        lines.append(f"CUDA driver: unavailable ({status['error']}); export works, replay needs an NVIDIA driver")
    return lines


def build(
    source_dir: str | None = None,
    ort_include: str | None = None,
    dest: Path | None = None,
    build_dir: str | None = None,
    jobs: int | None = None,
) -> list[Path]:
    """Configures, builds and installs the op libraries; returns the installed paths.

    Raises:
        FileNotFoundError: no sources, or cmake is not installed.
        RuntimeError: CMake failed (its output is included).
    """
    import torch.utils

    sources = find_sources(source_dir)
    cmake = shutil.which("cmake")
    if cmake is None:
        raise FileNotFoundError("leapp-build-warp-runtime: cmake is not installed (pip install cmake, or your OS package)")
    dest = dest or libraries.native_dir()
    ort = _ort_include(sources, ort_include)
    work = Path(build_dir) if build_dir else Path(tempfile.mkdtemp(prefix="leapp-ops-"))
    prefix = work / "install"
    configure = [cmake, "-S", str(sources), "-B", str(work / "build"), "-DCMAKE_BUILD_TYPE=Release",
                 f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}", f"-DCMAKE_INSTALL_PREFIX={prefix}"]
    if ort:
        configure.append(f"-DORT_INCLUDE_DIR={ort}")
    if shutil.which("ninja"):
        configure += ["-G", "Ninja"]
    steps = [configure, [cmake, "--build", str(work / "build"), "-j", str(jobs or os.cpu_count() or 2)],
             [cmake, "--install", str(work / "build")]]
    for step in steps:
        proc = subprocess.run(step, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(
                f"leapp-build-warp-runtime: {' '.join(step)} failed ({proc.returncode}):\n"
                f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
            )
    return install_built(prefix, dest)


def install_built(prefix: Path, dest: Path) -> list[Path]:
    """Copies the libraries CMake installed under ``prefix/leapp`` into ``dest``; returns the installed paths."""
    installed = []
    dest.mkdir(parents=True, exist_ok=True)
    for name in (*libraries.LIBRARY_NAMES.values(), *PLUGIN_NAMES):
        built = prefix / "leapp" / name
        if built.is_file():
            target = dest / name
            tmp = target.with_suffix(".so.tmp")
            shutil.copy2(built, tmp)
            os.replace(tmp, target)  # atomic: a process that has the old one mapped keeps it
            installed.append(target)
    return installed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="leapp-build-warp-runtime",
        description="Build leapp's native op libraries (torch: libleapp_warp_torch.so and the C++ runner's "
        "AOTInductor plugin libleapp_pipeline_aoti.so; ONNX Runtime: libleapp_warp_ort.so) against the installed "
        "torch, into the folder of leapp._native.",
    )
    parser.add_argument("--status", action="store_true", help="only report which libraries exist and the driver state")
    parser.add_argument("--source-dir", help="the ext/ folder of a leapp checkout (default: found automatically)")
    parser.add_argument("--ort-include", help="ONNX Runtime headers (default: $ORT_INCLUDE_DIR or third_party/)")
    parser.add_argument("--build-dir", help="keep the CMake build here (default: a temporary folder)")
    parser.add_argument("--dest", help="install into this folder instead of leapp._native's")
    parser.add_argument("-j", "--jobs", type=int, help="parallel compile jobs")
    args = parser.parse_args(argv)
    if args.status:
        print("\n".join(status_lines()))
        return 0
    try:
        installed = build(args.source_dir, args.ort_include, Path(args.dest) if args.dest else None,
                          args.build_dir, args.jobs)
    except (FileNotFoundError, RuntimeError, ImportError) as e:
        print(str(e), file=sys.stderr)
        return 1
    for path in installed:
        print(f"installed {path}")
    if not any(p.name == libraries.LIBRARY_NAMES["onnx"] for p in installed):
        print("libleapp_warp_ort.so was not built: ONNX Runtime headers not found "
              "(bash scripts/fetch-ort-headers.sh, or --ort-include)", file=sys.stderr)
    print("\n".join(status_lines()))
    return 0 if installed else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
