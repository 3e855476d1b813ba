// ext/pipeline/src/open_node.cpp: Pipeline::Impl::open_node, one node of pipeline.yaml opened by its runtime.
//
// Apart from pipeline.cpp, which keeps the wiring and the steps: a node's files checked (artifact_check.h), its
// segment entries against its bundles (segment_check.h), then an ONNX Runtime session or an AOTInductor package
// (aoti_host.h), or a clear refusal of what leapp's C++ runner cannot run. Mirrors leapp/runtime/pipeline.py.
#include <algorithm>
#include <filesystem>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include "artifact_check.h"
#include "onnx_external.h"
#include "pipeline_internal.h"
#include "pyrepr.h"
#include "segment_check.h"
#include "tensor_info.h"

namespace leapp {

using namespace pipeline_detail;

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

}  // namespace leapp
