// tests/runtime/mock_cuda/mock_libcuda.c: a fake libcuda.so.1 so the replay engine runs in CPU-only CI.
//
// It serves exactly the entry points ext/core/src/cuda_driver.cpp resolves
// through cuGetProcAddress. "Device memory" is host memory, streams execute
// their work at once, and a few known kernels are emulated in C from their
// kernelParams, so a replay's result proves that relocations, parameter
// bytes, memsets, copies and inits reached the right addresses. It also
// imitates the driver rules the runtime must respect: cubins load only on
// their SM family and (as CUDA 13 cubins) only on a CUDA 13+ driver, PTX only
// up to the ISA its driver version reads (MOCK_MAX_PTX; error 222 beyond),
// > 48 KiB dynamic shared memory needs cuFuncSetAttribute, and while a
// stream is being captured a thread not in relaxed mode may not allocate or
// load modules (error 900); neither may it free memory or unload modules.
//
// Resources are tracked so tests can see leaks and bad frees: every device
// and pinned allocation carries a header (magic, size); freeing an unknown or
// already freed pointer is refused (CUDA_ERROR_INVALID_VALUE) and counted. Freed
// blocks are poisoned (0xDD) and quarantined, never given back to malloc: a
// memset, copy or example-kernel launch touching one fails with
// CUDA_ERROR_ILLEGAL_ADDRESS and is counted as a use after free, as is a launch
// of a function whose module was unloaded (CUDA_ERROR_INVALID_HANDLE).
//
// Same-stream interleaving: work executes at enqueue time, so two threads
// enqueueing on one stream interleave exactly as their calls interleave.
// mock_set_stream_delay(us) sleeps after every memset, copy and launch, which
// widens the windows between one call's enqueues so that a missing lock shows
// up in nearly every multi-threaded run instead of once in thousands of calls.
//
// Fake cubins (tests): a 64-byte ELF header with e_flags = (arch << 8) | 4 and
// e_shoff = the image length, followed by the entry names.
//
// Graphs: a stream between cuStreamBeginCapture and cuStreamEndCapture records its memsets,
// copies and launches (a launch's parameters are copied for the kernels emulated here, whose
// parameter sizes this file knows) instead of running them; cuGraphLaunch runs a graph exec's
// nodes in order on the launch stream, counted like the same work enqueued op by op.
// cuGraphExecUpdate accepts a graph of the same node kinds and functions (error 910 otherwise).
//
// User objects: mock_set_capturing(s, 1) begins a caller capture with a new id (cuStreamGetCaptureInfo
// reports it and a graph handle); mock_set_capturing(s, 0) ends it and destroys its graph at once,
// which releases the user objects the graph holds (their destructors run then). MOCK_NO_CAPTURE_INFO=1
// hides cuStreamGetCaptureInfo and the user object entry points (an older driver); MOCK_RETAIN_FAILS=1
// makes cuGraphRetainUserObject fail. A capture begun with cuStreamBeginCapture has an id too; its graph
// takes the user objects retained during it, each instance holds another reference, and launches of an
// instance holding any are counted (a real driver tracks those launches on a thread of its own).
//
// Environment: MOCK_CC (default 90), MOCK_MAX_PTX (ISA * 10; default: what MOCK_DRIVER_VERSION reads, 9.0),
// MOCK_DRIVER_VERSION (default 13000), MOCK_DEVICES (default 1), MOCK_STREAM_DELAY_US (default 0: see below).
// Test hooks (ctypes): mock_stats, mock_resources, mock_last_loaded, mock_current_ctx, mock_set_capturing,
// mock_set_stream_delay, mock_graph_stats, mock_user_object_stats, mock_user_object_launches,
// mock_capture_id.
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;

typedef struct MockCtx { int device; } MockCtx;
typedef struct MockGraph MockGraph;
typedef struct MockUserObject MockUserObject;
// A caller capture begun by mock_set_capturing: its id and the user objects its graph holds.
typedef struct MockCapture { unsigned long long id; MockUserObject** objects; int count; } MockCapture;
typedef struct MockStream { MockCtx* ctx; int capturing; MockGraph* recording; MockCapture* capture; } MockStream;
typedef struct MockFunc MockFunc;
typedef struct MockModule {
  char* image;
  size_t size;
  int is_cubin, unloaded;
  MockFunc* funcs;          // every function handed out, freed never (a stale handle stays checkable)
  struct MockModule* next;  // in g_unloaded once unloaded
} MockModule;
struct MockFunc { MockModule* module; char name[256]; int max_dyn_smem; MockFunc* next; };
static MockModule* g_unloaded = NULL;  // unloaded modules: a launch through one is a use after unload

#define MAX_DEVICES 8
static MockCtx g_ctx[MAX_DEVICES];
static __thread MockCtx* t_current = NULL;
static __thread int t_capture_mode = 0;  // CU_STREAM_CAPTURE_MODE_GLOBAL
static atomic_int g_capturing = 0;
static atomic_llong g_stats[10];  // allocs, frees, launches, memsets, copies, module_loads, exchanges, set_current, load_failures, prohibited
static atomic_llong g_res[9];   // see mock_resources
static atomic_int g_stream_delay_us = 0;
static pthread_mutex_t g_mutex = PTHREAD_MUTEX_INITIALIZER;
static char g_last_loaded[64] = "";

enum { S_ALLOC, S_FREE, S_LAUNCH, S_MEMSET, S_COPY, S_LOAD, S_EXCHANGE, S_SETCUR, S_LOADFAIL, S_PROHIBITED };
enum { R_LIVE_DEVICE, R_LIVE_DEVICE_BYTES, R_LIVE_HOST, R_LIVE_MODULES, R_LIVE_STREAMS, R_BAD_FREES, R_UNLOADS,
       R_HOST_FREES, R_USE_AFTER_FREE };

/// After each stream operation: lets other threads enqueue in between (mock_set_stream_delay).
static void stream_op_done(void) {
  int us = atomic_load(&g_stream_delay_us);
  if (us > 0) usleep((useconds_t)us);
}

static int env_int(const char* name, int fallback) {
  const char* v = getenv(name);
  return v && *v ? atoi(v) : fallback;
}
static int device_count(void) { int n = env_int("MOCK_DEVICES", 1); return n > MAX_DEVICES ? MAX_DEVICES : n; }
static int device_cc(void) { return env_int("MOCK_CC", 90); }
/// The newest PTX ISA (* 10) the driver's JIT reads: MOCK_MAX_PTX, else what a real driver of
/// MOCK_DRIVER_VERSION reads (CUDA 13.x: 9.x; 12.9: 8.8; 12.8: 8.7; 12.0-12.6: 8.0-8.5; 11.x: 7.x).
static int max_ptx(void) {
  int explicit_max = env_int("MOCK_MAX_PTX", 0);
  if (explicit_max > 0) return explicit_max;
  int v = env_int("MOCK_DRIVER_VERSION", 13000), major = v / 1000, minor = (v % 1000) / 10;
  if (major >= 14) return 999;
  if (major == 13) return 90 + minor;
  if (major == 12) return minor >= 9 ? 88 : minor == 8 ? 87 : minor >= 5 ? 85 : 80 + minor;
  if (major == 11) return 70 + minor;
  return 65;
}

/// Potentially unsafe calls are refused while any stream captures, unless this thread is relaxed (2).
static int prohibited(void) {
  if (atomic_load(&g_capturing) > 0 && t_capture_mode != 2) {
    atomic_fetch_add(&g_stats[S_PROHIBITED], 1);
    return 1;
  }
  return 0;
}

static MockCtx* stream_ctx(void* s) {
  uintptr_t v = (uintptr_t)s;
  if (v <= 2) return t_current;
  return ((MockStream*)s)->ctx;
}

// --- basics -------------------------------------------------------------------------------------------

static CUresult m_cuGetErrorName(CUresult e, const char** s) {
  switch (e) {
    case 0: *s = "CUDA_SUCCESS"; break;
    case 1: *s = "CUDA_ERROR_INVALID_VALUE"; break;
    case 200: *s = "CUDA_ERROR_INVALID_IMAGE"; break;
    case 201: *s = "CUDA_ERROR_INVALID_CONTEXT"; break;
    case 209: *s = "CUDA_ERROR_NO_BINARY_FOR_GPU"; break;
    case 218: *s = "CUDA_ERROR_INVALID_PTX"; break;
    case 222: *s = "CUDA_ERROR_UNSUPPORTED_PTX_VERSION"; break;
    case 400: *s = "CUDA_ERROR_INVALID_HANDLE"; break;
    case 500: *s = "CUDA_ERROR_NOT_FOUND"; break;
    case 700: *s = "CUDA_ERROR_ILLEGAL_ADDRESS"; break;
    case 900: *s = "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED"; break;
    default: *s = "CUDA_ERROR_UNKNOWN"; return 1;
  }
  return 0;
}
static CUresult m_cuGetErrorString(CUresult e, const char** s) {
  const char* name = NULL;
  m_cuGetErrorName(e, &name);
  *s = e == 222 ? "the provided PTX was compiled with an unsupported toolchain." : "mock driver error";
  (void)name;
  return 0;
}
static CUresult m_cuInit(unsigned f) {
  (void)f;
  atomic_store(&g_stream_delay_us, env_int("MOCK_STREAM_DELAY_US", 0));
  return 0;
}
static CUresult m_cuDriverGetVersion(int* v) { *v = env_int("MOCK_DRIVER_VERSION", 13000); return 0; }
static CUresult m_cuDeviceGetCount(int* n) { *n = device_count(); return 0; }
static CUresult m_cuDeviceGet(int* d, int ordinal) {
  if (ordinal < 0 || ordinal >= device_count()) return 101;  // CUDA_ERROR_INVALID_DEVICE
  *d = ordinal;
  return 0;
}
static CUresult m_cuDeviceGetName(char* name, int len, int dev) { snprintf(name, len, "Mock GPU %d", dev); return 0; }
static CUresult m_cuDeviceGetAttribute(int* v, int attr, int dev) {
  (void)dev;
  if (attr == 75) *v = device_cc() / 10;
  else if (attr == 76) *v = device_cc() % 10;
  else if (attr == 97) *v = 232448;
  else if (attr == 8) *v = 49152;
  else *v = 0;
  return 0;
}
static CUresult m_cuDevicePrimaryCtxRetain(MockCtx** ctx, int dev) {
  g_ctx[dev].device = dev;
  *ctx = &g_ctx[dev];
  return 0;
}
static CUresult m_cuDevicePrimaryCtxRelease(int dev) { (void)dev; return 0; }
static CUresult m_cuCtxGetCurrent(MockCtx** ctx) { *ctx = t_current; return 0; }
static CUresult m_cuCtxSetCurrent(MockCtx* ctx) {
  atomic_fetch_add(&g_stats[S_SETCUR], 1);
  t_current = ctx;
  return 0;
}
static CUresult m_cuCtxGetDevice(int* dev) {
  if (!t_current) return 201;
  *dev = t_current->device;
  return 0;
}
static CUresult m_cuCtxSynchronize(void) { return prohibited() ? 900 : 0; }
static CUresult m_cuStreamGetCtx(void* s, MockCtx** ctx) {
  MockCtx* c = stream_ctx(s);
  if (!c) return 201;
  *ctx = c;
  return 0;
}
static CUresult m_cuStreamSynchronize(void* s) {
  MockStream* ms = (uintptr_t)s > 2 ? (MockStream*)s : NULL;
  if (ms && ms->capturing) return 900;
  return 0;
}
static CUresult m_cuStreamIsCapturing(void* s, int* status) {
  MockStream* ms = (uintptr_t)s > 2 ? (MockStream*)s : NULL;
  *status = ms && ms->capturing ? 1 : 0;
  return 0;
}
struct MockUserObject { void* ptr; void (*destroy)(void*); int refs; };
static atomic_llong g_user_objects[2];  // live user objects, destructors run
static atomic_llong g_capture_ids = 0;

static void user_object_release(MockUserObject* o, int count) {
  pthread_mutex_lock(&g_mutex);
  o->refs -= count;
  int gone = o->refs <= 0;
  pthread_mutex_unlock(&g_mutex);
  if (!gone) return;
  o->destroy(o->ptr);
  atomic_fetch_add(&g_user_objects[0], -1);
  atomic_fetch_add(&g_user_objects[1], 1);
  free(o);
}
static MockCapture* recording_capture(MockGraph* g);
static CUresult m_cuStreamGetCaptureInfo(void* s, int* status, unsigned long long* id, MockCapture** graph,
                                         const void** deps, size_t* ndeps) {
  MockStream* ms = (uintptr_t)s > 2 ? (MockStream*)s : NULL;
  *status = ms && (ms->capturing || ms->recording) ? 1 : 0;
  MockCapture* c = ms ? (ms->recording ? recording_capture(ms->recording) : ms->capture) : NULL;
  if (id) *id = c ? c->id : 0;
  if (graph) *graph = c;
  if (deps) *deps = NULL;
  if (ndeps) *ndeps = 0;
  return 0;
}
static CUresult m_cuUserObjectCreate(MockUserObject** out, void* ptr, void (*destroy)(void*), unsigned refs,
                                     unsigned flags) {
  if (flags != 1 || refs == 0 || !destroy) return 1;  // CUDA_ERROR_INVALID_VALUE: NO_DESTRUCTOR_SYNC is required
  MockUserObject* o = calloc(1, sizeof(MockUserObject));
  o->ptr = ptr, o->destroy = destroy, o->refs = (int)refs;
  atomic_fetch_add(&g_user_objects[0], 1);
  *out = o;
  return 0;
}
static CUresult m_cuUserObjectRelease(MockUserObject* o, unsigned count) {
  user_object_release(o, (int)count);
  return 0;
}
static CUresult m_cuGraphRetainUserObject(MockCapture* g, MockUserObject* o, unsigned count, unsigned flags) {
  if (env_int("MOCK_RETAIN_FAILS", 0)) return 1;
  if (!g) return 400;  // CUDA_ERROR_INVALID_HANDLE
  pthread_mutex_lock(&g_mutex);
  if (!(flags & 1)) o->refs += (int)count;  // CU_GRAPH_USER_OBJECT_MOVE takes the caller's reference
  g->objects = realloc(g->objects, sizeof(MockUserObject*) * (size_t)(g->count + 1));
  g->objects[g->count++] = o;
  pthread_mutex_unlock(&g_mutex);
  return 0;
}

static CUresult m_cuStreamCreate(MockStream** s, unsigned flags) {
  (void)flags;
  if (!t_current) return 201;
  MockStream* ms = calloc(1, sizeof(MockStream));
  ms->ctx = t_current;
  *s = ms;
  atomic_fetch_add(&g_res[R_LIVE_STREAMS], 1);
  return 0;
}
static CUresult m_cuStreamDestroy(MockStream* s) {
  if ((uintptr_t)s <= 2) return 400;
  free(s);
  atomic_fetch_add(&g_res[R_LIVE_STREAMS], -1);
  return 0;
}
static CUresult m_cuThreadExchangeStreamCaptureMode(int* mode) {
  atomic_fetch_add(&g_stats[S_EXCHANGE], 1);
  int old = t_capture_mode;
  t_capture_mode = *mode;
  *mode = old;
  return 0;
}

// --- memory --------------------------------------------------------------------------------------------

#define MOCK_DEVICE_BYTES ((size_t)16 << 30)  // a mock GPU holds 16 GiB: larger allocations fail as on a device

// Every allocation: a 256-byte header {magic, size} in front of the 256-aligned block handed out.
#define HEADER_BYTES 256
static struct { uintptr_t start, end; }* g_quarantine = NULL;  // freed blocks (see the top of the file)
static size_t g_quarantined = 0, g_quarantine_cap = 0;
static atomic_int g_any_quarantined = 0;
static pthread_mutex_t g_quarantine_mutex = PTHREAD_MUTEX_INITIALIZER;
static const uint64_t kLiveMagic = 0x4c454150504d454dull, kFreedMagic = 0x4652454544424c4bull;

static void* tracked_alloc(size_t n, uint64_t kind) {
  void* mem = NULL;
  if (posix_memalign(&mem, 256, HEADER_BYTES + (n ? n : 1))) return NULL;
  uint64_t header[3] = {kLiveMagic, (uint64_t)n, kind};
  memcpy(mem, header, sizeof(header));
  return (char*)mem + HEADER_BYTES;
}

/// Frees a tracked block of `kind`; 0 when `p` is not a live block of that kind (nothing is touched then).
static int tracked_free(void* p, uint64_t kind, uint64_t* size) {
  if (!p) return 0;
  char* mem = (char*)p - HEADER_BYTES;
  uint64_t header[3];
  memcpy(header, mem, sizeof(header));
  if (header[0] != kLiveMagic || header[2] != kind) {
    atomic_fetch_add(&g_res[R_BAD_FREES], 1);
    return 0;
  }
  *size = header[1];
  header[0] = kFreedMagic;
  memcpy(mem, header, sizeof(header));
  memset(p, 0xDD, (size_t)header[1]);  // a use after free reads garbage, not the old values
  pthread_mutex_lock(&g_quarantine_mutex);
  if (g_quarantined == g_quarantine_cap) {
    g_quarantine_cap = g_quarantine_cap ? 2 * g_quarantine_cap : 256;
    g_quarantine = realloc(g_quarantine, g_quarantine_cap * sizeof(*g_quarantine));
  }
  g_quarantine[g_quarantined].start = (uintptr_t)p;
  g_quarantine[g_quarantined].end = (uintptr_t)p + (header[1] ? header[1] : 1);
  ++g_quarantined;
  atomic_store(&g_any_quarantined, 1);
  pthread_mutex_unlock(&g_quarantine_mutex);
  return 1;
}

/// Whether [p, p + n) overlaps a freed block (then counted as a use after free).
static int freed(const void* p, size_t n) {
  if (!atomic_load(&g_any_quarantined) || n == 0) return 0;
  uintptr_t a = (uintptr_t)p, b = a + n;
  int hit = 0;
  pthread_mutex_lock(&g_quarantine_mutex);
  for (size_t i = 0; i < g_quarantined && !hit; ++i) hit = a < g_quarantine[i].end && g_quarantine[i].start < b;
  pthread_mutex_unlock(&g_quarantine_mutex);
  if (hit) atomic_fetch_add(&g_res[R_USE_AFTER_FREE], 1);
  return hit;
}

static CUresult m_cuMemAlloc(CUdeviceptr* p, size_t n) {
  if (!t_current) return 201;
  if (prohibited()) return 900;
  if (n > MOCK_DEVICE_BYTES) return 2;  // CUDA_ERROR_OUT_OF_MEMORY, without asking the host for it
  void* mem = tracked_alloc(n, 1);
  if (!mem) return 2;  // CUDA_ERROR_OUT_OF_MEMORY
  memset(mem, 0xCD, n);  // like uninitialised device memory: never zero by accident
  *p = (CUdeviceptr)(uintptr_t)mem;
  atomic_fetch_add(&g_stats[S_ALLOC], 1);
  atomic_fetch_add(&g_res[R_LIVE_DEVICE], 1);
  atomic_fetch_add(&g_res[R_LIVE_DEVICE_BYTES], (long long)n);
  return 0;
}
static CUresult m_cuMemFree(CUdeviceptr p) {
  if (prohibited()) return 900;
  uint64_t n = 0;
  if (!tracked_free((void*)(uintptr_t)p, 1, &n)) return 1;  // CUDA_ERROR_INVALID_VALUE
  atomic_fetch_add(&g_stats[S_FREE], 1);
  atomic_fetch_add(&g_res[R_LIVE_DEVICE], -1);
  atomic_fetch_add(&g_res[R_LIVE_DEVICE_BYTES], -(long long)n);
  return 0;
}
static CUresult m_cuMemAllocHost(void** p, size_t n) {
  if (prohibited()) return 900;
  *p = tracked_alloc(n, 2);
  if (!*p) return 2;
  atomic_fetch_add(&g_stats[S_ALLOC], 1);
  atomic_fetch_add(&g_res[R_LIVE_HOST], 1);
  return 0;
}
static CUresult m_cuMemFreeHost(void* p) {
  if (prohibited()) return 900;
  uint64_t n = 0;
  if (!tracked_free(p, 2, &n)) return 1;
  atomic_fetch_add(&g_res[R_HOST_FREES], 1);
  atomic_fetch_add(&g_res[R_LIVE_HOST], -1);
  return 0;
}
static MockGraph* recording(void* s) { return (uintptr_t)s > 2 ? ((MockStream*)s)->recording : NULL; }
static CUresult record_node(MockGraph* g, int kind, MockFunc* f, const unsigned* dims, unsigned smem, void** params,
                            CUdeviceptr dst, CUdeviceptr src, size_t n, unsigned char v);
enum { NODE_MEMSET = 1, NODE_COPY = 2, NODE_LAUNCH = 3 };

static CUresult m_cuMemsetD8Async(CUdeviceptr p, unsigned char v, size_t n, void* s) {
  if (!stream_ctx(s)) return 201;
  if (recording(s)) return record_node(recording(s), NODE_MEMSET, NULL, NULL, 0, NULL, p, 0, n, v);
  if (freed((void*)(uintptr_t)p, n)) return 700;
  memset((void*)(uintptr_t)p, v, n);
  atomic_fetch_add(&g_stats[S_MEMSET], 1);
  stream_op_done();
  return 0;
}
static CUresult m_copy(void* dst, const void* src, size_t n, void* s) {
  if (!stream_ctx(s)) return 201;
  if (recording(s))
    return record_node(recording(s), NODE_COPY, NULL, NULL, 0, NULL, (CUdeviceptr)(uintptr_t)dst,
                       (CUdeviceptr)(uintptr_t)src, n, 0);
  if (freed(dst, n) || freed(src, n)) return 700;
  memmove(dst, src, n);
  atomic_fetch_add(&g_stats[S_COPY], 1);
  stream_op_done();
  return 0;
}
static CUresult m_cuMemcpyAsync(CUdeviceptr d, CUdeviceptr s_, size_t n, void* s) {
  return m_copy((void*)(uintptr_t)d, (void*)(uintptr_t)s_, n, s);
}
static CUresult m_cuMemcpyDtoDAsync(CUdeviceptr d, CUdeviceptr s_, size_t n, void* s) {
  return m_copy((void*)(uintptr_t)d, (void*)(uintptr_t)s_, n, s);
}
static CUresult m_cuMemcpyHtoDAsync(CUdeviceptr d, const void* h, size_t n, void* s) {
  return m_copy((void*)(uintptr_t)d, h, n, s);
}
static CUresult m_cuMemcpyDtoHAsync(void* h, CUdeviceptr d, size_t n, void* s) {
  return m_copy(h, (void*)(uintptr_t)d, n, s);
}
static CUresult m_cuPointerGetAttribute(void* out, int attr, CUdeviceptr p) { (void)out; (void)attr; (void)p; return 1; }

// --- modules ---------------------------------------------------------------------------------------------

static void set_log(unsigned n, int* options, void** values, const char* text) {
  char* buf = NULL;
  size_t size = 0;
  for (unsigned i = 0; i < n; ++i) {
    if (options[i] == 5) buf = (char*)values[i];
    if (options[i] == 6) size = (size_t)(uintptr_t)values[i];
  }
  if (buf && size) snprintf(buf, size, "%s", text);
}

static CUresult m_cuModuleLoadDataEx(MockModule** mod, const void* image, unsigned n, int* options, void** values) {
  if (!t_current) return 201;
  if (prohibited()) return 900;
  const unsigned char* p = image;
  int cc = device_cc();
  size_t size;
  int is_cubin = memcmp(p, "\x7f" "ELF", 4) == 0;
  char desc[64];
  if (is_cubin) {
    // A real or fake cubin: e_flags (offset 48) carries the SM in bits 8..15; the size comes from
    // the section header table end (real) or a 'LEAPPMOCKEND' marker (fake), capped at 16 MiB.
    uint32_t flags;
    memcpy(&flags, p + 48, 4);
    int arch = (flags >> 8) & 0xff;
    if (env_int("MOCK_DRIVER_VERSION", 13000) < 13000) {
      // Test cubins stand for CUDA 13 ones (Warp 1.19's NVRTC 13.4): a CUDA 12 driver is taken to refuse them
      // (CUDA's compatibility rules, not measured; docs/bundle-format.md section 3).
      atomic_fetch_add(&g_stats[S_LOADFAIL], 1);
      set_log(n, options, values, "mock: cubin of a newer CUDA major version than the driver");
      return 209;
    }
    if (arch / 10 != cc / 10 || arch % 10 > cc % 10) {
      atomic_fetch_add(&g_stats[S_LOADFAIL], 1);
      set_log(n, options, values, "mock: no kernel image for this device");
      return 209;
    }
    // The image ends with the later of the section and program header tables (as in nvcc/NVRTC
    // cubins; fake test cubins set e_shoff to their length and no tables).
    uint64_t shoff, phoff;
    uint16_t phentsize, phnum, shentsize, shnum;
    memcpy(&phoff, p + 32, 8);
    memcpy(&shoff, p + 40, 8);
    memcpy(&phentsize, p + 54, 2);
    memcpy(&phnum, p + 56, 2);
    memcpy(&shentsize, p + 58, 2);
    memcpy(&shnum, p + 60, 2);
    uint64_t end_sh = shoff + (uint64_t)shentsize * shnum, end_ph = phoff + (uint64_t)phentsize * phnum;
    size = (size_t)(end_sh > end_ph ? end_sh : end_ph);
    if (size < 64 || size > (64u << 20)) {
      atomic_fetch_add(&g_stats[S_LOADFAIL], 1);
      set_log(n, options, values, "mock: malformed ELF header");
      return 200;
    }
    snprintf(desc, sizeof(desc), "cubin sm_%d", arch);
  } else {
    size = strlen((const char*)p) + 1;
    const char* v = strstr((const char*)p, ".version ");
    if (!v) { atomic_fetch_add(&g_stats[S_LOADFAIL], 1); set_log(n, options, values, "mock: no .version"); return 218; }
    int major = 0, minor = 0;
    sscanf(v + 9, "%d.%d", &major, &minor);
    if (major * 10 + minor > max_ptx()) {
      atomic_fetch_add(&g_stats[S_LOADFAIL], 1);
      char log[200];
      snprintf(log, sizeof(log), "ptxas application ptx input, line 4; fatal   : Unsupported .version %d.%d", major, minor);
      set_log(n, options, values, log);
      return 222;
    }
    snprintf(desc, sizeof(desc), "ptx %d.%d", major, minor);
  }
  MockModule* m = calloc(1, sizeof(MockModule));
  m->image = malloc(size);
  memcpy(m->image, p, size);
  m->size = size;
  m->is_cubin = is_cubin;
  *mod = m;
  pthread_mutex_lock(&g_mutex);
  snprintf(g_last_loaded, sizeof(g_last_loaded), "%s", desc);
  pthread_mutex_unlock(&g_mutex);
  atomic_fetch_add(&g_stats[S_LOAD], 1);
  atomic_fetch_add(&g_res[R_LIVE_MODULES], 1);
  return 0;
}
static CUresult m_cuModuleUnload(MockModule* m) {
  if (prohibited()) return 900;
  if (m->unloaded) {
    atomic_fetch_add(&g_res[R_BAD_FREES], 1);
    return 400;
  }
  free(m->image);
  m->image = NULL;
  pthread_mutex_lock(&g_mutex);
  m->unloaded = 1;
  m->next = g_unloaded;
  g_unloaded = m;
  pthread_mutex_unlock(&g_mutex);
  atomic_fetch_add(&g_res[R_UNLOADS], 1);
  atomic_fetch_add(&g_res[R_LIVE_MODULES], -1);
  return 0;
}
static CUresult m_cuModuleGetFunction(MockFunc** f, MockModule* m, const char* name) {
  size_t len = strlen(name);
  if (m->unloaded) return 400;
  if (len == 0 || len >= 256 || !memmem(m->image, m->size, name, len)) return 500;
  MockFunc* fn = calloc(1, sizeof(MockFunc));
  fn->module = m;
  memcpy(fn->name, name, len + 1);
  pthread_mutex_lock(&g_mutex);
  fn->next = m->funcs;
  m->funcs = fn;
  pthread_mutex_unlock(&g_mutex);
  *f = fn;
  return 0;
}
static CUresult m_cuFuncSetAttribute(MockFunc* f, int attr, int value) {
  if (attr == 8) {
    if (value > 232448) return 1;
    f->max_dyn_smem = value;
  }
  return 0;
}
static CUresult m_cuFuncGetAttribute(int* v, int attr, MockFunc* f) {
  (void)f;
  *v = attr == 0 ? 1024 : 0;
  return 0;
}

// --- kernels -----------------------------------------------------------------------------------------------

typedef struct {
  uint64_t data, grad;
  int32_t shape[4], strides[4];
  uint16_t ndim, flags;
} ArrayT;

static ArrayT arr(void** params, int i) { ArrayT a; memcpy(&a, params[i], sizeof(a)); return a; }
static uint64_t bounds_size(void** params) { uint64_t s; memcpy(&s, (char*)params[0] + 8, 8); return s; }

static CUresult launch_kernel(MockFunc* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                              unsigned bz, unsigned smem, void* stream, void** params, void** extra) {
  (void)gy; (void)gz; (void)by; (void)bz; (void)extra;
  if (!f) return 400;
  if (f->module->unloaded) {
    atomic_fetch_add(&g_res[R_USE_AFTER_FREE], 1);
    return 400;
  }
  if (!stream_ctx(stream)) return 201;
  if (smem > 49152 && (int)smem > f->max_dyn_smem) return 1;  // needs cuFuncSetAttribute first
  atomic_fetch_add(&g_stats[S_LAUNCH], 1);
  const char* name = f->name;
  if (strcmp(name, "leapp_example_scale_cuda_kernel_forward") == 0) {
    uint64_t n = bounds_size(params);
    float* x = (float*)(uintptr_t)arr(params, 1).data;
    float* c = (float*)(uintptr_t)arr(params, 2).data;
    float* out = (float*)(uintptr_t)arr(params, 3).data;
    if (freed(x, 4 * n) || freed(c, 4 * n) || freed(out, 4 * n)) return 700;
    for (uint64_t i = 0; i < n; ++i) out[i] = x[i] * c[i];
  } else if (strcmp(name, "leapp_test_smem_mirror") == 0) {
    uint64_t n = bounds_size(params);
    float* x = (float*)(uintptr_t)arr(params, 1).data;
    float* y = (float*)(uintptr_t)arr(params, 2).data;
    uint32_t window;
    memcpy(&window, params[3], 4);
    if (window > smem || window < 4u * bx) return 700;  // the kernel would address outside its shared memory
    for (uint64_t b = 0; b < gx; ++b)
      for (uint64_t t = 0; t < bx; ++t) {
        uint64_t i = b * bx + t, src = b * bx + (bx - 1 - t);
        if (i < n) y[i] = (src < n ? x[src] : 0.0f) + 1.0f;
      }
  } else if (strncmp(name, "affine_vec3_", 12) == 0) {
    uint64_t n = bounds_size(params);
    ArrayT x = arr(params, 1), y = arr(params, 4), hits = arr(params, 5);
    if (x.ndim != 1 || x.shape[0] != (int)n || x.strides[0] != 12 || y.shape[0] != (int)n || hits.shape[0] != 1)
      return 700;
    float scale, offset[3];
    memcpy(&scale, params[2], 4);
    memcpy(offset, params[3], 12);
    float* xs = (float*)(uintptr_t)x.data;
    float* ys = (float*)(uintptr_t)y.data;
    for (uint64_t i = 0; i < n; ++i)
      for (int k = 0; k < 3; ++k) ys[3 * i + k] = scale * xs[3 * i + k] + offset[k];
    *(int32_t*)(uintptr_t)hits.data += (int32_t)n;
  } else if (strncmp(name, "add_rows_", 9) == 0) {
    uint32_t rows, cols;
    memcpy(&rows, params[0], 4);
    memcpy(&cols, (char*)params[0] + 4, 4);
    ArrayT a = arr(params, 1), bias = arr(params, 2), out = arr(params, 4);
    int32_t k;
    memcpy(&k, params[3], 4);
    if (a.ndim != 2 || a.shape[0] != (int)rows || a.shape[1] != (int)cols || bias.shape[0] != (int)cols ||
        bounds_size(params) != (uint64_t)rows * cols)
      return 700;
    for (uint32_t i = 0; i < rows; ++i)
      for (uint32_t j = 0; j < cols; ++j) {
        float av = *(float*)(uintptr_t)(a.data + (uint64_t)i * a.strides[0] + (uint64_t)j * a.strides[1]);
        float bv = *(float*)(uintptr_t)(bias.data + (uint64_t)j * bias.strides[0]);
        *(float*)(uintptr_t)(out.data + (uint64_t)i * out.strides[0] + (uint64_t)j * out.strides[1]) = av + bv * (float)k;
      }
  }
  return 0;
}

static CUresult m_cuLaunchKernel(MockFunc* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                 unsigned bz, unsigned smem, void* stream, void** params, void** extra) {
  if (recording(stream)) {
    if (!f) return 400;
    if (smem > 49152 && (int)smem > f->max_dyn_smem) return 1;
    unsigned dims[6] = {gx, gy, gz, bx, by, bz};
    return record_node(recording(stream), NODE_LAUNCH, f, dims, smem, params, 0, 0, 0, 0);
  }
  CUresult r = launch_kernel(f, gx, gy, gz, bx, by, bz, smem, stream, params, extra);
  if (r == 0) stream_op_done();
  return r;
}


// --- graphs --------------------------------------------------------------------------------------------------

#define MAX_PARAMS 8
typedef struct MockNode {
  int kind;
  MockFunc* f;
  unsigned dims[6], smem;
  int nparams;  // -1: parameters not kept (a kernel this file does not emulate)
  unsigned char param_bytes[MAX_PARAMS][64];
  CUdeviceptr dst, src;
  size_t n;
  unsigned char value;
} MockNode;
struct MockGraph { MockNode* nodes; int count, cap; MockCapture* capture; };
static atomic_llong g_graph[5];  // live graphs, live execs, graph launches, instantiations, updates
static atomic_llong g_user_object_launches;  // launches of an instance that holds user objects
static MockCapture* recording_capture(MockGraph* g) { return g->capture; }

/// The parameter sizes of the kernels emulated above (Warp 1.19's ABI: bounds 24 B, array 56 B).
static int kernel_param_sizes(const char* name, size_t* sizes) {
  static const size_t scale[] = {24, 56, 56, 56}, mirror[] = {24, 56, 56, 4}, affine[] = {24, 56, 4, 12, 56, 56},
                      rows[] = {24, 56, 56, 4, 56};
  const size_t* src = NULL;
  int n = -1;
  if (strcmp(name, "leapp_example_scale_cuda_kernel_forward") == 0) src = scale, n = 4;
  else if (strcmp(name, "leapp_test_smem_mirror") == 0) src = mirror, n = 4;
  else if (strncmp(name, "affine_vec3_", 12) == 0) src = affine, n = 6;
  else if (strncmp(name, "add_rows_", 9) == 0) src = rows, n = 5;
  for (int i = 0; i < n; ++i) sizes[i] = src[i];
  return n;
}

static CUresult record_node(MockGraph* g, int kind, MockFunc* f, const unsigned* dims, unsigned smem, void** params,
                            CUdeviceptr dst, CUdeviceptr src, size_t n, unsigned char v) {
  if (g->count == g->cap) {
    g->cap = g->cap ? 2 * g->cap : 8;
    g->nodes = realloc(g->nodes, sizeof(MockNode) * (size_t)g->cap);
  }
  MockNode* node = &g->nodes[g->count++];
  memset(node, 0, sizeof(*node));
  node->kind = kind;
  node->f = f;
  node->smem = smem;
  if (dims) memcpy(node->dims, dims, sizeof(node->dims));
  node->dst = dst, node->src = src, node->n = n, node->value = v;
  node->nparams = -1;
  if (kind == NODE_LAUNCH && params) {
    size_t sizes[MAX_PARAMS];
    int np = kernel_param_sizes(f->name, sizes);
    for (int i = 0; i < np; ++i) memcpy(node->param_bytes[i], params[i], sizes[i]);
    node->nparams = np;
  }
  return 0;
}

static MockGraph* graph_copy(const MockGraph* g) {
  MockGraph* c = calloc(1, sizeof(MockGraph));
  c->count = c->cap = g->count;
  c->nodes = malloc(sizeof(MockNode) * (size_t)(g->count ? g->count : 1));
  memcpy(c->nodes, g->nodes, sizeof(MockNode) * (size_t)g->count);
  if (g->capture && g->capture->count) {  // an instance holds a reference to each of its graph's user objects
    c->capture = calloc(1, sizeof(MockCapture));
    c->capture->count = g->capture->count;
    c->capture->objects = malloc(sizeof(MockUserObject*) * (size_t)g->capture->count);
    pthread_mutex_lock(&g_mutex);
    for (int i = 0; i < g->capture->count; ++i) c->capture->objects[i] = g->capture->objects[i], c->capture->objects[i]->refs++;
    pthread_mutex_unlock(&g_mutex);
  }
  return c;
}
static void graph_free(MockGraph* g) {
  if (g->capture) {
    for (int i = 0; i < g->capture->count; ++i) user_object_release(g->capture->objects[i], 1);
    free(g->capture->objects);
    free(g->capture);
  }
  free(g->nodes);
  free(g);
}

static CUresult m_cuStreamBeginCapture(MockStream* s, int mode) {
  (void)mode;
  if ((uintptr_t)s <= 2) return 906;  // CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: not on a default stream
  if (s->recording || s->capturing) return 900;
  s->recording = calloc(1, sizeof(MockGraph));
  s->recording->capture = calloc(1, sizeof(MockCapture));
  s->recording->capture->id = (unsigned long long)atomic_fetch_add(&g_capture_ids, 1) + 1;
  atomic_fetch_add(&g_graph[0], 1);
  return 0;
}
static CUresult m_cuStreamEndCapture(MockStream* s, MockGraph** graph) {
  if ((uintptr_t)s <= 2 || !s->recording) return 901;  // CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
  *graph = s->recording;
  s->recording = NULL;
  return 0;
}
static CUresult m_cuGraphInstantiateWithFlags(MockGraph** exec, MockGraph* graph, unsigned long long flags) {
  (void)flags;
  *exec = graph_copy(graph);
  atomic_fetch_add(&g_graph[1], 1);
  atomic_fetch_add(&g_graph[3], 1);
  return 0;
}
static CUresult m_cuGraphExecUpdate(MockGraph* exec, MockGraph* graph, int* info) {
  int same = exec->count == graph->count;
  for (int i = 0; same && i < graph->count; ++i)
    same = exec->nodes[i].kind == graph->nodes[i].kind && exec->nodes[i].f == graph->nodes[i].f;
  if (!same) {
    if (info) info[0] = 2;  // CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED
    return 910;             // CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE
  }
  memcpy(exec->nodes, graph->nodes, sizeof(MockNode) * (size_t)graph->count);
  if (info) info[0] = 0;
  atomic_fetch_add(&g_graph[4], 1);
  return 0;
}
static CUresult m_cuGraphLaunch(MockGraph* exec, void* stream) {
  if (!stream_ctx(stream)) return 201;
  atomic_fetch_add(&g_graph[2], 1);
  if (exec->capture && exec->capture->count) atomic_fetch_add(&g_user_object_launches, 1);
  for (int i = 0; i < exec->count; ++i) {
    MockNode* n = &exec->nodes[i];
    CUresult r = 0;
    if (n->kind == NODE_MEMSET) {
      r = m_cuMemsetD8Async(n->dst, n->value, n->n, stream);
    } else if (n->kind == NODE_COPY) {
      r = m_copy((void*)(uintptr_t)n->dst, (void*)(uintptr_t)n->src, n->n, stream);
    } else {
      void* params[MAX_PARAMS];
      for (int p = 0; p < MAX_PARAMS; ++p) params[p] = n->param_bytes[p];
      r = m_cuLaunchKernel(n->f, n->dims[0], n->dims[1], n->dims[2], n->dims[3], n->dims[4], n->dims[5], n->smem,
                           stream, n->nparams >= 0 ? params : NULL, NULL);
    }
    if (r) return r;
  }
  return 0;
}
static CUresult m_cuGraphDestroy(MockGraph* g) {
  graph_free(g);
  atomic_fetch_add(&g_graph[0], -1);
  return 0;
}
static CUresult m_cuGraphExecDestroy(MockGraph* g) {
  graph_free(g);
  atomic_fetch_add(&g_graph[1], -1);
  return 0;
}

// --- cuGetProcAddress -----------------------------------------------------------------------------------------

#define ENTRY(name) {#name, (void*)m_##name}
static const struct { const char* name; void* fn; } kEntries[] = {
    ENTRY(cuGetErrorName), ENTRY(cuGetErrorString), ENTRY(cuInit), ENTRY(cuDriverGetVersion),
    ENTRY(cuDeviceGetCount), ENTRY(cuDeviceGet), ENTRY(cuDeviceGetName), ENTRY(cuDeviceGetAttribute),
    ENTRY(cuDevicePrimaryCtxRetain), ENTRY(cuDevicePrimaryCtxRelease), ENTRY(cuCtxGetCurrent),
    ENTRY(cuCtxSetCurrent), ENTRY(cuCtxGetDevice), ENTRY(cuCtxSynchronize), ENTRY(cuStreamGetCtx),
    ENTRY(cuStreamSynchronize), ENTRY(cuStreamIsCapturing), ENTRY(cuModuleLoadDataEx), ENTRY(cuModuleUnload),
    ENTRY(cuModuleGetFunction), ENTRY(cuFuncSetAttribute), ENTRY(cuLaunchKernel), ENTRY(cuMemAlloc),
    ENTRY(cuMemFree), ENTRY(cuMemAllocHost), ENTRY(cuMemFreeHost), ENTRY(cuMemsetD8Async), ENTRY(cuMemcpyAsync),
    ENTRY(cuMemcpyDtoDAsync), ENTRY(cuMemcpyHtoDAsync), ENTRY(cuMemcpyDtoHAsync), ENTRY(cuPointerGetAttribute),
    ENTRY(cuStreamCreate), ENTRY(cuStreamDestroy), ENTRY(cuThreadExchangeStreamCaptureMode),
    ENTRY(cuFuncGetAttribute), ENTRY(cuStreamBeginCapture), ENTRY(cuStreamEndCapture),
    ENTRY(cuGraphInstantiateWithFlags), ENTRY(cuGraphExecUpdate), ENTRY(cuGraphLaunch), ENTRY(cuGraphDestroy),
    ENTRY(cuGraphExecDestroy), ENTRY(cuStreamGetCaptureInfo), ENTRY(cuUserObjectCreate),
    ENTRY(cuUserObjectRelease), ENTRY(cuGraphRetainUserObject),
};

__attribute__((visibility("default"))) CUresult cuGetProcAddress_v2(const char* name, void** fn, int version,
                                                                    unsigned long long flags, int* status) {
  (void)version; (void)flags;
  if (env_int("MOCK_NO_CAPTURE_INFO", 0) && (strstr(name, "UserObject") || strcmp(name, "cuStreamGetCaptureInfo") == 0)) {
    *fn = NULL;
    if (status) *status = 1;
    return 500;
  }
  for (size_t i = 0; i < sizeof(kEntries) / sizeof(kEntries[0]); ++i)
    if (strcmp(kEntries[i].name, name) == 0) {
      *fn = kEntries[i].fn;
      if (status) *status = 0;
      return 0;
    }
  *fn = NULL;
  if (status) *status = 1;
  return 500;
}

// --- test hooks --------------------------------------------------------------------------------------------

__attribute__((visibility("default"))) void mock_stats(long long* out) {
  for (int i = 0; i < 10; ++i) out[i] = atomic_load(&g_stats[i]);
}
/// live device allocations, live device bytes, live pinned allocations, live modules, live streams
/// (cuStreamCreate'd), refused frees (unknown or double), module unloads, pinned frees, uses after free.
__attribute__((visibility("default"))) void mock_resources(long long* out) {
  for (int i = 0; i < 9; ++i) out[i] = atomic_load(&g_res[i]);
}
/// Sleep `us` microseconds after every memset, copy and launch (0: off).
/// live graphs, live graph execs, graph launches, instantiations, in-place updates.
__attribute__((visibility("default"))) void mock_graph_stats(long long* out) {
  for (int i = 0; i < 5; ++i) out[i] = atomic_load(&g_graph[i]);
}
__attribute__((visibility("default"))) void mock_set_stream_delay(int us) { atomic_store(&g_stream_delay_us, us); }
__attribute__((visibility("default"))) void mock_last_loaded(char* out, int n) {
  pthread_mutex_lock(&g_mutex);
  snprintf(out, (size_t)n, "%s", g_last_loaded);
  pthread_mutex_unlock(&g_mutex);
}
__attribute__((visibility("default"))) void* mock_current_ctx(void) { return t_current; }
__attribute__((visibility("default"))) void mock_set_current_ctx(void* ctx) { t_current = ctx; }
__attribute__((visibility("default"))) void* mock_primary_ctx(int dev) { g_ctx[dev].device = dev; return &g_ctx[dev]; }
__attribute__((visibility("default"))) void* mock_stream_create(int dev) {
  MockStream* s = calloc(1, sizeof(MockStream));
  g_ctx[dev].device = dev;
  s->ctx = &g_ctx[dev];
  return s;
}
__attribute__((visibility("default"))) void mock_set_capturing(void* stream, int on) {
  MockStream* s = stream;
  if (s->capturing != on) atomic_fetch_add(&g_capturing, on ? 1 : -1);
  s->capturing = on;
  if (on && !s->capture) {
    s->capture = calloc(1, sizeof(MockCapture));
    s->capture->id = (unsigned long long)atomic_fetch_add(&g_capture_ids, 1) + 1;
  } else if (!on && s->capture) {  // the capture ends and its graph is destroyed
    MockCapture* c = s->capture;
    s->capture = NULL;
    for (int i = 0; i < c->count; ++i) user_object_release(c->objects[i], 1);
    free(c->objects);
    free(c);
  }
}
/// live user objects, destructors run.
__attribute__((visibility("default"))) void mock_user_object_stats(long long* out) {
  for (int i = 0; i < 2; ++i) out[i] = atomic_load(&g_user_objects[i]);
}
/// The id of the caller capture mock_set_capturing began on `stream` (0: none).
__attribute__((visibility("default"))) unsigned long long mock_capture_id(void* stream) {
  MockStream* s = stream;
  return s->capture ? s->capture->id : 0;
}
/// Launches of a graph instance that holds user objects.
__attribute__((visibility("default"))) long long mock_user_object_launches(void) {
  return atomic_load(&g_user_object_launches);
}
