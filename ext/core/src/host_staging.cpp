// ext/core/src/host_staging.cpp: replay on host memory (the ORT CPU execution provider).
//
// A staging set is one non-blocking stream plus pinned host and device
// buffers sized for one segment's inputs and outputs. Sets are pooled per
// (bundle digest, device): a caller leases one for the duration of a call, so
// concurrent sessions and threads each get their own stream, staging memory
// and (because scratch is keyed by stream) scratch. Idle sets live until
// release_segments() frees them (release_staging below).
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>

#include "replay_internal.h"

namespace leapp {
namespace {

struct StagingSet {
  CUcontext ctx = nullptr;
  CUstream stream = nullptr;
  CUdeviceptr device_base = 0;
  uint8_t* host_base = nullptr;
  std::vector<uint64_t> in_offsets, out_offsets;  // same offsets on host and device
  uint64_t capacity = 0;  // bytes at device_base and host_base
};

/// Offsets of the inputs and outputs at these byte sizes (kSubAlignment-aligned); returns the total.
uint64_t layout(StagingSet& set, const std::vector<HostSpan>& inputs, const std::vector<HostSpan>& outputs) {
  uint64_t total = 0;
  set.in_offsets.clear();
  set.out_offsets.clear();
  for (const HostSpan& t : inputs) {
    set.in_offsets.push_back(total);
    total = detail::round_up(total + t.bytes, detail::kSubAlignment);
  }
  for (const HostSpan& t : outputs) {
    set.out_offsets.push_back(total);
    total = detail::round_up(total + t.bytes, detail::kSubAlignment);
  }
  return total;
}

/// Device and pinned memory of at least `total` bytes (a set's stream is idle between calls: the old
/// memory can go at once). A set is sized on its first call, and again when a dynamic batch needs more.
void reserve(const CudaDriver& d, StagingSet& set, uint64_t total, const std::string& segment) {
  if (total <= set.capacity) return;
  const std::string where = "leapp segment '" + segment + "': host staging";
  if (set.device_base && d.cuMemFree(set.device_base) == CUDA_SUCCESS) detail::count_free();
  if (set.host_base && d.cuMemFreeHost(set.host_base) == CUDA_SUCCESS) detail::count_free();
  set.device_base = 0;
  set.host_base = nullptr;
  set.capacity = 0;
  CUresult r = d.cuMemAlloc(&set.device_base, size_t(total));
  if (r != CUDA_SUCCESS) throw CudaError(r, where + ": cuMemAlloc of " + std::to_string(total) + " bytes: " + cu_error_text(r));
  detail::count_allocation();
  void* host = nullptr;
  r = d.cuMemAllocHost(&host, size_t(total));
  if (r != CUDA_SUCCESS)
    throw CudaError(r, where + ": cuMemAllocHost of " + std::to_string(total) + " bytes: " + cu_error_text(r));
  detail::count_allocation();
  set.host_base = static_cast<uint8_t*>(host);
  set.capacity = total;
}

struct Pool {
  std::mutex mutex;
  std::map<std::pair<std::string, int>, std::vector<std::unique_ptr<StagingSet>>> idle;
};

Pool& pool() {
  static Pool* p = new Pool();  // leaked: what is in it at exit is the process's to free
  return *p;
}

/// A set's context and stream; its memory comes with its first call (reserve).
std::unique_ptr<StagingSet> create_set(const CudaDriver& d, int device) {
  auto set = std::make_unique<StagingSet>();
  set->ctx = detail::primary_context(d, device);
  detail::ContextGuard guard(d, set->ctx);
  LEAPP_CHECK_CU(d.cuStreamCreate(&set->stream, CU_STREAM_NON_BLOCKING));
  return set;
}

/// Returns the leased set to the pool however the call ends.
class Lease {
 public:
  Lease(std::pair<std::string, int> key, std::unique_ptr<StagingSet> set) : key_(std::move(key)), set_(std::move(set)) {}
  ~Lease() {
    std::lock_guard<std::mutex> lock(pool().mutex);
    pool().idle[key_].push_back(std::move(set_));
  }
  StagingSet& operator*() { return *set_; }

 private:
  std::pair<std::string, int> key_;
  std::unique_ptr<StagingSet> set_;
};

void check_host(const Bundle& bundle, const char* side, const std::vector<TensorSpec>& specs,
                const std::vector<HostSpan>& spans, int64_t batch) {
  auto where = [&] { return "leapp segment '" + bundle.segment() + "': "; };  // texts built on failure only
  if (spans.size() != specs.size())
    throw std::invalid_argument(where() + "expected " + std::to_string(specs.size()) + " " + side + ", got " +
                                std::to_string(spans.size()));
  const Manifest& m = bundle.manifest();
  for (size_t j = 0; j < specs.size(); ++j) {
    auto what = [&] { return std::string(side) + "[" + std::to_string(j) + "] '" + specs[j].name + "'"; };
    const uint64_t want = m.bytes_at(specs[j], batch);
    if (spans[j].ptr == nullptr) throw std::invalid_argument(where() + what() + " is a null host pointer");
    if (spans[j].bytes != want)
      throw std::invalid_argument(where() + what() + " has " + std::to_string(spans[j].bytes) + " bytes, expected " +
                                  std::to_string(want) + " (" + specs[j].dtype +
                                  (m.dynamic ? " at batch " + std::to_string(batch) : std::string()) + ")");
  }
}

}  // namespace

int64_t detail::checked_host_batch(const Bundle& bundle, const std::vector<HostSpan>& inputs,
                                   const std::vector<HostSpan>& outputs) {
  return checked_call_batch(bundle, inputs, outputs, [&](const char* side, const auto& specs, const auto& spans,
                                                          int64_t batch) { check_host(bundle, side, specs, spans, batch); });
}

std::string detail::release_staging(const CudaDriver& d, std::string_view digest) {
  using Key = std::pair<std::string, int>;
  std::vector<std::pair<Key, std::unique_ptr<StagingSet>>> sets;
  {
    std::lock_guard<std::mutex> lock(pool().mutex);
    for (auto it = pool().idle.begin(); it != pool().idle.end();) {
      if (!digest.empty() && it->first.first != digest) {
        ++it;
        continue;
      }
      for (auto& set : it->second) sets.emplace_back(it->first, std::move(set));
      it = pool().idle.erase(it);
    }
  }
  std::string errors;
  for (auto& [key, set] : sets) {
    try {
      ContextGuard guard(d, set->ctx);
      CUresult r = d.cuStreamSynchronize(set->stream);
      if (r != CUDA_SUCCESS) {
        errors += "; host staging: cuStreamSynchronize failed: " + cu_error_text(r) + " (the set is kept)";
        std::lock_guard<std::mutex> lock(pool().mutex);
        pool().idle[key].push_back(std::move(set));
        continue;
      }
      d.cuStreamDestroy(set->stream);
      if (set->device_base) {
        if (d.cuMemFree(set->device_base) == CUDA_SUCCESS) count_free();
        else errors += "; host staging: cuMemFree refused";
      }
      if (set->host_base) {
        if (d.cuMemFreeHost(set->host_base) == CUDA_SUCCESS) count_free();
        else errors += "; host staging: cuMemFreeHost refused";
      }
    } catch (const std::exception& e) {
      errors += std::string("; host staging: ") + e.what();
    }
  }
  return errors;
}

int default_host_device() {
  const char* env = std::getenv("LEAPP_CUDA_DEVICE");
  if (env == nullptr || *env == '\0') return 0;
  char* end = nullptr;
  long v = std::strtol(env, &end, 10);
  if (*end != '\0' || v < 0 || v > 1 << 20)
    throw std::invalid_argument(std::string("leapp: LEAPP_CUDA_DEVICE='") + env + "' is not a device ordinal");
  return int(v);
}

void run_segment_host(const Bundle& bundle, const std::vector<HostSpan>& inputs, const std::vector<HostSpan>& outputs,
                      int device) {
  if (runs_on_this_cpu(bundle)) return run_segment_cpu(bundle, inputs, outputs);  // CPU code, or copies only
  const Manifest& m = bundle.manifest();
  const int64_t batch = detail::checked_host_batch(bundle, inputs, outputs);
  const CudaDriver& d = driver();
  if (device < 0) device = default_host_device();

  auto key = std::make_pair(bundle.digest(), device);
  std::unique_ptr<StagingSet> taken;
  {
    std::lock_guard<std::mutex> lock(pool().mutex);
    auto& idle = pool().idle[key];
    if (!idle.empty()) {
      taken = std::move(idle.back());
      idle.pop_back();
    }
  }
  if (!taken) taken = create_set(d, device);
  Lease lease(key, std::move(taken));
  StagingSet& s = *lease;

  detail::ContextGuard guard(d, s.ctx);
  auto where = [&] { return "leapp segment '" + m.segment + "': host staging"; };  // on failure only
  reserve(d, s, layout(s, inputs, outputs), m.segment);
  std::vector<DeviceSpan> dev_in, dev_out;
  for (size_t j = 0; j < inputs.size(); ++j) {
    std::memcpy(s.host_base + s.in_offsets[j], inputs[j].ptr, size_t(inputs[j].bytes));
    CUresult r = d.cuMemcpyHtoDAsync(s.device_base + s.in_offsets[j], s.host_base + s.in_offsets[j],
                                     size_t(inputs[j].bytes), s.stream);
    if (r != CUDA_SUCCESS) throw CudaError(r, where() + ": copying input " + std::to_string(j) + " to the device: " + cu_error_text(r));
    dev_in.push_back({s.device_base + s.in_offsets[j], inputs[j].bytes});
  }
  for (size_t j = 0; j < outputs.size(); ++j) dev_out.push_back({s.device_base + s.out_offsets[j], outputs[j].bytes});
  run_segment(bundle, dev_in, dev_out, s.stream, device);
  for (size_t j = 0; j < outputs.size(); ++j) {
    CUresult r = d.cuMemcpyDtoHAsync(s.host_base + s.out_offsets[j], s.device_base + s.out_offsets[j],
                                     size_t(outputs[j].bytes), s.stream);
    if (r != CUDA_SUCCESS) throw CudaError(r, where() + ": copying output " + std::to_string(j) + " back: " + cu_error_text(r));
  }
  CUresult r = d.cuStreamSynchronize(s.stream);
  if (r != CUDA_SUCCESS) throw CudaError(r, where() + ": the replay failed on the device: " + cu_error_text(r));
  for (size_t j = 0; j < outputs.size(); ++j)
    std::memcpy(outputs[j].ptr, s.host_base + s.out_offsets[j], size_t(outputs[j].bytes));
}

}  // namespace leapp
