// libleapp_pipeline_aoti.so: runs a PT2 node's AOTInductor package for libleapp_pipeline.so (aoti_plugin.h).
//
// Loaded with dlopen by the pipeline only when an export has a PT2 node with a recorded package, so the
// core runner needs no libtorch. Per node: the op library that registers leapp::warp_segment is loaded
// first (the package's proxy executor looks the op up when the package is loaded: docs/aoti.md), then
// torch::inductor::AOTIModelPackageLoader(package, "model", run_single_threaded=true, 1 runner, device).
// run_single_threaded: one Pipeline is not for concurrent runs (leapp/pipeline.h), and the thread-safe
// runner would record and wait on an event per run. Inputs are the caller's or the pipeline's buffers
// wrapped with torch::from_blob (no copy); the model runs on the caller's stream (the run's stream handle:
// the generated code sets it current for the ops, leapp's included). AOTInductor allocates its outputs; the
// pipeline copies them into its own or the caller's buffers (on the same stream), so one copy per output.
#include <dlfcn.h>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/StreamGuard.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <torch/headeronly/version.h>
#if LEAPP_AOTI_CUDA_POOLS
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "aoti_plugin.h"

namespace {

struct Model {
  std::unique_ptr<torch::inductor::AOTIModelPackageLoader> loader;
  std::string device;        // "cpu" or "cuda": the package's
  int device_index = -1;     // -1: host buffers
  std::vector<at::Tensor> outputs;  // the last run's, alive until the next run (their buffers were handed out)
};

void set_error(char* error, size_t size, const std::string& text) {
  if (!error || !size) return;
  size_t n = std::min(size - 1, text.size());
  std::memcpy(error, text.data(), n);
  error[n] = '\0';
}

bool dtype_of(const char* name, at::ScalarType* out) {
  static const std::pair<const char*, at::ScalarType> table[] = {
      {"bool", at::kBool},         {"uint8", at::kByte},        {"int8", at::kChar},
      {"int16", at::kShort},       {"int32", at::kInt},         {"int64", at::kLong},
      {"uint16", at::kUInt16},     {"uint32", at::kUInt32},     {"uint64", at::kUInt64},
      {"float16", at::kHalf},      {"bfloat16", at::kBFloat16}, {"float32", at::kFloat},
      {"float64", at::kDouble},    {"complex32", at::kComplexHalf}, {"complex64", at::kComplexFloat},
      {"complex128", at::kComplexDouble}, {"float8_e4m3fn", at::kFloat8_e4m3fn},
      {"float8_e4m3fnuz", at::kFloat8_e4m3fnuz}, {"float8_e5m2", at::kFloat8_e5m2},
      {"float8_e5m2fnuz", at::kFloat8_e5m2fnuz}};
  for (const auto& [n, t] : table)
    if (std::strcmp(n, name) == 0) return *out = t, true;
  return false;
}

std::string spec_text(const char* dtype, c10::IntArrayRef shape) {
  std::string out = std::string(dtype) + "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

bool op_registered() {
  return c10::Dispatcher::singleton().findSchema(c10::OperatorName("leapp::warp_segment", "")).has_value();
}

/// leapp::warp_segment registered once per process; the op library stays loaded (the dispatcher holds its kernels).
std::string register_op(const std::string& library) {
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  if (op_registered() || library.empty()) return "";
  if (!dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL)) {
    const char* why = dlerror();
    return "cannot load leapp's torch op library " + library + ": " + (why ? why : "dlopen failed");
  }
  if (!op_registered()) return library + " was loaded but registered no leapp::warp_segment";
  return "";
}

void* open_model(const char* package, const char* op_library, int device_index, char* error, size_t error_size) {
  try {
    std::string problem = register_op(op_library ? op_library : "");
    if (!problem.empty()) {
      set_error(error, error_size, problem);
      return nullptr;
    }
    auto model = std::make_unique<Model>();
    model->device_index = device_index;
    auto metadata = torch::inductor::AOTIModelPackageLoader::load_metadata_from_package(package, "model");
    auto key = metadata.find("AOTI_DEVICE_KEY");
    model->device = key == metadata.end() ? "" : key->second;
    const bool want_cuda = device_index >= 0;
    if (model->device != (want_cuda ? "cuda" : "cpu")) {
      set_error(error, error_size,
                "the package was compiled for " + (model->device.empty() ? std::string("an unknown device") : model->device) +
                    " (the device the node was exported on), and the pipeline runs on " +
                    (want_cuda ? "device buffers (CUDA)" : "host buffers (CPU)") +
                    "; export the node on that device and run `leapp aoti` again, or open the pipeline with " +
                    (want_cuda ? "host" : "device") + " buffers");
      return nullptr;
    }
    model->loader = std::make_unique<torch::inductor::AOTIModelPackageLoader>(
        package, "model", /*run_single_threaded=*/true, /*num_runners=*/1,
        static_cast<c10::DeviceIndex>(want_cuda ? device_index : -1));
    return model.release();
  } catch (const std::exception& e) {
    set_error(error, error_size, e.what());
    return nullptr;
  }
}

const char* model_device(void* handle) { return static_cast<Model*>(handle)->device.c_str(); }

int run_model(void* handle, const LeappAotiTensor* inputs, size_t n_inputs, LeappAotiTensor* outputs, size_t n_outputs,
              void* stream, char* error, size_t error_size) {
  Model& m = *static_cast<Model*>(handle);
  try {
    const bool cuda = m.device_index >= 0;
    const c10::Device device = cuda ? c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(m.device_index))
                                    : c10::Device(c10::kCPU);
    std::vector<at::Tensor> in;
    in.reserve(n_inputs);
    for (size_t i = 0; i < n_inputs; ++i) {
      at::ScalarType type;
      if (!dtype_of(inputs[i].dtype, &type)) throw std::invalid_argument(std::string("unknown dtype ") + inputs[i].dtype);
      in.push_back(at::from_blob(inputs[i].data, c10::IntArrayRef(inputs[i].shape, inputs[i].rank),
                                 at::TensorOptions().dtype(type).device(device)));
    }
    m.outputs.clear();  // the previous run's buffers go back to torch's allocator, in stream order
    std::vector<at::Tensor> out = m.loader->run(in, cuda ? stream : nullptr);
    if (out.size() != n_outputs)
      throw std::runtime_error("the package returned " + std::to_string(out.size()) + " outputs, pipeline.yaml lists " +
                               std::to_string(n_outputs));
    for (size_t i = 0; i < n_outputs; ++i) {
      at::ScalarType type;
      if (!dtype_of(outputs[i].dtype, &type)) throw std::invalid_argument(std::string("unknown dtype ") + outputs[i].dtype);
      c10::IntArrayRef shape(outputs[i].shape, outputs[i].rank);
      at::Tensor& t = out[i];
      if (t.scalar_type() != type || t.sizes() != shape || t.device() != device)
        throw std::runtime_error("output " + std::to_string(i) + " of the package is " +
                                 spec_text(c10::toString(t.scalar_type()), t.sizes()) + " on " + t.device().str() +
                                 ", pipeline.yaml lists " + spec_text(outputs[i].dtype, shape) + " on " + device.str());
      if (!t.is_contiguous()) {
        // a strided output made contiguous on the caller's stream. c10::cuda::getStreamFromExternal encodes an
        // external stream as its pointer; the guard is c10's device-generic one (no c10_cuda link needed).
        if (cuda) {
          c10::StreamGuard guard(c10::Stream(c10::Stream::UNSAFE, device, reinterpret_cast<c10::StreamId>(stream)));
          t = t.contiguous();
        } else {
          t = t.contiguous();
        }
      }
      outputs[i].data = t.data_ptr();
    }
    m.outputs = std::move(out);
    return 0;
  } catch (const std::exception& e) {
    set_error(error, error_size, e.what());
    return 1;
  }
}

void close_model(void* handle) { delete static_cast<Model*>(handle); }

#if LEAPP_AOTI_CUDA_POOLS
// What torch.cuda.graph does around a capture (at::cuda::CUDAGraph::capture_begin/capture_end/reset): a pool
// of its own, allocations on the capturing stream routed to it, released with the graph.
struct GraphPool {
  c10::DeviceIndex device;
  decltype(at::cuda::graph_pool_handle()) id;  // MempoolId_t (c10:: now, c10::cuda:: in older torch)
};

void* begin_graph_pool(int device_index, void* stream, char* error, size_t error_size) {
  try {
    auto pool = std::make_unique<GraphPool>(GraphPool{static_cast<c10::DeviceIndex>(device_index),
                                                      at::cuda::graph_pool_handle()});
    const auto capturing = static_cast<cudaStream_t>(stream);
    c10::cuda::CUDACachingAllocator::beginAllocateToPool(pool->device, pool->id,
                                                         [capturing](cudaStream_t s) { return s == capturing; });
    return pool.release();
  } catch (const std::exception& e) {
    set_error(error, error_size, e.what());
    return nullptr;
  }
}

void end_graph_pool(void* handle) {
  auto* pool = static_cast<GraphPool*>(handle);
  try {
    c10::cuda::CUDACachingAllocator::endAllocateToPool(pool->device, pool->id);
  } catch (...) {  // nothing to report it to: the pool is released with its graph either way
  }
}

void release_graph_pool(void* handle) {
  std::unique_ptr<GraphPool> pool(static_cast<GraphPool*>(handle));
  try {
    c10::cuda::CUDACachingAllocator::releasePool(pool->device, pool->id);
  } catch (...) {
  }
}

const LeappAotiPlugin kPlugin = {LEAPP_AOTI_PLUGIN_ABI, TORCH_VERSION, open_model, model_device, run_model, close_model,
                                 begin_graph_pool, end_graph_pool, release_graph_pool};
#else
const LeappAotiPlugin kPlugin = {LEAPP_AOTI_PLUGIN_ABI, TORCH_VERSION, open_model, model_device, run_model, close_model,
                                 nullptr, nullptr, nullptr};
#endif

}  // namespace

extern "C" __attribute__((visibility("default"))) const LeappAotiPlugin* leapp_pipeline_aoti_plugin(void) {
  return &kPlugin;
}
