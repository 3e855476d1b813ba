// ext/pipeline/src/tensor_info.cpp: the dtype table and overflow-checked byte counts of a pipeline's tensors.
//
// Apart from pipeline.cpp because opening a node (open_node.cpp) and the steps (pipeline.cpp) both use them.
#include "tensor_info.h"

#include <cstdint>

#include "pyrepr.h"

namespace leapp {

namespace pipeline_detail {

namespace {

constexpr DtypeInfo kDtypes[] = {
    {"bool", 1, 9},         {"uint8", 1, 2},     {"int8", 1, 3},        {"int16", 2, 5},         {"int32", 4, 6},
    {"int64", 8, 7},        {"uint16", 2, 0},    {"uint32", 4, 0},      {"uint64", 8, 0},        {"float16", 2, 10},
    {"bfloat16", 2, 16},    {"float32", 4, 1},   {"float64", 8, 11},    {"complex32", 4, 0},     {"complex64", 8, 0},
    {"complex128", 16, 0},  {"float8_e4m3fn", 1, 0}, {"float8_e4m3fnuz", 1, 0}, {"float8_e5m2", 1, 0},
    {"float8_e5m2fnuz", 1, 0}};

}  // namespace

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

}  // namespace pipeline_detail

using pipeline_detail::checked_bytes;

size_t TensorInfo::byte_size() const { return checked_bytes(*this, shape); }

std::vector<int64_t> TensorInfo::shape_at(int64_t batch) const {
  std::vector<int64_t> out = shape;
  if (batch > 0 && batch_max > 0 && !out.empty()) out[0] = batch;
  return out;
}

size_t TensorInfo::byte_size(int64_t batch) const { return checked_bytes(*this, shape_at(batch)); }

}  // namespace leapp
