"""leapp/_export/nvrtc_worker.py: compiles Warp-generated CUDA source in a separate process (no Warp import).

Warp 1.19's ``wp_cuda_compile_program`` (warp.so, NVRTC linked in) compiles one program at a time per
process: threads calling it finish one after another (measured: four targets in four threads end 0.39 s
apart). A bundle needs eight targets, so ``cuda_code`` compiles some of them in processes like this one,
which load warp.so with ctypes (30 ms; importing Warp would take 0.5 s) and make exactly the call Warp's
``build.build_cuda`` makes, with the arguments ``_warp_private.nvrtc_job`` derived from the module's
options. The binaries are byte-identical to Warp's own (tests/export/test_cuda_code.py).

Run as ``python -I -S nvrtc_worker.py JOB.json``: standard library only, so it starts in milliseconds.
``JOB.json``: {"library": warp.so, "results": path, "targets": [{"source", "program", "arch", "include",
"output", "debug", "optimization_level", "verbose", "verify_fp", "fast_math", "fuse_fp", "lineinfo",
"compile_time_trace", "precompiled_headers"}, ...]}. It writes {"targets": [{"output", "error", "seconds"}]}
to ``results`` and stops at the first failure (exit status 1); NVRTC's log goes to its stdout/stderr.
"""

from __future__ import annotations

import ctypes
import json
import sys
import time

# wp_cuda_compile_program's parameters as Warp 1.19 declares them (warp/_src/context.py, "argtypes").
ARGTYPES = [
    ctypes.c_char_p,  # cuda_src
    ctypes.c_char_p,  # program name
    ctypes.c_int,  # arch
    ctypes.c_char_p,  # arch_suffix
    ctypes.c_char_p,  # include_dir
    ctypes.c_int,  # num_cuda_include_dirs
    ctypes.POINTER(ctypes.c_char_p),  # cuda include dirs
    ctypes.c_bool,  # debug
    ctypes.c_int,  # optimization_level
    ctypes.c_bool,  # verbose
    ctypes.c_bool,  # verify_fp
    ctypes.c_bool,  # fast_math
    ctypes.c_bool,  # fuse_fp
    ctypes.c_bool,  # lineinfo
    ctypes.c_bool,  # compile_time_trace
    ctypes.c_bool,  # precompiled_headers
    ctypes.c_char_p,  # output_path
    ctypes.c_char_p,  # kernel_cache_dir (the PCH folder; none from CUDA 13 on)
    ctypes.c_size_t,  # num_ltoirs
    ctypes.POINTER(ctypes.c_char_p),  # ltoirs
    ctypes.POINTER(ctypes.c_size_t),  # ltoir_sizes
    ctypes.POINTER(ctypes.c_int),  # ltoir_input_types
]


def compile_targets(job: dict) -> tuple[list[dict], bool]:
    """Compiles each target of ``job``; (results, all succeeded)."""
    compile_program = ctypes.CDLL(job["library"]).wp_cuda_compile_program
    compile_program.argtypes = ARGTYPES
    compile_program.restype = ctypes.c_size_t
    results = []
    for t in job["targets"]:
        with open(t["source"], "rb") as f:
            source = f.read()
        start = time.perf_counter()
        error = compile_program(
            source, t["program"].encode(), t["arch"], b"", t["include"].encode(), 0, None, t["debug"],
            t["optimization_level"], t["verbose"], t["verify_fp"], t["fast_math"], t["fuse_fp"], t["lineinfo"],
            t["compile_time_trace"], t["precompiled_headers"], t["output"].encode(), None, 0,
            (ctypes.c_char_p * 0)(), (ctypes.c_size_t * 0)(), (ctypes.c_int * 0)(),
        )
        results.append({"output": t["output"], "error": int(error), "seconds": time.perf_counter() - start})
        if error:
            return results, False
    return results, True


def main(argv: list[str]) -> int:
    with open(argv[1], encoding="utf-8") as f:
        job = json.load(f)
    results, ok = compile_targets(job)
    with open(job["results"], "w", encoding="utf-8") as f:
        json.dump({"targets": results}, f)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
