/* benchmarks/native/graph_launch_alone.c: N launches of a one-node CUDA graph, each followed by a stream
 * synchronisation, and nothing else: the host allocations the CUDA driver itself makes per graph launch
 * (benchmarks/step_allocations.py counts them as the floor of a graphed leapp-run step).
 *
 *   graph_launch_alone N
 *
 * The driver is opened at run time (no CUDA headers or link-time dependency), as leapp opens it. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

typedef int CUresult;
typedef void* Handle;

static void* lib;
static void* sym(const char* name) {
  void* p = dlsym(lib, name);
  if (!p) {
    fprintf(stderr, "graph_launch_alone: libcuda.so.1 has no %s\n", name);
    exit(2);
  }
  return p;
}
static void check(CUresult r, const char* what) {
  if (r != 0) {
    fprintf(stderr, "graph_launch_alone: %s failed with CUDA error %d\n", what, r);
    exit(1);
  }
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: graph_launch_alone N\n");
    return 2;
  }
  long n = atol(argv[1]);
  lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "graph_launch_alone: %s\n", dlerror());
    return 2;
  }
  int device = 0;
  Handle ctx = 0, stream = 0, graph = 0, exec = 0;
  unsigned long long buffer = 0;
  check(((CUresult(*)(unsigned))sym("cuInit"))(0), "cuInit");
  check(((CUresult(*)(int*, int))sym("cuDeviceGet"))(&device, 0), "cuDeviceGet");
  check(((CUresult(*)(Handle*, int))sym("cuDevicePrimaryCtxRetain"))(&ctx, device), "cuDevicePrimaryCtxRetain");
  check(((CUresult(*)(Handle))sym("cuCtxSetCurrent"))(ctx), "cuCtxSetCurrent");
  check(((CUresult(*)(Handle*, unsigned))sym("cuStreamCreate"))(&stream, 0), "cuStreamCreate");
  check(((CUresult(*)(unsigned long long*, size_t))sym("cuMemAlloc_v2"))(&buffer, 256), "cuMemAlloc");
  check(((CUresult(*)(Handle, int))sym("cuStreamBeginCapture_v2"))(stream, 1 /* thread-local */), "cuStreamBeginCapture");
  check(((CUresult(*)(unsigned long long, unsigned char, size_t, Handle))sym("cuMemsetD8Async"))(buffer, 0, 256, stream),
        "cuMemsetD8Async");
  check(((CUresult(*)(Handle, Handle*))sym("cuStreamEndCapture"))(stream, &graph), "cuStreamEndCapture");
  check(((CUresult(*)(Handle*, Handle, unsigned long long))sym("cuGraphInstantiateWithFlags"))(&exec, graph, 0),
        "cuGraphInstantiateWithFlags");
  CUresult (*launch)(Handle, Handle) = (CUresult(*)(Handle, Handle))sym("cuGraphLaunch");
  CUresult (*synchronize)(Handle) = (CUresult(*)(Handle))sym("cuStreamSynchronize");
  for (long i = 0; i < n; ++i) {
    check(launch(exec, stream), "cuGraphLaunch");
    check(synchronize(stream), "cuStreamSynchronize");
  }
  return 0;
}
