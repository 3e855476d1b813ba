// ext/pipeline/src/initial_values.cpp: see initial_values.h. Each refusal repeats the text of
// leapp/pipeline_format/initial_values.py (tests/runtime/test_cpp_state.py compares them).
#include "initial_values.h"

#include <algorithm>
#include <cstdint>
#include <map>

#include "artifact_check.h"
#include "json.h"
#include "leapp/pipeline.h"
#include "pyrepr.h"
#include "tensor_info.h"

namespace leapp::pipeline_detail {
namespace {

using leapp::detail::JsonValue;
using T = JsonValue::Type;

// leapp/pipeline_format/format.py: MAX_PIPELINE_BYTES; initial_values.py: MAX_INITIAL_HEADER_BYTES
constexpr uint64_t kMaxFileBytes = uint64_t(1) << 32;
constexpr uint64_t kMaxHeaderBytes = uint64_t(16) << 20;

[[noreturn]] void fail(const std::string& text) { throw PipelineError(text); }

/// pipeline.yaml's dtype names -> safetensors' (initial_values.py: SAFETENSORS_DTYPES).
const char* safetensors_dtype(const std::string& dtype) {
  static const std::map<std::string, const char*> names = {
      {"bool", "BOOL"},   {"uint8", "U8"},     {"int8", "I8"},     {"int16", "I16"},     {"int32", "I32"},
      {"int64", "I64"},   {"uint16", "U16"},   {"uint32", "U32"},  {"uint64", "U64"},    {"float16", "F16"},
      {"bfloat16", "BF16"}, {"float32", "F32"}, {"float64", "F64"}, {"float8_e4m3fn", "F8_E4M3"},
      {"float8_e5m2", "F8_E5M2"}, {"complex64", "C64"}};
  auto it = names.find(dtype);
  return it == names.end() ? nullptr : it->second;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

/// Python's type(value).__name__ of a parsed JSON value.
const char* type_name(const JsonValue& v) {
  switch (v.type) {
    case T::kNull: return "NoneType";
    case T::kBool: return "bool";
    case T::kInt: return "int";
    case T::kFloat: return "float";
    case T::kString: return "str";
    case T::kArray: return "list";
    case T::kObject: return "dict";
  }
  return "?";
}

/// A non-negative integer of any size, as decimal digits (a JSON integer may exceed 64 bits; Python's reader
/// compares and subtracts them exactly, and so must this one to say the same).
struct Count {
  std::string digits;  // no leading zeros; "0" for zero
  static bool of(const JsonValue& v, Count& out) {  // false: not an int (bools and floats are not), or negative
    if (v.type != T::kInt) return false;
    if (!v.int_overflow) {
      if (v.integer < 0) return false;
      out.digits = std::to_string(v.integer);
      return true;
    }
    if (v.string.empty() || v.string[0] == '-') return false;
    out.digits = v.string;
    return true;
  }
  static Count of(uint64_t n) { return Count{std::to_string(n)}; }
  bool operator<(const Count& o) const {
    return digits.size() != o.digits.size() ? digits.size() < o.digits.size() : digits < o.digits;
  }
  bool operator==(const Count& o) const { return digits == o.digits; }
  bool operator!=(const Count& o) const { return digits != o.digits; }
  /// *this - o, for o <= *this.
  Count minus(const Count& o) const {
    std::string r = digits;
    int borrow = 0;
    for (size_t i = 0; i < r.size(); ++i) {
      const size_t at = r.size() - 1 - i;
      int d = (r[at] - '0') - borrow - (i < o.digits.size() ? o.digits[o.digits.size() - 1 - i] - '0' : 0);
      borrow = d < 0;
      r[at] = char('0' + (d + 10 * borrow));
    }
    const size_t first = r.find_first_not_of('0');
    return Count{first == std::string::npos ? "0" : r.substr(first)};
  }
};

struct Span {
  Count begin, end;
  std::string key;
  bool operator<(const Span& o) const {  // Python's sorted(((begin, end), key))
    if (begin != o.begin) return begin < o.begin;
    if (end != o.end) return end < o.end;
    return key < o.key;  // UTF-8 byte order is code point order
  }
};

/// initial_values._entry_span: one header entry against its state input, same order and texts.
Span entry_span(const JsonValue& entry, const StateValue& state, const std::string& node, const std::string& file) {
  const std::string at = file + ": " + repr_str(state.key) + ": ";
  bool keys = entry.type == T::kObject && entry.object.size() == 3;
  for (const char* name : {"dtype", "shape", "data_offsets"}) keys = keys && entry.find(name);
  if (!keys) fail(at + "expected an object with dtype, shape and data_offsets");
  const char* want = safetensors_dtype(state.spec.dtype);
  const JsonValue& dtype = *entry.find("dtype");
  const bool same_dtype = want ? dtype.type == T::kString && dtype.string == want : dtype.type == T::kNull;
  if (!same_dtype)
    fail(at + "dtype " + repr(dtype, false) + ", but state input " + repr_str(state.input) + " of node " + repr_str(node) +
         " is " + state.spec.dtype + " (" + (want ? want : "None") + ")");
  const JsonValue& shape = *entry.find("shape");
  bool same_shape = shape.type == T::kArray && shape.array.size() == state.spec.shape.size();
  for (size_t i = 0; same_shape && i < shape.array.size(); ++i) {
    const JsonValue& d = shape.array[i];
    same_shape = d.type == T::kInt && !d.int_overflow && d.integer == state.spec.shape[i];
  }
  if (shape.type == T::kArray)  // a float or a bool anywhere is refused even when the rest differs anyway
    for (const JsonValue& d : shape.array) same_shape = same_shape && d.type == T::kInt;
  if (!same_shape)
    fail(at + "shape " + repr(shape, false) + ", but state input " + repr_str(state.input) + " of node " + repr_str(node) +
         " has shape " + shape_text(state.spec.shape));
  const JsonValue& offsets = *entry.find("data_offsets");
  Span span{{}, {}, state.key};
  if (offsets.type != T::kArray || offsets.array.size() != 2 || offsets.array[0].type != T::kInt ||
      offsets.array[1].type != T::kInt || !Count::of(offsets.array[0], span.begin) ||
      !Count::of(offsets.array[1], span.end) || span.end < span.begin)
    fail(at + "data_offsets " + repr(offsets, false) + " must be [begin, end] with 0 <= begin <= end");
  const uint64_t size = state.bytes.size();  // set by the caller: the node input's byte count
  const Count held = span.end.minus(span.begin);
  if (held != Count::of(size))
    fail(at + "data_offsets [" + span.begin.digits + ", " + span.end.digits + "] hold " + held.digits + " bytes, " +
         state.spec.dtype + shape_text(state.spec.shape) + " is " + std::to_string(size) + " bytes");
  return span;
}

}  // namespace

void check_initial_values(const std::string& data, const std::string& file, std::vector<StateValue>& states,
                          const std::vector<std::string>& node_names) {
  if (data.size() > kMaxFileBytes)
    fail(file + ": " + std::to_string(data.size()) + " bytes, more than the " + std::to_string(kMaxFileBytes) +
         " bytes a pipeline's tensors may hold (MAX_PIPELINE_BYTES)");
  if (data.size() < 8)
    fail(file + ": " + std::to_string(data.size()) + " bytes, too short for a safetensors header length (8 bytes)");
  uint64_t n = 0;  // the header's length: checked against the bound and the file before it is used
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(data[size_t(i)]);
  if (n > kMaxHeaderBytes)
    fail(file + ": header length " + std::to_string(n) + " is more than " + std::to_string(kMaxHeaderBytes) + " bytes");
  if (n > data.size() - 8)
    fail(file + ": header length " + std::to_string(n) + " runs past the end of the file (" +
         std::to_string(data.size()) + " bytes)");
  JsonValue header;
  try {  // the bundle manifests' bounds, as Python's decode_strict_json keeps them by default
    header = leapp::detail::parse_json(std::string_view(data).substr(8, size_t(n)), file + ": header");
  } catch (const std::invalid_argument& e) {
    fail(e.what());
  }
  if (header.type != T::kObject) fail(file + ": header: expected a JSON object, got " + type_name(header));
  std::vector<std::string> keys;  // the header's tensor keys, in document order
  for (const auto& [key, value] : header.object) {
    if (key != "__metadata__") {
      keys.push_back(key);
      continue;
    }
    bool strings = value.type == T::kObject;
    for (const auto& kv : value.object) strings = strings && kv.second.type == T::kString;
    if (!strings) fail(file + ": header: __metadata__ must map names to strings");
  }
  std::vector<std::string> expected;
  for (const StateValue& s : states) expected.push_back(s.key);
  for (const std::string& key : expected)
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) {
      std::vector<std::string> sorted = keys;
      std::sort(sorted.begin(), sorted.end());
      fail(file + ": no initial value for state input " + repr_str(key) + " (keys: " + repr_names(sorted) + ")");
    }
  for (const std::string& key : keys)
    if (std::find(expected.begin(), expected.end(), key) == expected.end())
      fail(file + ": key " + repr_str(key) + " is no state input of the pipeline (state inputs: " +
           repr_names(expected) + ")");
  std::vector<Span> spans;
  for (StateValue& s : states) spans.push_back(entry_span(*header.find(s.key), s, node_names[s.node], file));
  std::vector<Span> ordered = spans;
  std::sort(ordered.begin(), ordered.end());
  Count at = Count::of(0);
  for (const Span& span : ordered) {
    if (span.begin != at)
      fail(file + ": " + repr_str(span.key) + ": data_offsets [" + span.begin.digits + ", " + span.end.digits + "] " +
           (span.begin < at ? std::string("overlaps the entry before it")
                            : "leaves a gap of " + span.begin.minus(at).digits + " bytes before it"));
    at = span.end;
  }
  const uint64_t body = data.size() - 8 - n;
  if (at != Count::of(body))
    fail(file + ": the entries' data ends at byte " + at.digits + " of " + std::to_string(body) +
         " data bytes (a file holds its entries' data and nothing else)");
  for (size_t s = 0; s < states.size(); ++s)  // every offset now lies in the data: at most `body`, no overlap
    states[s].bytes.assign(data, size_t(8 + n + std::stoull(spans[s].begin.digits)), states[s].bytes.size());
}

std::vector<StateValue> read_initial_values(const Description& d) {
  std::vector<StateValue> states;
  std::vector<std::string> node_names;
  for (const NodeDescription& node : d.nodes) node_names.push_back(node.name);
  for (const Edge& e : d.edges) {
    if (!e.state) continue;
    const size_t n = size_t(std::find(node_names.begin(), node_names.end(), e.to_node) - node_names.begin());
    const auto& inputs = d.nodes[n].inputs;  // the reader checked the edge's references
    const Spec& spec = *std::find_if(inputs.begin(), inputs.end(), [&](const Spec& s) { return s.name == e.to_input; });
    StateValue state{e.to_node + "/" + e.to_input, n, e.to_input, e.from_output, spec, {}};
    state.bytes.resize(checked_bytes(tensor_info(spec), spec.shape));  // bounded by the reader (MAX_TENSOR_BYTES)
    states.push_back(std::move(state));
  }
  if (states.empty()) return states;
  // leapp/runtime/state.py's load_state: read as an artifact is (contained, bounded, sha256), then checked
  const CheckedFile file = read_checked(d, "pipeline '" + d.name + "' initial values", d.initial_values_path,
                                        d.initial_values_sha256, d.file + ": initial_values.path");
  check_initial_values(file.data, file.path, states, node_names);
  return states;
}

}  // namespace leapp::pipeline_detail
