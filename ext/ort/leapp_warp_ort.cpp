// ext/ort/leapp_warp_ort.cpp: ONNX Runtime custom-op library, domain "leapp.warp", op "WarpSegment".
//
// Node layout (docs/runtime.md, "Front ends"): inputs = the segment's tensors, then the
// bundle as a uint8 tensor (an initializer); outputs = the segment's tensors;
// string attribute `signature` (docs/bundle-format.md section 5), which gives
// the output dtypes and shapes without the bundle bytes.
//
// One op class serves two execution providers:
//   CPU EP:  host tensors, staged through pinned memory onto a CUDA device of
//            leapp's choice (env LEAPP_CUDA_DEVICE, else 0) on a pooled stream;
//   CUDA EP: device tensors, replayed on the EP's compute stream.
// Kernel creation checks the element types and shapes the graph declares for
// the node's values against the signature (ORT allocates outputs by the
// declared type, so a contradiction would be a buffer overflow); Compute checks
// the actual tensors, and that each output ORT allocated holds exactly the
// segment's bytes. Bundles are parsed once per process (keyed by digest) and
// each kernel keeps the bundle it resolved for its initializer's (pointer,
// size), so Compute only validates shapes and enqueues work. Kernels may be called from several
// threads and sessions at once: the kernel's cache has a mutex, the runtime is
// thread-safe. Every failure becomes an OrtStatus naming the node and segment.
//
// The domain object is static: ORT keeps a pointer to it in every session
// created with these options, so it must outlive them all.
#define ORT_API_MANUAL_INIT
#include <onnxruntime_cxx_api.h>
#undef ORT_API_MANUAL_INIT

#include <cstdio>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "leapp/runtime.h"

namespace {

constexpr const char* kDomain = "leapp.warp";
constexpr const char* kOpName = "WarpSegment";

struct DtypeName {
  const char* name;
  ONNXTensorElementDataType type;
};
constexpr DtypeName kDtypes[] = {
    {"float32", ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT}, {"float16", ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16},
    {"bfloat16", ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16}, {"float64", ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE},
    {"int8", ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8}, {"int16", ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16},
    {"int32", ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32}, {"int64", ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64},
    {"uint8", ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8}, {"bool", ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL},
};

ONNXTensorElementDataType onnx_type(const std::string& dtype) {
  for (const DtypeName& d : kDtypes)
    if (dtype == d.name) return d.type;
  return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
}

/// torch-style name of an ONNX element type ("float32"), as the signature spells dtypes.
std::string type_name(ONNXTensorElementDataType type) {
  for (const DtypeName& d : kDtypes)
    if (type == d.type) return d.name;
  return "ONNX element type " + std::to_string(int(type));
}

/// "float32[4, 3]"; an unknown dimension (-1) prints as "?".
std::string describe(const std::string& dtype, const std::vector<int64_t>& shape) {
  std::string s = dtype + "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + (shape[i] < 0 ? "?" : std::to_string(shape[i]));
  return s + "]";
}

/// Thrown for problems of the call's arguments (ORT_INVALID_ARGUMENT).
struct BadArgument : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

/// Thrown by the kernel's constructor with a complete message (node and segment named).
struct BadNode : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

/// What the graph declares for one input or output of the node.
struct Declared {
  ONNXType kind = ONNX_TYPE_TENSOR;
  ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;  ///< UNDEFINED: not declared
  std::vector<int64_t> shape;  ///< -1 for a symbolic or unknown dimension
};

Declared declared(const Ort::TypeInfo& info) {
  Declared d;
  d.kind = info.GetONNXType();
  if (d.kind != ONNX_TYPE_TENSOR) return d;
  auto tensor = info.GetTensorTypeAndShapeInfo();
  d.type = tensor.GetElementType();
  d.shape = tensor.GetShape();
  return d;
}

class WarpSegmentKernel {
 public:
  WarpSegmentKernel(const OrtApi& api, const OrtKernelInfo* info, bool cuda_ep) : api_(api), cuda_ep_(cuda_ep) {
    Ort::ConstKernelInfo ki(info);
    node_ = ki.GetNodeName();
    try {
      signature_ = leapp::parse_signature(ki.GetAttribute<std::string>("signature"));
    } catch (const std::exception& e) {
      throw BadNode(std::string(kDomain) + "." + kOpName + " node '" + node_ + "': bad `signature` attribute: " +
                    e.what());
    }
    check_declarations(ki);
  }

  OrtStatusPtr ComputeV2(OrtKernelContext* context) noexcept {
    try {
      compute(context);
      return nullptr;
    } catch (const leapp::DriverUnavailable& e) {
      return status(ORT_FAIL, e.what());
    } catch (const std::invalid_argument& e) {
      return status(ORT_INVALID_ARGUMENT, e.what());
    } catch (const Ort::Exception& e) {
      return status(ORT_FAIL, e.what());
    } catch (const std::exception& e) {
      return status(ORT_FAIL, e.what());
    } catch (...) {
      return status(ORT_FAIL, "unknown error");
    }
  }

 private:
  OrtStatusPtr status(OrtErrorCode code, const std::string& msg) const {
    return api_.CreateStatus(code, (where() + ": " + msg).c_str());
  }

  std::string where() const {
    return std::string(kDomain) + "." + kOpName + " node '" + node_ + "' (segment '" + signature_.segment + "')";
  }

  /// The graph's declared types and shapes of the node's values against the signature, once per
  /// kernel: a declaration that contradicts the signature would make ORT allocate (and callers
  /// read) buffers of another size than the segment writes. Unknown element types and symbolic
  /// dimensions pass; compute() checks the actual tensors.
  void check_declarations(Ort::ConstKernelInfo ki) const {
    const size_t n_in = ki.GetInputCount(), n_out = ki.GetOutputCount();
    if (n_out != signature_.outputs.size())
      throw BadNode(where() + ": has " + std::to_string(n_out) + " outputs, the segment produces " +
                    std::to_string(signature_.outputs.size()));
    if (n_in == 0) throw BadNode(where() + ": no inputs: the bundle tensor must be the last input");
    if (signature_.has_inputs && n_in - 1 != signature_.inputs.size())
      throw BadNode(where() + ": has " + std::to_string(n_in - 1) + " segment inputs (plus the bundle), the segment "
                    "takes " + std::to_string(signature_.inputs.size()));
    if (signature_.has_inputs)
      for (size_t j = 0; j + 1 < n_in; ++j)
        check_declared("input", j, ki.GetInputName(j), signature_.inputs[j], declared(ki.GetInputTypeInfo(j)));
    for (size_t j = 0; j < n_out; ++j)
      check_declared("output", j, ki.GetOutputName(j), signature_.outputs[j], declared(ki.GetOutputTypeInfo(j)));
    Declared bundle = declared(ki.GetInputTypeInfo(n_in - 1));
    if (bundle.kind != ONNX_TYPE_TENSOR ||
        (bundle.type != ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED && bundle.type != ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8))
      throw BadNode(where() + ": the last input '" + ki.GetInputName(n_in - 1) + "' is declared " +
                    declared_text(bundle) + "; it must be the uint8 bundle tensor");
  }

  /// "uint8[16, ?]"; without the brackets when the graph gives no dimensions (see check_declared).
  static std::string declared_text(const Declared& d) {
    if (d.kind != ONNX_TYPE_TENSOR) return "a non-tensor ONNX value (ONNXType " + std::to_string(int(d.kind)) + ")";
    std::string type = d.type == ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED ? "?" : type_name(d.type);
    return d.shape.empty() ? type : describe(type, d.shape);
  }

  void check_declared(const char* role, size_t j, const std::string& value, const leapp::TensorSpec& spec,
                      const Declared& d) const {
    // ORT reports a value whose shape the graph leaves unknown as rank 0, like a scalar: rank 0
    // checks nothing here (the output is allocated with the segment's shape in compute()).
    bool ok = d.kind == ONNX_TYPE_TENSOR &&
              (d.type == ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED || d.type == onnx_type(spec.dtype)) &&
              (d.shape.empty() || d.shape.size() == spec.shape.size());
    for (size_t i = 0; ok && i < d.shape.size(); ++i) ok = d.shape[i] < 0 || d.shape[i] == spec.shape[i];
    if (!ok)
      throw BadNode(where() + ": " + role + " " + std::to_string(j) + " '" + spec.name + "' (ONNX value '" + value +
                    "') is declared " + declared_text(d) + " in the graph, the segment " +
                    (role[0] == 'i' ? "reads " : "writes ") + describe(spec.dtype, spec.shape));
  }

  /// The bundle of this node's bundle input, parsed once per (pointer, size).
  std::shared_ptr<const leapp::Bundle> bundle_for(Ort::ConstValue value, void* stream) {
    auto info = value.GetTensorTypeAndShapeInfo();
    if (info.GetElementType() != ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8)
      throw BadArgument("the last input must be the uint8 bundle tensor");
    const size_t size = info.GetElementCount();
    const void* data = value.GetTensorRawData();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (bundle_ && data == bundle_data_ && size == bundle_size_) return bundle_;
    }
    std::shared_ptr<const leapp::Bundle> b = leapp::find_bundle(signature_.digest);
    std::vector<uint8_t> host;
    const bool on_gpu = value.GetTensorMemoryInfo().GetDeviceType() == OrtMemoryInfoDeviceType_GPU;
    if (on_gpu) {
      // An initializer placed on the GPU by the CUDA EP: read it back once.
      const leapp::CudaDriver& d = leapp::driver();
      host.resize(size);
      LEAPP_CHECK_CU(d.cuMemcpyDtoHAsync(host.data(), leapp::CUdeviceptr(reinterpret_cast<uintptr_t>(data)), size,
                                         static_cast<leapp::CUstream>(stream)));
      LEAPP_CHECK_CU(d.cuStreamSynchronize(static_cast<leapp::CUstream>(stream)));
      data = host.data();
    }
    if (!b || b->bytes() != std::string_view(static_cast<const char*>(data), size))
      b = leapp::intern_bundle(data, size);
    leapp::check_signature(*b, signature_);
    std::lock_guard<std::mutex> lock(mutex_);
    bundle_ = b;
    bundle_data_ = value.GetTensorRawData();
    bundle_size_ = size;
    return b;
  }

  void compute(OrtKernelContext* context) {
    Ort::KernelContext ctx(context);
    const size_t n_in = ctx.GetInputCount();
    if (n_in == 0) throw BadArgument("no inputs: the bundle tensor must be the last input");
    void* stream = cuda_ep_ ? ctx.GetGPUComputeStream() : nullptr;
    std::shared_ptr<const leapp::Bundle> bundle = bundle_for(ctx.GetInput(n_in - 1), stream);
    const leapp::Manifest& m = bundle->manifest();

    if (n_in - 1 != m.inputs.size())
      throw BadArgument("got " + std::to_string(n_in - 1) + " segment inputs (plus the bundle), the segment takes " +
                        std::to_string(m.inputs.size()));
    if (ctx.GetOutputCount() != m.outputs.size())
      throw BadArgument("has " + std::to_string(ctx.GetOutputCount()) + " outputs, the segment produces " +
                        std::to_string(m.outputs.size()));

    // Dynamic batch: the batch comes from the input the manifest names; every dim 0 with a rule follows it.
    int64_t batch = 0;
    if (m.dynamic) {
      auto info = ctx.GetInput(m.batch_input).GetTensorTypeAndShapeInfo();
      batch = leapp::segment_batch(*bundle, uint64_t(info.GetElementCount()) *
                                                leapp::dtype_itemsize(m.inputs[m.batch_input].dtype));
    }
    auto shape_at = [&](const leapp::TensorSpec& spec) {
      std::vector<int64_t> shape = spec.shape;
      if (!shape.empty()) shape[0] = m.dim0_at(spec, batch);
      return shape;
    };
    auto bytes_at = [&](const leapp::TensorSpec& spec) { return m.bytes_at(spec, batch); };
    std::vector<leapp::DeviceSpan> dev_in, dev_out;
    std::vector<leapp::HostSpan> host_in, host_out;
    for (size_t j = 0; j < m.inputs.size(); ++j) {
      const leapp::TensorSpec& spec = m.inputs[j];
      const std::vector<int64_t> want = shape_at(spec);
      Ort::ConstValue v = ctx.GetInput(j);
      auto info = v.GetTensorTypeAndShapeInfo();
      std::vector<int64_t> shape = info.GetShape();
      if (info.GetElementType() != onnx_type(spec.dtype) || shape != want)
        throw BadArgument("input " + std::to_string(j) + " '" + spec.name + "' expects " +
                          describe(spec.dtype, want) + ", got " + describe(type_name(info.GetElementType()), shape) +
                          (m.dynamic ? " (at batch " + std::to_string(batch) + ")" : std::string()));
      const void* p = v.GetTensorRawData();
      dev_in.push_back({leapp::CUdeviceptr(reinterpret_cast<uintptr_t>(p)), bytes_at(spec)});
      host_in.push_back({const_cast<void*>(p), bytes_at(spec)});
    }
    leapp::check_segment_memory(*bundle, batch);  // before ONNX Runtime allocates outputs sized by the file
    for (size_t j = 0; j < m.outputs.size(); ++j) {
      const leapp::TensorSpec& spec = m.outputs[j];
      const std::vector<int64_t> want = shape_at(spec);
      Ort::UnownedValue v = ctx.GetOutput(j, want.data(), want.size());
      // ORT allocates by the element type the graph gives the value; the segment writes bytes_at(spec).
      auto info = v.GetTensorTypeAndShapeInfo();
      if (info.GetElementType() != onnx_type(spec.dtype) || info.GetShape() != want)
        throw BadArgument("output " + std::to_string(j) + " '" + spec.name + "' is " +
                          describe(type_name(info.GetElementType()), info.GetShape()) +
                          " as ONNX Runtime allocated it, the segment writes " + describe(spec.dtype, want));
      void* p = v.GetTensorMutableRawData();
      dev_out.push_back({leapp::CUdeviceptr(reinterpret_cast<uintptr_t>(p)), bytes_at(spec)});
      host_out.push_back({p, bytes_at(spec)});
    }
    if (cuda_ep_)
      leapp::run_segment(*bundle, dev_in, dev_out, static_cast<leapp::CUstream>(stream), -1);
    else
      leapp::run_segment_host(*bundle, host_in, host_out, -1);
  }

  const OrtApi& api_;
  bool cuda_ep_;
  std::string node_;
  leapp::Signature signature_;
  std::mutex mutex_;
  std::shared_ptr<const leapp::Bundle> bundle_;
  const void* bundle_data_ = nullptr;
  size_t bundle_size_ = 0;
};

struct WarpSegmentOp : Ort::CustomOpBase<WarpSegmentOp, WarpSegmentKernel, /*WithStatus=*/true> {
  explicit WarpSegmentOp(const char* provider) : provider_(provider) {}

  OrtStatusPtr CreateKernelV2(const OrtApi& api, const OrtKernelInfo* info, void** kernel) const noexcept {
    try {
      *kernel = new WarpSegmentKernel(api, info, provider_ != nullptr);
      return nullptr;
    } catch (const BadNode& e) {
      return api.CreateStatus(ORT_INVALID_ARGUMENT, e.what());
    } catch (const std::exception& e) {
      std::string node;
      try {
        node = Ort::ConstKernelInfo(info).GetNodeName();
      } catch (...) {
      }
      return api.CreateStatus(ORT_FAIL, (std::string(kDomain) + "." + kOpName + " node '" + node + "': " + e.what())
                                            .c_str());
    }
  }

  const char* GetName() const { return kOpName; }
  const char* GetExecutionProviderType() const { return provider_; }  // nullptr = CPU EP

  size_t GetInputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetInputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED; }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t) const {
    return OrtCustomOpInputOutputCharacteristic::INPUT_OUTPUT_VARIADIC;
  }
  int GetVariadicInputMinArity() const { return 1; }  // at least the bundle
  bool GetVariadicInputHomogeneity() const { return false; }

  size_t GetOutputTypeCount() const { return 1; }
  ONNXTensorElementDataType GetOutputType(size_t) const { return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED; }
  OrtCustomOpInputOutputCharacteristic GetOutputCharacteristic(size_t) const {
    return OrtCustomOpInputOutputCharacteristic::INPUT_OUTPUT_VARIADIC;
  }
  int GetVariadicOutputMinArity() const { return 1; }
  bool GetVariadicOutputHomogeneity() const { return false; }

 private:
  const char* provider_;
};

}  // namespace

/// leapp::release_segments for this library's own copy of the runtime (called by
/// leapp.runtime.release_segments through ctypes): the count, or -1 with the error in `error`.
extern "C" __attribute__((visibility("default"))) long long LeappReleaseSegments(const char* digest, char* error,
                                                                               size_t error_size) {
  try {
    return static_cast<long long>(leapp::release_segments(digest ? std::string_view(digest) : std::string_view()));
  } catch (const std::exception& e) {
    if (error && error_size) std::snprintf(error, error_size, "%s", e.what());
    return -1;
  }
}

/// leapp::adopt_capture / leapp::release_capture for this library's own copy of the runtime: leapp's C++
/// Pipeline owns its step graphs and says when one is gone (docs/deploy.md, "Allocations in a step").
extern "C" __attribute__((visibility("default"))) void LeappAdoptCapture(unsigned long long capture_id) {
  leapp::adopt_capture(capture_id);
}
extern "C" __attribute__((visibility("default"))) void LeappReleaseCapture(unsigned long long capture_id) {
  leapp::release_capture(capture_id);
}

extern "C" __attribute__((visibility("default"))) OrtStatus* ORT_API_CALL
RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  const OrtApi* api = api_base->GetApi(ORT_API_VERSION);
  if (api == nullptr) {
    // The running ORT is older than the headers we were built with.
    return nullptr;  // cannot even create a status without an API table
  }
  Ort::InitApi(api);
  try {
    static WarpSegmentOp cpu_op(nullptr);
    static WarpSegmentOp cuda_op("CUDAExecutionProvider");
    static Ort::CustomOpDomain domain{kDomain};
    static std::once_flag once;
    std::call_once(once, [] {
      domain.Add(&cpu_op);
      domain.Add(&cuda_op);
    });
    Ort::UnownedSessionOptions session_options(options);
    session_options.Add(domain);
  } catch (const std::exception& e) {
    return api->CreateStatus(ORT_FAIL, e.what());
  }
  return nullptr;
}
