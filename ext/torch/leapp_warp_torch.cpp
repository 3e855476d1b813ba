// ext/torch/leapp_warp_torch.cpp: the leapp::warp_segment operator for torch.
//
// The schema lives here, once; Python registers the fake (meta) kernel that
// reads output dtypes and shapes from `signature`.
#include <torch/library.h>
#include <ATen/ATen.h>

namespace {

std::vector<at::Tensor> warp_segment_cpu(const std::vector<at::Tensor>& inputs, const at::Tensor& bundle,
                                         c10::string_view signature) {
  (void)inputs;
  (void)bundle;
  (void)signature;
  TORCH_CHECK(false, "leapp::warp_segment: exported Warp segments replay on CUDA devices only; "
                     "the inputs are on the CPU. Move the inputs to a CUDA device.");
}

}  // namespace

TORCH_LIBRARY(leapp, m) {
  m.def("warp_segment(Tensor[] inputs, Tensor bundle, str signature) -> Tensor[]");
}

TORCH_LIBRARY_IMPL(leapp, CPU, m) { m.impl("warp_segment", &warp_segment_cpu); }
