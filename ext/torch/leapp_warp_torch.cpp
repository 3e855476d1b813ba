// ext/torch/leapp_warp_torch.cpp: the leapp::warp_segment operator for torch (Python-free PT2).
//
// The schema lives here, once; Python registers the fake (meta) kernel that
// reads output dtypes and shapes from `signature`. The CUDA kernel replays
// the segment's bundle on the current CUDA stream of the inputs' device, so it
// composes with torch's stream semantics and with torch.cuda.graph capture:
// after the first call for a bundle nothing here synchronises or allocates
// (outputs come from torch's allocator, which capture redirects to its pool).
//
// The bundle tensor's bytes are copied to the host once per tensor identity
// (its StorageImpl, data pointer, sizes, strides and device, plus torch's
// version counter, which in-place writes bump) and parsed once per digest.
// The cache holds a strong reference to the storage (a bounded number of
// entries), so its address cannot be reused by another storage while an entry
// names it: a tensor freed and reallocated at the same address is read anew
// (strong, bounded references need no assumption about how torch ends a
// storage's life; the price is up to that many bundles kept). Every call checks the
// signature against the bundle; each thread remembers the last few (tensor
// identity, signature) pairs that passed, so the hot path takes no lock and
// compares a handful of words. Errors: bad inputs or bundles -> ValueError
// (TORCH_CHECK_VALUE), driver problems -> RuntimeError.
#include <ATen/ATen.h>
#include <c10/util/SmallVector.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include <algorithm>
#include <array>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

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

std::string describe(const std::string& dtype, c10::IntArrayRef shape) {
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

/// What identifies the bytes of a bundle tensor as the cache last read them.
struct TensorIdentity {
  // Strong: the storage (and so its address) stays while this exists, so no other storage can
  // have its address. Entries are bounded (kCachedTensors, kRemembered per thread).
  c10::Storage storage;
  const void* data = nullptr;
  int64_t numel = 0;
  int64_t stride = 0;
  c10::Device device{c10::DeviceType::CPU};
  bool versioned = false;  ///< false for inference tensors, which have no version counter
  uint32_t version = 0;

  static TensorIdentity of(const at::Tensor& t) {
    TensorIdentity id;
    id.storage = t.storage();
    id.data = t.const_data_ptr();
    id.numel = t.numel();
    id.stride = t.dim() == 1 ? t.stride(0) : 0;
    id.device = t.device();
    id.versioned = !t.is_inference();
    id.version = id.versioned ? t.unsafeGetTensorImpl()->version_counter().current_version() : 0;
    return id;
  }

  /// Whether `t` (a 1-D strided tensor) is this tensor with the same bytes, as far as torch can tell.
  bool matches(const at::Tensor& t) const {
    const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
    return storage.unsafeGetStorageImpl() == impl->storage().unsafeGetStorageImpl() && data == t.const_data_ptr() &&
           numel == t.numel() && stride == t.stride(0) && device == t.device() &&
           versioned == !t.is_inference() && (!versioned || version == impl->version_counter().current_version());
  }

  /// The same view of the same storage (perhaps another version of its bytes).
  bool same_view(const TensorIdentity& o) const {
    return storage.unsafeGetStorageImpl() == o.storage.unsafeGetStorageImpl() && data == o.data && numel == o.numel &&
           stride == o.stride && device == o.device;
  }
};

constexpr size_t kCachedTensors = 64;  // bundle tensors kept read (a PT2 program holds one per segment)

struct SignatureCache {
  std::mutex mutex;
  std::unordered_map<std::string, std::shared_ptr<const leapp::Signature>> by_text;
  // bundle tensors read so far, oldest first (at most kCachedTensors)
  std::vector<std::pair<TensorIdentity, std::shared_ptr<const leapp::Bundle>>> by_tensor;
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

struct ReadBundle {
  TensorIdentity tensor;  ///< as of before the bytes were read: a write racing with the read is seen next call
  std::shared_ptr<const leapp::Bundle> bundle;
};

/// The bundle `bundle` holds: from the process-wide cache (another thread may have read it),
/// else read (device-to-host) and parsed.
ReadBundle read_bundle(const at::Tensor& bundle, const leapp::Signature& sig, leapp::CUstream stream) {
  SignatureCache& c = cache();
  {
    std::lock_guard<std::mutex> lock(c.mutex);
    for (const auto& [id, b] : c.by_tensor)
      if (id.matches(bundle)) return {id, b};  // the caller checks it against the signature
  }
  if (bundle.is_cuda())
    TORCH_CHECK(!leapp::stream_is_capturing(stream), "leapp::warp_segment '", sig.segment,
                "': the bundle tensor lives on ", bundle.device(),
                " and was never read before this CUDA graph capture; run the op once before capturing "
                "(reading the bundle needs a device-to-host copy, which capture forbids)");
  ReadBundle r{TensorIdentity::of(bundle), nullptr};
  at::Tensor host = bundle.to(at::kCPU).contiguous();
  r.bundle = leapp::intern_bundle(host.data_ptr(), size_t(host.numel()));
  std::lock_guard<std::mutex> lock(c.mutex);
  auto& v = c.by_tensor;
  v.erase(std::remove_if(v.begin(), v.end(),
                         [&](const auto& e) { return e.first.same_view(r.tensor); }),
          v.end());
  if (v.size() >= kCachedTensors) v.erase(v.begin());  // the oldest goes, and with it its storage reference
  v.emplace_back(r.tensor, r.bundle);
  return r;
}

/// The bundle for a call, checked against `sig` (signature_of() interns signatures, so `sig`'s
/// address names its text). Each thread keeps its last few (tensor, signature) pairs that passed.
std::shared_ptr<const leapp::Bundle> bundle_of(const at::Tensor& bundle, const leapp::Signature& sig,
                                               leapp::CUstream stream) {
  struct Passed {
    TensorIdentity tensor;
    const leapp::Signature* sig = nullptr;
    std::shared_ptr<const leapp::Bundle> bundle;
  };
  constexpr size_t kRemembered = 8;  // a PT2 graph calls the op once per segment, in turn
  thread_local std::array<Passed, kRemembered> passed;
  thread_local size_t next = 0;

  TORCH_CHECK_VALUE(bundle.scalar_type() == at::kByte, "leapp::warp_segment '", sig.segment,
                    "': the bundle must be a uint8 tensor, got ", bundle.scalar_type());
  TORCH_CHECK_VALUE(bundle.layout() == at::kStrided && bundle.dim() == 1 && !bundle.is_meta(),
                    "leapp::warp_segment '", sig.segment, "': the bundle must be a 1-D dense uint8 tensor with data, "
                    "got a ", bundle.dim(), "-D ", bundle.layout(), " tensor on ", bundle.device(),
                    bundle.is_meta() ? " (meta tensors hold no bytes)" : "");
  for (const Passed& p : passed)
    if (p.sig == &sig && p.bundle && p.tensor.matches(bundle)) return p.bundle;

  ReadBundle r = read_bundle(bundle, sig, stream);
  leapp::check_signature(*r.bundle, sig);
  passed[next++ % kRemembered] = Passed{std::move(r.tensor), &sig, r.bundle};
  return r.bundle;
}

/// The op on CUDA tensors (run_segment on the current stream), or with `cpu_code` on CPU tensors (the bundle's
/// CPU code, run_segment_cpu on this thread): the same checks, the same outputs.
std::vector<at::Tensor> warp_segment_impl(const std::vector<at::Tensor>& inputs, const at::Tensor& bundle,
                                          c10::string_view signature, bool cpu_code) {
  std::shared_ptr<const leapp::Signature> sig = signature_of(signature);
  // TORCH_CHECK* evaluate their message only on failure: where() costs nothing on the hot path.
  auto where = [&] { return "leapp::warp_segment '" + sig->segment + "'"; };
  c10::Device device = inputs.empty() ? bundle.device() : inputs[0].device();
  if (cpu_code) {
    TORCH_CHECK_VALUE(device.is_cpu(), where(), ": expects CPU inputs, got ", device);
  } else {
    TORCH_CHECK_VALUE(device.is_cuda() || (kCpuAsCuda && device.is_cpu()), where(), ": expects CUDA inputs, got ",
                      device);
  }
  leapp::CUstream stream = cpu_code ? nullptr : current_stream(device);
  std::shared_ptr<const leapp::Bundle> b = bundle_of(bundle, *sig, stream);
  const leapp::Manifest& m = b->manifest();
  if (cpu_code && !leapp::runs_on_this_cpu(*b)) {
    TORCH_CHECK(false, leapp::cpu_code_refusal(*b), "; the inputs are on the CPU: move them to a CUDA device");
  }

  TORCH_CHECK_VALUE(inputs.size() == m.inputs.size(), where(), ": expected ", m.inputs.size(), " inputs, got ",
                    inputs.size());
  // Dynamic batch: the batch comes from the input the manifest names; every shape's dim 0 follows it.
  int64_t batch = 0;
  if (m.dynamic) {
    const at::Tensor& t = inputs[m.batch_input];
    const leapp::TensorSpec& spec = m.inputs[m.batch_input];
    TORCH_CHECK_VALUE(t.dim() == int64_t(spec.shape.size()) && t.dim() > 0, where(), ": input ", m.batch_input, " '",
                      spec.name, "' expects ", spec.shape.size(), " dims (dim 0 follows the batch), got ", t.sizes());
    try {
      batch = leapp::segment_batch(*b, uint64_t(t.numel()) * t.element_size());
    } catch (const std::invalid_argument& e) {
      TORCH_CHECK_VALUE(false, e.what());
    }
  }
  // A shape at this call's batch (dynamic bundles only; a fixed one's shapes are used in place, uncopied).
  auto shape_at = [&](const leapp::TensorSpec& spec) {
    c10::SmallVector<int64_t, 8> shape(spec.shape.begin(), spec.shape.end());
    if (!shape.empty()) shape[0] = m.dim0_at(spec, batch);
    return shape;
  };
  auto bytes_at = [&](const leapp::TensorSpec& spec) { return m.bytes_at(spec, batch); };
  // Per-call host state without heap allocations at a steady arity: the spans are reused per thread
  // (run_segment never calls back into the op), contiguous inputs are kept alive until the replay is queued.
  c10::SmallVector<at::Tensor, 8> dense;
  thread_local std::vector<leapp::DeviceSpan> in, out;
  in.clear();
  out.clear();
  for (size_t j = 0; j < inputs.size(); ++j) {
    const leapp::TensorSpec& spec = m.inputs[j];
    const at::Tensor& t = inputs[j];
    TORCH_CHECK_VALUE(t.device() == device, where(), ": input ", j, " '", spec.name, "' is on ", t.device(),
                      ", input 0 on ", device, " (all inputs must be on one CUDA device)");
    c10::SmallVector<int64_t, 8> at_batch;
    c10::IntArrayRef want = spec.shape;
    if (m.dynamic) want = at_batch = shape_at(spec);
    TORCH_CHECK_VALUE(t.scalar_type() == scalar_type(spec.dtype) && t.sizes().equals(want), where(),
                      ": input ", j, " '", spec.name, "' expects ", describe(spec.dtype, want), ", got ",
                      t.scalar_type(), t.sizes(), m.dynamic ? " (at batch " + std::to_string(batch) + ")" : "");
    dense.push_back(t.contiguous());
    in.push_back({leapp::CUdeviceptr(reinterpret_cast<uintptr_t>(dense.back().data_ptr())), bytes_at(spec)});
  }
  try {
    leapp::check_segment_memory(*b, batch);  // before the outputs, sized by the file, are allocated
  } catch (const std::runtime_error& e) {
    TORCH_CHECK(false, e.what());
  }
  std::vector<at::Tensor> outputs;
  outputs.reserve(m.outputs.size());
  for (const leapp::TensorSpec& spec : m.outputs) {
    const auto options = at::TensorOptions().dtype(scalar_type(spec.dtype)).device(device);
    outputs.push_back(m.dynamic ? at::empty(shape_at(spec), options) : at::empty(spec.shape, options));
    out.push_back({leapp::CUdeviceptr(reinterpret_cast<uintptr_t>(outputs.back().data_ptr())), bytes_at(spec)});
  }
  try {
    if (cpu_code) {
      thread_local std::vector<leapp::HostSpan> host_in, host_out;
      host_in.clear();
      host_out.clear();
      for (const auto& span : in) host_in.push_back({reinterpret_cast<void*>(uintptr_t(span.ptr)), span.bytes});
      for (const auto& span : out) host_out.push_back({reinterpret_cast<void*>(uintptr_t(span.ptr)), span.bytes});
      leapp::run_segment_cpu(*b, host_in, host_out);
    } else {
      leapp::run_segment(*b, in, out, stream, device.is_cuda() ? device.index() : 0);
    }
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK_VALUE(false, e.what());
  } catch (const std::exception& e) {
    TORCH_CHECK(false, e.what());
  }
  return outputs;
}

std::vector<at::Tensor> warp_segment_checked(const std::vector<at::Tensor>& inputs, const at::Tensor& bundle,
                                             c10::string_view signature, bool cpu_code) {
  try {
    return warp_segment_impl(inputs, bundle, signature, cpu_code);
  } catch (const c10::Error&) {
    throw;
  } catch (const std::invalid_argument& e) {  // bundle/signature parsing
    TORCH_CHECK_VALUE(false, e.what());
  } catch (const std::exception& e) {  // DriverUnavailable, CudaError
    TORCH_CHECK(false, e.what());
  }
}

std::vector<at::Tensor> warp_segment_cuda(const std::vector<at::Tensor>& inputs, const at::Tensor& bundle,
                                          c10::string_view signature) {
  return warp_segment_checked(inputs, bundle, signature, false);
}

[[maybe_unused]] std::vector<at::Tensor> warp_segment_cpu(const std::vector<at::Tensor>& inputs,
                                                          const at::Tensor& bundle, c10::string_view signature) {
  return warp_segment_checked(inputs, bundle, signature, true);
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

/// Whether this library's CPU kernel replays segments on a fake driver (only the tests' build): leapp's C++
/// pipeline asks before it opens a CPU AOTInductor package whose node has Warp segments. Without it, the CPU
/// kernel runs a segment's CPU code, so the pipeline asks whether every segment of the node has CPU code for
/// this machine (or launches no kernel) instead (leapp::runs_on_this_cpu).
extern "C" __attribute__((visibility("default"))) int leapp_warp_torch_replays_on_cpu() {
#ifdef LEAPP_TORCH_TEST_CPU_AS_CUDA
  return 1;
#else
  return 0;
#endif
}

/// leapp::adopt_capture / leapp::release_capture for this library's own copy of the runtime: leapp's C++
/// Pipeline owns its step graphs and says when one is gone (docs/deploy.md, "Allocations in a step").
extern "C" __attribute__((visibility("default"))) void leapp_warp_torch_adopt_capture(unsigned long long capture_id) {
  leapp::adopt_capture(capture_id);
}
extern "C" __attribute__((visibility("default"))) void leapp_warp_torch_release_capture(unsigned long long capture_id) {
  leapp::release_capture(capture_id);
}

TORCH_LIBRARY_IMPL(leapp, CUDA, m) { m.impl("warp_segment", &warp_segment_cuda); }
