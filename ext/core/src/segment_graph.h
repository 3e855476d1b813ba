// ext/core/src/segment_graph.h: a segment's call replayed as one CUDA graph launch (internal).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "segment_cache.h"

namespace leapp::detail {

/// Whether segments may replay as graphs: the driver has the API and LEAPP_SEGMENT_GRAPHS is not "0".
bool graphs_enabled(const CudaDriver& d);

/// Replays the call as one graph launch (segment_graph.cpp); false when the call should enqueue its ops
/// instead. Throws only when a graph launch itself fails. `key` is the caller's reusable buffer.
bool replay_graph(const CudaDriver& d, const Bundle& bundle, StreamScratch& sc, const std::vector<CUdeviceptr>& addr,
                  const std::vector<DeviceSpan>& inputs, const std::vector<DeviceSpan>& outputs, CUstream stream,
                  std::vector<CUdeviceptr>& key, int64_t batch);

// The call's own enqueues (replay.cpp), which a graph captures.

/// Enqueues one call's work on `stream`: the per-call buffer inits, then the ops in order.
/// `params` and `param_ptrs` are the caller's reusable host buffers.
void enqueue_call(const CudaDriver& d, const Bundle& bundle, const PreparedSegment& seg,
                  const std::vector<CUdeviceptr>& addr, const std::vector<DeviceSpan>& inputs, CUstream stream,
                  std::vector<uint8_t>& params, std::vector<void*>& param_ptrs, int64_t batch);

/// Throws CudaError naming `what` when an enqueue failed.
void enqueued(CUresult r, const std::string& what);

}  // namespace leapp::detail
