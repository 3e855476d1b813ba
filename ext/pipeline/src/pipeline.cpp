// ext/pipeline/src/pipeline.cpp: Pipeline::open and run (see leapp/pipeline.h).
//
// Mirrors leapp/runtime/pipeline.py::load: wiring read and checked (description.cpp), then per node:
// artifact and extra files contained and digested, the node opened by its runtime. Values between
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
#include <fstream>
#include <map>
#include <set>

#include "aoti_host.h"
#include "description.h"
#include "leapp/cuda_driver.h"
#include "leapp/pipeline.h"
#include "onnx_external.h"
#include "ort_runtime.h"
#include "pyrepr.h"
#include "segment_check.h"
#include "sha256.h"
#include "step_graph.h"

namespace leapp {

using namespace pipeline_detail;

namespace {

struct DtypeInfo {
  const char* name;
  size_t size;
  int onnx;  ///< ONNXTensorElementDataType, 0: cannot cross an ONNX boundary (leapp/runtime/onnx_runner.py)
};

constexpr DtypeInfo kDtypes[] = {
    {"bool", 1, 9},         {"uint8", 1, 2},     {"int8", 1, 3},        {"int16", 2, 5},         {"int32", 4, 6},
    {"int64", 8, 7},        {"uint16", 2, 0},    {"uint32", 4, 0},      {"uint64", 8, 0},        {"float16", 2, 10},
    {"bfloat16", 2, 16},    {"float32", 4, 1},   {"float64", 8, 11},    {"complex32", 4, 0},     {"complex64", 8, 0},
    {"complex128", 16, 0},  {"float8_e4m3fn", 1, 0}, {"float8_e4m3fnuz", 1, 0}, {"float8_e5m2", 1, 0},
    {"float8_e5m2fnuz", 1, 0}};

const DtypeInfo& dtype_info(const std::string& name) {
  for (const DtypeInfo& d : kDtypes)
    if (name == d.name) return d;
  throw PipelineError("unknown dtype " + repr_str(name));  // the schema's enum has refused it already
}

std::string spec_text(const TensorInfo& t) {
  std::string out = t.dtype + "[";
  for (size_t i = 0; i < t.shape.size(); ++i) out += (i ? ", " : "") + std::to_string(t.shape[i]);
  return out + "]";
}

/// The bytes of `shape` (dim 0 replaced by `batch` when given) of `element_size`-byte elements; throws
/// PipelineError when the count overflows (a hostile shape such as [2^62 + 1, 5] must not wrap to 20).
size_t checked_bytes(const TensorInfo& t, const std::vector<int64_t>& shape) {
  size_t n = t.element_size;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, size_t(d), &n) || n > size_t(PTRDIFF_MAX))
      throw PipelineError("tensor " + repr_str(t.name) + ": " + spec_text(t) + " holds more bytes than this "
                          "machine can address");
  }
  return n;
}

TensorInfo tensor_info(const Spec& s) {
  TensorInfo t{s.name, s.dtype, s.shape, dtype_info(s.dtype).size, s.metadata, s.batch_min, s.batch_max};
  checked_bytes(t, t.shape_at(t.batch_max > 0 ? t.batch_max : 0));  // refused when the description is read
  return t;
}

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

/// NodeInfo::execution of a node PipelineOptions::only_node left unopened: no runtime, no buffers.
constexpr const char* kUnopened = "unopened";

/// A buffer owned by the pipeline: host memory or device memory from the driver.
struct OwnedBuffer {
  std::vector<uint64_t> host;  // 8-byte aligned
  CUdeviceptr device = 0;
  size_t bytes = 0;  // capacity (dynamic batch: grows with set_batch)
  void* data() { return device ? reinterpret_cast<void*>(device) : host.data(); }
};

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

/// A file a node names, as read once: `data` is what was hashed and what ONNX Runtime gets.
struct CheckedFile {
  std::string path;
  std::string data;
};

/// The steps read_checked and verify_file share: the path contained and present, before anything reads it.
std::string present_path(const Description& d, const std::string& where, const std::string& rel,
                         const std::string& field) {
  std::string path = contained_path(d.folder, rel, field + " (" + where + ")");
  if (!is_regular_file(path)) throw PipelineError(where + ": artifact " + path + " is missing");
  return path;
}

void check_digest(const std::string& where, const std::string& path, const std::string& actual,
                  const std::string& expected) {
  if (actual != expected)
    throw PipelineError(where + ": artifact " + path + " has sha256 " + actual + " but pipeline.yaml records " +
                        expected + "; the file changed after export");
}

/// leapp.pipeline_format.read_checked, same order and texts: contained, present, at most
/// LEAPP_MAX_ARTIFACT_BYTES (checked before reading), same sha256 over the bytes read.
CheckedFile read_checked(const Description& d, const std::string& where, const std::string& rel,
                         const std::string& expected, const std::string& field) {
  std::string path = present_path(d, where, rel, field);
  std::string data = read_artifact(path, where);
  const auto digest = leapp::detail::sha256(data.data(), data.size());
  check_digest(where, path, leapp::detail::to_hex(digest.data(), digest.size()), expected);
  return {path, std::move(data)};
}

/// read_checked without keeping the bytes (--check, the PT2 beside an AOTInductor package): the size limit
/// first, then the sha256 over the file read in chunks.
std::string verify_file(const Description& d, const std::string& where, const std::string& rel,
                        const std::string& expected, const std::string& field) {
  std::string path = present_path(d, where, rel, field);
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(path, ec);
  if (!ec) check_artifact_size(path, size, where);
  check_digest(where, path, sha256_file(path), expected);
  return path;
}

/// Every artifact and extra file of every node, as leapp.load checks them before opening a node.
void verify_files(const Description& d) {
  for (size_t i = 0; i < d.nodes.size(); ++i) {
    const NodeDescription& n = d.nodes[i];
    const std::string where = "pipeline '" + d.name + "' node '" + n.name + "'";
    const std::string field = d.file + ": nodes[" + std::to_string(i) + "]";
    verify_file(d, where, n.artifact, n.sha256, field + ".artifact");
    for (size_t f = 0; f < n.files.size(); ++f)
      verify_file(d, where, n.files[f].first, n.files[f].second, field + ".files[" + std::to_string(f) + "].path");
    if (n.backend == "pt2" && n.has_aoti) verify_aoti_package(d, i);
  }
}

}  // namespace

void Pipeline::check(const std::string& export_dir) { verify_files(read_description(export_dir)); }

size_t TensorInfo::byte_size() const { return checked_bytes(*this, shape); }

std::vector<int64_t> TensorInfo::shape_at(int64_t batch) const {
  std::vector<int64_t> out = shape;
  if (batch > 0 && batch_max > 0 && !out.empty()) out[0] = batch;
  return out;
}

size_t TensorInfo::byte_size(int64_t batch) const { return checked_bytes(*this, shape_at(batch)); }

struct Node {
  NodeInfo info;
  AotiModel aoti;  // a PT2 node: its AOTInductor package, run by the plugin
  std::unique_ptr<Ort::Session> session;
  std::unique_ptr<Ort::IoBinding> binding;
  std::vector<std::string> input_names, output_names;  // the model's, bound by position as leapp.load does
  std::vector<int> output_types, input_types;
  std::vector<std::pair<int, std::string>> sources;  // per input: (producer node, output) or (-1, pipeline input)
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

struct Pipeline::Impl {
  Description description;
  PipelineOptions options;
  std::unique_ptr<Ort::Env> env;
  std::vector<TensorInfo> inputs, outputs;
  std::vector<NodeInfo> node_infos;
  std::vector<Node> nodes;
  std::map<std::pair<int, std::string>, OwnedBuffer> values;  // (node, output) -> buffer
  std::set<std::pair<int, std::string>> read_by_edges;
  std::unique_ptr<Ort::MemoryInfo> memory;
  std::unique_ptr<Ort::RunOptions> run_options;  // made once ORT is loaded (its constructor calls the API)
  std::unique_ptr<Ort::RunOptions> capture_run_options;  // device runs while the stream is captured: no host wait
  bool timing = false;
  std::vector<double> seconds;
  CUcontext context = nullptr;
  CUstream own_stream = nullptr;  // kDevice without PipelineOptions::stream: the pipeline's (see pipeline.h)
  int64_t batch = 0;  // set_batch: 0 = the traced shapes
  std::unique_ptr<CaptureResources> graph_pool;  // PT2 nodes: torch's pool while a step is captured
  LibraryReferences scratch_owners;  // the op libraries graphs release scratch to; outlive `graphs`
  StepGraphs graphs;  // run() as CUDA graphs (step_graph.h); destroyed before graph_pool (it releases pools)

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

  void open_node(size_t index, const NodeDescription& d);
  std::string graph_off_reason() const;
  void adopt_captures();
  void run_nodes(const std::map<std::string, const void*>& inputs, const std::map<std::string, void*>& outputs);
  void refresh_plan();
  void run_one(Node& node, const std::vector<void*>& in, const std::vector<void*>& out);
  void run_aoti(Node& node, const std::vector<void*>& in, const std::vector<void*>& out);
};

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

namespace {

/// leapp/runtime/artifact_safety.py::check_onnx_external_data, same walk and texts: every external-data
/// location of the model must be one of the node's verified `files` (ORT keeps it in the model's folder
/// only from 1.24 on). Returns "" when the model is fine, else the refusal (after `where: `); a model
/// whose bytes are not well-formed protobuf along the walk throws std::invalid_argument.
std::string external_data_problem(const std::string& model, const std::string& bytes,
                                  const std::vector<CheckedFile>& files) {
  namespace fs = std::filesystem;
  std::set<fs::path> allowed;
  for (const CheckedFile& file : files) {
    std::error_code ec;
    fs::path p = fs::weakly_canonical(file.path, ec);
    if (!ec) allowed.insert(p);
  }
  const fs::path model_path(model);
  const std::string name = model_path.filename().string();
  struct Refused {
    std::string text;
  };
  try {  // each location is checked as the walk finds it: the first refusal ends the walk
    onnx_external_locations(bytes, [&](const std::string& place, const std::string& location) {
      const auto head = [&] { return name + ": " + place + ": external data location " + short_repr_str(location); };
      bool dotdot = false;
      for (const auto& part : fs::path(location)) dotdot = dotdot || part == "..";
      if (location.empty() || location.find('\0') != std::string::npos || location[0] == '/' || dotdot)
        throw Refused{head() + " is not a plain relative path inside the export folder"};
      std::error_code ec;
      fs::path target = fs::weakly_canonical(model_path.parent_path() / location, ec);
      if (ec || !allowed.count(target))
        throw Refused{head() + " is not one of the node's files in pipeline.yaml (files: the external data leapp "
                               "exported, each with its sha256); ONNX Runtime before 1.24 would read it wherever "
                               "it points"};
    });
  } catch (const Refused& refused) {
    return refused.text;
  }
  return "";
}

}  // namespace

void Pipeline::Impl::open_node(size_t index, const NodeDescription& d) {
  const std::string where = "pipeline '" + description.name + "' node '" + d.name + "'";
  const std::string field = description.file + ": nodes[" + std::to_string(index) + "]";
  auto verify = [&](const std::string& rel, const std::string& expected, const std::string& what) {
    return verify_file(description, where, rel, expected, what);
  };
  Node node;
  node.info.name = d.name;
  node.info.backend = d.backend;
  node.info.device = d.device;
  // An ONNX model and its files are read once: the bytes hashed are the bytes ONNX Runtime opens. Other
  // artifacts are only checked here (a PT2 node runs from its AOTInductor package, checked when opened), and
  // so are the files of a node PipelineOptions::only_node leaves unopened.
  const bool opened = options.only_node.empty() || options.only_node == d.name;
  CheckedFile model;
  std::vector<CheckedFile> checked;
  if (opened && d.backend == "onnx") {
    model = read_checked(description, where, d.artifact, d.sha256, field + ".artifact");
    node.info.artifact = model.path;
    for (size_t i = 0; i < d.files.size(); ++i) {
      checked.push_back(read_checked(description, where, d.files[i].first, d.files[i].second,
                                     field + ".files[" + std::to_string(i) + "].path"));
    }
  } else {
    node.info.artifact = verify(d.artifact, d.sha256, field + ".artifact");
    for (size_t i = 0; i < d.files.size(); ++i)
      verify(d.files[i].first, d.files[i].second, field + ".files[" + std::to_string(i) + "].path");
  }
  for (const Spec& s : d.inputs) node.info.inputs.push_back(tensor_info(s));
  for (const Spec& s : d.outputs) node.info.outputs.push_back(tensor_info(s));
  if (!opened) {
    node.info.execution = kUnopened;
    node_infos.push_back(node.info);
    nodes.push_back(std::move(node));
    return;
  }
  size_t cpu_code_segments = 0;  // the segments with CPU code for this machine
  if (d.backend == "pt2") {  // the claims: the bundles inside an AOTInductor package are out of this reader's reach
    for (const SegmentDescription& s : d.segment_list) cpu_code_segments += claims_this_machine(s.cpu_code);
  }
  const std::string cannot_open =
      where + ": cannot open " + node.info.artifact + " (onnx; is the file corrupt or truncated?): PipelineError: ";
  if (d.backend == "onnx") {  // the entries against the bundles the model holds, as leapp.load checks them
    std::vector<std::pair<std::string, const std::string*>> files;
    for (const CheckedFile& file : checked) files.emplace_back(file.path, &file.data);
    try {
      cpu_code_segments = check_onnx_segments(description, index, node.info.artifact, model.data, files);
    } catch (const std::invalid_argument& e) {
      throw PipelineError(cannot_open + std::filesystem::path(node.info.artifact).filename().string() + " is " + e.what());
    }
  }
  if (d.backend == "pt2" && d.has_aoti) {
    const bool device = options.memory == Memory::kDevice;
    const std::string op_library = torch_op_library(options.torch_op_library);
    node.aoti = open_aoti_node(description, index, aoti_plugin_path(options.aoti_plugin), op_library,
                               device ? options.device_index : -1);
    if (!device && cpu_code_segments < d.segments && !op_library_replays_on_cpu(op_library))
      throw PipelineError(where + ": " + std::to_string(d.segments - cpu_code_segments) + " of its " +
                          std::to_string(d.segments) + " Warp segment(s) hold no CPU code for this machine and replay "
                          "on CUDA devices only, and its AOTInductor package (" + d.aoti_path + ") runs on the CPU: "
                          "export the node with CPU code (trace it on the CPU, or LEAPP_CPU_CODE=1; "
                          "docs/export-cpu.md), or make its package on a CUDA device (`leapp aoti`) and open the "
                          "pipeline with device buffers (leapp-run --device cuda)");
    node.info.execution = device ? "aoti-cuda" : "aoti-cpu";
    node_infos.push_back(node.info);
    nodes.push_back(std::move(node));
    return;
  }
  if (d.backend == "pt2")
    throw PipelineError(where + ": a pt2 node (" + d.artifact + ") without an AOTInductor package; leapp's C++ runner "
                        "runs a PT2 node from the package that `leapp aoti " + description.folder + " " + d.name +
                        "` makes and records in pipeline.yaml (docs/aoti.md), or export the node with "
                        "export_with='onnx'");
  if (d.backend != "onnx")
    throw PipelineError(where + ": a " + d.backend + " node (" + d.artifact + "); leapp's C++ runner runs ONNX nodes "
                        "and PT2 nodes with an AOTInductor package (`leapp aoti`, docs/aoti.md). Export the node "
                        "with export_with='onnx' or 'pt2'");
  if (d.segments > cpu_code_segments && options.memory != Memory::kDevice) {
    // segments without CPU code: the op stages host tensors onto a CUDA device; without one, say so now, not from
    // inside a run (segments with CPU code for this machine run on the CPU, docs/export-cpu.md)
    std::string why;
    try {
      int count = 0;
      const CudaDriver& drv = driver();
      if (drv.cuDeviceGetCount(&count) != CUDA_SUCCESS || count == 0) why = "the CUDA driver reports no device";
    } catch (const std::exception& e) {
      why = e.what();
    }
    if (!why.empty())
      throw PipelineError(where + ": " + std::to_string(d.segments - cpu_code_segments) + " of its " +
                          std::to_string(d.segments) + " Warp segment(s) hold no CPU code for this machine and replay "
                          "on a CUDA device (on ONNX Runtime's CPU EP through pinned host memory), and this machine "
                          "has none: " + why);
  }
  std::string library = ort_op_library(options.ort_op_library);
  if (library.empty() && d.segments)
    throw PipelineError(where + ": the node has Warp segments and leapp's ONNX Runtime op library "
                        "libleapp_warp_ort.so was not found (next to libleapp_pipeline.so, or "
                        "$LEAPP_WARP_ONNX_CUSTOM_OP_LIBRARY)");
  std::string problem;
  try {
    problem = external_data_problem(node.info.artifact, model.data, checked);
  } catch (const std::invalid_argument& e) {
    throw PipelineError(cannot_open + std::filesystem::path(node.info.artifact).filename().string() + " is " + e.what());
  }
  if (!problem.empty()) throw PipelineError(where + ": " + problem);
  try {
    Ort::SessionOptions so;
    so.SetExecutionMode(ORT_SEQUENTIAL);
    so.SetInterOpNumThreads(1);
    so.SetIntraOpNumThreads(std::max(0, options.intra_op_threads));
    so.AddConfigEntry("session.intra_op.allow_spinning", options.spin ? "1" : "0");
    so.AddConfigEntry("session.inter_op.allow_spinning", options.spin ? "1" : "0");
    if (!library.empty()) so.RegisterCustomOpsLibrary(library.c_str());
    if (options.memory == Memory::kDevice) {
      OrtCUDAProviderOptionsV2* cuda = nullptr;
      Ort::ThrowOnError(Ort::GetApi().CreateCUDAProviderOptions(&cuda));
      std::unique_ptr<OrtCUDAProviderOptionsV2, void (*)(OrtCUDAProviderOptionsV2*)> guard(
          cuda, [](OrtCUDAProviderOptionsV2* p) { Ort::GetApi().ReleaseCUDAProviderOptions(p); });
      // use_tf32 off: float32 matmuls as torch computes them by default (leapp/runtime/onnx_runner.py)
      std::string device_id = std::to_string(options.device_index);
      const char* k[] = {"device_id", "use_tf32", "has_user_compute_stream"};
      const char* v[] = {device_id.c_str(), "0", "1"};
      Ort::ThrowOnError(Ort::GetApi().UpdateCUDAProviderOptions(cuda, k, v, 3));
      Ort::ThrowOnError(Ort::GetApi().UpdateCUDAProviderOptionsWithValue(cuda, "user_compute_stream", stream()));
      so.AppendExecutionProvider_CUDA_V2(*cuda);
      // keep a linear layer's MatMul + Add apart: ORT's CUDA Gemm with a bias is two GEMMs
      // (leapp/_export/onnx_gemm.py; the Python runner's CUDA_SESSION_CONFIG)
      so.AddConfigEntry("optimization.disable_specified_optimizers", "MatMulAddFusion");
      node.info.execution = "ort-cuda";
    } else {
      node.info.execution = "ort-cpu";
    }
    if (!checked.empty()) {  // the external data from the bytes checked, under the names the model uses
      namespace fs = std::filesystem;
      std::error_code ec;
      const fs::path model_dir = fs::weakly_canonical(fs::path(model.path).parent_path(), ec);
      std::vector<std::basic_string<ORTCHAR_T>> names;
      std::vector<char*> buffers;
      std::vector<size_t> lengths;
      for (CheckedFile& file : checked) {
        names.push_back(fs::weakly_canonical(file.path, ec).lexically_relative(model_dir).generic_string());
        buffers.push_back(file.data.data());
        lengths.push_back(file.data.size());
      }
      so.AddExternalInitializersFromFilesInMemory(names, buffers, lengths);
    }
    try {
      node.session = std::make_unique<Ort::Session>(*env, model.data.data(), model.data.size(), so);
    } catch (const Ort::Exception& e) {
      throw PipelineError("onnxruntime could not load " + node.info.artifact + ": " + ort_error_text(e));
    }
    Ort::AllocatorWithDefaultOptions allocator;
    for (size_t i = 0; i < node.session->GetInputCount(); ++i)
      node.input_names.push_back(node.session->GetInputNameAllocated(i, allocator).get());
    for (size_t i = 0; i < node.session->GetOutputCount(); ++i)
      node.output_names.push_back(node.session->GetOutputNameAllocated(i, allocator).get());
    if (node.input_names.size() != d.inputs.size() || node.output_names.size() != d.outputs.size()) {
      std::vector<std::string> ins, outs;
      for (const Spec& s : d.inputs) ins.push_back(s.name);
      for (const Spec& s : d.outputs) outs.push_back(s.name);
      throw PipelineError(node.info.artifact + ": the model has inputs " + repr_names(node.input_names) +
                          " and outputs " + repr_names(node.output_names) + ", pipeline.yaml lists " +
                          repr_names(ins) + " and " + repr_names(outs));
    }
    for (const TensorInfo& t : node.info.outputs) {
      int type = dtype_info(t.dtype).onnx;
      if (!type) throw PipelineError("dtype " + t.dtype + " cannot cross an ONNX boundary in leapp");
      node.output_types.push_back(type);
    }
    for (const TensorInfo& t : node.info.inputs) {
      int type = dtype_info(t.dtype).onnx;
      if (!type) throw PipelineError("dtype " + t.dtype + " cannot cross an ONNX boundary in leapp");
      node.input_types.push_back(type);
    }
    node.binding = std::make_unique<Ort::IoBinding>(*node.session);
  } catch (const PipelineError& e) {
    throw PipelineError(cannot_open + e.what());
  } catch (const Ort::Exception& e) {
    throw PipelineError(cannot_open + ort_error_text(e));
  }
  node_infos.push_back(node.info);
  nodes.push_back(std::move(node));
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
  impl->description = read_description(export_dir);
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
    if (!e.feedback) {  // feedback: state the caller carries between runs, a pipeline input within one
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
void Pipeline::set_timing(bool on) { impl_->timing = on; }
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
      if (node.sources[i].first < 0) node.call_in[i] = const_cast<void*>(inputs.find(node.sources[i].second)->second);
    for (size_t i = 0; i < node.direct_out.size(); ++i)
      if (node.direct_out[i] >= 0) node.call_out[i] = outputs.find(this->outputs[size_t(node.direct_out[i])].name)->second;
    run_one(node, node.call_in, node.call_out);
  }
  for (const auto& [o, src] : copied_outputs) {  // outputs that edges also read: one copy, same memory
    void* dst = outputs.find(this->outputs[o].name)->second;
    size_t bytes = this->outputs[o].byte_size(batch);
    if (options.memory == Memory::kDevice)
      LEAPP_CHECK_CU(driver().cuMemcpyDtoDAsync(CUdeviceptr(dst), CUdeviceptr(src), bytes, stream()));
    else
      std::memcpy(dst, src, bytes);
  }
}

void Pipeline::run(const std::map<std::string, const void*>& inputs, const std::map<std::string, void*>& outputs) {
  Impl& p = *impl_;
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
