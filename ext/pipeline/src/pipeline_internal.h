// ext/pipeline/src/pipeline_internal.h: Pipeline::Impl, its nodes and its buffers (internal).
//
// Shared by the two jobs of a pipeline: opening its nodes (open_node.cpp: the files checked, ONNX Runtime
// sessions, AOTInductor packages) and running its steps (pipeline.cpp: Pipeline::open's wiring and buffers,
// run, run_node, set_batch, the step as a CUDA graph).
#pragma once

#include <dlfcn.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "aoti_host.h"
#include "description.h"
#include "leapp/cuda_driver.h"
#include "leapp/pipeline.h"
#include "ort_runtime.h"
#include "step_graph.h"

namespace leapp {

namespace pipeline_detail {

/// NodeInfo::execution of a node PipelineOptions::only_node left unopened: no runtime, no buffers.
constexpr const char* kUnopened = "unopened";
/// Node::sources' producer of an input fed by a state edge: the pipeline's state buffer.
constexpr int kStateSource = -2;


/// A buffer owned by the pipeline: host memory or device memory from the driver.
struct OwnedBuffer {
  std::vector<uint64_t> host;  // 8-byte aligned
  CUdeviceptr device = 0;
  size_t bytes = 0;  // capacity (dynamic batch: grows with set_batch)
  void* data() { return device ? reinterpret_cast<void*>(device) : host.data(); }
};

/// A state the pipeline carries (docs/deploy.md, "State"): its buffer, which the node's input reads every run and
/// the node's update output is copied into after a run that succeeded, and its initial value.
struct State {
  TensorInfo info;  // name "node/input"; the node input's dtype, shape, metadata
  int node = 0;
  std::string output;   // the node output that updates it
  std::string initial;  // initial_values.safetensors' bytes (reset())
  OwnedBuffer buffer;
};

struct Node {
  NodeInfo info;
  AotiModel aoti;  // a PT2 node: its AOTInductor package, run by the plugin
  std::unique_ptr<Ort::Session> session;
  std::unique_ptr<Ort::IoBinding> binding;
  std::vector<std::string> input_names, output_names;  // the model's, bound by position as leapp.load does
  std::vector<int> output_types, input_types;
  // per input: (producer node, output), (-1, pipeline input) or (kStateSource, index into Impl::states as text)
  std::vector<std::pair<int, std::string>> sources;
  std::vector<size_t> state_of;  // per input: its index in Impl::states when sources[i].first == kStateSource
  // run()'s plan, made once (refresh_plan): each input's and output's buffer when it is the pipeline's own,
  // and where the caller's goes; `direct_out[i]` is the pipeline output written straight into the caller's
  // buffer (-1: the pipeline's). Filled in place each run, so a step allocates nothing here.
  std::vector<void*> call_in, call_out;
  std::vector<void*> alone_in, alone_out;  // run_node's: the caller's buffers, in place (sized at open)
  std::vector<int> direct_out;
  // What the IoBinding holds (ONNX nodes): rebound only when a buffer or the batch changes, since binding
  // makes new OrtValues (heap allocations) and a control loop passes the same buffers every step.
  std::vector<void*> bound_in, bound_out;
  int64_t bound_batch = -1;
};

/// dlopen references, closed on destruction.
struct LibraryReferences {
  std::vector<void*> handles;
  LibraryReferences() = default;
  LibraryReferences(const LibraryReferences&) = delete;
  LibraryReferences& operator=(const LibraryReferences&) = delete;
  ~LibraryReferences() {
    for (void* h : handles) dlclose(h);
  }
};

}  // namespace pipeline_detail

struct Pipeline::Impl {
  pipeline_detail::Description description;
  PipelineOptions options;
  std::unique_ptr<Ort::Env> env;
  std::vector<TensorInfo> inputs, outputs;
  std::vector<NodeInfo> node_infos;
  std::vector<pipeline_detail::Node> nodes;
  std::map<std::pair<int, std::string>, pipeline_detail::OwnedBuffer> values;  // (node, output) -> buffer
  std::vector<pipeline_detail::State> states;  // in state-edge order
  std::vector<StateInfo> state_infos;
  std::set<std::pair<int, std::string>> read_by_edges;
  std::unique_ptr<Ort::MemoryInfo> memory;
  std::unique_ptr<Ort::RunOptions> run_options;  // made once ORT is loaded (its constructor calls the API)
  std::unique_ptr<Ort::RunOptions> capture_run_options;  // device runs while the stream is captured: no host wait
  bool timing = false;
  std::vector<double> seconds;
  // run, run_node, reset, set_batch and set_timing one at a time: they share the intermediate buffers, the state
  // and the step graphs (docs/deploy.md, "Threads"); a second thread waits, as with leapp.load's lock
  std::mutex calls;
  CUcontext context = nullptr;
  CUstream own_stream = nullptr;  // kDevice without PipelineOptions::stream: the pipeline's (see pipeline.h)
  int64_t batch = 0;  // set_batch: 0 = the traced shapes
  std::unique_ptr<pipeline_detail::CaptureResources> graph_pool;  // PT2 nodes: torch's pool while a step is captured
  pipeline_detail::LibraryReferences scratch_owners;  // the op libraries graphs release scratch to; outlive `graphs`
  // run() as CUDA graphs (step_graph.h); destroyed before graph_pool (it releases pools)
  pipeline_detail::StepGraphs graphs;

  // Never throws: device buffers exist only once the driver gave a context, and a destructor that threw
  // while an error from open() unwinds would end the process (exit 134) instead of reporting that error.
  ~Impl() {
    try {
      graphs.clear(stream());  // before the nodes: a graph's release goes to the PT2 nodes' plugin
    } catch (...) {
    }
    nodes.clear();
    if (options.memory != Memory::kDevice || context == nullptr) return;
    try {
      const CudaDriver& d = driver();
      for (auto& kv : values)
        if (kv.second.device) d.cuMemFree(kv.second.device);
      for (auto& state : states)
        if (state.buffer.device) d.cuMemFree(state.buffer.device);
      if (own_stream) d.cuStreamDestroy(own_stream);
    } catch (...) {  // the driver failed after the buffers were made: nothing left to free them with
    }
  }

  /// The pipeline's context current on this thread; set only when it is not already (a step calls this twice,
  /// run and synchronize, and the driver may allocate on a switch).
  void make_current() const {
    if (!context) return;
    CUcontext current = nullptr;
    if (driver().cuCtxGetCurrent(&current) == CUDA_SUCCESS && current == context) return;
    LEAPP_CHECK_CU(driver().cuCtxSetCurrent(context));
  }

  CUstream stream() const {
    if (options.stream) return reinterpret_cast<CUstream>(options.stream);
    return own_stream ? own_stream : cu_stream_legacy();
  }

  Ort::Value tensor(const TensorInfo& t, int onnx_type, void* data) const {
    const std::vector<int64_t> shape = t.shape_at(batch);
    return Ort::Value::CreateTensor(*memory, data, t.byte_size(batch), shape.data(), shape.size(),
                                    ONNXTensorElementDataType(onnx_type));
  }

  // Pipeline outputs that edges also read: (output index, the pipeline's buffer), copied after the nodes run.
  std::vector<std::pair<size_t, void*>> copied_outputs;

  void open_node(size_t index, const pipeline_detail::NodeDescription& d);
  std::string graph_off_reason() const;
  void adopt_captures();
  void run_nodes(const std::map<std::string, const void*>& inputs, const std::map<std::string, void*>& outputs);
  void copy(void* dst, const void* src, size_t bytes, bool from_host = false);  // on the stream (kDevice)
  pipeline_detail::State& state_named(const std::string& name, const char* call);
  void open_states();   // pipeline_state.cpp: initial values read, buffers made, inputs wired to them
  void carry_states();  // after a run's nodes: each update copied into its state's buffer
  void refresh_plan();
  void run_one(pipeline_detail::Node& node, const std::vector<void*>& in, const std::vector<void*>& out);
  void run_aoti(pipeline_detail::Node& node, const std::vector<void*>& in, const std::vector<void*>& out);
};

}  // namespace leapp
