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
// and can. (The per-thread default stream counts as one stream per thread,
// for the thread's lifetime: its scratch is not reused by a later thread.)
#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <tuple>

#include "replay_internal.h"

namespace leapp {
namespace detail {
namespace {

std::atomic<uint64_t> g_allocations{0};

std::mutex& cache_mutex() {
  static std::mutex* m = new std::mutex();
  return *m;
}

constexpr uint64_t kSubAlignment = 256;  // sub-buffers of one allocation start 256-aligned
uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

bool is_special_stream(CUstream s) {
  return s == nullptr || s == cu_stream_legacy() || s == cu_stream_per_thread();
}

struct StreamKey {
  CUstream stream;
  uint64_t thread;  // only for the per-thread default stream: this_thread_serial()
  bool operator<(const StreamKey& o) const { return std::tie(stream, thread) < std::tie(o.stream, o.thread); }
};

/// A number no other thread of the process ever gets (std::thread::id values are
/// reused after a thread exits, while its per-thread stream's work may still run).
uint64_t this_thread_serial() {
  static std::atomic<uint64_t> next{1};
  thread_local uint64_t serial = next.fetch_add(1);
  return serial;
}

/// A segment made ready in one context: functions, constants, scratch per stream.
struct PreparedSegment {
  std::vector<CUmodule> modules;
  std::vector<std::string> choices;    // per module, "cubin sm_90" (diagnostics)
  std::vector<CUfunction> functions;  // per kernel; null when no launch uses it
  std::vector<CUdeviceptr> constants;  // per buffer; 0 unless constant
  std::map<StreamKey, std::vector<CUdeviceptr>> scratch;  // per buffer; 0 unless scratch
};

std::map<std::pair<CUcontext, std::string>, std::unique_ptr<PreparedSegment>>& segments() {
  static auto* s = new std::map<std::pair<CUcontext, std::string>, std::unique_ptr<PreparedSegment>>();
  return *s;  // leaked on purpose: device memory and modules live until the process ends
}

CUdeviceptr allocate(const CudaDriver& d, uint64_t bytes, const std::string& what) {
  CUdeviceptr p = 0;
  CUresult r = d.cuMemAlloc(&p, size_t(bytes));
  if (r != CUDA_SUCCESS)
    throw CudaError(r, what + ": cuMemAlloc of " + std::to_string(bytes) + " bytes failed: " + cu_error_text(r));
  count_allocation();
  return p;
}

/// Sub-buffer addresses for every buffer of `role`, carved from one allocation.
std::vector<CUdeviceptr> allocate_role(const CudaDriver& d, const Manifest& m, BufferRole role, const std::string& what,
                                       std::vector<uint64_t>* offsets_out = nullptr) {
  std::vector<uint64_t> offsets(m.buffers.size(), 0);
  uint64_t total = 0;
  for (size_t i = 0; i < m.buffers.size(); ++i) {
    if (m.buffers[i].role != role) continue;
    offsets[i] = total;
    total = round_up(total + m.buffers[i].bytes, kSubAlignment);
  }
  std::vector<CUdeviceptr> addr(m.buffers.size(), 0);
  if (total == 0) return addr;
  CUdeviceptr base = allocate(d, total, what);
  for (size_t i = 0; i < m.buffers.size(); ++i)
    if (m.buffers[i].role == role) addr[i] = base + offsets[i];
  if (offsets_out) *offsets_out = offsets;
  return addr;
}

std::unique_ptr<PreparedSegment> prepare(const CudaDriver& d, const Bundle& bundle, const DeviceAttrs& dev) {
  const Manifest& m = bundle.manifest();
  const std::string where = "leapp segment '" + m.segment + "'";
  auto seg = std::make_unique<PreparedSegment>();

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

  // Constants: uploaded once, through a private stream so that no other
  // stream (possibly one being captured) is involved.
  std::vector<uint64_t> offsets;
  seg->constants = allocate_role(d, m, BufferRole::kConstant, where + ": constants", &offsets);
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
      r = d.cuMemcpyHtoDAsync(seg->constants[i], bytes.data(), bytes.size(), upload);
    }
    if (r == CUDA_SUCCESS) r = d.cuStreamSynchronize(upload);
    d.cuStreamDestroy(upload);
    if (r != CUDA_SUCCESS) throw CudaError(r, where + ": uploading constants failed: " + cu_error_text(r));
  }
  return seg;
}

struct Resolved {
  CUcontext ctx = nullptr;
  int device = 0;
};

int current_device(const CudaDriver& d) {
  CUdevice dev = 0;
  LEAPP_CHECK_CU(d.cuCtxGetDevice(&dev));
  return int(dev);  // CUdevice is the ordinal
}

}  // namespace

// --- small shared pieces -------------------------------------------------------------

void count_allocation() { g_allocations.fetch_add(1, std::memory_order_relaxed); }

ContextGuard::ContextGuard(const CudaDriver& d, CUcontext ctx) : d_(d) {
  LEAPP_CHECK_CU(d.cuCtxGetCurrent(&saved_));
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
                 const std::vector<DeviceSpan>& spans) {
  auto where = [&] { return "leapp segment '" + bundle.segment() + "': "; };
  if (spans.size() != specs.size())
    throw std::invalid_argument(where() + "expected " + std::to_string(specs.size()) + " " + side + ", got " +
                                std::to_string(spans.size()));
  for (size_t j = 0; j < specs.size(); ++j) {
    const TensorSpec& s = specs[j];
    if (spans[j].ptr != 0 && spans[j].bytes == s.bytes) continue;
    std::string what = std::string(side) + "[" + std::to_string(j) + "] '" + s.name + "'";
    if (spans[j].ptr == 0) throw std::invalid_argument(where() + what + " is a null device pointer");
    throw std::invalid_argument(where() + what + " has " + std::to_string(spans[j].bytes) + " bytes, expected " +
                                std::to_string(s.bytes) + " (" + s.dtype + " of shape " + shape_text(s.shape) + ")");
  }
}

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

}  // namespace

void run_segment(const Bundle& bundle, const std::vector<DeviceSpan>& inputs, const std::vector<DeviceSpan>& outputs,
                 CUstream stream, int device) {
  using namespace detail;
  const Manifest& m = bundle.manifest();
  check_spans(bundle, "inputs", m.inputs, inputs);
  check_spans(bundle, "outputs", m.outputs, outputs);
  const CudaDriver& d = driver();
  // Error texts only: built when something fails, never on the hot path.
  auto where = [&] { return "leapp segment '" + m.segment + "'"; };

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
    if (device >= 0 && current_device(d) != device) ctx = nullptr;
  }
  if (ctx == nullptr) ctx = primary_context(d, device < 0 ? 0 : device);
  ContextGuard guard(d, ctx);
  const int ctx_device = current_device(d);
  if (device >= 0 && ctx_device != device)
    throw std::invalid_argument(where() + ": the stream belongs to CUDA device " + std::to_string(ctx_device) +
                                ", but device " + std::to_string(device) + " was requested");

  // Caches: the prepared segment and this stream's scratch (both built once).
  // The thread remembers its last hit, so a loop replaying one segment on one
  // stream skips the lock and the lookup. Entries are never erased and
  // std::map nodes never move, so the remembered pointers stay valid; the
  // digest is compared too, because a freed Bundle's address may be reused.
  StreamKey skey{stream, stream == cu_stream_per_thread() ? this_thread_serial() : 0};
  struct LastHit {
    CUcontext ctx = nullptr;
    const Bundle* bundle = nullptr;
    std::string digest;
    StreamKey stream{nullptr, 0};
    PreparedSegment* seg = nullptr;
    const std::vector<CUdeviceptr>* scratch = nullptr;
  };
  thread_local LastHit last;
  PreparedSegment* seg = nullptr;
  const std::vector<CUdeviceptr>* scratch = nullptr;
  if (last.seg != nullptr && last.ctx == ctx && last.bundle == &bundle && !(last.stream < skey) &&
      !(skey < last.stream) && last.digest == bundle.digest()) {
    seg = last.seg;
    scratch = last.scratch;
  } else {
    std::lock_guard<std::mutex> lock(cache_mutex());
    auto key = std::make_pair(ctx, bundle.digest());
    auto it = segments().find(key);
    bool need_setup = it == segments().end() || it->second->scratch.find(skey) == it->second->scratch.end();
    if (need_setup) {
      RelaxedCaptureMode relaxed(d);  // one-time setup is legal even while a stream is captured
      if (it == segments().end()) it = segments().emplace(key, prepare(d, bundle, device_attrs(d, ctx_device))).first;
      auto sit = it->second->scratch.find(skey);
      if (sit == it->second->scratch.end())
        sit = it->second->scratch.emplace(skey, allocate_role(d, m, BufferRole::kScratch, where() + ": scratch")).first;
    }
    seg = it->second.get();
    scratch = &seg->scratch.find(skey)->second;
    last.ctx = ctx;
    last.bundle = &bundle;
    last.digest = bundle.digest();
    last.stream = skey;
    last.seg = seg;
    last.scratch = scratch;
  }

  // Buffer addresses for this call.
  thread_local std::vector<CUdeviceptr> addr;
  addr.assign(m.buffers.size(), 0);
  for (size_t i = 0; i < m.buffers.size(); ++i) {
    const BufferSpec& b = m.buffers[i];
    switch (b.role) {
      case BufferRole::kInput: addr[i] = inputs[b.io].ptr; break;
      case BufferRole::kOutput: addr[i] = outputs[b.io].ptr; break;
      case BufferRole::kScratch: addr[i] = (*scratch)[i]; break;
      case BufferRole::kConstant: addr[i] = seg->constants[i]; break;
    }
  }

  // Per-call initialisation, then the ops, all on `stream`.
  for (size_t i = 0; i < m.buffers.size(); ++i) {
    const BufferSpec& b = m.buffers[i];
    CUresult r = CUDA_SUCCESS;
    if (b.init == BufferInit::kZero)
      r = d.cuMemsetD8Async(addr[i], 0, size_t(b.bytes), stream);
    else if (b.init == BufferInit::kInput)
      r = d.cuMemcpyDtoDAsync(addr[i], inputs[b.init_index].ptr, size_t(b.bytes), stream);
    if (r != CUDA_SUCCESS) enqueued(r, where() + ": initialising buffers[" + std::to_string(i) + "] (init)");
  }
  thread_local std::vector<uint8_t> params;
  thread_local std::vector<void*> param_ptrs;
  for (size_t i = 0; i < m.ops.size(); ++i) {
    const OpSpec& op = m.ops[i];
    CUresult r = CUDA_SUCCESS;
    switch (op.kind) {
      case OpKind::kLaunch: {
        std::string_view blob = bundle.blob(op.params_blob);
        params.assign(blob.begin(), blob.end());
        for (const RelocSpec& rel : op.relocs) {
          CUdeviceptr a = addr[rel.buffer] + rel.buffer_offset;
          std::memcpy(params.data() + op.param_offsets[rel.param] + rel.offset, &a, sizeof(a));
        }
        param_ptrs.resize(op.param_offsets.size());
        for (size_t p = 0; p < op.param_offsets.size(); ++p) param_ptrs[p] = params.data() + op.param_offsets[p];
        r = d.cuLaunchKernel(seg->functions[op.kernel], op.grid[0], op.grid[1], op.grid[2], op.block[0], op.block[1],
                             op.block[2], op.smem, stream, param_ptrs.data(), nullptr);
        break;
      }
      case OpKind::kMemset:
        if (op.bytes) r = d.cuMemsetD8Async(addr[op.dst] + op.dst_offset, op.value, size_t(op.bytes), stream);
        break;
      case OpKind::kCopy:
        if (op.bytes)
          r = d.cuMemcpyDtoDAsync(addr[op.dst] + op.dst_offset, addr[op.src] + op.src_offset, size_t(op.bytes), stream);
        break;
    }
    if (r != CUDA_SUCCESS) enqueued(r, where() + ": " + op_text(m, i));
  }
}

}  // namespace leapp
