// ext/pipeline/src/onnx_external.cpp: see onnx_external.h. Field numbers from onnx.proto (onnx 1.16+).
#include "onnx_external.h"

#include <cstdint>
#include <cstdlib>
#include <stdexcept>

#include "pyrepr.h"

namespace leapp::pipeline_detail {
namespace {

constexpr int kMaxDepth = 100;  // protobuf's own default recursion limit

/// One field of a message: its number and, for the length-delimited ones, its bytes; varints' values.
struct Field {
  uint32_t number = 0;
  int wire = 0;
  std::string_view bytes;
  uint64_t value = 0;
};

[[noreturn]] void malformed(const std::string& what) { throw std::invalid_argument("not a well-formed ONNX model: " + what); }

uint64_t varint(std::string_view data, size_t& pos) {
  uint64_t v = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (pos >= data.size()) malformed("a varint runs past the end");
    const auto byte = static_cast<uint8_t>(data[pos++]);
    v |= uint64_t(byte & 0x7f) << shift;
    if (!(byte & 0x80)) return v;
  }
  malformed("a varint longer than 10 bytes");
}

/// The fields of `data`, in order. Groups (wire types 3 and 4, which ONNX never uses) are refused.
std::vector<Field> fields(std::string_view data) {
  std::vector<Field> out;
  size_t pos = 0;
  while (pos < data.size()) {
    const uint64_t tag = varint(data, pos);
    Field f;
    f.number = uint32_t(tag >> 3);
    f.wire = int(tag & 7);
    if (f.number == 0 || (tag >> 3) > 0x1fffffff) malformed("field number 0 or above 2^29");
    switch (f.wire) {
      case 0: f.value = varint(data, pos); break;
      case 1:
        if (data.size() - pos < 8) malformed("a fixed64 runs past the end");
        pos += 8;
        break;
      case 5:
        if (data.size() - pos < 4) malformed("a fixed32 runs past the end");
        pos += 4;
        break;
      case 2: {
        const uint64_t n = varint(data, pos);
        if (n > data.size() - pos) malformed("a length-delimited field runs past the end");
        f.bytes = data.substr(pos, size_t(n));
        pos += size_t(n);
        break;
      }
      default: malformed("wire type " + std::to_string(f.wire));
    }
    out.push_back(f);
  }
  return out;
}

/// The last length-delimited value of field `number` as text (protobuf: the last of a singular field wins).
std::string text_of(const std::vector<Field>& fs, uint32_t number) {
  std::string s;
  for (const Field& f : fs)
    if (f.number == number && f.wire == 2) s.assign(f.bytes);
  return s;
}

using Out = const LocationVisitor;

/// A singular message field's bytes: protobuf merges its occurrences into one message of their concatenated
/// bytes. The one occurrence there almost always is stays a view (a model's graph holds all its weights).
struct Merged {
  std::string storage;    ///< the concatenation, when the field occurs more than once
  std::string_view single;  ///< the one occurrence (a view into the message)
  bool multi = false;
  operator std::string_view() const { return multi ? std::string_view(storage) : single; }  // NOLINT
};

Merged merged(const std::vector<Field>& fs, uint32_t number) {
  Merged m;
  size_t count = 0;
  for (const Field& f : fs)
    if (f.number == number && f.wire == 2 && count++ == 0) m.single = f.bytes;
  if (count > 1) {
    m.multi = true;
    for (const Field& f : fs)
      if (f.number == number && f.wire == 2) m.storage.append(f.bytes);
  }
  return m;
}

bool has(const std::vector<Field>& fs, uint32_t number) {
  for (const Field& f : fs)
    if (f.number == number && f.wire == 2) return true;
  return false;
}

void check_depth(int depth) {
  if (depth > kMaxDepth) malformed("nested deeper than " + std::to_string(kMaxDepth) + " messages");
}

// TensorProto: name 8, external_data 13 (StringStringEntryProto: key 1, value 2), data_location 14 (EXTERNAL = 1)
void tensor(std::string_view data, const std::string& place, Out& out, int depth) {
  check_depth(depth);
  const std::vector<Field> fs = fields(data);
  uint64_t location_kind = 0;
  for (const Field& f : fs)
    if (f.number == 14 && f.wire == 0) location_kind = f.value;
  size_t found = 0;
  for (const Field& f : fs) {
    if (f.number != 13 || f.wire != 2) continue;
    const std::vector<Field> entry = fields(f.bytes);
    if (text_of(entry, 1) == "location") {
      out(place, text_of(entry, 2));
      ++found;
    }
  }
  if (location_kind == 1 && found == 0) out(place, "");
}

std::string tensor_name(std::string_view data) { return text_of(fields(data), 8); }

// SparseTensorProto: values 1, indices 2 (TensorProto)
void sparse(std::string_view data, const std::string& place, Out& out, int depth) {
  check_depth(depth);
  const std::vector<Field> fs = fields(data);
  tensor(merged(fs, 1), place, out, depth + 1);
  tensor(merged(fs, 2), place + " indices", out, depth + 1);
}

void graph(std::string_view data, const std::string& where, Out& out, int depth);

// AttributeProto: name 1, t 5, g 6, tensors 10, graphs 11, sparse_tensor 22, sparse_tensors 23
void attribute(const std::vector<Field>& attr, const std::string& place, Out& out, int depth) {
  if (has(attr, 5)) tensor(merged(attr, 5), place, out, depth + 1);
  for (const Field& f : attr)
    if (f.number == 10 && f.wire == 2) tensor(f.bytes, place, out, depth + 1);
  if (has(attr, 22)) sparse(merged(attr, 22), place, out, depth + 1);
  for (const Field& f : attr)
    if (f.number == 23 && f.wire == 2) sparse(f.bytes, place, out, depth + 1);
  if (has(attr, 6)) graph(merged(attr, 6), place, out, depth + 1);
  for (const Field& f : attr)
    if (f.number == 11 && f.wire == 2) graph(f.bytes, place, out, depth + 1);
}

// NodeProto: name 3, op_type 4, attribute 5
void node(std::string_view data, const std::string& where, Out& out, int depth) {
  check_depth(depth);
  const std::vector<Field> fs = fields(data);
  std::string name = text_of(fs, 3);
  if (name.empty()) name = text_of(fs, 4);
  for (const Field& a : fs) {
    if (a.number != 5 || a.wire != 2) continue;
    const std::vector<Field> attr = fields(a.bytes);
    attribute(attr, where + ".node " + short_repr_str(name) + " attribute " + short_repr_str(text_of(attr, 1)), out, depth + 1);
  }
}

// GraphProto: node 1, initializer 5, sparse_initializer 15. FunctionProto (nodes only): node 7.
void graph_like(std::string_view data, const std::string& where, uint32_t node_field, Out& out, int depth) {
  check_depth(depth);
  const std::vector<Field> fs = fields(data);
  if (node_field == 1) {
    for (const Field& f : fs)
      if (f.number == 5 && f.wire == 2) tensor(f.bytes, where + ".initializer " + short_repr_str(tensor_name(f.bytes)), out, depth + 1);
    for (const Field& f : fs)
      if (f.number == 15 && f.wire == 2) {
        const std::vector<Field> sp = fields(f.bytes);
        sparse(f.bytes, where + ".sparse_initializer " + short_repr_str(tensor_name(merged(sp, 1))), out, depth + 1);
      }
  }
  for (const Field& f : fs)
    if (f.number == node_field && f.wire == 2) node(f.bytes, where, out, depth + 1);
}

void graph(std::string_view data, const std::string& where, Out& out, int depth) { graph_like(data, where, 1, out, depth); }

// FunctionProto: name 1, node 7, attribute_proto 11 (the attributes' default values)
void function(std::string_view data, Out& out, int depth) {
  check_depth(depth);
  const std::vector<Field> fs = fields(data);
  const std::string where = "function " + short_repr_str(text_of(fs, 1));
  graph_like(data, where, 7, out, depth);
  for (const Field& a : fs) {
    if (a.number != 11 || a.wire != 2) continue;
    const std::vector<Field> attr = fields(a.bytes);
    attribute(attr, where + " attribute default " + short_repr_str(text_of(attr, 1)), out, depth + 1);
  }
}

}  // namespace

// ModelProto: graph 7, training_info 20 (TrainingInfoProto: initialization 1, algorithm 2), functions 25
void onnx_external_locations(std::string_view model, const LocationVisitor& visit) {
  Out& out = visit;
  const std::vector<Field> fs = fields(model);
  graph(merged(fs, 7), "graph", out, 1);
  for (const Field& f : fs)
    if (f.number == 25 && f.wire == 2) function(f.bytes, out, 1);
  size_t i = 0;
  for (const Field& f : fs) {
    if (f.number != 20 || f.wire != 2) continue;
    const std::vector<Field> info = fields(f.bytes);
    const std::string where = "training_info[" + std::to_string(i++) + "]";
    graph(merged(info, 1), where + ".initialization", out, 2);
    graph(merged(info, 2), where + ".algorithm", out, 2);
  }
}

// NodeProto: input 1, name 3, op_type 4, attribute 5 (AttributeProto: name 1, s 4), domain 7. TensorProto: data_type 2
// (UINT8 = 2), name 8, raw_data 9, external_data 13, data_location 14.
std::vector<WarpSegmentNode> onnx_warp_segments(std::string_view model) {
  const std::vector<Field> fs = fields(model);
  const Merged graph_bytes = merged(fs, 7);
  const std::vector<Field> graph = fields(graph_bytes);
  std::vector<WarpSegmentNode> out;
  std::vector<std::string> bundle_inputs;
  for (const Field& f : graph) {
    if (f.number != 1 || f.wire != 2) continue;
    const std::vector<Field> node = fields(f.bytes);
    if (text_of(node, 7) != "leapp.warp" || text_of(node, 4) != "WarpSegment") continue;
    WarpSegmentNode seg;
    seg.name = text_of(node, 3);
    std::string last;
    for (const Field& n : node) {
      if (n.number == 1 && n.wire == 2) last.assign(n.bytes);
      if (n.number != 5 || n.wire != 2) continue;
      const std::vector<Field> attr = fields(n.bytes);
      if (text_of(attr, 1) == "signature") seg.signature = text_of(attr, 4);
    }
    bundle_inputs.push_back(last);
    out.push_back(std::move(seg));
  }
  for (size_t i = 0; i < out.size(); ++i) {
    for (const Field& f : graph) {  // the last initializer of that name, as a protobuf map of names would keep
      if (f.number != 5 || f.wire != 2 || bundle_inputs[i].empty()) continue;
      const std::vector<Field> t = fields(f.bytes);
      if (text_of(t, 8) != bundle_inputs[i]) continue;
      WarpSegmentNode& seg = out[i];
      uint64_t type = 0, kind = 0;
      for (const Field& g : t) {
        if (g.number == 2 && g.wire == 0) type = g.value;
        if (g.number == 14 && g.wire == 0) kind = g.value;
      }
      seg.has_bundle = type == 2;
      seg.external = kind == 1;
      seg.raw.clear();
      for (const Field& g : t)
        if (g.number == 9 && g.wire == 2) seg.raw.assign(g.bytes);
      seg.location.clear();
      seg.offset = 0;
      seg.length = -1;
      for (const Field& g : t) {
        if (g.number != 13 || g.wire != 2) continue;
        const std::vector<Field> entry = fields(g.bytes);
        const std::string key = text_of(entry, 1), value = text_of(entry, 2);
        char* end = nullptr;
        if (key == "location") seg.location = value;
        else if (key == "offset") seg.offset = std::strtoull(value.c_str(), &end, 10);
        else if (key == "length") seg.length = int64_t(std::strtoull(value.c_str(), &end, 10));
      }
    }
  }
  return out;
}

}  // namespace leapp::pipeline_detail
