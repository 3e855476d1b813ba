// ext/core/src/segment_cache.h: prepared segments and their per-stream scratch, with their lifetimes (internal).
//
// The table (segment_cache.cpp) owns one PreparedSegment per (CUcontext, bundle digest): its modules,
// functions and constants. Each owns one StreamScratch per stream (and per caller capture) that replays it:
// scratch memory, that stream's segment graphs (segment_graph.cpp) and the lock that keeps one call's
// enqueues together. replay.cpp finds or makes the entry of a call and enqueues on it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "manifest.h"
#include "replay_internal.h"

namespace leapp::detail {

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
uint64_t this_thread_serial();

/// Buffers of one role carved from one allocation (`base`, 0 when the role has no bytes).
struct RoleMemory {
  CUdeviceptr base = 0;
  std::vector<CUdeviceptr> addr;  // per buffer; 0 unless of the role
  uint64_t capacity = 0;          // bytes at `base`
  std::vector<CUdeviceptr> retired;  // dynamic batch: smaller scratch given up on growth, freed with the entry
};

/// Dynamic batch: the offsets of the scratch buffers at `batch` (256-aligned, in buffer order); returns the total.
uint64_t scratch_layout(const Manifest& m, int64_t batch, std::vector<uint64_t>& offsets);

struct PreparedSegment;

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
  // Graph replay, guarded by `enqueue` (segment_graph.cpp).
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
  std::map<StreamKey, std::shared_ptr<StreamScratch>> scratch;  // guarded by the table's mutex (segment_cache.cpp)
};

/// A device allocation of `bytes` (counted: leapp::allocation_count); throws CudaError naming `what`.
CUdeviceptr allocate(const CudaDriver& d, uint64_t bytes, const std::string& what);

/// The scratch entry of (ctx, digest, key), made on first use (with the prepared segment). A key
/// with a capture id is tied to `capture_graph`, the caller's graph (by a user object, or kept for
/// the caller when it adopted the capture: adopt_capture); making one frees the entries of captures
/// whose graphs are gone.
std::shared_ptr<StreamScratch> find_or_create(const CudaDriver& d, const Bundle& bundle, CUcontext ctx,
                                              int ctx_device, const StreamKey& key, CUgraph capture_graph);

}  // namespace leapp::detail
