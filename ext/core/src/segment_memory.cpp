// ext/core/src/segment_memory.cpp: the memory one segment call may take, checked before anything is allocated.
//
// Every size a call allocates comes from the bundle, a file: its outputs (the signature's shapes, allocated by
// the op or the caller), its scratch and its constants (allocated by the runtime). The format caps each of them
// at 2^40 bytes, far above any machine, so that no arithmetic overflows; this is the runtime's own, lower limit
// on what one call at one batch may take (docs/runtime.md, "Memory"): an edited manifest asking for gigabytes is
// refused with the segment, the batch and the sizes named instead of being allocated, or failing as a bare
// std::bad_alloc deep inside an allocator.
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "leapp/runtime.h"
#include "json.h"
#include "replay_internal.h"

namespace leapp {
namespace {

constexpr uint64_t kDefaultLimit = uint64_t(1) << 32;  // 4 GiB: far above a robot's step, far below a host's memory

uint64_t read_limit() {
  const char* env = std::getenv("LEAPP_MAX_SEGMENT_BYTES");
  if (env == nullptr || *env == '\0') return kDefaultLimit;
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(env, &end, 10);
  if (*env < '0' || *env > '9' || *end != '\0' || errno == ERANGE || v == 0 || v > kBundleMaxBufferBytes)
    throw std::invalid_argument("leapp: LEAPP_MAX_SEGMENT_BYTES='" + detail::shown(env) +
                                "' is not a byte count in [1, 2^40] (docs/runtime.md, \"Memory\")");
  return uint64_t(v);
}

std::string gib(uint64_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f GiB", double(bytes) / double(uint64_t(1) << 30));
  return text;
}

}  // namespace

uint64_t segment_memory_limit() {
  static const uint64_t limit = read_limit();  // read once: a limit that changed mid-run would be a second rule
  return limit;
}

SegmentMemory segment_memory(const Bundle& bundle, int64_t batch) {
  const Manifest& m = bundle.manifest();
  SegmentMemory need;
  for (const TensorSpec& t : m.outputs) need.outputs += m.bytes_at(t, batch);
  for (const BufferSpec& b : m.buffers) {  // the layouts run_segment and run_segment_cpu carve (scratch_layout)
    if (b.role == BufferRole::kScratch)
      need.scratch = detail::round_up(need.scratch + uint64_t(m.dynamic ? b.bytes_rule.at(batch) : b.bytes),
                                      detail::kSubAlignment);
    else if (b.role == BufferRole::kConstant)
      need.constants = detail::round_up(need.constants + b.bytes, detail::kSubAlignment);
  }
  return need;  // each term <= 2^40 x 2^20 buffers (the format's caps): no sum overflows
}

void check_segment_memory(const Bundle& bundle, int64_t batch) {
  const SegmentMemory need = segment_memory(bundle, batch);
  const uint64_t limit = segment_memory_limit();
  const uint64_t total = need.outputs + need.scratch + need.constants;
  if (total <= limit) return;
  const Manifest& m = bundle.manifest();
  throw std::runtime_error(
      "leapp segment '" + detail::shown(m.segment) + "' needs " + std::to_string(total) + " bytes (" + gib(total) +
      ")" + (m.dynamic ? " at batch " + std::to_string(batch) : std::string()) + ": outputs " +
      std::to_string(need.outputs) + ", scratch " + std::to_string(need.scratch) + ", constants " +
      std::to_string(need.constants) + "; more than the " + std::to_string(limit) + " bytes (" + gib(limit) +
      ") a call may take (LEAPP_MAX_SEGMENT_BYTES, docs/runtime.md \"Memory\"); nothing was allocated");
}

}  // namespace leapp
