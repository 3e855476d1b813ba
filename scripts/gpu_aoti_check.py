"""scripts/gpu_aoti_check.py: why does every AOTInductor package crash when loaded on this machine?

On the H200 machine (torch 2.11.0+cu130) ``torch._inductor.aoti_load_package`` segfaulted for any
package, even ``sin(x) * 2 + 1``. Hypothesis: its ``CXX=/opt/gcc/bin/g++`` finds only
``libstdc++.a`` for ``-lstdc++``, so the model library Inductor links carries a private C++ runtime
(what crashed leapp's own op library: docs/building.md, "One C++ runtime per process"). Reproduced
on a CPU machine with a g++ that links libstdc++ statically: the package fails to load
(``Error: std::bad_cast``), and loads with ``-l:libstdc++.so.6``.

What it does, each step in child processes (a crash is a return code, not the end of the run):

1. prints torch, CUDA, $CXX, the compiler Inductor picks, each candidate compiler's
   ``-print-file-name=libstdc++.so`` / ``.a`` and leapp's probe link (``leapp._export.cxx_runtime``);
2. compiles ``sin(x) * 2 + 1`` on CUDA into a package per configuration, in parallel:
   ``default`` (this environment), ``system-g++`` (CXX=/usr/bin/g++ CC=/usr/bin/gcc), and
   ``leapp-fix`` (the default compiler plus what ``leapp aoti`` adds, when it adds anything);
3. reads each package library's dynamic symbols (a defined ``__cxa_begin_catch`` is a private
   C++ runtime) and NEEDED entries, then loads and runs each package in a fresh
   ``python -X faulthandler`` (return code -11 is SIGSEGV);
4. optionally (``--cpp``) loads the default package from C++ (tests/runtime/aoti_cpp, built with
   CMake), to tell a crash in torch's Python binding from one in the loader;
5. prints VERDICT lines. Exit status 0 when the package ``leapp aoti`` would make here loads and
   computes the right values, 1 otherwise.

Run on the GPU machine (leapp built there):
    bash scripts/gpu-run.sh python3 scripts/gpu_aoti_check.py            # about 1 minute
    bash scripts/gpu-run.sh python3 scripts/gpu_aoti_check.py --cpp      # plus a CMake build
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
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SYMBOLS = ("__cxa_begin_catch", "__cxa_throw", "_Unwind_RaiseException", "GOMP_parallel", "omp_get_num_threads")
N = 1024

COMPILE_CHILD = r"""
import json, sys, time, torch
configs = json.loads(sys.argv[2])
if "cpp.cxx" in configs:
    configs["cpp.cxx"] = tuple(configs["cpp.cxx"])
class SinModel(torch.nn.Module):
    def forward(self, x):
        return torch.sin(x) * 2 + 1
program = torch.export.export(SinModel(), (torch.randn(%d, device=sys.argv[3]),))
start = time.perf_counter()
torch._inductor.aoti_compile_and_package(program, package_path=sys.argv[1], inductor_configs=configs)
print(f"compiled in {time.perf_counter() - start:.1f} s", flush=True)
""" % N

LOAD_CHILD = r"""
import sys, torch
model = torch._inductor.aoti_load_package(sys.argv[1])
print("loaded", flush=True)
x = torch.randn(%d, device=sys.argv[2])
y = model(x)
y = y[0] if isinstance(y, (list, tuple)) else y
if x.is_cuda:
    torch.cuda.synchronize()
error = (y - (torch.sin(x) * 2 + 1)).abs().max().item()
print(f"ran: max abs error {error:.3g}", flush=True)
sys.exit(0 if error < 1e-5 else 3)
""" % N


def run(cmd: list[str], env: dict | None = None, timeout: float = 300) -> tuple[int, str]:
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        return 124, f"timed out after {timeout} s: {(e.stdout or '')[-1000:]}"
    except OSError as e:
        return 127, f"{type(e).__name__}: {e}"
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def first_line(text: str) -> str:
    return text.splitlines()[0] if text else ""


def describe_compiler(name: str, compiler: str) -> None:
    from leapp._export.cxx_runtime import probe_compiler

    rc, version = run([compiler, "--version"], timeout=30)
    print(f"  {name}: {compiler} -> {shutil.which(compiler) or '?'}  ({first_line(version) if rc == 0 else version})")
    for lib in ("libstdc++.so", "libstdc++.a"):
        rc, found = run([compiler, f"-print-file-name={lib}"], timeout=30)
        shown = found if os.path.isabs(found) else f"{found!r} (not found: a bare name means none)"
        print(f"    -print-file-name={lib}: {shown}")
    probe = probe_compiler(compiler)
    fix = "nothing needed" if probe.fix == [] else (f"-l{probe.fix[0]} fixes it" if probe.fix else "NO FIX: " + probe.detail[-300:])
    print(f"    probe link: {'PRIVATE C++ runtime (static libstdc++)' if probe.private else 'shared C++ runtime'}; {fix}")


def package_library_report(package: Path, work: Path) -> dict:
    """Defined runtime symbols and NEEDED entries of the package's model library."""
    from leapp._export.cxx_runtime import defined_dynamic_symbols

    with zipfile.ZipFile(package) as archive:
        libraries = [n for n in archive.namelist() if n.endswith(".so")]
        if not libraries:
            return {"error": f"no .so in {package.name}: {archive.namelist()}"}
        so = work / "model.so"
        so.write_bytes(archive.read(libraries[0]))
    defined = defined_dynamic_symbols(so)
    report = {"library": libraries[0].rsplit("/", 1)[-1], "size": so.stat().st_size,
              "defines": [s for s in SYMBOLS if s in defined]}
    if shutil.which("readelf"):
        rc, text = run(["readelf", "-d", str(so)], timeout=30)
        report["needed"] = [line.split("[", 1)[1].rstrip("]") for line in text.splitlines() if "(NEEDED)" in line]
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cpp", action="store_true", help="also load the default package from C++ (CMake build)")
    parser.add_argument("--keep", default=None, help="keep the packages and logs in this folder")
    parser.add_argument("--device", default="cuda", help="cuda (default), or cpu to try the script on a CPU machine")
    args = parser.parse_args()

    import torch
    import torch._inductor.config as inductor_config
    from torch._inductor import cpp_builder

    import leapp.aoti
    from leapp.errors import ExportError

    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, device "
          f"{torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'NONE'}, python {sys.version.split()[0]}")
    if args.device != "cpu" and not torch.cuda.is_available():
        print("VERDICT: no CUDA device visible to torch; nothing to check")
        return 1
    print(f"CXX={os.environ.get('CXX', '(unset)')} CC={os.environ.get('CC', '(unset)')}")
    print(f"aot_inductor.custom_op_libs option: {'present' if hasattr(inductor_config.aot_inductor, 'custom_op_libs') else 'ABSENT'}")
    inductor_compiler = cpp_builder.get_cpp_compiler()
    print("compilers:")
    describe_compiler("Inductor's (default)", inductor_compiler)
    system_gxx = "/usr/bin/g++"
    if os.path.exists(system_gxx):
        describe_compiler("system", system_gxx)

    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="gpu-aoti-check-"))
    work.mkdir(parents=True, exist_ok=True)
    configs: dict[str, tuple[dict, dict]] = {"default": (dict(os.environ), {})}
    if os.path.exists(system_gxx) and shutil.which(inductor_compiler) != system_gxx:
        env = dict(os.environ, CXX=system_gxx, CC="/usr/bin/gcc")
        configs["system-g++"] = (env, {})
    try:
        fix = leapp.aoti.compiler_configs({})
        if fix:
            configs["leapp-fix"] = (dict(os.environ), fix)
            print(f"leapp aoti adds: {fix}")
        else:
            print("leapp aoti adds nothing here (the default compiler links the shared C++ runtime)")
    except ExportError as e:
        print(f"leapp aoti refuses here: {e}")

    print(f"\ncompiling sin(x) * 2 + 1 on {args.device} in {len(configs)} configuration(s), in parallel ({work}) ...")
    start = time.perf_counter()
    children = {}
    for name, (env, inductor_configs) in configs.items():
        folder = work / name
        (folder / "tmp").mkdir(parents=True, exist_ok=True)
        child_env = dict(env)
        if name != "default":  # own Inductor caches and precompiled headers: no object made by another compiler
            child_env["TMPDIR"] = str(folder / "tmp")
            child_env["TORCHINDUCTOR_CACHE_DIR"] = str(folder / "tmp" / "inductor")
        log = open(folder / "compile.log", "w")  # noqa: SIM115 - the child writes it until it is reaped below
        children[name] = (subprocess.Popen(
            [sys.executable, "-c", COMPILE_CHILD, str(folder / "sin.pt2"), json.dumps(inductor_configs), args.device],
            env=child_env, stdout=log, stderr=subprocess.STDOUT), log, child_env)
    results: dict[str, dict] = {}
    for name, (proc, log, child_env) in children.items():
        try:
            rc = proc.wait(timeout=400)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = 124
        log.close()
        text = (work / name / "compile.log").read_text()
        results[name] = {"compile_rc": rc, "compile_log": text[-1500:], "env": child_env}
    print(f"compiled in {time.perf_counter() - start:.1f} s (wall)")

    loads = {}
    for name, result in results.items():
        package = work / name / "sin.pt2"
        if result["compile_rc"] != 0 or not package.is_file():
            continue
        result["library"] = package_library_report(package, work / name)
        loads[name] = subprocess.Popen([sys.executable, "-X", "faulthandler", "-c", LOAD_CHILD, str(package), args.device],
                                       env=result["env"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for name, proc in loads.items():
        try:
            out, _ = proc.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            proc.kill()
            out = "timed out"
        results[name]["load_rc"] = proc.returncode
        results[name]["load_log"] = (out or "")[-2500:]

    print()
    for name, result in results.items():
        print(f"== {name}")
        if result["compile_rc"] != 0:
            print(f"  compile FAILED (rc {result['compile_rc']}):\n    " + result["compile_log"].replace("\n", "\n    "))
            continue
        print(f"  {result['compile_log'].strip().splitlines()[-1] if result['compile_log'].strip() else ''}")
        lib = result.get("library", {})
        print(f"  model library {lib.get('library')}: {lib.get('size')} bytes; defines {lib.get('defines') or 'none of'} "
              f"{'' if lib.get('defines') else list(SYMBOLS)}")
        if "needed" in lib:
            print(f"  NEEDED: {', '.join(lib['needed'])}")
        rc = result.get("load_rc")
        state = "LOADS AND RUNS" if rc == 0 else ("CRASHED (SIGSEGV)" if rc == -11 else f"FAILED (rc {rc})")
        print(f"  load + run: {state}")
        if rc != 0:
            print("    " + result.get("load_log", "").replace("\n", "\n    "))

    if args.cpp and results.get("default", {}).get("compile_rc") == 0:
        results["default"]["cpp"] = load_from_cpp(work, work / "default" / "sin.pt2", args.device)

    return verdict(results, inductor_compiler)


def load_from_cpp(work: Path, package: Path, device: str) -> str:
    """Builds tests/runtime/aoti_cpp and runs the package on ``device`` from C++; returns a one-line result."""
    import numpy as np
    import torch

    cmake = shutil.which("cmake")
    if cmake is None:
        return "not run: no cmake"
    build = work / "cpp-build"
    rc, text = run([cmake, "-S", str(REPO / "tests" / "runtime" / "aoti_cpp"), "-B", str(build),
                    "-DCMAKE_BUILD_TYPE=Release", f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}"], timeout=300)
    if rc == 0:
        rc, text = run([cmake, "--build", str(build), "-j", "8"], timeout=600)
    if rc != 0:
        print("C++ build failed:\n  " + text[-3000:].replace("\n", "\n  "))
        return f"not run: the CMake build failed (rc {rc})"
    inputs, outputs = work / "cpp-in", work / "cpp-out"
    inputs.mkdir(exist_ok=True)
    outputs.mkdir(exist_ok=True)
    x = np.random.default_rng(0).standard_normal(N).astype(np.float32)
    x.tofile(inputs / "x.bin")
    (inputs / "inputs.txt").write_text(f"x.bin float32 1 {N}\n")
    rc, text = run([str(build / "aoti_run"), "-", str(package), device, str(inputs), str(outputs)], timeout=180)
    print(f"== C++ AOTIModelPackageLoader, default package: rc {rc}\n  " + text[-2000:].replace("\n", "\n  "))
    if rc != 0:
        return "CRASHED (SIGSEGV)" if rc == -11 else f"FAILED (rc {rc})"
    y = np.fromfile(outputs / "output_0.bin", dtype=np.float32)
    error = float(np.abs(y - (np.sin(x) * 2 + 1)).max())
    return f"LOADS AND RUNS (max abs error {error:.3g})"


def verdict(results: dict, compiler: str) -> int:
    def loads(name: str) -> bool:
        return results.get(name, {}).get("load_rc") == 0

    def private(name: str) -> bool:
        return "__cxa_begin_catch" in results.get(name, {}).get("library", {}).get("defines", [])

    print()
    if "cpp" in results.get("default", {}):
        print(f"C++ loader on the default package: {results['default']['cpp']}")
    leapp_route = "leapp-fix" if "leapp-fix" in results else "default"
    if results.get("default", {}).get("compile_rc") != 0:
        print("VERDICT: the default configuration does not even compile; see its log above")
    elif loads("default"):
        print(f"VERDICT: no crash here: the default compiler's package loads and runs "
              f"(private C++ runtime in it: {private('default')})")
    elif private("default") and (loads("system-g++") or loads("leapp-fix")):
        fixed = [n for n in ("system-g++", "leapp-fix") if loads(n)]
        print(f"VERDICT: hypothesis CONFIRMED: {compiler} links a private libstdc++ into the package library "
              f"(__cxa_begin_catch defined in it) and that package fails to load (rc {results['default'].get('load_rc')}); "
              f"without the private copy it loads: {', '.join(fixed)}")
    elif not private("default"):
        print(f"VERDICT: hypothesis REFUTED: the default package carries no private C++ runtime, yet loading it failed "
              f"(rc {results['default'].get('load_rc')}); see the load output above (faulthandler's stack)")
    else:
        print("VERDICT: the default package carries a private C++ runtime, but no configuration loads; see the logs above")
    ok = loads(leapp_route)
    print(f"VERDICT: the package `leapp aoti` makes here ({leapp_route}) {'LOADS AND RUNS' if ok else 'DOES NOT LOAD'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
