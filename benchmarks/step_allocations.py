"""Host and device allocations per step of leapp-run on an export, next to ONNX Runtime alone (issue 34).

A tiny malloc/calloc/realloc counter (C, compiled here with the system's cc) is preloaded into
leapp-run, which opens the export and runs the step ``--time A`` and then ``--time B`` more times in
two processes; the difference divided by ``B - A`` is the allocations of one step after warm-up. The
same count for ``benchmarks/native/ort_alone.cpp`` (ONNX Runtime's C++ API, one session per ONNX node,
each IoBinding bound once, no leapp) is the floor ONNX Runtime's ``Run`` sets: what leapp adds is the
difference. Default export: examples/cpu_policy.py's (three ONNX nodes on the CPU EP), made here.
tests/runtime/test_step_allocations.py asserts that leapp adds none.

On a CUDA export (``--device cuda``) the device allocations are counted too: a CUPTI callback library,
loaded by the driver itself (``CUDA_INJECTION64_PATH``), counts every driver call that allocates or frees
memory (cuMemAlloc*, cuMemCreate, cuMemHostAlloc, cuMemPoolCreate, ... and their frees), whoever makes it:
leapp, ONNX Runtime's CUDA EP, torch's allocator in an AOTInductor package. leapp-run runs the step as one
CUDA graph and node by node (``--no-graph``); tests/e2e/test_cpp_runner_gpu.py asserts that neither
allocates device memory after warm-up and that the graphed step makes no host allocation either. Host counts
come from processes without CUPTI (its callbacks allocate on the host themselves); ``per_step_sites`` says
where a step's host allocations are made, by call stack (inside libcuda, or which library and symbol).

    python3 benchmarks/step_allocations.py [--export DIR] [--steps 100,1100] [--device cuda] [--graph-kinds]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
# Both counters report only in the process the script started: one it starts inherits the preload (and the
# injection), and would report its own counts first.
COUNTED = r"""
#include <stdlib.h>
#include <unistd.h>
static int counted(void) { /* the child of $LEAPP_COUNTER_PARENT, the measuring script */
  const char* parent = getenv("LEAPP_COUNTER_PARENT");
  return !parent || strtol(parent, 0, 10) == (long)getppid();
}
"""
COUNTER = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <link.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
extern void* __libc_malloc(size_t);
extern void* __libc_calloc(size_t, size_t);
extern void* __libc_realloc(void*, size_t);
static atomic_long count, in_driver, dropped;
/* With $LEAPP_ALLOCATION_SITES=N set, the call stack of each allocation after the first N is taken (glibc's
 * backtrace) and counted per call site (up to DEPTH frames), reported at exit as library+offset so that two
 * runs of different lengths can be compared by site; N skips the start-up's (a CUDA EP session makes
 * millions, whose stacks would take minutes). One with a frame in libcuda is the driver's own: its site is
 * the driver's caller. */
enum { DEPTH = 8, SITES = 1 << 18, PROBES = 256 };
typedef struct { void* frames[DEPTH + 1]; long n; } Site;  /* frames[0]: 1 in the driver */
static Site sites[SITES];
static atomic_flag sites_lock = ATOMIC_FLAG_INIT;
static int mode = -1;  /* -1 unknown, 0 counts only, 1 sites */
static long armed_after;  /* sites of the allocations after this many only: $LEAPP_ALLOCATION_SITES */
static __thread __attribute__((tls_model("initial-exec"))) int busy;
static uintptr_t driver_lo, driver_hi;
static int find_driver(struct dl_phdr_info* info, size_t size, void* data) {
  (void)size; (void)data;
  if (!info->dlpi_name || !strstr(info->dlpi_name, "libcuda.so")) return 0;
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)* h = &info->dlpi_phdr[i];
    if (h->p_type != PT_LOAD) continue;
    uintptr_t lo = info->dlpi_addr + h->p_vaddr, hi = lo + h->p_memsz;
    if (!driver_lo || lo < driver_lo) driver_lo = lo;
    if (hi > driver_hi) driver_hi = hi;
  }
  return 1;
}
static __attribute__((noinline)) void note(void) {
  long number = atomic_fetch_add(&count, 1) + 1;
  if (mode == 0 || busy) return;
  busy = 1;
  if (mode < 0) {
    const char* sites_after = getenv("LEAPP_ALLOCATION_SITES");
    armed_after = sites_after ? strtol(sites_after, 0, 10) : 0;
    mode = sites_after != 0;
  }
  if (mode == 1 && number > armed_after) {
    if (!driver_hi) dl_iterate_phdr(find_driver, 0);
    void* frames[DEPTH + 2 + 16];  /* room for the driver's own frames */
    int n = backtrace(frames, DEPTH + 2 + 16);
    int driver = 0, from = 2; /* frames[0], [1]: note and the allocation function */
    for (int i = 0; i < n; ++i)
      if ((uintptr_t)frames[i] >= driver_lo && (uintptr_t)frames[i] < driver_hi) driver = 1, from = i + 1;
    if (driver) atomic_fetch_add(&in_driver, 1);
    if (n > from) {  /* the driver's own: the site is its caller, the frames after the driver's outermost */
      void* key[DEPTH + 1] = {0};
      key[0] = (void*)(uintptr_t)driver;
      memcpy(key + 1, frames + from, sizeof(void*) * (size_t)(n - from < DEPTH ? n - from : DEPTH));
      uintptr_t h = 0;
      for (int i = 0; i <= DEPTH; ++i) h = (h ^ (uintptr_t)key[i]) * 0x9E3779B97F4A7C15ull, h ^= h >> 29;
      while (atomic_flag_test_and_set(&sites_lock)) {}
      int probe = 0;
      for (; probe < PROBES; ++probe) {
        Site* s = &sites[(h + (uintptr_t)probe) % SITES];
        if (s->n == 0) memcpy(s->frames, key, sizeof key);
        if (memcmp(s->frames, key, sizeof key) == 0) { s->n++; break; }
      }
      if (probe == PROBES) atomic_fetch_add(&dropped, 1);
      atomic_flag_clear(&sites_lock);
    }
  }
  busy = 0;
}
void* malloc(size_t n) { note(); return __libc_malloc(n); }
void* calloc(size_t a, size_t b) { note(); return __libc_calloc(a, b); }
void* realloc(void* p, size_t n) { note(); return __libc_realloc(p, n); }
/* COUNTED */
__attribute__((destructor)) static void report(void) {
  busy = 1;
  if (!counted()) {
    fprintf(stderr, "LEAPP_OTHER_PROCESS %s %ld\n", program_invocation_short_name, (long)count);
    return;
  }
  fprintf(stderr, "LEAPP_ALLOCATIONS %ld\n", (long)count);
  if (mode != 1) return;
  fprintf(stderr, "LEAPP_DRIVER_ALLOCATIONS %ld %ld\n", (long)in_driver, (long)dropped);
  for (int i = 0; i < SITES; ++i) {
    if (!sites[i].n) continue;
    fprintf(stderr, "LEAPP_SITE %ld %s", sites[i].n, sites[i].frames[0] ? "driver" : "other");
    for (int f = 1; f <= DEPTH && sites[i].frames[f]; ++f) {
      Dl_info info;
      if (dladdr(sites[i].frames[f], &info) && info.dli_fname)
        fprintf(stderr, " %s+0x%lx%s%s%s", strrchr(info.dli_fname, '/') ? strrchr(info.dli_fname, '/') + 1 : info.dli_fname,
                (unsigned long)((uintptr_t)sites[i].frames[f] - (uintptr_t)info.dli_fbase),
                info.dli_sname ? "(" : "", info.dli_sname ? info.dli_sname : "", info.dli_sname ? ")" : "");
      else
        fprintf(stderr, " ?");
    }
    fprintf(stderr, "\n");
  }
}
"""


# The CUPTI ABI this counter uses (cupti_callbacks.h, stable since CUDA 4): declared here so that it compiles
# without CUPTI's headers; libcupti is opened at run time from $LEAPP_CUPTI_LIBRARY.
DEVICE_COUNTER = r"""
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
typedef struct {
  int callbackSite;  /* CUPTI_API_ENTER = 0 */
  const char* functionName;
  const void* functionParams;
  void* functionReturnValue;
  const char* symbolName;
  void* context;
  uint32_t contextUid;
  uint64_t* correlationData;
  uint32_t correlationId;
} CallbackData;
typedef void (*Callback)(void*, int, uint32_t, const void*);
static atomic_long allocations, frees;
static const char* const ALLOCATE[] = {"cuMemAlloc", "cuMemHostAlloc", "cuMemCreate", "cuMemPoolCreate",
  "cuArrayCreate", "cuArray3DCreate", "cuMipmappedArrayCreate", "cuMemHostRegister", 0};
static const char* const FREE[] = {"cuMemFree", "cuMemRelease", "cuMemPoolDestroy", "cuArrayDestroy",
  "cuMipmappedArrayDestroy", "cuMemHostUnregister", 0};
static int starts(const char* name, const char* const* prefixes) {
  for (; *prefixes; ++prefixes) if (strncmp(name, *prefixes, strlen(*prefixes)) == 0) return 1;
  return 0;
}
static void on_call(void* user, int domain, uint32_t id, const void* data) {
  const CallbackData* d = (const CallbackData*)data;
  if (d->callbackSite != 0 || !d->functionName) return;
  if (starts(d->functionName, ALLOCATE)) atomic_fetch_add(&allocations, 1);
  else if (starts(d->functionName, FREE)) atomic_fetch_add(&frees, 1);
}
static int ready;
int InitializeInjection(void) {  /* called by the driver in cuInit when CUDA_INJECTION64_PATH names us */
  const char* path = getenv("LEAPP_CUPTI_LIBRARY");
  void* cupti = path ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : 0;
  int (*subscribe)(void**, Callback, void*) = cupti ? dlsym(cupti, "cuptiSubscribe") : 0;
  int (*enable)(uint32_t, void*, int) = cupti ? dlsym(cupti, "cuptiEnableDomain") : 0;
  void* subscriber = 0;
  if (!subscribe || !enable || subscribe(&subscriber, on_call, 0) != 0 || enable(1, subscriber, 1) != 0) {
    fprintf(stderr, "LEAPP_DEVICE_COUNTER failed: %s\n", cupti ? "CUPTI refused the subscription" : dlerror());
    return 0;
  }
  ready = 1;
  return 1;
}
/* COUNTED */
__attribute__((destructor)) static void report(void) {
  if (ready && counted()) fprintf(stderr, "LEAPP_DEVICE_ALLOCATIONS %ld %ld\n", (long)allocations, (long)frees);
}
"""


class Unavailable(RuntimeError):
    """A tool this measurement needs is missing (its message says which)."""


def counter(folder: Path) -> Path:
    """The allocation counter, compiled into ``folder``."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise Unavailable("needs a C compiler (cc) for the allocation counter")
    (folder / "count.c").write_text(COUNTER.replace("/* COUNTED */", COUNTED))
    subprocess.run([cc, "-O2", "-shared", "-fPIC", str(folder / "count.c"), "-o", str(folder / "count.so"), "-ldl"],
                   check=True)
    return folder / "count.so"


def cupti_library() -> Path:
    """libcupti: the CUDA toolkit's, or the one torch's CUDA wheels install (nvidia/*/lib)."""
    import glob

    roots = [*(p for p in sys.path if p), "/usr/local/cuda"]
    patterns = ("nvidia/cuda_cupti/lib/libcupti.so*", "nvidia/cu*/lib/libcupti.so*", "lib64/libcupti.so*",
                "extras/CUPTI/lib64/libcupti.so*")
    for root in roots:
        for pattern in patterns:
            found = sorted(glob.glob(f"{root}/{pattern}"))
            if found:
                return Path(found[0])
    raise Unavailable("needs libcupti (the CUDA toolkit's, or torch's nvidia-cuda-cupti wheel) for the device "
                      "allocation counter")


def device_counter(folder: Path) -> Path:
    """The device allocation counter (a CUDA injection library), compiled into ``folder``."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise Unavailable("needs a C compiler (cc) for the device allocation counter")
    (folder / "device_count.c").write_text(DEVICE_COUNTER.replace("/* COUNTED */", COUNTED))
    subprocess.run([cc, "-O2", "-shared", "-fPIC", str(folder / "device_count.c"), "-o",
                    str(folder / "device_count.so"), "-ldl"], check=True)
    return folder / "device_count.so"


def graph_alone(folder: Path) -> Path:
    """benchmarks/native/graph_launch_alone.c compiled into ``folder``: the driver's own host allocations per
    graph launch and synchronisation, the floor of a graphed step (``graph_launch_alone N [KIND [COUNT]]``)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise Unavailable("needs a C compiler (cc) for the graph launch floor")
    subprocess.run([cc, "-O2", str(ROOT / "benchmarks" / "native" / "graph_launch_alone.c"), "-o",
                    str(folder / "graph_launch_alone"), "-ldl"], check=True)
    return folder / "graph_launch_alone"


def ort_alone(folder: Path) -> Path:
    """benchmarks/native/ort_alone.cpp, compiled into ``folder`` against ONNX Runtime's headers (third_party/,
    scripts/fetch-ort-headers.sh) and the onnxruntime wheel's library."""
    import onnxruntime

    cxx = shutil.which("c++") or shutil.which("g++")
    include = ROOT / "third_party" / "onnxruntime" / "include"
    libraries = sorted(Path(onnxruntime.__file__).parent.glob("capi/libonnxruntime.so*"))
    if cxx is None or not (include / "onnxruntime_cxx_api.h").is_file() or not libraries:
        raise Unavailable("needs a C++ compiler, ONNX Runtime's headers in third_party/ (bash "
                          "scripts/fetch-ort-headers.sh) and the onnxruntime wheel's library")
    link = folder / "libonnxruntime.so.1"  # the name the library's SONAME asks for
    link.unlink(missing_ok=True)
    link.symlink_to(libraries[-1])
    subprocess.run([cxx, "-O2", "-std=c++17", f"-I{include}", str(ROOT / "benchmarks" / "native" / "ort_alone.cpp"),
                    "-o", str(folder / "ort_alone"), f"-L{folder}", "-l:libonnxruntime.so.1",
                    f"-Wl,-rpath,{folder}"], check=True, capture_output=True)
    return folder / "ort_alone"


def _run_counted(command: list[str], library: Path, device: Path | None = None, sites_after: int | None = None,
                 cuda: bool = False) -> list[str]:
    """The ``LEAPP_*`` lines one counted process reports on stderr; ``cuda``: a leapp-run on CUDA (the
    onnxruntime with the CUDA EP), ``device``: with the device counter injected (implies ``cuda``);
    ``sites_after``: the call sites of the allocations after that many."""
    env = {"LD_PRELOAD": str(library), "PATH": "/usr/bin:/bin", "LEAPP_COUNTER_PARENT": str(os.getpid())}
    if sites_after is not None:
        env["LEAPP_ALLOCATION_SITES"] = str(sites_after)
    if device is not None or cuda:
        from leapp.testing.cpp_runner import leapp_run_env

        env = {**leapp_run_env(), **env}
    if device is not None:
        env.update(CUDA_INJECTION64_PATH=str(device), LEAPP_CUPTI_LIBRARY=str(cupti_library()))
    r = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"{command[0]} failed: {r.stderr[-2000:]}")
    return [line for line in r.stderr.splitlines() if line.startswith("LEAPP_")]


def _counts(command: list[str], library: Path, device: Path | None, cuda: bool = False) -> tuple[int, int, int]:
    """(host allocations, device allocations, device frees) of one process; the device ones 0 without
    ``device``."""
    lines = {line.split()[0]: line.split()[1:] for line in _run_counted(command, library, device, cuda=cuda)}
    if device is not None and "LEAPP_DEVICE_ALLOCATIONS" not in lines:
        raise Unavailable(f"the device allocation counter reported nothing: {lines.get('LEAPP_DEVICE_COUNTER')}")
    allocations, frees = lines.get("LEAPP_DEVICE_ALLOCATIONS", ["0", "0"])
    return int(lines["LEAPP_ALLOCATIONS"][0]), int(allocations), int(frees)


def per_step(command, library: Path, steps: tuple[int, int], repeats: int = 1) -> float:
    """Allocations of one step: ``command(n)`` (argv running n steps) at both counts, the difference per step.

    ONNX Runtime now and then makes a few hundred allocations more in a process (not tied to a step count):
    with ``repeats`` > 1 each count is the least of that many processes, which drops such bursts."""
    return per_step_counts(command, library, steps, repeats)[0]


def per_step_counts(command, library: Path, steps: tuple[int, int], repeats: int = 1,
                    device: Path | None = None) -> tuple[float, float, float]:
    """(host allocations, device allocations, device frees) of one step, as ``per_step``; the device counts
    with ``device`` (the injection library of ``device_counter``), from other processes than the host count:
    CUPTI's callbacks allocate on the host themselves (about one per graph launch and synchronisation on the
    H200), which would be counted as the step's."""
    a, b = steps

    def least(n, injected):
        return [min(c) for c in zip(*(_counts(command(n), library, injected, cuda=device is not None)
                                      for _ in range(repeats)))]

    host = (least(b, None)[0] - least(a, None)[0]) / (b - a)
    if device is None:
        return host, 0.0, 0.0
    first, last = least(a, device), least(b, device)
    return host, (last[1] - first[1]) / (b - a), (last[2] - first[2]) / (b - a)


def per_step_sites(command, library: Path, steps: tuple[int, int], cuda: bool = False):
    """Where one step's host allocations come from: (in the CUDA driver, elsewhere, {call site: per step}).

    The counter takes every allocation's call stack: one with a frame in libcuda is the driver's own (a graph
    launch's, a synchronisation's), which no caller can avoid; the others are counted by call site (library+offset
    frames, innermost first; the driver's by the frames that called into it), and a site whose count grows with
    the step count is listed with its rate."""
    # Sites only for the last allocations of the shorter run and what follows (at least a few thousand): the
    # same start-up in both runs, so the difference is the steps'.
    shorter = min(_counts(command(steps[0]), library, None, cuda=cuda)[0] for _ in range(2))
    after = max(0, shorter - max(5000, shorter // 50))

    def one(n):
        lines = _run_counted(command(n), library, sites_after=after, cuda=cuda)
        total = next(int(x.split()[1]) for x in lines if x.startswith("LEAPP_ALLOCATIONS ")) - after
        driver, dropped = next(tuple(map(int, x.split()[1:])) for x in lines if x.startswith("LEAPP_DRIVER_ALLOCATIONS "))
        if dropped:
            raise RuntimeError(f"the allocation counter's site table overflowed ({dropped} allocations unplaced)")
        by_site: dict[str, int] = {}
        for x in lines:
            if x.startswith("LEAPP_SITE "):
                _, count, kind, *frames = x.split()
                site = ("in the driver, called from " if kind == "driver" else "") + " ".join(frames)
                by_site[site] = by_site.get(site, 0) + int(count)
        return driver, total - driver, by_site

    (d_a, o_a, s_a), (d_b, o_b, s_b) = one(steps[0]), one(steps[1])
    span = steps[1] - steps[0]
    growing = {site: (n - s_a.get(site, 0)) / span for site, n in s_b.items() if n > s_a.get(site, 0)}
    return (d_b - d_a) / span, (o_b - o_a) / span, dict(sorted(growing.items(), key=lambda kv: -kv[1]))


def leapp_run_command(export: Path, inputs: Path, out: Path, node: str | None = None, *flags: str):
    """``leapp-run`` running n steps of the pipeline, or of ``node`` alone (``--node``: ``run_node``), with
    ``flags`` (``--device cuda``, ``--no-graph``)."""
    leapp_run = Path(sys.executable).with_name("leapp-run")
    if not leapp_run.is_file():
        raise Unavailable("leapp-run was not built (docs/deploy.md)")
    alone = ["--node", node] if node else []
    return lambda n: [str(leapp_run), str(export), "--in", str(inputs), "--out", str(out), "--time", str(n), *alone,
                      *flags]


def ort_alone_command(program: Path, pipeline, node: str | None = None):
    models = [str(n.artifact) for name, n in pipeline.nodes.items() if n.backend == "onnx" and node in (None, name)]
    return lambda n: [str(program), str(n), *models]


def write_inputs(pipeline, folder: Path, node: str | None = None) -> Path:
    """Random inputs of the pipeline, or of ``node`` alone, as leapp-run reads them."""
    folder.mkdir(exist_ok=True)
    rng = np.random.default_rng(0)
    specs = pipeline.inputs.values() if node is None else pipeline.nodes[node].inputs
    for spec in specs:
        rng.standard_normal(spec.shape).astype(str(spec.dtype).removeprefix("torch.")).tofile(folder / f"{spec.name}.bin")
    return folder


def cuda_table(export: Path, steps: tuple[int, int]) -> str:
    """The markdown table of host and device allocations per step of leapp-run --device cuda on ``export``,
    graphed and node by node."""
    import leapp

    rows = ["| leapp-run --device cuda | host allocations | device allocations | device frees |", "|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        inputs = write_inputs(leapp.load(export), tmp / "in")
        library, device = counter(tmp), device_counter(tmp)
        for label, flags in (("one CUDA graph", ()), ("node by node (--no-graph)", ("--no-graph",))):
            command = leapp_run_command(export, inputs, tmp / "out", None, "--device", "cuda", *flags)
            host, allocations, frees = per_step_counts(command, library, steps, repeats=2, device=device)
            rows.append(f"| {label} | {host:.3f} | {allocations:.3f} | {frees:.3f} |")
        floor = graph_alone(tmp)
        host, allocations, frees = per_step_counts(lambda n: [str(floor), str(n)], library, steps, repeats=2,
                                                   device=device)
        rows.append(f"| (floor: a one-node graph launched and synchronised, no leapp) | {host:.3f} | {allocations:.3f} "
                    f"| {frees:.3f} |")
        graphed = leapp_run_command(export, inputs, tmp / "out", None, "--device", "cuda")
        driver, other, sites = per_step_sites(graphed, library, steps, cuda=True)
        rows += ["", f"One CUDA graph, host allocations per step by where they are made: {driver:.3f} inside the "
                     f"driver, {other:.3f} elsewhere; the sites that grow with the steps:", ""]
        rows += [f"- {rate:.3f} per step: {site}" for site, rate in sites.items()] or ["- none"]
    return "\n".join(rows)


GRAPH_KINDS = ("memset", "d2d", "h2d", "h2d-pinned", "d2h", "d2h-pinned", "kernel", "kernel-4000", "event-record",
               "event-wait", "alloc-free", "fork", "cluster-kernel", "pdl-kernel", "user-object")


def graph_kinds_table(steps: tuple[int, int]) -> str:
    """The markdown table of host allocations per launch and synchronisation of a bare graph of one node kind
    (benchmarks/native/graph_launch_alone.c), 1 and 40 nodes: which kinds make the driver allocate at launch."""
    rows = ["| graph nodes | host allocations per launch, 1 node | 40 nodes | inside the driver, 40 nodes |",
            "|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        library, program = counter(tmp), graph_alone(tmp)
        for kind in GRAPH_KINDS:
            try:
                one, many = (per_step(lambda n, c=c: [str(program), str(n), kind, str(c)], library, steps, repeats=2)
                             for c in (1, 40))
                driver, _, _ = per_step_sites(lambda n: [str(program), str(n), kind, "40"], library, steps)
            except RuntimeError as e:  # a kind this driver or device refuses: said in its row
                rows.append(f"| {kind} | {str(e).splitlines()[0][-160:]} | | |")
                continue
            rows.append(f"| {kind} | {one:.3f} | {many:.3f} | {driver:.3f} |")
    return "\n".join(rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--export", help="an export folder (default: examples/cpu_policy.py's, made here)")
    parser.add_argument("--steps", default="100,1100", help="A,B: the two step counts compared")
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                        help="cuda: leapp-run --device cuda on --export (a CUDA export), host and device counts")
    parser.add_argument("--graph-kinds", action="store_true",
                        help="no leapp: the host allocations of bare graphs of each node kind, per launch (a GPU)")
    args = parser.parse_args(argv)
    steps = tuple(int(v) for v in args.steps.split(","))
    if args.graph_kinds:
        try:
            print(graph_kinds_table(steps))
        except (Unavailable, RuntimeError) as e:  # no driver: the program says so
            sys.exit(f"step_allocations: {e}")
        return 0
    import leapp

    if args.device == "cuda":
        if not args.export:
            parser.error("--device cuda needs --export (a CUDA export, e.g. examples/go2_pipeline.py's)")
        print(cuda_table(Path(args.export), steps))
        return 0

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        export = Path(args.export) if args.export else None
        if export is None:
            subprocess.run([sys.executable, str(ROOT / "examples" / "cpu_policy.py"), "--out", str(tmp)], check=True,
                           capture_output=True)
            export = tmp / "go2_cpu"
        pipeline = leapp.load(export)
        try:
            library = counter(tmp)
            leapp_step = per_step(leapp_run_command(export, write_inputs(pipeline, tmp / "in"), tmp / "out"), library,
                                  steps, repeats=3)
            floor = per_step(ort_alone_command(ort_alone(tmp), pipeline), library, steps, repeats=3)
        except Unavailable as e:
            sys.exit(f"step_allocations: {e}")
    print("| export | nodes | leapp-run, per step | ONNX Runtime alone, per step | leapp adds |")
    print("|---|---|---|---|---|")
    print(f"| {export.name} | {len(pipeline.nodes)} | {leapp_step:.2f} | {floor:.2f} | {leapp_step - floor:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
