// ext/core/src/replay_internal.h: contexts, devices and module loading for replay (internal).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "leapp/runtime.h"

namespace leapp::detail {

/// Makes `ctx` current for its scope and restores the caller's context after.
class ContextGuard {
 public:
  ContextGuard(const CudaDriver& d, CUcontext ctx);
  /// The same when the caller already knows the current context (`current`).
  ContextGuard(const CudaDriver& d, CUcontext ctx, CUcontext current);
  ~ContextGuard();
  ContextGuard(const ContextGuard&) = delete;
  ContextGuard& operator=(const ContextGuard&) = delete;

 private:
  const CudaDriver& d_;
  CUcontext saved_ = nullptr;
  bool switched_ = false;
};

/// Switches the calling thread to relaxed stream-capture mode for its scope,
/// so one-time setup (cuMemAlloc, module loads) is legal while some stream is
/// being captured; the caller's mode is restored after.
class RelaxedCaptureMode {
 public:
  explicit RelaxedCaptureMode(const CudaDriver& d);
  ~RelaxedCaptureMode();
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  const CudaDriver& d_;
  int saved_ = CU_STREAM_CAPTURE_MODE_RELAXED;
  bool ok_ = false;
};

/// What driver_status() reports of a device, and what a launch needs besides.
struct DeviceAttrs : DeviceInfo {
  int max_smem_optin = 0;  ///< CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
};

/// Buffers carved from one allocation (segment scratch, host staging) each start at this alignment.
constexpr uint64_t kSubAlignment = 256;
inline uint64_t round_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

/// Cached attributes of device `ordinal`; throws std::invalid_argument for a bad ordinal.
const DeviceAttrs& device_attrs(const CudaDriver& d, int ordinal);

/// The retained primary context of device `ordinal` (retained once, never released).
CUcontext primary_context(const CudaDriver& d, int ordinal);

/// The device of the current context (its ordinal).
int current_device(const CudaDriver& d);

/// "13.0" for 13000.
std::string cuda_version_text(int version);

/// Counts one runtime allocation (see leapp::allocation_count).
void count_allocation();
/// Counts one runtime free (see leapp::free_count).
void count_free();

/// Frees the idle host-staging sets of segment `digest` (all when empty): synchronises
/// and destroys their streams, frees their device and pinned memory. Sets leased by a
/// call in flight are left alone. Returns "; what failed" for each failure, else "".
std::string release_staging(const CudaDriver& d, std::string_view digest);

/// The call's batch (0 without dynamic batch), after `check(side, specs, spans, batch)` checked every span's
/// count, pointer and size of both sides (device or host spans: the batch is read before the sizes are checked).
template <class Spans, class Check>
int64_t checked_call_batch(const Bundle& bundle, const Spans& inputs, const Spans& outputs, Check&& check) {
  const Manifest& m = bundle.manifest();
  int64_t batch = 0;
  if (m.dynamic) {
    if (inputs.size() != m.inputs.size()) check("inputs", m.inputs, inputs, 0);  // names the count
    batch = segment_batch(bundle, inputs[m.batch_input].bytes);
  }
  check("inputs", m.inputs, inputs, batch);
  check("outputs", m.outputs, outputs, batch);
  return batch;
}

/// checked_call_batch for host spans (run_segment_host, run_segment_cpu).
int64_t checked_host_batch(const Bundle& bundle, const std::vector<HostSpan>& inputs,
                           const std::vector<HostSpan>& outputs);

/// One loaded CUDA module and what was chosen, e.g. "cubin sm_90".
struct LoadedModule {
  CUmodule module = nullptr;
  std::string choice;
};

/// Loads modules[index] of `bundle` into the current context, trying
/// binary_candidates() in order. Throws with the segment, the device's
/// compute capability, the driver version, the archs present and the PTX ISA
/// when nothing loads (and explains CUDA_ERROR_UNSUPPORTED_PTX_VERSION).
LoadedModule load_module(const CudaDriver& d, const Bundle& bundle, uint32_t index, const DeviceAttrs& dev);

}  // namespace leapp::detail
