// ext/core/src/segment_graph.cpp: a segment's call as one CUDA graph launch (segment_graph.h).
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
#include <algorithm>
#include <cstdlib>
#include <string_view>

#include "segment_graph.h"

namespace leapp::detail {
namespace {

constexpr size_t kGraphsPerStream = 8;  // distinct (input, output) address sets kept per stream entry
constexpr uint32_t kMissStreak = 16;    // misses in a row before replaying op by op for a while
constexpr uint32_t kEagerCalls = 256;   // calls replayed op by op after such a streak

/// Captures one call's work, for addresses `addr`, into a new graph on `sc`'s private stream;
/// nullptr when capture fails (the op-by-op path then reports any real error).
CUgraph capture_call(const CudaDriver& d, const Bundle& bundle, StreamScratch& sc,
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

}  // namespace

bool graphs_enabled(const CudaDriver& d) {
  static const bool env_on = [] {
    const char* v = std::getenv("LEAPP_SEGMENT_GRAPHS");
    return v == nullptr || std::string_view(v) != "0";
  }();
  return env_on && d.has_graphs();
}

bool replay_graph(const CudaDriver& d, const Bundle& bundle, StreamScratch& sc,
                  const std::vector<CUdeviceptr>& addr, const std::vector<DeviceSpan>& inputs,
                  const std::vector<DeviceSpan>& outputs, CUstream stream, std::vector<CUdeviceptr>& key,
                  int64_t batch) {
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

}  // namespace leapp::detail
