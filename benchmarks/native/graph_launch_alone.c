/* benchmarks/native/graph_launch_alone.c: N launches of a CUDA graph of one kind of node, each followed by a
 * stream synchronisation, and nothing else: the host allocations the CUDA driver itself makes per graph launch
 * (benchmarks/step_allocations.py counts them: the floor of a graphed leapp-run step, and which node kinds
 * make the driver allocate at launch).
 *
 *   graph_launch_alone N [KIND [COUNT]]
 *
 * KIND (default memset) is captured COUNT times (default 1) into the graph:
 *   memset        a 256-byte cuMemsetD8Async
 *   d2d           a 4 KiB device-to-device copy
 *   h2d, d2h      a 4 KiB copy from or to pageable host memory (malloc)
 *   h2d-pinned, d2h-pinned   the same with page-locked memory (cuMemAllocHost)
 *   kernel        an empty kernel with one pointer parameter
 *   kernel-4000   an empty kernel with 4,000 bytes of parameters
 *   event-record  an external event record node (cuEventRecordWithFlags, CU_EVENT_RECORD_EXTERNAL)
 *   event-wait    an external event wait node (cuStreamWaitEvent, CU_EVENT_WAIT_EXTERNAL)
 *   alloc-free    a stream-ordered allocation and its free (memory alloc and free nodes)
 *   fork          a memset on a second stream, forked from and joined back to the first (COUNT branches)
 *   cluster-kernel  the pointer kernel launched in clusters of 2 blocks (cuLaunchKernelEx)
 *   pdl-kernel    the pointer kernel with programmatic stream serialisation (a programmatic dependency on
 *                 the previous kernel, as CUTLASS and cuBLAS launch on sm_90)
 *   user-object   a memset, and a user object the capturing graph retains (cuGraphRetainUserObject on the
 *                 graph of cuStreamGetCaptureInfo, as leapp ties a captured segment's scratch to the graph)
 *
 * The driver is opened at run time (no CUDA headers or link-time dependency), as leapp opens it; the kernels
 * are PTX for sm_52, compiled by the driver for the device. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef void* Handle;
typedef unsigned long long Pointer;

static void* lib;
static void* sym(const char* name) {
  void* p = dlsym(lib, name);
  if (!p) {
    fprintf(stderr, "graph_launch_alone: libcuda.so.1 has no %s\n", name);
    exit(2);
  }
  return p;
}
static void nothing(void* p) { (void)p; }
static void check(CUresult r, const char* what) {
  if (r != 0) {
    fprintf(stderr, "graph_launch_alone: %s failed with CUDA error %d\n", what, r);
    exit(1);
  }
}

/* cuda.h's CUlaunchAttribute (an id, padding, a 64-byte value) and CUlaunchConfig, for cuLaunchKernelEx. */
typedef struct {
  int id;
  int pad;
  union {
    char bytes[64];
    struct { unsigned x, y, z; } cluster;
    int programmatic_serialisation;
  } value;
} LaunchAttribute;
typedef struct {
  unsigned grid_x, grid_y, grid_z, block_x, block_y, block_z, shared_bytes;
  Handle stream;
  LaunchAttribute* attributes;
  unsigned attribute_count;
} LaunchConfig;
enum { kClusterDimension = 4, kProgrammaticStreamSerialization = 6, kMaxBranches = 64 };

static const char kPtx[] =
    ".version 7.0\n.target sm_52\n.address_size 64\n"
    ".visible .entry one_pointer(.param .u64 p) { ret; }\n"
    ".visible .entry big_parameters(.param .align 8 .b8 p[4000]) { ret; }\n";

int main(int argc, char** argv) {
  if (argc < 2 || argc > 4) {
    fprintf(stderr, "usage: graph_launch_alone N [KIND [COUNT]]\n");
    return 2;
  }
  long n = atol(argv[1]);
  const char* kind = argc > 2 ? argv[2] : "memset";
  int count = argc > 3 ? atoi(argv[3]) : 1;
  lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    fprintf(stderr, "graph_launch_alone: %s\n", dlerror());
    return 2;
  }
  int device = 0;
  Handle ctx = 0, stream = 0, graph = 0, exec = 0, module = 0, one_pointer = 0, big_parameters = 0, event = 0;
  Pointer buffer = 0;
  check(((CUresult(*)(unsigned))sym("cuInit"))(0), "cuInit");
  check(((CUresult(*)(int*, int))sym("cuDeviceGet"))(&device, 0), "cuDeviceGet");
  check(((CUresult(*)(Handle*, int))sym("cuDevicePrimaryCtxRetain"))(&ctx, device), "cuDevicePrimaryCtxRetain");
  check(((CUresult(*)(Handle))sym("cuCtxSetCurrent"))(ctx), "cuCtxSetCurrent");
  check(((CUresult(*)(Handle*, unsigned))sym("cuStreamCreate"))(&stream, 0), "cuStreamCreate");
  check(((CUresult(*)(Pointer*, size_t))sym("cuMemAlloc_v2"))(&buffer, 1 << 16), "cuMemAlloc");
  const int pinned = strstr(kind, "pinned") != 0;
  void* host = 0;
  if (pinned)
    check(((CUresult(*)(void**, size_t))sym("cuMemAllocHost_v2"))(&host, 1 << 16), "cuMemAllocHost");
  else
    host = calloc(1, 1 << 16);
  check(((CUresult(*)(Handle*, const void*))sym("cuModuleLoadData"))(&module, kPtx), "cuModuleLoadData");
  check(((CUresult(*)(Handle*, Handle, const char*))sym("cuModuleGetFunction"))(&one_pointer, module, "one_pointer"),
        "cuModuleGetFunction");
  check(((CUresult(*)(Handle*, Handle, const char*))sym("cuModuleGetFunction"))(&big_parameters, module,
                                                                               "big_parameters"),
        "cuModuleGetFunction");
  check(((CUresult(*)(Handle*, unsigned))sym("cuEventCreate"))(&event, 2 /* CU_EVENT_DISABLE_TIMING */),
        "cuEventCreate");
  if (strcmp(kind, "event-wait") == 0) check(((CUresult(*)(Handle, Handle))sym("cuEventRecord"))(event, stream), "cuEventRecord");
  CUresult (*launch_kernel)(Handle, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, Handle,
                            void**, void**) = sym("cuLaunchKernel");
  static char parameters[4000];
  void* pointer_arguments[] = {&buffer};
  void* big_arguments[] = {parameters};
  CUresult (*launch_kernel_ex)(const LaunchConfig*, Handle, void**, void**) = 0;
  if (strstr(kind, "cluster") || strstr(kind, "pdl")) launch_kernel_ex = sym("cuLaunchKernelEx");
  LaunchAttribute attribute;
  memset(&attribute, 0, sizeof attribute);
  if (strstr(kind, "cluster")) attribute.id = kClusterDimension, attribute.value.cluster.x = 2,
                               attribute.value.cluster.y = attribute.value.cluster.z = 1;
  else attribute.id = kProgrammaticStreamSerialization, attribute.value.programmatic_serialisation = 1;
  LaunchConfig config = {2, 1, 1, 32, 1, 1, 0, stream, &attribute, 1};
  Handle branches[kMaxBranches] = {0}, forked = 0, joined[kMaxBranches] = {0};
  if (strcmp(kind, "fork") == 0) {
    if (count > kMaxBranches) count = kMaxBranches;
    check(((CUresult(*)(Handle*, unsigned))sym("cuEventCreate"))(&forked, 2), "cuEventCreate");
    for (int i = 0; i < count; ++i) {
      check(((CUresult(*)(Handle*, unsigned))sym("cuStreamCreate"))(&branches[i], 1 /* non-blocking */),
            "cuStreamCreate");
      check(((CUresult(*)(Handle*, unsigned))sym("cuEventCreate"))(&joined[i], 2), "cuEventCreate");
    }
  }

  check(((CUresult(*)(Handle, int))sym("cuStreamBeginCapture_v2"))(stream, 1 /* thread-local */), "cuStreamBeginCapture");
  for (int i = 0; i < count; ++i) {
    if (strcmp(kind, "memset") == 0) {
      check(((CUresult(*)(Pointer, unsigned char, size_t, Handle))sym("cuMemsetD8Async"))(buffer, 0, 256, stream),
            "cuMemsetD8Async");
    } else if (strcmp(kind, "d2d") == 0) {
      check(((CUresult(*)(Pointer, Pointer, size_t, Handle))sym("cuMemcpyDtoDAsync_v2"))(buffer + 8192, buffer, 4096,
                                                                                         stream),
            "cuMemcpyDtoDAsync");
    } else if (strncmp(kind, "h2d", 3) == 0) {
      check(((CUresult(*)(Pointer, const void*, size_t, Handle))sym("cuMemcpyHtoDAsync_v2"))(buffer, host, 4096, stream),
            "cuMemcpyHtoDAsync");
    } else if (strncmp(kind, "d2h", 3) == 0) {
      check(((CUresult(*)(void*, Pointer, size_t, Handle))sym("cuMemcpyDtoHAsync_v2"))(host, buffer, 4096, stream),
            "cuMemcpyDtoHAsync");
    } else if (strcmp(kind, "kernel") == 0) {
      check(launch_kernel(one_pointer, 1, 1, 1, 32, 1, 1, 0, stream, pointer_arguments, 0), "cuLaunchKernel");
    } else if (strcmp(kind, "kernel-4000") == 0) {
      check(launch_kernel(big_parameters, 1, 1, 1, 32, 1, 1, 0, stream, big_arguments, 0), "cuLaunchKernel");
    } else if (strcmp(kind, "event-record") == 0) {
      check(((CUresult(*)(Handle, Handle, unsigned))sym("cuEventRecordWithFlags"))(event, stream, 1 /* EXTERNAL */),
            "cuEventRecordWithFlags");
    } else if (strcmp(kind, "event-wait") == 0) {
      check(((CUresult(*)(Handle, Handle, unsigned))sym("cuStreamWaitEvent"))(stream, event, 1 /* EXTERNAL */),
            "cuStreamWaitEvent");
    } else if (strcmp(kind, "alloc-free") == 0) {
      Pointer p = 0;
      check(((CUresult(*)(Pointer*, size_t, Handle))sym("cuMemAllocAsync"))(&p, 4096, stream), "cuMemAllocAsync");
      check(((CUresult(*)(Pointer, Handle))sym("cuMemFreeAsync"))(p, stream), "cuMemFreeAsync");
    } else if (strcmp(kind, "fork") == 0) {
      CUresult (*record)(Handle, Handle) = sym("cuEventRecord");
      CUresult (*wait)(Handle, Handle, unsigned) = sym("cuStreamWaitEvent");
      check(record(forked, stream), "cuEventRecord");
      check(wait(branches[i], forked, 0), "cuStreamWaitEvent");
      check(((CUresult(*)(Pointer, unsigned char, size_t, Handle))sym("cuMemsetD8Async"))(buffer + 256u * i, 0, 256,
                                                                                          branches[i]),
            "cuMemsetD8Async");
      check(record(joined[i], branches[i]), "cuEventRecord");
      check(wait(stream, joined[i], 0), "cuStreamWaitEvent");
    } else if (strcmp(kind, "user-object") == 0) {
      check(((CUresult(*)(Pointer, unsigned char, size_t, Handle))sym("cuMemsetD8Async"))(buffer, 0, 256, stream),
            "cuMemsetD8Async");
      int status = 0;
      unsigned long long id = 0;
      Handle capturing = 0, object = 0;
      check(((CUresult(*)(Handle, int*, unsigned long long*, Handle*, void*, size_t*))sym("cuStreamGetCaptureInfo_v2"))(
                stream, &status, &id, &capturing, 0, 0),
            "cuStreamGetCaptureInfo");
      check(((CUresult(*)(Handle*, void*, void (*)(void*), unsigned, unsigned))sym("cuUserObjectCreate"))(
                &object, 0, nothing, 1, 1 /* CU_USER_OBJECT_NO_DESTRUCTOR_SYNC */),
            "cuUserObjectCreate");
      check(((CUresult(*)(Handle, Handle, unsigned, unsigned))sym("cuGraphRetainUserObject"))(
                capturing, object, 1, 1 /* CU_GRAPH_USER_OBJECT_MOVE */),
            "cuGraphRetainUserObject");
    } else if (launch_kernel_ex) {
      check(launch_kernel_ex(&config, one_pointer, pointer_arguments, 0), "cuLaunchKernelEx");
    } else {
      fprintf(stderr, "graph_launch_alone: unknown KIND '%s'\n", kind);
      return 2;
    }
  }
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
