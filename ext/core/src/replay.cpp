// ext/core/src/replay.cpp: replaying a segment's ops on the caller's stream.
//
// One-time work (module loads, constant uploads, scratch allocation) happens
// under one mutex on the first call per (CUcontext, bundle digest[, stream]);
// later calls only read the caches and enqueue work, so they are safe inside
// CUDA graph capture and never allocate. Per-call state (buffer addresses and
// the relocated parameter bytes) lives in thread-local vectors: concurrent
// callers never share it. cuLaunchKernel copies the parameter values when it
// is called, so the host buffer may be reused right after.
//
// Scratch is keyed by stream too: two streams replaying the same segment at
// once must not share scratch memory, while calls on one stream are ordered
// and can, provided each call's work reaches the stream in one piece. So a
// call holds its StreamScratch's lock from its first enqueue (the inits) to
// its last op: two threads replaying one segment on one stream (the legacy
// default stream, torch's current stream shared by threads) enqueue one call
// after the other, never interleaved. The per-thread default stream counts as
// one stream per thread; its scratch is freed when the thread exits.
//
// Graph replay: a segment of two or more enqueues (inits, launches, memsets,
// copies) replays as one CUDA graph launch. Each StreamScratch keeps a few
// instantiated graphs keyed by the call's input and output addresses (scratch
// and constants are fixed per entry); a graph is captured on a private stream
// of the entry the first time a key is seen, and the least recently used one
// is updated in place (cuGraphExecUpdate) once kGraphsPerStream exist. Calls
// whose addresses keep changing (kMissStreak misses in a row) replay op by op
// for the next kEagerCalls calls, then try again. A stream being captured by
// the caller (torch.cuda.graph) always gets the ops themselves, as does every
// call when LEAPP_SEGMENT_GRAPHS=0 or the driver lacks the graph API.
//
// Captures: a call made while the caller captures its stream (torch.cuda.graph, a CUDA graph of
// leapp.load) is recorded, not run, and the graph replays it later, on any stream. Its scratch is
// therefore keyed by the capture too (cuStreamGetCaptureInfo's id): two graphs never share scratch,
// even when captured on one stream (torch's default capture stream, or its pool streams, which
// repeat), so replaying them at once on two streams cannot race. The entry is tied to the captured
// graph by a CUDA user object; once the graph and its instances are gone and their launches done,
// the driver's callback queues the entry, and the next new entry (or release_segments()) frees it.
//
// Lifetimes: the table owns PreparedSegments, each owns its StreamScratch
// entries. release_segments() takes them out of the table, waits for calls
// in flight (the scratch locks), marks them released, synchronises the
// context and frees; a thread still holding one (its last-hit cache) finds
// `released` set under the lock and looks up again.
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <tuple>

#include "manifest.h"
#include "replay_internal.h"

namespace leapp {
namespace detail {
namespace {

std::atomic<uint64_t> g_allocations{0};
std::atomic<uint64_t> g_frees{0};

std::mutex& cache_mutex() {
  static std::mutex* m = new std::mutex();
  return *m;
}


bool is_special_stream(CUstream s) {
  return s == nullptr || s == cu_stream_legacy() || s == cu_stream_per_thread();
}

struct StreamKey {
  CUstream stream;
  uint64_t thread;   // only for the per-thread default stream: this_thread_serial()
  uint64_t capture;  // the caller's capture sequence (cuStreamGetCaptureInfo's id) while `stream` is captured, else 0
  bool operator<(const StreamKey& o) const {
    return std::tie(stream, thread, capture) < std::tie(o.stream, o.thread, o.capture);
  }
  bool operator==(const StreamKey& o) const { return stream == o.stream && thread == o.thread && capture == o.capture; }
};

/// A number no other thread of the process ever gets (std::thread::id values are
/// reused after a thread exits, while its per-thread stream's work may still run).
uint64_t this_thread_serial() {
  static std::atomic<uint64_t> next{1};
  thread_local uint64_t serial = next.fetch_add(1);
  return serial;
}

/// Buffers of one role carved from one allocation (`base`, 0 when the role has no bytes).
struct RoleMemory {
  CUdeviceptr base = 0;
  std::vector<CUdeviceptr> addr;  // per buffer; 0 unless of the role
  uint64_t capacity = 0;          // bytes at `base`
  std::vector<CUdeviceptr> retired;  // dynamic batch: smaller scratch given up on growth, freed with the entry
};

/// Dynamic batch: the offsets of the scratch buffers at `batch` (256-aligned, in buffer order); returns the total.
uint64_t scratch_layout(const Manifest& m, int64_t batch, std::vector<uint64_t>& offsets) {
  offsets.assign(m.buffers.size(), 0);
  uint64_t total = 0;
  for (size_t i = 0; i < m.buffers.size(); ++i) {
    if (m.buffers[i].role != BufferRole::kScratch) continue;
    offsets[i] = total;
    total = round_up(total + uint64_t(m.buffers[i].bytes_rule.at(batch)), kSubAlignment);
  }
  return total;
}

struct PreparedSegment;

constexpr size_t kGraphsPerStream = 8;  // distinct (input, output) address sets kept per stream entry
constexpr uint32_t kMissStreak = 16;    // misses in a row before replaying op by op for a while
constexpr uint32_t kEagerCalls = 256;   // calls replayed op by op after such a streak

/// An instantiated graph of a segment's enqueues for one set of I/O addresses.
struct SegmentGraph {
  std::vector<CUdeviceptr> key;  // inputs then outputs
  CUgraphExec exec = nullptr;
};

/// One stream's scratch for one prepared segment, and the lock that keeps a
/// call's enqueues contiguous on that stream.
struct StreamScratch {
  std::mutex enqueue;
  std::shared_ptr<PreparedSegment> seg;  // modules, functions, constants (outlives `released`)
  StreamKey key{nullptr, 0, 0};
  RoleMemory memory;
  bool released = false;  // guarded by `enqueue`: the memory is freed or being freed, look up again
  // Graph replay, guarded by `enqueue` (see the top of the file).
  CUstream build_stream = nullptr;   // private stream graphs are captured on; made on first use
  std::vector<SegmentGraph> graphs;  // least recently used first
  uint32_t miss_streak = 0;
  uint32_t eager_calls = 0;          // calls left to replay op by op
  bool graphs_failed = false;        // building a graph failed once: op by op from then on
};

/// A segment made ready in one context: functions, constants, scratch per stream.
struct PreparedSegment {
  CUcontext ctx = nullptr;
  std::string digest;
  std::vector<CUmodule> modules;
  std::vector<std::string> choices;    // per module, "cubin sm_90" (diagnostics)
  std::vector<CUfunction> functions;  // per kernel; null when no launch uses it
  RoleMemory constants;
  size_t enqueues = 0;                 // inits plus ops: what one call puts on the stream
  std::map<StreamKey, std::shared_ptr<StreamScratch>> scratch;  // guarded by cache_mutex()
};

using SegmentTable = std::map<std::pair<CUcontext, std::string>, std::shared_ptr<PreparedSegment>>;

SegmentTable& segments() {
  static auto* s = new SegmentTable();
  return *s;  // leaked on purpose: what is still in it at exit is the process's to free
}

/// Device memory and modules whose free failed (cuCtxSynchronize refused during a
/// capture, say); the next release_segments() tries again. Guarded by cache_mutex().
struct Pending {
  CUcontext ctx = nullptr;
  std::vector<CUgraphExec> graphs;  // destroyed before the modules their kernels come from
  std::vector<CUstream> streams;
  std::vector<CUdeviceptr> memory;
  std::vector<CUmodule> modules;
  bool empty() const { return graphs.empty() && streams.empty() && memory.empty() && modules.empty(); }
};
std::vector<Pending>& pending_frees() {
  static auto* p = new std::vector<Pending>();
  return *p;
}

CUdeviceptr allocate(const CudaDriver& d, uint64_t bytes, const std::string& what) {
  CUdeviceptr p = 0;
  CUresult r = d.cuMemAlloc(&p, size_t(bytes));
  if (r != CUDA_SUCCESS)
    throw CudaError(r, what + ": cuMemAlloc of " + std::to_string(bytes) + " bytes failed: " + cu_error_text(r));
  count_allocation();
  return p;
}

/// Every buffer of `role`, carved from one allocation.
RoleMemory allocate_role(const CudaDriver& d, const Manifest& m, BufferRole role, const std::string& what) {
  std::vector<uint64_t> offsets(m.buffers.size(), 0);
  uint64_t total = 0;
  for (size_t i = 0; i < m.buffers.size(); ++i) {
    if (m.buffers[i].role != role) continue;
    offsets[i] = total;
    total = round_up(total + m.buffers[i].bytes, kSubAlignment);
  }
  RoleMemory out;
  out.addr.assign(m.buffers.size(), 0);
  if (total == 0) return out;
  out.base = allocate(d, total, what);
  out.capacity = total;
  for (size_t i = 0; i < m.buffers.size(); ++i)
    if (m.buffers[i].role == role) out.addr[i] = out.base + offsets[i];
  return out;
}

/// Frees device memory and unloads modules of `p` in the current context (ctx is current);
/// what the driver refuses stays in `p` (returns false then).
bool free_now(const CudaDriver& d, Pending& p) {
  std::vector<CUgraphExec> graphs;
  for (CUgraphExec g : p.graphs)
    if (d.cuGraphExecDestroy(g) != CUDA_SUCCESS) graphs.push_back(g);
  std::vector<CUstream> streams;
  for (CUstream s : p.streams)
    if (d.cuStreamDestroy(s) != CUDA_SUCCESS) streams.push_back(s);
  std::vector<CUdeviceptr> memory;
  for (CUdeviceptr m : p.memory) {
    if (d.cuMemFree(m) == CUDA_SUCCESS) count_free();
    else memory.push_back(m);
  }
  std::vector<CUmodule> modules;
  for (CUmodule m : p.modules)
    if (d.cuModuleUnload(m) != CUDA_SUCCESS) modules.push_back(m);
  p.graphs = std::move(graphs);
  p.streams = std::move(streams);
  p.memory = std::move(memory);
  p.modules = std::move(modules);
  return p.empty();
}

/// Moves what `sc` owns on the device (scratch, graphs, its build stream) into `p`.
void take_stream_resources(StreamScratch& sc, Pending& p) {
  if (sc.memory.base) p.memory.push_back(sc.memory.base);
  for (CUdeviceptr r : sc.memory.retired) p.memory.push_back(r);  // dynamic batch: outgrown scratch
  sc.memory.retired.clear();
  for (SegmentGraph& g : sc.graphs) p.graphs.push_back(g.exec);
  sc.graphs.clear();
  if (sc.build_stream) p.streams.push_back(sc.build_stream);
  sc.build_stream = nullptr;
}

/// What `seg` owns on the device (its modules and constants; not its scratch).
Pending segment_resources(const PreparedSegment& seg) {
  Pending p;
  p.ctx = seg.ctx;
  for (CUmodule m : seg.modules)
    if (m) p.modules.push_back(m);
  if (seg.constants.base) p.memory.push_back(seg.constants.base);
  return p;
}

void fill(const CudaDriver& d, const Bundle& bundle, const DeviceAttrs& dev, PreparedSegment* seg);

/// Modules, functions and constants of `bundle` in the current context `ctx`; on failure
/// what was loaded or allocated so far is given back before the error propagates.
std::shared_ptr<PreparedSegment> prepare(const CudaDriver& d, const Bundle& bundle, const DeviceAttrs& dev,
                                         CUcontext ctx) {
  auto seg = std::make_shared<PreparedSegment>();
  seg->ctx = ctx;
  seg->digest = bundle.digest();
  try {
    fill(d, bundle, dev, seg.get());
  } catch (...) {
    Pending p = segment_resources(*seg);
    free_now(d, p);
    throw;
  }
  return seg;
}

void fill(const CudaDriver& d, const Bundle& bundle, const DeviceAttrs& dev, PreparedSegment* seg) {
  const Manifest& m = bundle.manifest();
  const std::string where = "leapp segment '" + m.segment + "'";

  // Modules and functions, for the kernels that launches use.
  std::vector<uint32_t> max_smem(m.kernels.size(), 0);
  std::vector<bool> used(m.kernels.size(), false);
  for (const OpSpec& op : m.ops) {
    if (op.kind != OpKind::kLaunch) continue;
    used[op.kernel] = true;
    max_smem[op.kernel] = std::max({max_smem[op.kernel], op.smem, m.kernels[op.kernel].smem_bytes});
  }
  seg->modules.assign(m.modules.size(), nullptr);
  seg->choices.assign(m.modules.size(), "");
  seg->functions.assign(m.kernels.size(), nullptr);
  for (size_t k = 0; k < m.kernels.size(); ++k) {
    if (!used[k]) continue;
    const KernelSpec& kernel = m.kernels[k];
    if (seg->modules[kernel.module] == nullptr) {
      LoadedModule loaded = load_module(d, bundle, kernel.module, dev);
      seg->modules[kernel.module] = loaded.module;
      seg->choices[kernel.module] = loaded.choice;
    }
    CUfunction f = nullptr;
    CUresult r = d.cuModuleGetFunction(&f, seg->modules[kernel.module], kernel.entry.c_str());
    if (r != CUDA_SUCCESS)
      throw CudaError(r, where + ": kernels[" + std::to_string(k) + "] entry '" + kernel.entry + "' not found in module " +
                             std::to_string(kernel.module) + " (" + seg->choices[kernel.module] + "): " + cu_error_text(r));
    // Also forces a lazily loaded function to load now (not later, e.g. inside a graph capture).
    int max_threads = 0;
    r = d.cuFuncGetAttribute(&max_threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, f);
    if (r != CUDA_SUCCESS)
      throw CudaError(r, where + ": kernel '" + kernel.entry + "' (" + seg->choices[kernel.module] +
                             ") cannot be loaded: " + cu_error_text(r));
    for (size_t i = 0; i < m.ops.size(); ++i) {
      const OpSpec& op = m.ops[i];
      uint64_t threads = uint64_t(op.block[0]) * op.block[1] * op.block[2];
      if (op.kind == OpKind::kLaunch && op.kernel == k && threads > uint64_t(max_threads))
        throw std::runtime_error(where + ": ops[" + std::to_string(i) + "] launches '" + kernel.entry + "' with " +
                                 std::to_string(threads) + " threads per block, but its " + seg->choices[kernel.module] +
                                 " build allows at most " + std::to_string(max_threads) + " on device " +
                                 std::to_string(dev.ordinal));
    }
    if (max_smem[k] > 0) {
      r = d.cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, int(max_smem[k]));
      if (r != CUDA_SUCCESS)
        throw CudaError(r, where + ": kernel '" + kernel.entry + "' needs " + std::to_string(max_smem[k]) +
                               " bytes of dynamic shared memory; device " + std::to_string(dev.ordinal) +
                               " allows at most " + std::to_string(dev.max_smem_optin) + " per block: " + cu_error_text(r));
    }
    seg->functions[k] = f;
  }

  for (const BufferSpec& b : m.buffers) seg->enqueues += b.init == BufferInit::kZero || b.init == BufferInit::kInput;
  for (const OpSpec& op : m.ops) seg->enqueues += op.kind == OpKind::kLaunch || op.bytes != 0;

  // Constants: uploaded once, through a private stream so that no other
  // stream (possibly one being captured) is involved.
  seg->constants = allocate_role(d, m, BufferRole::kConstant, where + ": constants");
  bool any_constant = false;
  for (size_t i = 0; i < m.buffers.size(); ++i) any_constant |= m.buffers[i].role == BufferRole::kConstant;
  if (any_constant) {
    CUstream upload = nullptr;
    LEAPP_CHECK_CU(d.cuStreamCreate(&upload, CU_STREAM_NON_BLOCKING));
    CUresult r = CUDA_SUCCESS;
    for (size_t i = 0; i < m.buffers.size() && r == CUDA_SUCCESS; ++i) {
      const BufferSpec& b = m.buffers[i];
      if (b.role != BufferRole::kConstant) continue;
      std::string_view bytes = bundle.blob(b.init_index);
      r = d.cuMemcpyHtoDAsync(seg->constants.addr[i], bytes.data(), bytes.size(), upload);
    }
    CUresult synced = d.cuStreamSynchronize(upload);  // also after a failed copy: nothing may still be in flight
    if (r == CUDA_SUCCESS) r = synced;
    d.cuStreamDestroy(upload);
    if (r != CUDA_SUCCESS) throw CudaError(r, where + ": uploading constants failed: " + cu_error_text(r));
  }
}

int current_device(const CudaDriver& d) {
  CUdevice dev = 0;
  LEAPP_CHECK_CU(d.cuCtxGetDevice(&dev));
  return int(dev);  // CUdevice is the ordinal
}

/// Keeps what could not be freed for the next release_segments().
void defer(Pending p) {
  if (p.empty()) return;
  std::lock_guard<std::mutex> lock(cache_mutex());
  pending_frees().push_back(std::move(p));
}

/// A caller capture's scratch entry (see CaptureTag below), named for the table.
struct CaptureTag {
  CUcontext ctx;
  std::string digest;
  StreamKey key;
  bool keep = false;  // the graph could not take it: the entry stays until release_segments()
};

std::mutex& orphan_mutex() {
  static std::mutex* m = new std::mutex();
  return *m;
}

/// Entries whose captured graph is gone, for the next find_or_create or release_segments.
std::vector<std::unique_ptr<CaptureTag>>& orphans() {
  static auto* v = new std::vector<std::unique_ptr<CaptureTag>>();
  return *v;
}

/// The destructor of the user object a captured graph holds (CUhostFn: called by the driver once the
/// graph and its instances are destroyed and their launches done, on any thread; no CUDA calls here).
void capture_graph_gone(void* p) {
  std::unique_ptr<CaptureTag> tag(static_cast<CaptureTag*>(p));
  if (tag->keep) return;
  std::lock_guard<std::mutex> lock(orphan_mutex());
  orphans().push_back(std::move(tag));
}

/// Ties the scratch entry `key` (made inside the caller's capture into `graph`) to that graph: the
/// driver reports when the graph is gone (capture_graph_gone). Without that the entry stays until
/// release_segments().
void attach_to_capture(const CudaDriver& d, CUgraph graph, CUcontext ctx, const std::string& digest,
                       const StreamKey& key) {
  auto* tag = new CaptureTag{ctx, digest, key};
  CUuserObject object = nullptr;
  if (d.cuUserObjectCreate(&object, tag, capture_graph_gone, 1, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC) != CUDA_SUCCESS) {
    delete tag;
    return;
  }
  if (d.cuGraphRetainUserObject(graph, object, 1, CU_GRAPH_USER_OBJECT_MOVE) != CUDA_SUCCESS) {
    tag->keep = true;  // the release below runs the destructor now: it must not free what the capture uses
    d.cuUserObjectRelease(object, 1);
  }
}

/// Takes the entries of gone captures out of the table (cache_mutex() held); what they own goes to `out`.
void take_orphans(std::vector<Pending>& out) {
  std::vector<std::unique_ptr<CaptureTag>> gone;
  {
    std::lock_guard<std::mutex> lock(orphan_mutex());
    gone.swap(orphans());
  }
  for (const std::unique_ptr<CaptureTag>& tag : gone) {
    auto it = segments().find(std::make_pair(tag->ctx, tag->digest));
    if (it == segments().end()) continue;  // released since, with its entries
    auto& table = it->second->scratch;
    auto sit = table.find(tag->key);
    if (sit == table.end()) continue;
    std::shared_ptr<StreamScratch> sc = sit->second;
    table.erase(sit);
    std::lock_guard<std::mutex> hold(sc->enqueue);
    if (sc->released) continue;
    sc->released = true;  // a thread's last-hit cache looks up again
    Pending p;
    p.ctx = tag->ctx;
    take_stream_resources(*sc, p);
    if (!p.empty()) out.push_back(std::move(p));
  }
}

/// This thread's entries on the per-thread default stream: their stream ends with
/// the thread, so their scratch is freed then (see ~ThreadStreamScratch).
struct ThreadStreamScratch {
  std::vector<std::weak_ptr<StreamScratch>> entries;
  ~ThreadStreamScratch();
};

ThreadStreamScratch& thread_stream_scratch() {
  thread_local ThreadStreamScratch t;
  return t;
}

ThreadStreamScratch::~ThreadStreamScratch() {
  if (entries.empty()) return;
  // exit() destroys the calling thread's thread_locals first: the main thread's scratch
  // is left to the process teardown (no driver calls while the process ends).
  if (getpid() == pid_t(syscall(SYS_gettid))) return;
  try {
    std::vector<std::shared_ptr<StreamScratch>> mine;
    {
      std::lock_guard<std::mutex> lock(cache_mutex());
      for (const std::weak_ptr<StreamScratch>& w : entries) {
        std::shared_ptr<StreamScratch> sc = w.lock();
        if (!sc) continue;
        auto& table = sc->seg->scratch;
        auto it = table.find(sc->key);
        if (it != table.end() && it->second == sc) table.erase(it);
        std::lock_guard<std::mutex> hold(sc->enqueue);
        if (sc->released) continue;  // release_segments() took it
        sc->released = true;
        mine.push_back(std::move(sc));
      }
    }
    const CudaDriver& d = driver();
    for (const std::shared_ptr<StreamScratch>& sc : mine) {
      Pending p;
      p.ctx = sc->seg->ctx;
      take_stream_resources(*sc, p);
      if (p.empty()) continue;
      try {
        ContextGuard guard(d, p.ctx);
        RelaxedCaptureMode relaxed(d);  // never disturbs another thread's capture
        if (d.cuStreamSynchronize(cu_stream_per_thread()) == CUDA_SUCCESS) free_now(d, p);
      } catch (const std::exception&) {
      }
      defer(std::move(p));
    }
  } catch (...) {
    // a thread exit must not throw; what was not freed stays allocated
  }
}

/// The scratch entry of (ctx, digest, key), made on first use (with the prepared segment). A key
/// with a capture id is tied to `capture_graph`, the caller's graph; making one frees the entries
/// of captures whose graphs are gone.
std::shared_ptr<StreamScratch> find_or_create(const CudaDriver& d, const Bundle& bundle, CUcontext ctx,
                                              int ctx_device, const StreamKey& key, CUgraph capture_graph) {
  std::lock_guard<std::mutex> lock(cache_mutex());
  auto seg_key = std::make_pair(ctx, bundle.digest());
  auto it = segments().find(seg_key);
  if (it != segments().end()) {
    auto sit = it->second->scratch.find(key);
    if (sit != it->second->scratch.end()) return sit->second;
  }
  RelaxedCaptureMode relaxed(d);  // one-time setup is legal even while a stream is captured
  std::vector<Pending> gone;
  take_orphans(gone);
  for (Pending& p : gone) {  // their graphs' launches are done: nothing on the device uses this memory
    try {
      ContextGuard guard(d, p.ctx);
      free_now(d, p);
    } catch (const CudaError&) {
      // the context is gone, and what it held with it
      p = Pending{};
    }
    if (!p.empty()) pending_frees().push_back(std::move(p));
  }
  if (it == segments().end())  // (`it` is still valid: take_orphans erases scratch entries, never segments)
    it = segments().emplace(seg_key, prepare(d, bundle, device_attrs(d, ctx_device), ctx)).first;
  auto sc = std::make_shared<StreamScratch>();
  sc->seg = it->second;
  sc->key = key;
  sc->memory = allocate_role(d, bundle.manifest(), BufferRole::kScratch, "leapp segment '" + bundle.segment() + "': scratch");
  it->second->scratch.emplace(key, sc);
  if (key.capture != 0) attach_to_capture(d, capture_graph, ctx, bundle.digest(), key);
  if (key.thread != 0 && key.capture == 0) {  // a captured entry lives with its graph, not the thread
    auto& mine = thread_stream_scratch().entries;
    mine.erase(std::remove_if(mine.begin(), mine.end(), [](const auto& w) { return w.expired(); }), mine.end());
    mine.push_back(sc);
  }
  return sc;
}

}  // namespace

// --- small shared pieces -------------------------------------------------------------

void count_allocation() { g_allocations.fetch_add(1, std::memory_order_relaxed); }
void count_free() { g_frees.fetch_add(1, std::memory_order_relaxed); }

ContextGuard::ContextGuard(const CudaDriver& d, CUcontext ctx) : d_(d) {
  LEAPP_CHECK_CU(d.cuCtxGetCurrent(&saved_));
  if (saved_ != ctx) {
    LEAPP_CHECK_CU(d.cuCtxSetCurrent(ctx));
    switched_ = true;
  }
}

ContextGuard::ContextGuard(const CudaDriver& d, CUcontext ctx, CUcontext current) : d_(d), saved_(current) {
  if (saved_ != ctx) {
    LEAPP_CHECK_CU(d.cuCtxSetCurrent(ctx));
    switched_ = true;
  }
}

ContextGuard::~ContextGuard() {
  if (switched_) d_.cuCtxSetCurrent(saved_);
}

RelaxedCaptureMode::RelaxedCaptureMode(const CudaDriver& d) : d_(d) {
  saved_ = CU_STREAM_CAPTURE_MODE_RELAXED;
  ok_ = d.cuThreadExchangeStreamCaptureMode(&saved_) == CUDA_SUCCESS;
}

RelaxedCaptureMode::~RelaxedCaptureMode() {
  if (ok_) d_.cuThreadExchangeStreamCaptureMode(&saved_);
}

const DeviceAttrs& device_attrs(const CudaDriver& d, int ordinal) {
  static std::mutex* mutex = new std::mutex();
  static auto* cache = new std::map<int, DeviceAttrs>();
  std::lock_guard<std::mutex> lock(*mutex);
  auto it = cache->find(ordinal);
  if (it != cache->end()) return it->second;
  int count = 0;
  LEAPP_CHECK_CU(d.cuDeviceGetCount(&count));
  if (ordinal < 0 || ordinal >= count)
    throw std::invalid_argument("leapp: CUDA device " + std::to_string(ordinal) + " does not exist (" +
                                std::to_string(count) + " devices)");
  CUdevice dev = 0;
  LEAPP_CHECK_CU(d.cuDeviceGet(&dev, ordinal));
  DeviceAttrs a;
  a.ordinal = ordinal;
  char name[256] = {0};
  d.cuDeviceGetName(name, sizeof(name) - 1, dev);
  a.name = name;
  LEAPP_CHECK_CU(d.cuDeviceGetAttribute(&a.cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
  LEAPP_CHECK_CU(d.cuDeviceGetAttribute(&a.cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev));
  d.cuDeviceGetAttribute(&a.max_smem_optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev);
  return cache->emplace(ordinal, a).first->second;
}

CUcontext primary_context(const CudaDriver& d, int ordinal) {
  static std::mutex* mutex = new std::mutex();
  static auto* cache = new std::map<int, CUcontext>();
  device_attrs(d, ordinal);  // validates the ordinal
  std::lock_guard<std::mutex> lock(*mutex);
  auto it = cache->find(ordinal);
  if (it != cache->end()) return it->second;
  CUdevice dev = 0;
  LEAPP_CHECK_CU(d.cuDeviceGet(&dev, ordinal));
  CUcontext ctx = nullptr;
  LEAPP_CHECK_CU(d.cuDevicePrimaryCtxRetain(&ctx, dev));
  cache->emplace(ordinal, ctx);
  return ctx;
}

}  // namespace detail

// --- public API ------------------------------------------------------------------------

uint64_t allocation_count() { return detail::g_allocations.load(std::memory_order_relaxed); }

uint64_t free_count() { return detail::g_frees.load(std::memory_order_relaxed); }

size_t release_segments(std::string_view digest) {
  using namespace detail;
  const CudaDriver* dp = nullptr;
  try {
    dp = &driver();
  } catch (const DriverUnavailable&) {
    return 0;  // nothing was ever prepared
  }
  const CudaDriver& d = *dp;
  std::string errors = release_staging(d, digest);

  // 1. Out of the table; each scratch lock waits for a call enqueueing right now, and
  //    `released` sends later holders (last-hit caches) back to the table.
  std::vector<Pending> work;
  size_t released = 0;
  {
    std::lock_guard<std::mutex> lock(cache_mutex());
    for (auto it = segments().begin(); it != segments().end();) {
      if (!digest.empty() && it->first.second != digest) {
        ++it;
        continue;
      }
      PreparedSegment& seg = *it->second;
      Pending p = segment_resources(seg);
      for (auto& entry : seg.scratch) {
        StreamScratch& sc = *entry.second;
        std::lock_guard<std::mutex> hold(sc.enqueue);
        sc.released = true;
        take_stream_resources(sc, p);
      }
      seg.scratch.clear();
      work.push_back(std::move(p));
      it = segments().erase(it);
      ++released;
    }
    take_orphans(work);
    for (Pending& p : pending_frees()) work.push_back(std::move(p));  // earlier failures: try again
    pending_frees().clear();
  }

  // 2. Per context: wait for all queued work (kernels may still use this memory), then free.
  std::vector<CUcontext> contexts;
  for (const Pending& p : work)
    if (std::find(contexts.begin(), contexts.end(), p.ctx) == contexts.end()) contexts.push_back(p.ctx);
  for (CUcontext ctx : contexts) {
    CUresult r = CUDA_SUCCESS;
    try {
      ContextGuard guard(d, ctx);
      r = d.cuCtxSynchronize();
      if (r == CUDA_SUCCESS)
        for (Pending& p : work)
          if (p.ctx == ctx && !free_now(d, p))
            errors += "; a cuMemFree or cuModuleUnload was refused (kept for the next release_segments())";
    } catch (const CudaError& e) {
      // The context cannot be made current (destroyed by its owner): what it held went with it.
      errors += std::string("; ") + e.what();
      for (Pending& p : work)
        if (p.ctx == ctx) p = Pending{};
      continue;
    }
    if (r != CUDA_SUCCESS)
      errors += "; cuCtxSynchronize failed: " + cu_error_text(r) +
                " (is a stream being captured into a CUDA graph? nothing of that context was freed; "
                "call release_segments() again after the capture)";
  }
  for (Pending& p : work) defer(std::move(p));
  if (!errors.empty()) throw std::runtime_error("leapp::release_segments: " + errors.substr(2));
  return released;
}

bool stream_is_capturing(CUstream stream) {
  try {
    const CudaDriver& d = driver();
    int status = CU_STREAM_CAPTURE_STATUS_NONE;
    if (d.cuStreamIsCapturing(stream, &status) != CUDA_SUCCESS) return false;
    return status != CU_STREAM_CAPTURE_STATUS_NONE;
  } catch (const DriverUnavailable&) {
    return false;
  }
}

namespace {

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string t = "(";
  for (size_t i = 0; i < shape.size(); ++i) t += (i ? ", " : "") + std::to_string(shape[i]);
  return t + (shape.size() == 1 ? ",)" : ")");
}

/// Checks count, null pointers and byte sizes. Strings are built only on failure:
/// this runs on every call.
void check_spans(const Bundle& bundle, const char* side, const std::vector<TensorSpec>& specs,
                 const std::vector<DeviceSpan>& spans, int64_t batch) {
  auto where = [&] { return "leapp segment '" + bundle.segment() + "': "; };
  if (spans.size() != specs.size())
    throw std::invalid_argument(where() + "expected " + std::to_string(specs.size()) + " " + side + ", got " +
                                std::to_string(spans.size()));
  const Manifest& m = bundle.manifest();
  const bool dynamic = m.dynamic;
  for (size_t j = 0; j < specs.size(); ++j) {
    const TensorSpec& s = specs[j];
    const uint64_t want = m.bytes_at(s, batch);
    if (spans[j].ptr != 0 && spans[j].bytes == want) continue;
    std::string what = std::string(side) + "[" + std::to_string(j) + "] '" + s.name + "'";
    if (spans[j].ptr == 0) throw std::invalid_argument(where() + what + " is a null device pointer");
    std::vector<int64_t> shape = s.shape;
    if (!shape.empty()) shape[0] = m.dim0_at(s, batch);
    throw std::invalid_argument(where() + what + " has " + std::to_string(spans[j].bytes) + " bytes, expected " +
                                std::to_string(want) + " (" + s.dtype + " of shape " + shape_text(shape) +
                                (dynamic ? " at batch " + std::to_string(batch) : std::string()) + ")");
  }
}

}  // namespace

int64_t segment_batch(const Bundle& bundle, uint64_t bytes) {
  const Manifest& m = bundle.manifest();
  if (!m.dynamic) return 0;
  auto where = [&] { return "leapp segment '" + m.segment + "' (dynamic batch " + std::to_string(m.batch_min) + ".." +
                            std::to_string(m.batch_max) + "): "; };
  const TensorSpec& t = m.inputs[m.batch_input];
  auto what = [&] { return "input " + std::to_string(m.batch_input) + " '" + t.name + "'"; };  // on failure only
  if (bytes % t.row_bytes != 0)
    throw std::invalid_argument(where() + what() + " has " + std::to_string(bytes) + " bytes, not a whole number of " +
                                std::to_string(t.row_bytes) + "-byte rows (" + t.dtype + " rows of shape " +
                                shape_text(std::vector<int64_t>(t.shape.begin() + 1, t.shape.end())) + ")");
  if (bytes / t.row_bytes > uint64_t(kBundleMaxBufferBytes))  // keeps rows - b (|b| <= 2^40) far from overflow
    throw std::invalid_argument(where() + what() + " has " + std::to_string(bytes) + " bytes, more than any batch");
  const int64_t rows = int64_t(bytes / t.row_bytes);
  const int64_t a = t.batch_rule.a, b = t.batch_rule.b;
  const int64_t batch = (rows - b) / a;
  if ((rows - b) % a != 0 || batch < m.batch_min || batch > m.batch_max)
    throw std::invalid_argument(where() + what() + " has " + std::to_string(rows) + " rows (dim 0 = " +
                                std::to_string(a) + " * batch + " + std::to_string(b) + "), which is not a batch in " +
                                std::to_string(m.batch_min) + ".." + std::to_string(m.batch_max));
  return batch;
}

namespace {

std::string op_text(const Manifest& m, size_t i) {
  const OpSpec& op = m.ops[i];
  std::string s = "ops[" + std::to_string(i) + "] ";
  switch (op.kind) {
    case OpKind::kLaunch:
      return s + "launch of '" + m.kernels[op.kernel].entry + "' (grid " + std::to_string(op.grid[0]) + "x" +
             std::to_string(op.grid[1]) + "x" + std::to_string(op.grid[2]) + ", block " + std::to_string(op.block[0]) +
             "x" + std::to_string(op.block[1]) + "x" + std::to_string(op.block[2]) + ", smem " +
             std::to_string(op.smem) + ")";
    case OpKind::kMemset: return s + "memset of buffer " + std::to_string(op.dst);
    case OpKind::kCopy: return s + "copy from buffer " + std::to_string(op.src) + " to buffer " + std::to_string(op.dst);
  }
  return s;
}

void enqueued(CUresult r, const std::string& what) {
  if (r != CUDA_SUCCESS) throw CudaError(r, what + ": " + cu_error_text(r) + " [code " + std::to_string(r) + "]");
}


/// Enqueues one call's work on `stream`: the per-call buffer inits, then the ops in order.
/// `params` and `param_ptrs` are the caller's reusable host buffers.
void enqueue_call(const CudaDriver& d, const Bundle& bundle, const detail::PreparedSegment& seg,
                  const std::vector<CUdeviceptr>& addr, const std::vector<DeviceSpan>& inputs, CUstream stream,
                  std::vector<uint8_t>& params, std::vector<void*>& param_ptrs, int64_t batch) {
  const Manifest& m = bundle.manifest();
  auto where = [&] { return "leapp segment '" + m.segment + "'"; };
  for (size_t i = 0; i < m.buffers.size(); ++i) {
    const BufferSpec& b = m.buffers[i];
    const uint64_t nbytes = m.dynamic ? uint64_t(b.bytes_rule.at(batch)) : b.bytes;
    CUresult r = CUDA_SUCCESS;
    if (b.init == BufferInit::kZero)
      r = d.cuMemsetD8Async(addr[i], 0, size_t(nbytes), stream);
    else if (b.init == BufferInit::kInput)
      r = d.cuMemcpyDtoDAsync(addr[i], inputs[b.init_index].ptr, size_t(nbytes), stream);
    if (r != CUDA_SUCCESS) enqueued(r, where() + ": initialising buffers[" + std::to_string(i) + "] (init)");
  }
  for (size_t i = 0; i < m.ops.size(); ++i) {
    const OpSpec& op = m.ops[i];
    CUresult r = CUDA_SUCCESS;
    switch (op.kind) {
      case OpKind::kLaunch: {
        std::string_view blob = bundle.blob(op.params_blob);
        params.resize(blob.size());  // (a memcpy: assign() from char iterators copies byte by byte)
        std::memcpy(params.data(), blob.data(), blob.size());
        uint32_t grid[3] = {op.grid[0], op.grid[1], op.grid[2]};
        if (op.sized) {  // dynamic batch: Warp skips empty launches; the grid follows the size
          const uint64_t size = uint64_t(op.size_rule.at(batch));
          if (size == 0) break;
          detail::launch_grid(size, op.block[0], op.grid_stride, op.max_blocks, grid);
        }
        for (const RelocSpec& rel : op.relocs) {
          CUdeviceptr a = addr[rel.buffer] + (m.dynamic ? uint64_t(rel.buffer_offset_rule.at(batch)) : rel.buffer_offset);
          std::memcpy(params.data() + op.param_offsets[rel.param] + rel.offset, &a, sizeof(a));
        }
        for (const PatchSpec& patch : op.patches) {  // values checked in range at both ends of the batch range
          const uint64_t v = uint64_t(patch.rule.at(batch));
          std::memcpy(params.data() + op.param_offsets[patch.param] + patch.offset, &v, patch.width);
        }
        param_ptrs.resize(op.param_offsets.size());
        for (size_t p = 0; p < op.param_offsets.size(); ++p) param_ptrs[p] = params.data() + op.param_offsets[p];
        r = d.cuLaunchKernel(seg.functions[op.kernel], grid[0], grid[1], grid[2], op.block[0], op.block[1],
                             op.block[2], op.smem, stream, param_ptrs.data(), nullptr);
        break;
      }
      case OpKind::kMemset: {
        const uint64_t n = m.dynamic ? uint64_t(op.bytes_rule.at(batch)) : op.bytes;
        const uint64_t off = m.dynamic ? uint64_t(op.dst_offset_rule.at(batch)) : op.dst_offset;
        if (n) r = d.cuMemsetD8Async(addr[op.dst] + off, op.value, size_t(n), stream);
        break;
      }
      case OpKind::kCopy: {
        const uint64_t n = m.dynamic ? uint64_t(op.bytes_rule.at(batch)) : op.bytes;
        const uint64_t dst = m.dynamic ? uint64_t(op.dst_offset_rule.at(batch)) : op.dst_offset;
        const uint64_t src = m.dynamic ? uint64_t(op.src_offset_rule.at(batch)) : op.src_offset;
        if (n) r = d.cuMemcpyDtoDAsync(addr[op.dst] + dst, addr[op.src] + src, size_t(n), stream);
        break;
      }
    }
    if (r != CUDA_SUCCESS) enqueued(r, where() + ": " + op_text(m, i));
  }
}

/// Whether segments may replay as graphs: the driver has the API and LEAPP_SEGMENT_GRAPHS is not "0".
bool graphs_enabled(const CudaDriver& d) {
  static const bool env_on = [] {
    const char* v = std::getenv("LEAPP_SEGMENT_GRAPHS");
    return v == nullptr || std::string_view(v) != "0";
  }();
  return env_on && d.has_graphs();
}

/// The caller's stream's capture. `status` is not NONE while it is captured, or when that cannot be read
/// (the legacy stream while another stream's global-mode capture runs): then the ops go on it one by
/// one. `id` and `graph` name an active capture (when the driver has cuStreamGetCaptureInfo), else 0.
struct CaptureState {
  int status = CU_STREAM_CAPTURE_STATUS_NONE;
  unsigned long long id = 0;
  CUgraph graph = nullptr;
};

CaptureState capture_state(const CudaDriver& d, CUstream stream) {
  CaptureState s;
  CUresult r = d.has_capture_scratch()
                   ? d.cuStreamGetCaptureInfo(stream, &s.status, &s.id, &s.graph, nullptr, nullptr)
                   : d.cuStreamIsCapturing(stream, &s.status);
  if (r != CUDA_SUCCESS) s.status = -1;
  if (s.status != CU_STREAM_CAPTURE_STATUS_ACTIVE || s.graph == nullptr) {
    s.id = 0;
    s.graph = nullptr;
  }
  return s;
}

/// Captures one call's work, for addresses `addr`, into a new graph on `sc`'s private stream;
/// nullptr when capture fails (the op-by-op path then reports any real error).
CUgraph capture_call(const CudaDriver& d, const Bundle& bundle, detail::StreamScratch& sc,
                     const std::vector<CUdeviceptr>& addr, const std::vector<DeviceSpan>& inputs, int64_t batch) {
  if (sc.build_stream == nullptr && d.cuStreamCreate(&sc.build_stream, CU_STREAM_NON_BLOCKING) != CUDA_SUCCESS) {
    sc.build_stream = nullptr;
    return nullptr;
  }
  if (d.cuStreamBeginCapture(sc.build_stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) != CUDA_SUCCESS) return nullptr;
  bool ok = true;
  try {
    std::vector<uint8_t> params;
    std::vector<void*> param_ptrs;
    enqueue_call(d, bundle, *sc.seg, addr, inputs, sc.build_stream, params, param_ptrs, batch);
  } catch (const std::exception&) {
    ok = false;
  }
  CUgraph graph = nullptr;
  if (d.cuStreamEndCapture(sc.build_stream, &graph) != CUDA_SUCCESS) ok = false;
  if (!ok && graph != nullptr) {
    d.cuGraphDestroy(graph);
    graph = nullptr;
  }
  return graph;
}

/// Replays the call as one graph launch (see the top of the file); false when the call
/// should enqueue its ops instead. Throws only when a graph launch itself fails.
bool replay_graph(const CudaDriver& d, const Bundle& bundle, detail::StreamScratch& sc,
                  const std::vector<CUdeviceptr>& addr, const std::vector<DeviceSpan>& inputs,
                  const std::vector<DeviceSpan>& outputs, CUstream stream, std::vector<CUdeviceptr>& key,
                  int64_t batch) {
  using namespace detail;
  if (sc.graphs_failed) return false;
  if (sc.eager_calls > 0) {
    --sc.eager_calls;
    return false;
  }
  key.clear();
  for (const DeviceSpan& s : inputs) key.push_back(s.ptr);
  for (const DeviceSpan& s : outputs) key.push_back(s.ptr);
  // Dynamic batch: a graph holds one batch's grids, sizes and parameters, and the scratch address
  // (which moves when the stream's scratch grows), so both are part of the key.
  key.push_back(CUdeviceptr(batch));
  key.push_back(sc.memory.base);
  auto& graphs = sc.graphs;
  CUgraphExec exec = nullptr;
  for (size_t i = graphs.size(); i-- > 0;) {
    if (graphs[i].key != key) continue;
    exec = graphs[i].exec;
    if (i + 1 != graphs.size()) std::rotate(graphs.begin() + i, graphs.begin() + i + 1, graphs.end());
    sc.miss_streak = 0;
    break;
  }
  if (exec == nullptr) {
    if (!graphs.empty() && ++sc.miss_streak >= kMissStreak) {
      sc.miss_streak = 0;
      sc.eager_calls = kEagerCalls;
      return false;
    }
    RelaxedCaptureMode relaxed(d);  // a stream create or instantiate is legal even if another stream is captured
    CUgraph graph = capture_call(d, bundle, sc, addr, inputs, batch);
    if (graph == nullptr) {
      sc.graphs_failed = true;
      return false;
    }
    if (graphs.size() >= kGraphsPerStream) {  // update the least recently used graph in place
      SegmentGraph victim = std::move(graphs.front());
      graphs.erase(graphs.begin());
      CUgraphExecUpdateResultInfo info{};
      if (d.cuGraphExecUpdate(victim.exec, graph, &info) == CUDA_SUCCESS) {
        exec = victim.exec;
      } else {
        d.cuGraphExecDestroy(victim.exec);
      }
    }
    if (exec == nullptr && d.cuGraphInstantiateWithFlags(&exec, graph, 0) != CUDA_SUCCESS) exec = nullptr;
    d.cuGraphDestroy(graph);
    if (exec == nullptr) {
      sc.graphs_failed = true;
      return false;
    }
    graphs.push_back(SegmentGraph{key, exec});
  }
  CUresult r = d.cuGraphLaunch(exec, stream);
  if (r != CUDA_SUCCESS)
    enqueued(r, "leapp segment '" + bundle.segment() + "': launching its CUDA graph (" +
                    std::to_string(bundle.manifest().ops.size()) + " ops)");
  return true;
}

}  // namespace

void run_segment(const Bundle& bundle, const std::vector<DeviceSpan>& inputs, const std::vector<DeviceSpan>& outputs,
                 CUstream stream, int device) {
  using namespace detail;
  const Manifest& m = bundle.manifest();
  int64_t batch = 0;
  if (m.dynamic) {
    if (inputs.size() != m.inputs.size()) check_spans(bundle, "inputs", m.inputs, inputs, 0);  // names the count
    batch = segment_batch(bundle, inputs[m.batch_input].bytes);
  }
  check_spans(bundle, "inputs", m.inputs, inputs, batch);
  check_spans(bundle, "outputs", m.outputs, outputs, batch);
  const CudaDriver& d = driver();
  // Error texts only: built when something fails, never on the hot path.
  auto where = [&] { return "leapp segment '" + m.segment + "'"; };

  // The thread remembers its last hit (context, its device, bundle, stream and the
  // scratch entry), so a loop replaying one segment on one stream skips the table
  // lock, the lookup and the device query. The digest is compared too, because a
  // freed Bundle's address may be reused; `released` is checked under the entry's
  // lock, because release_segments() may have freed it since.
  // Per-call host state sits in one thread_local (one TLS lookup per call): the
  // last hit, buffer addresses, relocated parameter bytes and their pointers.
  struct LastHit {
    CUcontext ctx = nullptr;
    int ctx_device = -1;
    const Bundle* bundle = nullptr;
    std::string digest;
    StreamKey stream{nullptr, 0, 0};
    std::shared_ptr<StreamScratch> scratch;
  };
  struct CallState {
    LastHit last;
    std::vector<CUdeviceptr> addr;
    std::vector<uint8_t> params;
    std::vector<void*> param_ptrs;
    std::vector<CUdeviceptr> key;
  };
  thread_local CallState state;
  LastHit& last = state.last;

  // The context: the stream's own, else the current one (when on `device`), else the primary.
  CUcontext saved = nullptr;
  LEAPP_CHECK_CU(d.cuCtxGetCurrent(&saved));
  CUcontext ctx = nullptr;
  if (!is_special_stream(stream)) {
    CUresult r = d.cuStreamGetCtx(stream, &ctx);
    if (r != CUDA_SUCCESS)
      throw CudaError(r, where() + ": cuStreamGetCtx failed for stream " +
                             std::to_string(reinterpret_cast<uintptr_t>(stream)) + " (not a CUDA stream?): " +
                             cu_error_text(r));
  } else if (saved != nullptr) {
    ctx = saved;
    if (device >= 0 && (saved == last.ctx ? last.ctx_device : current_device(d)) != device) ctx = nullptr;
  }
  if (ctx == nullptr) ctx = primary_context(d, device < 0 ? 0 : device);
  ContextGuard guard(d, ctx, saved);
  const int ctx_device = ctx == last.ctx ? last.ctx_device : current_device(d);
  if (device >= 0 && ctx_device != device)
    throw std::invalid_argument(where() + ": the stream belongs to CUDA device " + std::to_string(ctx_device) +
                                ", but device " + std::to_string(device) + " was requested");

  // This stream's scratch entry, locked until the last op is enqueued (see the top of the file); inside
  // a caller's capture, the entry of that capture (see "Captures" at the top of the file).
  const CaptureState capture = capture_state(d, stream);
  StreamKey skey{stream, stream == cu_stream_per_thread() ? this_thread_serial() : 0, capture.id};
  StreamScratch* sc = nullptr;
  std::unique_lock<std::mutex> hold;
  if (last.scratch && last.ctx == ctx && last.bundle == &bundle && last.stream == skey &&
      last.digest == bundle.digest()) {
    hold = std::unique_lock<std::mutex>(last.scratch->enqueue);
    if (!last.scratch->released) sc = last.scratch.get();
    else hold.unlock();
  }
  if (sc == nullptr) {
    std::shared_ptr<StreamScratch> found;
    for (;;) {  // an entry released between the lookup and the lock is looked up again
      found = find_or_create(d, bundle, ctx, ctx_device, skey, capture.graph);
      hold = std::unique_lock<std::mutex>(found->enqueue);
      if (!found->released) break;
      hold.unlock();
    }
    last.ctx = ctx;
    last.ctx_device = ctx_device;
    last.bundle = &bundle;
    last.digest = bundle.digest();
    last.stream = skey;
    last.scratch = std::move(found);
    sc = last.scratch.get();
  }
  const PreparedSegment& seg = *sc->seg;

  // Dynamic batch: this batch's scratch layout; the stream's scratch grows (never shrinks) when it needs more,
  // so a steady batch allocates nothing. The smaller allocation stays until the entry is freed: work queued on
  // this stream may still use it.
  thread_local std::vector<uint64_t> scratch_offsets;
  if (m.dynamic) {
    const uint64_t need = scratch_layout(m, batch, scratch_offsets);
    if (need > sc->memory.capacity) {
      RelaxedCaptureMode relaxed(d);
      uint64_t grow = std::max(need, sc->memory.capacity + sc->memory.capacity / 2);
      uint64_t most = scratch_layout(m, m.batch_max, scratch_offsets);
      grow = std::min(grow, std::max(most, need));
      scratch_layout(m, batch, scratch_offsets);
      CUdeviceptr p = allocate(d, grow, where() + ": scratch for batch " + std::to_string(batch));
      if (sc->memory.base) sc->memory.retired.push_back(sc->memory.base);
      sc->memory.base = p;
      sc->memory.capacity = grow;
    }
  }

  // Buffer addresses for this call.
  std::vector<CUdeviceptr>& addr = state.addr;
  addr.resize(m.buffers.size());  // every entry is written below
  for (size_t i = 0; i < m.buffers.size(); ++i) {
    const BufferSpec& b = m.buffers[i];
    switch (b.role) {
      case BufferRole::kInput: addr[i] = inputs[b.io].ptr; break;
      case BufferRole::kOutput: addr[i] = outputs[b.io].ptr; break;
      case BufferRole::kScratch:
        addr[i] = m.dynamic ? sc->memory.base + scratch_offsets[i] : sc->memory.addr[i];
        break;
      case BufferRole::kConstant: addr[i] = seg.constants.addr[i]; break;
    }
  }

  // One graph launch when the segment has one for these addresses and this batch (or can make one), else the ops.
  if (seg.enqueues >= 2 && graphs_enabled(d) && capture.status == CU_STREAM_CAPTURE_STATUS_NONE &&
      replay_graph(d, bundle, *sc, addr, inputs, outputs, stream, state.key, batch))
    return;
  enqueue_call(d, bundle, seg, addr, inputs, stream, state.params, state.param_ptrs, batch);
}

}  // namespace leapp
