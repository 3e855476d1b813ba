// ext/pipeline/src/step_graph.cpp: StepGraphs (see step_graph.h).
#include "step_graph.h"

#include <algorithm>

namespace leapp::pipeline_detail {

StepGraphs::~StepGraphs() {
  for (Graph& g : graphs_) drop(g);
}

void StepGraphs::drop(Graph& g) noexcept {
  try {
    driver().cuGraphExecDestroy(g.exec);
  } catch (...) {  // no driver left to free it with
  }
  if (resources_ && g.held) resources_->release(g.held);
  release_capture(g.capture);
}

void StepGraphs::release_capture(unsigned long long capture) noexcept {
  if (capture == 0) return;
  for (const ScratchOwner& o : owners_) o.release(capture);
}

void StepGraphs::turn_on(size_t key_size) {
  reason_.clear();
  key_.assign(key_size, nullptr);
  last_.reserve(key_size);
}

void StepGraphs::turn_off(std::string reason) {
  reason_ = std::move(reason);
  last_.clear();
}

bool StepGraphs::launch_known(CUstream stream) {
  for (Graph& g : graphs_)
    if (g.key == key_) {
      LEAPP_CHECK_CU(driver().cuGraphLaunch(g.exec, stream));
      g.used = ++tick_;
      ++replays_;
      return true;
    }
  return false;
}

bool StepGraphs::begin_capture(CUstream stream) {
  held_ = nullptr;
  if (resources_) {
    try {
      held_ = resources_->begin(stream);  // before the capture, as torch.cuda.graph routes its pool
    } catch (const std::exception& e) {
      turn_off(std::string("a step graph cannot own what a PT2 node allocates: ") + e.what());
      return false;
    }
  }
  // thread-local: only this thread's calls that capture forbids (a cudaMalloc, a synchronisation) break the
  // capture, so other threads of the process keep working while a step is captured
  const CudaDriver& d = driver();
  const CUresult r = d.cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
  if (r != CUDA_SUCCESS) {
    give_back();
    turn_off("cannot capture the pipeline's stream (" + cu_error_text(r) + ")");
    return false;
  }
  int status = 0;
  unsigned long long id = 0;
  capture_ = 0;
  if (!owners_.empty() && d.cuStreamGetCaptureInfo &&
      d.cuStreamGetCaptureInfo(stream, &status, &id, nullptr, nullptr, nullptr) == CUDA_SUCCESS &&
      status == CU_STREAM_CAPTURE_STATUS_ACTIVE && id != 0) {
    for (const ScratchOwner& o : owners_) o.adopt(id);
    capture_ = id;
  }
  return true;
}

void StepGraphs::give_back() noexcept {
  if (resources_ && held_) resources_->end(held_);
  release_held();
}

void StepGraphs::release_held() noexcept {
  if (resources_ && held_) resources_->release(held_);
  held_ = nullptr;
  release_capture(capture_);  // its graph is gone and was never launched
  capture_ = 0;
}

void StepGraphs::abandon_capture(CUstream stream, const std::string& why) {
  CUgraph graph = nullptr;
  driver().cuStreamEndCapture(stream, &graph);  // ends it whatever the step left behind
  if (graph) driver().cuGraphDestroy(graph);
  give_back();
  turn_off("capturing the step failed (" + why + "); steps run node by node");
}

bool StepGraphs::end_capture(CUstream stream) {
  const CudaDriver& d = driver();
  CUgraph graph = nullptr;
  CUresult r = d.cuStreamEndCapture(stream, &graph);
  if (resources_ && held_) resources_->end(held_);
  // Nothing of the captured work ran: when the graph is refused, the caller runs the step directly.
  std::string refused;
  size_t hosts = 0;
  CUgraphExec exec = nullptr;
  if (r != CUDA_SUCCESS)  // a node made a call capture forbids (a host synchronisation, a CPU EP node)
    refused = "capturing the step failed (" + cu_error_text(r) + "): a node makes a call CUDA cannot capture (a "
              "host synchronisation or copy, for example a node with ONNX Runtime CPU EP kernels)";
  else if (!count_graph_host_nodes(graph, hosts))
    refused = "the captured step's nodes could not be listed (cuGraphGetNodes)";
  else if (hosts > 0)  // a host function replays every launch, on whatever its captured pointers hold by then
    refused = "capturing the step recorded " + std::to_string(hosts) + " host callback(s), which a graph would "
              "run again at every launch (ONNX Runtime frees pinned staging buffers from such callbacks)";
  else if ((r = d.cuGraphInstantiateWithFlags(&exec, graph, 0)) != CUDA_SUCCESS)
    refused = "instantiating the step's graph failed (" + cu_error_text(r) + ")";
  if (graph) d.cuGraphDestroy(graph);
  if (!refused.empty()) {
    release_held();
    turn_off(refused + "; steps run node by node");
    return false;
  }
  if (graphs_.size() >= kMaxGraphs) {
    auto lru = std::min_element(graphs_.begin(), graphs_.end(),
                                [](const Graph& a, const Graph& b) { return a.used < b.used; });
    LEAPP_CHECK_CU(d.cuStreamSynchronize(stream));  // its last launch may still run
    drop(*lru);
    graphs_.erase(lru);
  }
  graphs_.push_back(Graph{key_, exec, held_, ++tick_, capture_});
  held_ = nullptr;
  capture_ = 0;
  ++captures_;
  LEAPP_CHECK_CU(d.cuGraphLaunch(exec, stream));  // the captured work did not run: this is the step
  ++replays_;
  return true;
}

void StepGraphs::clear(CUstream stream) {
  if (graphs_.empty()) return;
  LEAPP_CHECK_CU(driver().cuStreamSynchronize(stream));
  for (Graph& g : graphs_) drop(g);
  graphs_.clear();
  last_.clear();
}

}  // namespace leapp::pipeline_detail
