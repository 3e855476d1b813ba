// ext/core/src/segment_cache.cpp: the table of prepared segments and their scratch (segment_cache.h).
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
// Captures: a call made while the caller captures its stream (torch.cuda.graph, a CUDA graph of
// leapp.load) is recorded, not run, and the graph replays it later, on any stream. Its scratch is
// therefore keyed by the capture too (cuStreamGetCaptureInfo's id): two graphs never share scratch,
// even when captured on one stream (torch's default capture stream, or its pool streams, which
// repeat), so replaying them at once on two streams cannot race. The entry is tied to the captured
// graph by a CUDA user object; once the graph and its instances are gone and their launches done,
// the driver's callback queues the entry, and the next new entry (or release_segments()) frees it.
// A caller that owns the graph (leapp's C++ Pipeline) adopts the capture instead (adopt_capture): no
// user object, whose per-launch tracking allocates in the driver; release_capture queues the entries.
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
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <tuple>

#include "manifest.h"
#include "segment_cache.h"

namespace leapp {
namespace detail {
namespace {

std::atomic<uint64_t> g_allocations{0};
std::atomic<uint64_t> g_frees{0};

std::mutex& cache_mutex() {
  static std::mutex* m = new std::mutex();
  return *m;
}


}  // namespace

/// A number no other thread of the process ever gets (std::thread::id values are
/// reused after a thread exits, while its per-thread stream's work may still run).
uint64_t this_thread_serial() {
  static std::atomic<uint64_t> next{1};
  thread_local uint64_t serial = next.fetch_add(1);
  return serial;
}

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

namespace {

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

}  // namespace

CUdeviceptr allocate(const CudaDriver& d, uint64_t bytes, const std::string& what) {
  CUdeviceptr p = 0;
  CUresult r = d.cuMemAlloc(&p, size_t(bytes));
  if (r != CUDA_SUCCESS)
    throw CudaError(r, what + ": cuMemAlloc of " + std::to_string(bytes) + " bytes failed: " + cu_error_text(r));
  count_allocation();
  return p;
}

namespace {

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

/// Captures whose graphs a caller owns (adopt_capture), with the entries made in each; guarded by
/// orphan_mutex().
std::map<uint64_t, std::vector<std::unique_ptr<CaptureTag>>>& adopted() {
  static auto* m = new std::map<uint64_t, std::vector<std::unique_ptr<CaptureTag>>>();
  return *m;
}

/// Ties the scratch entry `key` (made inside the caller's capture into `graph`) to that graph: the
/// caller that adopted the capture reports when the graph is gone (release_capture), else the driver
/// does (capture_graph_gone). Without either the entry stays until release_segments().
void attach_to_capture(const CudaDriver& d, CUgraph graph, CUcontext ctx, const std::string& digest,
                       const StreamKey& key) {
  {
    std::lock_guard<std::mutex> lock(orphan_mutex());
    auto owned = adopted().find(key.capture);
    if (owned != adopted().end()) {
      owned->second.push_back(std::make_unique<CaptureTag>(CaptureTag{ctx, digest, key}));
      return;
    }
  }
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

}  // namespace

std::shared_ptr<StreamScratch> find_or_create(const CudaDriver& d, const Bundle& bundle, CUcontext ctx,
                                              int ctx_device, const StreamKey& key, CUgraph capture_graph) {
  std::lock_guard<std::mutex> lock(cache_mutex());
  auto seg_key = std::make_pair(ctx, bundle.digest());
  auto it = segments().find(seg_key);
  if (it != segments().end()) {
    auto sit = it->second->scratch.find(key);
    if (sit != it->second->scratch.end()) return sit->second;
  }
  // before the constants and the first scratch are allocated (a dynamic segment's scratch starts at the traced
  // batch; fit_scratch checks each larger one): a size from the file never reaches cuMemAlloc unchecked
  check_segment_memory(bundle, bundle.manifest().dynamic ? bundle.manifest().batch_traced : 0);
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


void count_allocation() { g_allocations.fetch_add(1, std::memory_order_relaxed); }
void count_free() { g_frees.fetch_add(1, std::memory_order_relaxed); }

}  // namespace detail

uint64_t allocation_count() { return detail::g_allocations.load(std::memory_order_relaxed); }

void adopt_capture(uint64_t capture_id) {
  std::lock_guard<std::mutex> lock(detail::orphan_mutex());
  detail::adopted()[capture_id];
}

void release_capture(uint64_t capture_id) {
  std::lock_guard<std::mutex> lock(detail::orphan_mutex());
  auto owned = detail::adopted().find(capture_id);
  if (owned == detail::adopted().end()) return;
  for (auto& tag : owned->second) detail::orphans().push_back(std::move(tag));
  detail::adopted().erase(owned);
}

uint64_t free_count() { return detail::g_frees.load(std::memory_order_relaxed); }

size_t release_segments(std::string_view digest) {
  using namespace detail;
  const size_t cpu = release_cpu_code(digest);
  const CudaDriver* dp = nullptr;
  try {
    dp = &driver();
  } catch (const DriverUnavailable&) {
    return cpu;  // nothing was ever prepared on a GPU
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
  return released + cpu;
}

}  // namespace leapp
