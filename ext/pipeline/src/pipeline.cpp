// ext/pipeline/src/pipeline.cpp: Pipeline::open's wiring and buffers, and the steps: run, run_node, set_batch.
//
// Mirrors leapp/runtime/pipeline.py::load: wiring read and checked (description.cpp), then per node:
// artifact and extra files contained and digested, the node opened by its runtime (open_node.cpp). Values between
// nodes live in buffers owned here, in the caller's memory kind: a consumer's input is bound to its
// producer's output buffer (no copy; on the device, no host round trip), a pipeline output that no
// edge reads is bound straight to the caller's buffer.
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <new>

#include "artifact_check.h"
#include "initial_values.h"
#include "pipeline_internal.h"
#include "pyrepr.h"
#include "signed_files.h"
#include "tensor_info.h"

namespace leapp {

using namespace pipeline_detail;

namespace {

/// `host` sized for `bytes` (8-byte aligned): the buffer of node `node`'s output `t`. The reader bounded its size
/// (MAX_TENSOR_BYTES); a machine that still cannot give it gets a PipelineError naming what, not std::bad_alloc.
void host_buffer(std::vector<uint64_t>& host, size_t bytes, const std::string& pipeline, const std::string& node,
                 const TensorInfo& t) {
  try {
    host.resize((bytes + 7) / 8 + 1);
  } catch (const std::bad_alloc&) {
    throw PipelineError("pipeline '" + pipeline + "' node '" + node + "': cannot allocate " + std::to_string(bytes) +
                        " bytes for its output " + repr_str(t.name) + " (" + spec_text(t) + "): out of memory");
  }
}

void check_names(const std::vector<TensorInfo>& specs, const std::vector<std::string>& given, const std::string& where,
                 const char* what) {
  std::vector<std::string> expected, missing, unknown;
  for (const TensorInfo& s : specs) expected.push_back(s.name);
  for (const std::string& e : expected)
    if (std::find(given.begin(), given.end(), e) == given.end()) missing.push_back(e);
  for (const std::string& g : given)
    if (std::find(expected.begin(), expected.end(), g) == expected.end()) unknown.push_back(g);
  if (missing.empty() && unknown.empty()) return;
  std::sort(unknown.begin(), unknown.end());
  std::string parts;
  if (!missing.empty()) parts += "missing " + repr_names(missing);
  if (!unknown.empty()) parts += std::string(parts.empty() ? "" : ", ") + "unexpected " + repr_names(unknown);
  throw PipelineError(where + ": " + what + " " + parts + "; expected " + repr_names(expected));
}

/// Whether `given` names exactly `specs` (no allocation: the common case of every run).
template <class V>
bool same_names(const std::vector<TensorInfo>& specs, const std::map<std::string, V>& given) {
  if (given.size() != specs.size()) return false;
  for (const TensorInfo& t : specs)
    if (given.find(t.name) == given.end()) return false;
  return true;
}

template <class V>
std::vector<std::string> keys(const std::map<std::string, V>& m) {
  std::vector<std::string> out;
  for (const auto& kv : m) out.push_back(kv.first);
  return out;
}

}  // namespace

void Pipeline::check(const std::string& export_dir, const PipelineOptions& options) {
  const std::vector<std::string> keys = trusted_key_paths(options.trusted_keys);
  const Description d = read_description(export_dir, keys.empty() ? nullptr : verify_export(export_dir, keys));
  verify_files(d);
  read_initial_values(d);
}

/// A PT2 node: the plugin wraps the input buffers as tensors (no copy) and runs the package on the stream;
/// AOTInductor allocates the outputs, copied here into the pipeline's or the caller's buffers (same stream).
/// The stream goes as a handle (the caller's or the pipeline's own), never as CU_STREAM_LEGACY (0x1), a handle
/// torch would read as an invalid stream id.
void Pipeline::Impl::run_aoti(Node& node, const std::vector<void*>& in, const std::vector<void*>& out) {
  std::vector<std::vector<int64_t>> shapes;  // this batch's shapes, alive for the call
  shapes.reserve(in.size() + out.size());
  auto describe = [&](const TensorInfo& t, void* data) {
    shapes.push_back(t.shape_at(batch));
    return LeappAotiTensor{t.dtype.c_str(), shapes.back().data(), shapes.back().size(), data};
  };
  std::vector<LeappAotiTensor> inputs, outputs;
  for (size_t i = 0; i < in.size(); ++i) inputs.push_back(describe(node.info.inputs[i], in[i]));
  for (size_t i = 0; i < out.size(); ++i) outputs.push_back(describe(node.info.outputs[i], nullptr));
  char error[4096] = {0};
  const bool device = options.memory == Memory::kDevice;
  if (node.aoti.plugin->run(node.aoti.model.get(), inputs.data(), inputs.size(), outputs.data(), outputs.size(),
                            device ? static_cast<void*>(stream()) : nullptr, error, sizeof(error)) != 0)
    throw PipelineError("Pipeline '" + description.name + "' node '" + node.info.name + "' (" +
                        std::filesystem::path(node.aoti.package).filename().string() + "): " + error);
  for (size_t i = 0; i < out.size(); ++i) {
    size_t bytes = node.info.outputs[i].byte_size(batch);
    if (!bytes) continue;
    if (device)
      LEAPP_CHECK_CU(driver().cuMemcpyDtoDAsync(CUdeviceptr(out[i]), CUdeviceptr(outputs[i].data), bytes, stream()));
    else
      std::memcpy(out[i], outputs[i].data, bytes);
  }
}

/// The plan of run(): buffers of the pipeline's own values and where each caller's buffer goes. Made at open
/// and after set_batch (which may move the pipeline's buffers).
void Pipeline::Impl::refresh_plan() {
  copied_outputs.clear();
  seconds.reserve(nodes.size());
  if (!options.only_node.empty()) return;  // run() refuses; run_node takes every buffer from the caller
  for (size_t n = 0; n < nodes.size(); ++n) {
    Node& node = nodes[n];
    if (node.info.execution == kUnopened) continue;
    node.call_in.assign(node.sources.size(), nullptr);
    node.call_out.assign(node.info.outputs.size(), nullptr);
    node.direct_out.assign(node.info.outputs.size(), -1);
    for (size_t i = 0; i < node.sources.size(); ++i)
      if (node.sources[i].first >= 0) node.call_in[i] = values.at(node.sources[i]).data();
      else if (node.sources[i].first == kStateSource) node.call_in[i] = states[node.state_of[i]].buffer.data();
    for (size_t i = 0; i < node.info.outputs.size(); ++i) {
      const std::string& name = node.info.outputs[i].name;
      node.call_out[i] = values.at({int(n), name}).data();
      for (size_t o = 0; o < description.outputs.size(); ++o) {
        const PipelineOutput& po = description.outputs[o];
        if (po.node != node.info.name || po.output != name) continue;
        if (read_by_edges.count({int(n), name})) copied_outputs.emplace_back(o, node.call_out[i]);
        else node.direct_out[i] = int(o);  // no edge reads it: the caller's buffer itself
      }
    }
  }
}

void Pipeline::Impl::run_one(Node& node, const std::vector<void*>& in, const std::vector<void*>& out) {
  auto start = std::chrono::steady_clock::now();
  if (node.aoti.plugin) {
    run_aoti(node, in, out);
  } else try {
    if (node.bound_batch != batch) {  // a new batch changes every shape: bind all again
      node.bound_in.assign(in.size(), nullptr);
      node.bound_out.assign(out.size(), nullptr);
    }
    node.bound_batch = -1;  // until every binding below succeeded
    for (size_t i = 0; i < in.size(); ++i)
      if (node.bound_in[i] != in[i]) {
        node.binding->BindInput(node.input_names[i].c_str(), tensor(node.info.inputs[i], node.input_types[i], in[i]));
        node.bound_in[i] = in[i];
      }
    for (size_t i = 0; i < out.size(); ++i)
      if (node.bound_out[i] != out[i]) {
        node.binding->BindOutput(node.output_names[i].c_str(), tensor(node.info.outputs[i], node.output_types[i], out[i]));
        node.bound_out[i] = out[i];
      }
    node.bound_batch = batch;
    int capture = 0;  // CU_STREAM_CAPTURE_STATUS_NONE; a stream whose status cannot be read is taken as captured
    const bool captured = capture_run_options &&
                          (driver().cuStreamIsCapturing(stream(), &capture) != CUDA_SUCCESS || capture != 0);
    node.session->Run(captured ? *capture_run_options : *run_options, *node.binding);
  } catch (const Ort::Exception& e) {
    throw PipelineError("Pipeline '" + description.name + "' node '" + node.info.name + "' (" +
                        std::filesystem::path(node.info.artifact).filename().string() + "): " + ort_error_text(e));
  }
  if (timing) {
    if (options.memory == Memory::kDevice) LEAPP_CHECK_CU(driver().cuStreamSynchronize(stream()));
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
}

Pipeline::Pipeline(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Pipeline::~Pipeline() = default;

std::unique_ptr<Pipeline> Pipeline::open(const std::string& export_dir, const PipelineOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  // a signed export: verified before any of its files is parsed and before anything is loaded or mapped
  const std::vector<std::string> keys = trusted_key_paths(options.trusted_keys);
  impl->description = read_description(export_dir, keys.empty() ? nullptr : verify_export(export_dir, keys));
  const Description& d = impl->description;
  if (!options.only_node.empty() &&
      std::none_of(d.nodes.begin(), d.nodes.end(), [&](const NodeDescription& n) { return n.name == options.only_node; })) {
    std::vector<std::string> names;
    for (const NodeDescription& n : d.nodes) names.push_back(n.name);
    throw NodeNotFound("pipeline '" + d.name + "' has no node " + repr_str(options.only_node) + " (nodes: " +
                       repr_names(names) + ")");
  }
  load_onnxruntime(options.onnxruntime_library);
  impl->env = std::make_unique<Ort::Env>(ORT_LOGGING_LEVEL_WARNING, "leapp");
  impl->run_options = std::make_unique<Ort::RunOptions>();
  if (options.memory == Memory::kDevice) {
    // The driver first: without one, onnxruntime-gpu would not help, and the message must not suggest it.
    const CudaDriver& drv = driver();  // throws DriverUnavailable with the reason
    std::vector<std::string> providers = Ort::GetAvailableProviders();
    if (std::find(providers.begin(), providers.end(), "CUDAExecutionProvider") == providers.end())
      throw PipelineError("pipeline '" + d.name + "': device buffers need ONNX Runtime's CUDA execution provider, "
                          "which " + load_onnxruntime("") + " does not have (providers: " + repr_names(providers) +
                          "); install onnxruntime-gpu, or open with host buffers (CPU EP)");
    CUdevice device = 0;
    LEAPP_CHECK_CU(drv.cuInit(0));
    LEAPP_CHECK_CU(drv.cuDeviceGet(&device, options.device_index));
    LEAPP_CHECK_CU(drv.cuDevicePrimaryCtxRetain(&impl->context, device));  // the runtime API's (ORT's) context
    impl->make_current();
    // No stream given: one of the pipeline's own, blocking (flags 0), so that it stays ordered with the caller's
    // work on the legacy default stream as that stream itself would be, and can be captured (step_graph.h).
    if (!options.stream) LEAPP_CHECK_CU(drv.cuStreamCreate(&impl->own_stream, 0));
    impl->memory = std::make_unique<Ort::MemoryInfo>("Cuda", OrtDeviceAllocator, options.device_index, OrtMemTypeDefault);
    // While the step is captured ORT must not wait for the stream (a capture forbids it); outputs are ready in
    // stream order. Outside a capture it waits: without the wait, ORT 1.30's CUDA EP releases the pinned staging
    // buffers of some models from a host callback, whose cudaFreeHost aborts the process (CUDA error 800;
    // leapp/runtime/onnx_runner.py)
    impl->capture_run_options = std::make_unique<Ort::RunOptions>();
    impl->capture_run_options->AddConfigEntry("disable_synchronize_execution_providers", "1");
  } else {
    impl->memory = std::make_unique<Ort::MemoryInfo>(Ort::MemoryInfo::CreateCpu(OrtDeviceAllocator, OrtMemTypeDefault));
  }
  for (size_t i = 0; i < d.nodes.size(); ++i) impl->open_node(i, d.nodes[i]);
  std::map<std::string, int> index;
  for (size_t i = 0; i < d.nodes.size(); ++i) index[d.nodes[i].name] = int(i);
  for (Node& node : impl->nodes) node.sources.resize(node.info.inputs.size());
  auto input_slot = [&](const std::string& node, const std::string& input) -> std::pair<int, std::string>& {
    Node& n = impl->nodes[size_t(index[node])];
    for (size_t i = 0; i < n.info.inputs.size(); ++i)
      if (n.info.inputs[i].name == input) return n.sources[i];
    throw PipelineError("internal: unchecked wiring");
  };
  for (const Edge& e : d.edges)
    if (!e.feedback) {  // feedback: a state edge (open_states) or a value the caller carries, a pipeline input
      input_slot(e.to_node, e.to_input) = {index[e.from_node], e.from_output};
      impl->read_by_edges.insert({index[e.from_node], e.from_output});
    }
  for (const PipelineInput& in : d.inputs) {
    impl->inputs.push_back(tensor_info(in.spec));
    for (const auto& [node, input] : in.consumers) input_slot(node, input) = {-1, in.spec.name};
  }
  for (const PipelineOutput& out : d.outputs) impl->outputs.push_back(tensor_info(out.spec));
  for (size_t n = 0; n < impl->nodes.size(); ++n)
    for (const TensorInfo& t : impl->nodes[n].info.outputs) {
      if (impl->nodes[n].info.execution == kUnopened) continue;  // only_node: run() refuses, no buffers
      OwnedBuffer& b = impl->values[{int(n), t.name}];
      b.bytes = t.byte_size();
      if (options.memory == Memory::kDevice)
        LEAPP_CHECK_CU(driver().cuMemAlloc(&b.device, std::max<size_t>(t.byte_size(), 1)));
      else
        host_buffer(b.host, t.byte_size(), d.name, impl->nodes[n].info.name, t);
    }
  impl->open_states();
  impl->refresh_plan();
  const std::string off = impl->graph_off_reason();
  if (off.empty()) {
    for (const Node& node : impl->nodes)
      if (node.aoti.plugin && !impl->graph_pool) impl->graph_pool = aoti_graph_pool(node.aoti.plugin, options.device_index);
    impl->graphs.set_resources(impl->graph_pool.get());
    impl->adopt_captures();
    impl->graphs.turn_on(impl->inputs.size() + impl->outputs.size() + 1);
  } else {
    impl->graphs.turn_off(off);
  }
  return std::unique_ptr<Pipeline>(new Pipeline(std::move(impl)));
}

const std::string& Pipeline::name() const { return impl_->description.name; }
const std::vector<TensorInfo>& Pipeline::inputs() const { return impl_->inputs; }
const std::vector<TensorInfo>& Pipeline::outputs() const { return impl_->outputs; }
const std::vector<NodeInfo>& Pipeline::nodes() const { return impl_->node_infos; }
void Pipeline::set_timing(bool on) {
  std::lock_guard<std::mutex> one_at_a_time(impl_->calls);
  impl_->timing = on;
}
const std::vector<double>& Pipeline::last_node_seconds() const { return impl_->seconds; }
const std::string& Pipeline::graph_reason() const { return impl_->graphs.reason(); }
int64_t Pipeline::graph_captures() const { return impl_->graphs.captures(); }
int64_t Pipeline::graph_replays() const { return impl_->graphs.replays(); }

/// The op libraries this pipeline loaded (each links its own copy of leapp's runtime) keep the scratch of the
/// segments a step capture records for the step's graph, which releases it when the graph goes: no CUDA user
/// object ties it to the graph, whose tracking would make the driver allocate at every launch (step_graph.h).
/// A library that is not loaded, or predates these entry points, keeps its user objects.
void Pipeline::Impl::adopt_captures() {
  struct Library {
    std::string path;
    const char *adopt, *release;
  };
  const Library libraries[] = {
      {ort_op_library(options.ort_op_library), "LeappAdoptCapture", "LeappReleaseCapture"},
      {torch_op_library(options.torch_op_library), "leapp_warp_torch_adopt_capture", "leapp_warp_torch_release_capture"}};
  for (const Library& library : libraries) {
    void* handle = library.path.empty() ? nullptr : dlopen(library.path.c_str(), RTLD_NOW | RTLD_NOLOAD);
    if (!handle) continue;
    ScratchOwner owner;
    owner.adopt = reinterpret_cast<void (*)(unsigned long long)>(dlsym(handle, library.adopt));
    owner.release = reinterpret_cast<void (*)(unsigned long long)>(dlsym(handle, library.release));
    if (!owner.adopt || !owner.release) {
      dlclose(handle);
      continue;
    }
    scratch_owners.handles.push_back(handle);
    graphs.add_scratch_owner(owner);
  }
}

/// Why steps are not CUDA graphs ("" when they can be), checked once at open.
std::string Pipeline::Impl::graph_off_reason() const {
  if (options.memory != Memory::kDevice) return "host buffers (PipelineOptions::memory): CUDA graphs need kDevice";
  if (!options.only_node.empty()) return "opened for one node (PipelineOptions::only_node)";
  if (!options.cuda_graph) return "turned off (PipelineOptions::cuda_graph)";
  if (const char* env = std::getenv("LEAPP_PIPELINE_GRAPH")) {
    const std::string v = env;
    if (v == "0") return "turned off by $LEAPP_PIPELINE_GRAPH=0";
    if (v != "1" && !v.empty())
      throw PipelineError("$LEAPP_PIPELINE_GRAPH must be 0 or 1, got " + repr_str(v));
  }
  if (!driver().has_graphs() || !driver().cuGraphGetNodes)
    return "this CUDA driver lacks the graph API (cuStreamBeginCapture, cuGraphLaunch, cuGraphGetNodes)";
  for (const Node& node : nodes)
    if (!node.aoti.plugin)
      for (const TensorInfo& t : node.info.inputs)
        if (t.batch_max != 0)  // as leapp.load's plain-call graphs (leapp/runtime/pipeline.py, plain_call_graph)
          return "node '" + node.info.name + "': an ONNX node with a dynamic batch (ONNX Runtime's arena hands out "
                 "its intermediate buffers by size: after a run at another batch, a graph captured at this one "
                 "could point at memory the arena gave to something else)";
  for (const Node& node : nodes)
    if (node.aoti.plugin && !node.aoti.plugin->begin_graph_pool)
      return "node '" + node.info.name + "' runs an AOTInductor package, and the AOTInductor plugin was built "
             "without torch's CUDA allocator pools (a torch without CUDA, or CUDA's headers missing at build "
             "time), which a graph needs to own the package's memory";
  return "";
}

void Pipeline::Impl::run_nodes(const std::map<std::string, const void*>& inputs,
                               const std::map<std::string, void*>& outputs) {
  for (Node& node : nodes) {  // the plan's buffers, the caller's filled in: no allocation (refresh_plan)
    for (size_t i = 0; i < node.sources.size(); ++i)
      if (node.sources[i].first == -1) node.call_in[i] = const_cast<void*>(inputs.find(node.sources[i].second)->second);
    for (size_t i = 0; i < node.direct_out.size(); ++i)
      if (node.direct_out[i] >= 0) node.call_out[i] = outputs.find(this->outputs[size_t(node.direct_out[i])].name)->second;
    run_one(node, node.call_in, node.call_out);
  }
  for (const auto& [o, src] : copied_outputs) {  // outputs that edges also read: one copy, same memory
    void* dst = outputs.find(this->outputs[o].name)->second;
    copy(dst, src, this->outputs[o].byte_size(batch));
  }
  carry_states();  // every node ran: their updates become the next run's states (inside a step's graph too)
}

void Pipeline::Impl::copy(void* dst, const void* src, size_t bytes, bool from_host) {
  if (options.memory != Memory::kDevice) return void(std::memcpy(dst, src, bytes));
  if (from_host) LEAPP_CHECK_CU(driver().cuMemcpyHtoDAsync(CUdeviceptr(dst), src, bytes, stream()));
  else LEAPP_CHECK_CU(driver().cuMemcpyDtoDAsync(CUdeviceptr(dst), CUdeviceptr(src), bytes, stream()));
}

void Pipeline::run(const std::map<std::string, const void*>& inputs, const std::map<std::string, void*>& outputs) {
  Impl& p = *impl_;
  std::lock_guard<std::mutex> one_at_a_time(p.calls);
  auto where = [&] { return "Pipeline '" + p.description.name + "'"; };  // built for errors only
  if (!p.options.only_node.empty())
    throw PipelineError(where() + " was opened for node '" + p.options.only_node + "' alone (PipelineOptions::only_node): "
                        "run_node runs it; open without only_node to run the pipeline");
  if (!same_names(p.inputs, inputs)) check_names(p.inputs, keys(inputs), where(), "inputs");
  if (!same_names(p.outputs, outputs)) check_names(p.outputs, keys(outputs), where(), "outputs");
  p.make_current();
  p.seconds.clear();
  if (p.timing || !p.graphs.reason().empty()) return p.run_nodes(inputs, outputs);
  std::vector<const void*>& key = p.graphs.key();  // every buffer and the batch: what a graph bakes in
  size_t k = 0;
  for (const auto& [name, buffer] : inputs) key[k++] = buffer;  // std::map: in name order, the same every run
  for (const auto& [name, buffer] : outputs) key[k++] = buffer;
  key[k] = reinterpret_cast<const void*>(static_cast<intptr_t>(p.batch));
  p.graphs.run(p.stream(), [&] { p.run_nodes(inputs, outputs); });
}

void Pipeline::run_node(const std::string& name, const std::map<std::string, const void*>& inputs,
                        const std::map<std::string, void*>& outputs) {
  Impl& p = *impl_;
  std::lock_guard<std::mutex> one_at_a_time(p.calls);
  auto it = std::find_if(p.nodes.begin(), p.nodes.end(), [&](const Node& n) { return n.info.name == name; });
  if (it == p.nodes.end()) {
    std::vector<std::string> names;
    for (const Node& n : p.nodes) names.push_back(n.info.name);
    throw PipelineError("Pipeline '" + p.description.name + "': no node " + repr_str(name) + " (nodes: " +
                        repr_names(names) + ")");
  }
  auto where = [&] { return "Pipeline '" + p.description.name + "' node '" + name + "'"; };  // for errors only
  if (it->info.execution == kUnopened)
    throw PipelineError(where() + " was not opened: the pipeline was opened for node '" + p.options.only_node +
                        "' alone (PipelineOptions::only_node)");
  if (!same_names(it->info.inputs, inputs)) check_names(it->info.inputs, keys(inputs), where(), "inputs");
  if (!same_names(it->info.outputs, outputs)) check_names(it->info.outputs, keys(outputs), where(), "outputs");
  p.make_current();
  p.seconds.clear();
  Node& node = *it;  // its own vectors, filled in place: a loop of run_node allocates nothing here either
  node.alone_in.resize(node.info.inputs.size());
  node.alone_out.resize(node.info.outputs.size());
  for (size_t i = 0; i < node.info.inputs.size(); ++i)
    node.alone_in[i] = const_cast<void*>(inputs.find(node.info.inputs[i].name)->second);
  for (size_t i = 0; i < node.info.outputs.size(); ++i)
    node.alone_out[i] = outputs.find(node.info.outputs[i].name)->second;
  p.run_one(node, node.alone_in, node.alone_out);
}

std::shared_ptr<void> Pipeline::allocate(size_t bytes) {
  if (impl_->options.memory != Memory::kDevice)
    return std::shared_ptr<void>(new uint64_t[(bytes + 7) / 8 + 1](), [](void* p) { delete[] static_cast<uint64_t*>(p); });
  impl_->make_current();
  CUdeviceptr p = 0;
  LEAPP_CHECK_CU(driver().cuMemAlloc(&p, std::max<size_t>(bytes, 1)));
  CUcontext context = impl_->context;
  return std::shared_ptr<void>(reinterpret_cast<void*>(p), [context](void* q) {
    if (context) driver().cuCtxSetCurrent(context);
    driver().cuMemFree(reinterpret_cast<CUdeviceptr>(q));
  });
}

void Pipeline::upload(void* buffer, const void* host, size_t bytes) {
  if (impl_->options.memory != Memory::kDevice) return void(std::memcpy(buffer, host, bytes));
  impl_->make_current();
  LEAPP_CHECK_CU(driver().cuMemcpyHtoDAsync(reinterpret_cast<CUdeviceptr>(buffer), host, bytes, impl_->stream()));
}

void Pipeline::download(void* host, const void* buffer, size_t bytes) {
  if (impl_->options.memory != Memory::kDevice) return void(std::memcpy(host, buffer, bytes));
  impl_->make_current();
  LEAPP_CHECK_CU(driver().cuMemcpyDtoHAsync(host, reinterpret_cast<CUdeviceptr>(buffer), bytes, impl_->stream()));
}

void Pipeline::set_batch(int64_t batch) {
  Impl& p = *impl_;
  std::lock_guard<std::mutex> one_at_a_time(p.calls);
  const std::string where = "Pipeline '" + p.description.name + "'";
  int64_t lo = 0, hi = 0;
  std::string named;
  for (const NodeInfo& n : p.node_infos)
    for (const auto* side : {&n.inputs, &n.outputs})
      for (const TensorInfo& t : *side) {
        if (t.batch_max == 0) continue;
        if (hi == 0 || t.batch_min > lo) lo = t.batch_min, named = "node '" + n.name + "' " + t.name;
        if (hi == 0 || t.batch_max < hi) hi = t.batch_max, named = "node '" + n.name + "' " + t.name;
      }
  if (hi == 0) throw PipelineError(where + ": set_batch(" + std::to_string(batch) + "): the export has no dynamic "
                                   "batch (leapp.node(..., dynamic_batch=...), docs/recorder.md section 1.0)");
  if (batch < lo || batch > hi)
    throw PipelineError(where + ": batch " + std::to_string(batch) + " is outside the exported range " +
                        std::to_string(lo) + ".." + std::to_string(hi) + " (" + named + ")");
  p.make_current();
  bool synced = false;
  for (size_t n = 0; n < p.nodes.size(); ++n)
    for (const TensorInfo& t : p.nodes[n].info.outputs) {
      if (p.nodes[n].info.execution == kUnopened) continue;  // only_node: no buffers
      OwnedBuffer& b = p.values.at({int(n), t.name});
      const size_t need = t.byte_size(batch);
      if (need <= b.bytes) continue;
      if (p.options.memory == Memory::kDevice) {
        if (!synced) LEAPP_CHECK_CU(driver().cuStreamSynchronize(p.stream()));  // queued work may use the old one
        synced = true;
        CUdeviceptr grown = 0;
        LEAPP_CHECK_CU(driver().cuMemAlloc(&grown, need));
        driver().cuMemFree(b.device);
        b.device = grown;
      } else {
        host_buffer(b.host, need, p.description.name, p.nodes[n].info.name, t);
      }
      b.bytes = need;
    }
  p.batch = batch;
  p.refresh_plan();  // a grown buffer moved
  if (synced) p.graphs.clear(p.stream());  // graphs bake in the buffers that moved
}

int64_t Pipeline::batch() const { return impl_->batch; }

void Pipeline::synchronize() {
  if (impl_->options.memory != Memory::kDevice) return;
  impl_->make_current();
  LEAPP_CHECK_CU(driver().cuStreamSynchronize(impl_->stream()));
}

}  // namespace leapp
