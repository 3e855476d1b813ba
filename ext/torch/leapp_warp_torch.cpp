// ext/torch/leapp_warp_torch.cpp: the leapp::warp_segment operator for torch (Python-free PT2).
//
// The schema lives here, once; Python registers the fake (meta) kernel that
// reads output dtypes and shapes from `signature`. The CUDA kernel replays
// the segment's bundle on the current CUDA stream of the inputs' device, so it
// composes with torch's stream semantics and with torch.cuda.graph capture:
// after the first call for a bundle nothing here synchronises or allocates
// (outputs come from torch's allocator, which capture redirects to its pool).
//
// The bundle tensor's bytes are copied to the host once per (data pointer,
// size, device) and parsed once per digest; the signature's digest must match,
// so a reused address never selects a stale bundle. Errors: bad inputs or
// bundles -> ValueError (TORCH_CHECK_VALUE), driver problems -> RuntimeError.
#include <ATen/ATen.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>

#if __has_include(<c10/cuda/CUDAStream.h>) && __has_include(<cuda_runtime_api.h>)
#include <c10/cuda/CUDAStream.h>
#define LEAPP_HAVE_C10_CUDA 1
#else
#define LEAPP_HAVE_C10_CUDA 0
#endif

#include "leapp/runtime.h"

namespace {

at::ScalarType scalar_type(const std::string& dtype) {
  if (dtype == "float32") return at::kFloat;
  if (dtype == "float16") return at::kHalf;
  if (dtype == "bfloat16") return at::kBFloat16;
  if (dtype == "float64") return at::kDouble;
  if (dtype == "int8") return at::kChar;
  if (dtype == "int16") return at::kShort;
  if (dtype == "int32") return at::kInt;
  if (dtype == "int64") return at::kLong;
  if (dtype == "uint8") return at::kByte;
  if (dtype == "bool") return at::kBool;
  TORCH_CHECK_VALUE(false, "leapp::warp_segment: unknown dtype '", dtype, "'");
}

std::string describe(const std::string& dtype, const std::vector<int64_t>& shape) {
  std::string s = dtype + "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Test builds only (tests/runtime/test_runtime_torch_cpu_replay.py): CPU tensors
// stand in for CUDA ones so the CUDA kernel runs against a fake libcuda.so.1
// that treats host memory as device memory. Never defined in real builds.
#ifdef LEAPP_TORCH_TEST_CPU_AS_CUDA
constexpr bool kCpuAsCuda = true;
#else
constexpr bool kCpuAsCuda = false;
#endif

/// The current CUDA stream of `device`, as a driver handle.
leapp::CUstream current_stream(const c10::Device& device) {
  if (kCpuAsCuda && device.is_cpu()) return nullptr;
#if LEAPP_HAVE_C10_CUDA
  return reinterpret_cast<leapp::CUstream>(c10::cuda::getCurrentCUDAStream(device.index()).stream());
#else
  // Without CUDA headers (a CPU build of torch's headers): the same stream
  // through the device-generic interface that torch's CUDA library registers.
  const auto* impl = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
  return reinterpret_cast<leapp::CUstream>(impl->getStream(device).native_handle());
#endif
}

struct SignatureCache {
  std::mutex mutex;
  std::unordered_map<std::string, std::shared_ptr<const leapp::Signature>> by_text;
  // (data pointer, bytes, device type, device index) of a bundle tensor -> the bundle read from it
  std::map<std::tuple<const void*, int64_t, int, int>, std::shared_ptr<const leapp::Bundle>> by_tensor;
};

SignatureCache& cache() {
  static SignatureCache* c = new SignatureCache();  // leaked: used until the process ends
  return *c;
}

std::shared_ptr<const leapp::Signature> signature_of(c10::string_view text) {
  // The op is called with the same signature text every time: each thread
  // remembers the last one and skips the copy, the hash and the lock.
  struct Last {
    std::string text;
    std::shared_ptr<const leapp::Signature> sig;
  };
  thread_local Last last;
  if (last.sig && c10::string_view(last.text) == text) return last.sig;
  std::string key(text.data(), text.size());
  SignatureCache& c = cache();
  std::shared_ptr<const leapp::Signature> sig;
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    auto it = c.by_text.find(key);
    if (it != c.by_text.end()) sig = it->second;
  }
  if (!sig) {
    auto parsed = std::make_shared<const leapp::Signature>(leapp::parse_signature(key));
    std::lock_guard<std::mutex> lock(c.mutex);
    sig = c.by_text.emplace(key, parsed).first->second;
  }
  last.text = std::move(key);
  last.sig = sig;
  return sig;
}

std::shared_ptr<const leapp::Bundle> bundle_of(const at::Tensor& bundle, const leapp::Signature& sig,
                                               leapp::CUstream stream) {
  TORCH_CHECK_VALUE(bundle.scalar_type() == at::kByte, "leapp::warp_segment '", sig.segment,
                    "': the bundle must be a uint8 tensor, got ", bundle.scalar_type());
  auto key = std::make_tuple(static_cast<const void*>(bundle.data_ptr()), bundle.numel(),
                             int(bundle.device().type()), int(bundle.device().index()));
  SignatureCache& c = cache();
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    auto it = c.by_tensor.find(key);
    if (it != c.by_tensor.end() && it->second->digest() == sig.digest) return it->second;
  }
  if (bundle.is_cuda())
    TORCH_CHECK(!leapp::stream_is_capturing(stream), "leapp::warp_segment '", sig.segment,
                "': the bundle tensor lives on ", bundle.device(),
                " and was never read before this CUDA graph capture; run the op once before capturing "
                "(reading the bundle needs a device-to-host copy, which capture forbids)");
  at::Tensor host = bundle.to(at::kCPU).contiguous();
  std::shared_ptr<const leapp::Bundle> b = leapp::intern_bundle(host.data_ptr(), size_t(host.numel()));
  leapp::check_signature(*b, sig);
  std::lock_guard<std::mutex> lock(c.mutex);
  c.by_tensor[key] = b;
  return b;
}

std::vector<at::Tensor> warp_segment_cuda_impl(const std::vector<at::Tensor>& inputs, const at::Tensor& bundle,
                                               c10::string_view signature) {
  std::shared_ptr<const leapp::Signature> sig = signature_of(signature);
  // TORCH_CHECK* evaluate their message only on failure: where() costs nothing on the hot path.
  auto where = [&] { return "leapp::warp_segment '" + sig->segment + "'"; };
  c10::Device device = inputs.empty() ? bundle.device() : inputs[0].device();
  TORCH_CHECK_VALUE(device.is_cuda() || (kCpuAsCuda && device.is_cpu()), where(), ": expects CUDA inputs, got ", device);
  leapp::CUstream stream = current_stream(device);
  std::shared_ptr<const leapp::Bundle> b = bundle_of(bundle, *sig, stream);
  const leapp::Manifest& m = b->manifest();

  TORCH_CHECK_VALUE(inputs.size() == m.inputs.size(), where(), ": expected ", m.inputs.size(), " inputs, got ",
                    inputs.size());
  std::vector<at::Tensor> dense;
  std::vector<leapp::DeviceSpan> in;
  dense.reserve(inputs.size());
  in.reserve(inputs.size());
  for (size_t j = 0; j < inputs.size(); ++j) {
    const leapp::TensorSpec& spec = m.inputs[j];
    const at::Tensor& t = inputs[j];
    TORCH_CHECK_VALUE(t.device() == device, where(), ": input ", j, " '", spec.name, "' is on ", t.device(),
                      ", input 0 on ", device, " (all inputs must be on one CUDA device)");
    TORCH_CHECK_VALUE(t.scalar_type() == scalar_type(spec.dtype) && t.sizes().equals(spec.shape), where(),
                      ": input ", j, " '", spec.name, "' expects ", describe(spec.dtype, spec.shape), ", got ",
                      t.scalar_type(), t.sizes());
    dense.push_back(t.contiguous());
    in.push_back({leapp::CUdeviceptr(reinterpret_cast<uintptr_t>(dense.back().data_ptr())), spec.bytes});
  }
  std::vector<at::Tensor> outputs;
  std::vector<leapp::DeviceSpan> out;
  outputs.reserve(m.outputs.size());
  out.reserve(m.outputs.size());
  for (const leapp::TensorSpec& spec : m.outputs) {
    outputs.push_back(at::empty(spec.shape, at::TensorOptions().dtype(scalar_type(spec.dtype)).device(device)));
    out.push_back({leapp::CUdeviceptr(reinterpret_cast<uintptr_t>(outputs.back().data_ptr())), spec.bytes});
  }
  try {
    leapp::run_segment(*b, in, out, stream, device.is_cuda() ? device.index() : 0);
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK_VALUE(false, e.what());
  } catch (const std::exception& e) {
    TORCH_CHECK(false, e.what());
  }
  return outputs;
}

std::vector<at::Tensor> warp_segment_cuda(const std::vector<at::Tensor>& inputs, const at::Tensor& bundle,
                                          c10::string_view signature) {
  try {
    return warp_segment_cuda_impl(inputs, bundle, signature);
  } catch (const c10::Error&) {
    throw;
  } catch (const std::invalid_argument& e) {  // bundle/signature parsing
    TORCH_CHECK_VALUE(false, e.what());
  } catch (const std::exception& e) {  // DriverUnavailable, CudaError
    TORCH_CHECK(false, e.what());
  }
}

[[maybe_unused]] std::vector<at::Tensor> warp_segment_cpu(const std::vector<at::Tensor>& inputs, const at::Tensor& bundle,
                                         c10::string_view signature) {
  (void)inputs;
  (void)bundle;
  std::string segment;
  try {
    segment = signature_of(signature)->segment;
  } catch (const std::exception&) {
  }
  TORCH_CHECK(false, "leapp::warp_segment '", segment,
              "': exported Warp segments replay on CUDA devices only; "
              "the inputs are on the CPU. Move the inputs to a CUDA device.");
}

/// leapp::release_segments for this library's own copy of the runtime (leapp.runtime.release_segments).
int64_t release_segments_op(const std::optional<std::string>& digest) {
  try {
    return int64_t(leapp::release_segments(digest ? std::string_view(*digest) : std::string_view()));
  } catch (const std::exception& e) {
    TORCH_CHECK(false, e.what());
  }
}

}  // namespace

TORCH_LIBRARY(leapp, m) {
  m.def("warp_segment(Tensor[] inputs, Tensor bundle, str signature) -> Tensor[]");
  m.def("release_segments(str? digest=None) -> int", &release_segments_op);
}

#ifdef LEAPP_TORCH_TEST_CPU_AS_CUDA
TORCH_LIBRARY_IMPL(leapp, CPU, m) { m.impl("warp_segment", &warp_segment_cuda); }
#else
TORCH_LIBRARY_IMPL(leapp, CPU, m) { m.impl("warp_segment", &warp_segment_cpu); }
#endif

TORCH_LIBRARY_IMPL(leapp, CUDA, m) { m.impl("warp_segment", &warp_segment_cuda); }
