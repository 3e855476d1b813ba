// ext/pipeline/src/tensor_info.h: the dtypes a pipeline knows and its tensors' byte counts (internal).
//
// One dtype table and one overflow-checked byte count for opening nodes (open_node.cpp) and running steps
// (pipeline.cpp); TensorInfo's own members (leapp/pipeline.h) are defined beside them in tensor_info.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "description.h"
#include "leapp/pipeline.h"

namespace leapp::pipeline_detail {

struct DtypeInfo {
  const char* name;
  size_t size;
  int onnx;  ///< ONNXTensorElementDataType, 0: cannot cross an ONNX boundary (leapp/runtime/onnx_runner.py)
};

/// The entry of dtype `name`; PipelineError for a name the table lacks.
const DtypeInfo& dtype_info(const std::string& name);

/// "float32[2, 3]": a tensor's dtype and traced shape, for messages.
std::string spec_text(const TensorInfo& t);

/// The bytes of `shape` (dim 0 replaced by `batch` when given) of `element_size`-byte elements; throws
/// PipelineError when the count overflows (a hostile shape such as [2^62 + 1, 5] must not wrap to 20).
size_t checked_bytes(const TensorInfo& t, const std::vector<int64_t>& shape);

/// The TensorInfo of a description's entry, its byte count checked at the largest batch.
TensorInfo tensor_info(const Spec& s);

}  // namespace leapp::pipeline_detail
