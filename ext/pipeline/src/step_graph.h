// ext/pipeline/src/step_graph.h: a whole Pipeline::run as one CUDA graph (docs/deploy.md, "A step as one CUDA
// graph"), internal.
//
// The contract is torch.compile(mode="reduce-overhead")'s and ONNX Runtime's enable_cuda_graph, as leapp.load
// keeps it (docs/runtime.md, "Plain calls"): a graph reads and writes the buffers it was captured with. So a
// step is keyed by every input and output address and the batch; the first run with a key runs node by node
// (ONNX Runtime's warm-up: its arena then holds what a run needs), the second captures the step on the
// pipeline's stream and launches the graph, later runs with that key launch it. A control loop that passes
// the same buffers every step (writing new values into them) therefore runs one graph launch per step.
#pragma once

#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "leapp/cuda_driver.h"

namespace leapp::pipeline_detail {

/// What a capture owns besides its graph: for PT2 nodes, the torch pool their allocations go to while the step
/// is captured (aoti_plugin.h). begin (before the capture; throws with the reason), end (the capture ended or
/// failed), release (the graph is gone).
class CaptureResources {
 public:
  virtual ~CaptureResources() = default;
  virtual void* begin(CUstream stream) = 0;
  virtual void end(void* held) noexcept = 0;
  virtual void release(void* held) noexcept = 0;
};

/// A copy of leapp's runtime that replays Warp segments inside the step (each op library links its own: ONNX
/// Runtime's libleapp_warp_ort.so, torch's libleapp_warp_torch.so): its adopt_capture and release_capture
/// (leapp/runtime.h). The step's captures are adopted, so the scratch of the segments they record belongs to
/// the pipeline's graph without a CUDA user object, whose tracking makes the driver allocate at every launch.
struct ScratchOwner {
  void (*adopt)(unsigned long long capture_id) = nullptr;
  void (*release)(unsigned long long capture_id) = nullptr;
};

class StepGraphs {
 public:
  /// Graphs kept per pipeline (the least recently used goes): a loop alternating two sets of buffers (double
  /// buffering) replays both.
  static constexpr size_t kMaxGraphs = 2;

  StepGraphs() = default;
  StepGraphs(const StepGraphs&) = delete;
  StepGraphs& operator=(const StepGraphs&) = delete;
  ~StepGraphs();  ///< never throws

  /// Why steps run node by node ("" while graphs are on); set at open, or by a capture that failed.
  const std::string& reason() const { return reason_; }
  /// Graphs on, for keys of `key_size` entries (every input and output address, then the batch).
  void turn_on(size_t key_size);
  void turn_off(std::string reason);
  int64_t captures() const { return captures_; }
  int64_t replays() const { return replays_; }

  /// What captures hold besides their graphs (not owned; outlives this), or null.
  void set_resources(CaptureResources* resources) { resources_ = resources; }
  /// A runtime copy whose captured scratch the step graphs own (set at open; each added once).
  void add_scratch_owner(ScratchOwner owner) { owners_.push_back(owner); }

  /// The run's key, filled in place by the caller before run() (sized once: no allocation per step).
  std::vector<const void*>& key() { return key_; }

  /// Runs `step` (which enqueues a whole run on `stream`) directly, captures it, or launches its graph.
  template <class Step>
  void run(CUstream stream, Step&& step) {
    if (!reason_.empty()) return step();
    if (launch_known(stream)) return;
    if (key_ != last_) {  // a new key: run directly, and remember it (same size: assign allocates nothing)
      last_ = key_;
      return step();
    }
    if (!begin_capture(stream)) return step();
    try {
      step();
    } catch (const std::exception& e) {
      abandon_capture(stream, e.what());
      return step();  // the run itself still has to happen
    }
    if (!end_capture(stream)) step();
  }

  /// Drops every graph (the pipeline's own buffers moved, or the caller asked); waits for `stream` first.
  void clear(CUstream stream);

 private:
  struct Graph {
    std::vector<const void*> key;
    CUgraphExec exec = nullptr;
    void* held = nullptr;  // CaptureResources::begin's
    uint64_t used = 0;
    unsigned long long capture = 0;  // its capture's id, adopted by owners_ (0: none)
  };
  bool launch_known(CUstream stream);
  void drop(Graph& g) noexcept;
  bool begin_capture(CUstream stream);
  void release_capture(unsigned long long capture) noexcept;  // owners_ free what that capture recorded
  void give_back() noexcept;     // ends and releases held_ (a capture that did not happen)
  void release_held() noexcept;  // releases held_ and capture_ (its capture ended, its graph was refused)
  void abandon_capture(CUstream stream, const std::string& why);
  bool end_capture(CUstream stream);

  std::string reason_ = "not opened on device buffers";
  std::vector<const void*> key_, last_;
  std::vector<Graph> graphs_;
  CaptureResources* resources_ = nullptr;
  void* held_ = nullptr;  // the capture in progress's
  unsigned long long capture_ = 0;  // the capture in progress's id, when owners_ adopted it
  std::vector<ScratchOwner> owners_;
  uint64_t tick_ = 0;
  int64_t captures_ = 0, replays_ = 0;
};

}  // namespace leapp::pipeline_detail
