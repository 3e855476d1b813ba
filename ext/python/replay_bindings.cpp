// ext/python/replay_bindings.cpp: replaying a bundle from Python (device pointers or host arrays).
//
// The GIL is released while the driver works, so several Python threads can
// replay at once. Error mapping: bad inputs -> ValueError, no driver ->
// leapp._native.DriverUnavailable, driver failures -> RuntimeError.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <optional>

#include "bindings.h"
#include "leapp/runtime.h"

namespace nb = nanobind;

namespace leapp::python {
namespace {

std::vector<DeviceSpan> device_spans(const char* side, const std::vector<uint64_t>& ptrs,
                                     const std::optional<std::vector<uint64_t>>& nbytes,
                                     const std::vector<TensorSpec>& specs) {
  if (nbytes && nbytes->size() != ptrs.size())
    throw std::invalid_argument(std::string("run_segment(): ") + side + " has " + std::to_string(ptrs.size()) +
                                " pointers but " + std::to_string(nbytes->size()) + " sizes");
  std::vector<DeviceSpan> out;
  for (size_t j = 0; j < ptrs.size(); ++j) {
    // Without sizes the caller vouches for them: take the signature's.
    uint64_t bytes = nbytes ? (*nbytes)[j] : (j < specs.size() ? specs[j].bytes : 0);
    out.push_back({CUdeviceptr(ptrs[j]), bytes});
  }
  return out;
}

using HostArray = nb::ndarray<nb::device::cpu, nb::c_contig>;

}  // namespace

void bind_replay(nb::module_& m) {
  m.def(
      "run_segment",
      [](const PyBundle& b, const std::vector<uint64_t>& input_ptrs, const std::vector<uint64_t>& output_ptrs,
         uint64_t stream, int device, const std::optional<std::vector<uint64_t>>& input_nbytes,
         const std::optional<std::vector<uint64_t>>& output_nbytes) {
        const Manifest& man = b.bundle->manifest();
        std::vector<DeviceSpan> in = device_spans("input_ptrs", input_ptrs, input_nbytes, man.inputs);
        std::vector<DeviceSpan> out = device_spans("output_ptrs", output_ptrs, output_nbytes, man.outputs);
        nb::gil_scoped_release release;
        run_segment(*b.bundle, in, out, reinterpret_cast<CUstream>(uintptr_t(stream)), device);
      },
      nb::arg("bundle"), nb::arg("input_ptrs"), nb::arg("output_ptrs"), nb::arg("stream"), nb::arg("device"),
      nb::arg("input_nbytes") = nb::none(), nb::arg("output_nbytes") = nb::none(),
      "Enqueues the segment on `stream` (a CUstream as int, 0 = legacy default) of CUDA device `device` "
      "(-1: the stream's). Pointers are device addresses in signature order; sizes, when given, are checked.");

  m.def(
      "run_segment_host",
      [](const PyBundle& b, std::vector<HostArray> inputs, std::vector<HostArray> outputs, int device) {
        std::vector<HostSpan> in, out;
        for (auto& a : inputs) in.push_back({a.data(), uint64_t(a.nbytes())});
        for (auto& a : outputs) out.push_back({a.data(), uint64_t(a.nbytes())});
        nb::gil_scoped_release release;
        run_segment_host(*b.bundle, in, out, device);
      },
      // outputs: noconvert, so a non-contiguous array is a TypeError instead of a silently written copy
      nb::arg("bundle"), nb::arg("inputs"), nb::arg("outputs").noconvert(), nb::arg("device") = -1,
      "Runs the segment on C-contiguous host arrays (staged through pinned memory) and waits; "
      "`outputs` are written in place. device -1: env LEAPP_CUDA_DEVICE, else 0.");

  m.def(
      "run_segment_cpu",
      [](const PyBundle& b, const std::vector<uint64_t>& input_ptrs, const std::vector<uint64_t>& output_ptrs,
         const std::vector<uint64_t>& input_nbytes, const std::vector<uint64_t>& output_nbytes) {
        if (input_nbytes.size() != input_ptrs.size() || output_nbytes.size() != output_ptrs.size())
          throw std::invalid_argument("run_segment_cpu(): one size per pointer");
        std::vector<HostSpan> in, out;
        for (size_t j = 0; j < input_ptrs.size(); ++j)
          in.push_back({reinterpret_cast<void*>(uintptr_t(input_ptrs[j])), input_nbytes[j]});
        for (size_t j = 0; j < output_ptrs.size(); ++j)
          out.push_back({reinterpret_cast<void*>(uintptr_t(output_ptrs[j])), output_nbytes[j]});
        nb::gil_scoped_release release;
        run_segment_cpu(*b.bundle, in, out);
      },
      nb::arg("bundle"), nb::arg("input_ptrs"), nb::arg("output_ptrs"), nb::arg("input_nbytes"),
      nb::arg("output_nbytes"),
      "Runs the segment's CPU code on host memory (addresses and sizes in signature order) on this thread; "
      "RuntimeError (cpu_code_refusal) when the bundle has none for this machine.");
  m.def(
      "check_segment_memory", [](const PyBundle& b, int64_t batch) { check_segment_memory(*b.bundle, batch); },
      nb::arg("bundle"), nb::arg("batch") = 0,
      "RuntimeError naming the segment and the sizes when a call at `batch` would take more than "
      "segment_memory_limit() (LEAPP_MAX_SEGMENT_BYTES; docs/runtime.md, \"Memory\").");
  m.def(
      "segment_memory",
      [](const PyBundle& b, int64_t batch) {
        SegmentMemory need = segment_memory(*b.bundle, batch);
        return nb::make_tuple(need.outputs, need.scratch, need.constants);
      },
      nb::arg("bundle"), nb::arg("batch") = 0, "(outputs, scratch, constants) bytes a call at `batch` takes.");
  m.def("segment_memory_limit", &segment_memory_limit, "The most one segment call may take, in bytes.");
  m.def(
      "cpu_code_refusal", [](const PyBundle& b) { return cpu_code_refusal(*b.bundle); }, nb::arg("bundle"),
      "Why the bundle's segment cannot run on this machine's CPU (\"\" when it can).");

  m.def("allocation_count", &allocation_count,
        "Device/pinned allocations the runtime made so far; constant once every (segment, device, stream) is warm.");
  m.def("free_count", &free_count, "Device/pinned frees the runtime made so far (release_segments, thread exits).");
  m.def("adopt_capture", &adopt_capture, nb::arg("capture_id"),
        "The caller owns the graph of capture `capture_id` (cuStreamGetCaptureInfo's id): calls it records keep "
        "their scratch here, without a CUDA user object, until release_capture(capture_id).");
  m.def("release_capture", &release_capture, nb::arg("capture_id"),
        "The adopted capture's graph and its instances are gone and their launches done: its scratch is freed by "
        "the next new scratch entry or release_segments().");
  m.def("interned_bundle_count", &interned_bundle_count,
        "Bundles in the process-wide table: those alive (the table holds none alive itself).");
  m.def(
      "release_segments",
      [](const std::optional<std::string>& digest) {
        nb::gil_scoped_release release;
        return release_segments(digest ? std::string_view(*digest) : std::string_view());
      },
      nb::arg("digest") = nb::none(),
      "Frees the modules, constants, scratch and idle host staging of segment `digest` (all segments when None) "
      "after waiting for calls enqueueing it and synchronising its contexts; returns how many (context, segment) "
      "preparations were released. No CUDA graph that captured them may be replayed afterwards, and no stream of "
      "those contexts may be capturing (RuntimeError then; nothing of that context is freed).");
  m.def(
      "stream_is_capturing", [](uint64_t stream) { return stream_is_capturing(reinterpret_cast<CUstream>(uintptr_t(stream))); },
      nb::arg("stream"));
}

}  // namespace leapp::python
