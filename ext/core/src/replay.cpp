// ext/core/src/replay.cpp: replaying a segment's ops on the caller's stream (leapp::run_segment).
//
// One-time work (module loads, constant uploads, scratch allocation) happens
// under one mutex on the first call per (CUcontext, bundle digest[, stream]);
// later calls only read the caches and enqueue work, so they are safe inside
// CUDA graph capture and never allocate. Per-call state (buffer addresses and
// the relocated parameter bytes) lives in thread-local vectors: concurrent
// callers never share it. cuLaunchKernel copies the parameter values when it
// is called, so the host buffer may be reused right after.
//
// The pieces: the prepared segments and per-stream scratch with their lifetimes (segment_cache.cpp),
// contexts and devices (cuda_context.cpp), a call as one CUDA graph (segment_graph.cpp); this file
// checks a call, finds its entry and enqueues it.
#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <stdexcept>

#include "manifest.h"
#include "replay_internal.h"
#include "segment_cache.h"
#include "segment_graph.h"

namespace leapp {
namespace {

bool is_special_stream(CUstream s) {
  return s == nullptr || s == cu_stream_legacy() || s == cu_stream_per_thread();
}

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

namespace detail {
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

}  // namespace

void enqueued(CUresult r, const std::string& what) {
  if (r != CUDA_SUCCESS) throw CudaError(r, what + ": " + cu_error_text(r) + " [code " + std::to_string(r) + "]");
}

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

}  // namespace detail

namespace {

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

/// The thread remembers its last hit (context, its device, bundle, stream and the scratch entry), so a loop
/// replaying one segment on one stream skips the table lock, the lookup and the device query. The digest is
/// compared too, because a freed Bundle's address may be reused; `released` is checked under the entry's lock,
/// because release_segments() may have freed it since.
struct LastHit {
  CUcontext ctx = nullptr;
  int ctx_device = -1;
  const Bundle* bundle = nullptr;
  std::string digest;
  detail::StreamKey stream{nullptr, 0, 0};
  std::shared_ptr<detail::StreamScratch> scratch;
};

/// Per-call host state, in one thread_local (one TLS lookup per call): the last hit, buffer addresses,
/// relocated parameter bytes and their pointers, a graph key, the dynamic-batch scratch offsets.
struct CallState {
  LastHit last;
  std::vector<CUdeviceptr> addr;
  std::vector<uint8_t> params;
  std::vector<void*> param_ptrs;
  std::vector<CUdeviceptr> key;
  std::vector<uint64_t> scratch_offsets;
};

/// Error texts only: built when something fails, never on the hot path.
std::string where(const Manifest& m) { return "leapp segment '" + m.segment + "'"; }

/// The context a call runs in: the stream's own, else the current one (when on `device`), else the primary.
CUcontext call_context(const CudaDriver& d, const Manifest& m, CUstream stream, int device, CUcontext current,
                       const LastHit& last) {
  using namespace detail;
  CUcontext ctx = nullptr;
  if (!is_special_stream(stream)) {
    CUresult r = d.cuStreamGetCtx(stream, &ctx);
    if (r != CUDA_SUCCESS)
      throw CudaError(r, where(m) + ": cuStreamGetCtx failed for stream " +
                             std::to_string(reinterpret_cast<uintptr_t>(stream)) + " (not a CUDA stream?): " +
                             cu_error_text(r));
  } else if (current != nullptr) {
    ctx = current;
    if (device >= 0 && (current == last.ctx ? last.ctx_device : current_device(d)) != device) ctx = nullptr;
  }
  return ctx != nullptr ? ctx : primary_context(d, device < 0 ? 0 : device);
}

/// This stream's scratch entry, locked in `hold` until the last op is enqueued (segment_cache.cpp); inside a
/// caller's capture, the entry of that capture.
detail::StreamScratch& locked_scratch(const CudaDriver& d, const Bundle& bundle, CUcontext ctx, int ctx_device,
                                      const detail::StreamKey& key, CUgraph capture_graph, LastHit& last,
                                      std::unique_lock<std::mutex>& hold) {
  using namespace detail;
  if (last.scratch && last.ctx == ctx && last.bundle == &bundle && last.stream == key &&
      last.digest == bundle.digest()) {
    hold = std::unique_lock<std::mutex>(last.scratch->enqueue);
    if (!last.scratch->released) return *last.scratch;
    hold.unlock();
  }
  std::shared_ptr<StreamScratch> found;
  for (;;) {  // an entry released between the lookup and the lock is looked up again
    found = find_or_create(d, bundle, ctx, ctx_device, key, capture_graph);
    hold = std::unique_lock<std::mutex>(found->enqueue);
    if (!found->released) break;
    hold.unlock();
  }
  last.ctx = ctx;
  last.ctx_device = ctx_device;
  last.bundle = &bundle;
  last.digest = bundle.digest();
  last.stream = key;
  last.scratch = std::move(found);
  return *last.scratch;
}

/// Dynamic batch: this batch's scratch layout in `offsets`; the stream's scratch grows (never shrinks) when it
/// needs more, so a steady batch allocates nothing. The smaller allocation stays until the entry is freed: work
/// queued on this stream may still use it.
void fit_scratch(const CudaDriver& d, const Bundle& bundle, int64_t batch, detail::StreamScratch& sc,
                 std::vector<uint64_t>& offsets) {
  using namespace detail;
  const Manifest& m = bundle.manifest();
  const uint64_t need = scratch_layout(m, batch, offsets);
  if (need <= sc.memory.capacity) return;
  check_segment_memory(bundle, batch);
  RelaxedCaptureMode relaxed(d);
  uint64_t grow = std::max(need, sc.memory.capacity + sc.memory.capacity / 2);
  uint64_t most = scratch_layout(m, m.batch_max, offsets);
  grow = std::min(grow, std::max(most, need));
  scratch_layout(m, batch, offsets);
  CUdeviceptr p = allocate(d, grow, where(m) + ": scratch for batch " + std::to_string(batch));
  if (sc.memory.base) sc.memory.retired.push_back(sc.memory.base);
  sc.memory.base = p;
  sc.memory.capacity = grow;
}

/// Every buffer's address for this call: the caller's inputs and outputs, the entry's scratch, the constants.
void buffer_addresses(const Manifest& m, const std::vector<DeviceSpan>& inputs, const std::vector<DeviceSpan>& outputs,
                      const detail::StreamScratch& sc, const std::vector<uint64_t>& scratch_offsets,
                      std::vector<CUdeviceptr>& addr) {
  addr.resize(m.buffers.size());  // every entry is written below
  for (size_t i = 0; i < m.buffers.size(); ++i) {
    const BufferSpec& b = m.buffers[i];
    switch (b.role) {
      case BufferRole::kInput: addr[i] = inputs[b.io].ptr; break;
      case BufferRole::kOutput: addr[i] = outputs[b.io].ptr; break;
      case BufferRole::kScratch:
        addr[i] = m.dynamic ? sc.memory.base + scratch_offsets[i] : sc.memory.addr[i];
        break;
      case BufferRole::kConstant: addr[i] = sc.seg->constants.addr[i]; break;
    }
  }
}

}  // namespace

void run_segment(const Bundle& bundle, const std::vector<DeviceSpan>& inputs, const std::vector<DeviceSpan>& outputs,
                 CUstream stream, int device) {
  using namespace detail;
  const Manifest& m = bundle.manifest();
  const int64_t batch = detail::checked_call_batch(bundle, inputs, outputs, [&](const char* side, const auto& specs,
                                                                                 const auto& spans, int64_t b) {
    check_spans(bundle, side, specs, spans, b);
  });
  const CudaDriver& d = driver();
  thread_local CallState state;

  CUcontext saved = nullptr;
  LEAPP_CHECK_CU(d.cuCtxGetCurrent(&saved));
  const CUcontext ctx = call_context(d, m, stream, device, saved, state.last);
  ContextGuard guard(d, ctx, saved);
  const int ctx_device = ctx == state.last.ctx ? state.last.ctx_device : current_device(d);
  if (device >= 0 && ctx_device != device)
    throw std::invalid_argument(where(m) + ": the stream belongs to CUDA device " + std::to_string(ctx_device) +
                                ", but device " + std::to_string(device) + " was requested");

  const CaptureState capture = capture_state(d, stream);
  const StreamKey key{stream, stream == cu_stream_per_thread() ? this_thread_serial() : 0, capture.id};
  std::unique_lock<std::mutex> hold;
  StreamScratch& sc = locked_scratch(d, bundle, ctx, ctx_device, key, capture.graph, state.last, hold);
  if (m.dynamic) fit_scratch(d, bundle, batch, sc, state.scratch_offsets);
  buffer_addresses(m, inputs, outputs, sc, state.scratch_offsets, state.addr);

  // One graph launch when the segment has one for these addresses and this batch (or can make one), else the ops.
  if (sc.seg->enqueues >= 2 && graphs_enabled(d) && capture.status == CU_STREAM_CAPTURE_STATUS_NONE &&
      replay_graph(d, bundle, sc, state.addr, inputs, outputs, stream, state.key, batch))
    return;
  enqueue_call(d, bundle, *sc.seg, state.addr, inputs, stream, state.params, state.param_ptrs, batch);
}

}  // namespace leapp
