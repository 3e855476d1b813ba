// ext/core/src/manifest_signature.cpp: tensor entries, in a manifest's signature and an op's (sections 2 and 5).
//
// Kept apart from manifest.cpp because both readers of a signature share these rules: read_manifest checks its
// signature.inputs and signature.outputs against the buffers, and read_signature parses the `signature`
// attribute of an ONNX or torch op (mirroring leapp.bundle.parse_signature) with no manifest at all.
#include <algorithm>
#include <map>
#include <string>

#include "manifest.h"
#include "manifest_internal.h"

namespace leapp::detail {
namespace {

std::vector<int64_t> read_dims(const Checker& c, const JsonValue& obj, const std::string& path, const char* key) {
  std::vector<int64_t> dims;
  const auto& arr = c.array(obj, path, key);
  for (size_t d = 0; d < arr.size(); ++d)
    dims.push_back(c.integer(arr[d], Checker::at(Checker::join(path, key), d), 0, kMaxI64));
  return dims;
}

/// name, dtype, shape (and bytes = prod(shape) * itemsize, or 0 on overflow).
TensorSpec read_tensor_basics(const Checker& c, const JsonValue& t, const std::string& path) {
  TensorSpec spec;
  spec.name = c.string(t, path, "name");
  if (spec.name.empty()) c.fail(Checker::join(path, "name"), "is empty");
  spec.dtype = c.string(t, path, "dtype");
  size_t itemsize = dtype_itemsize(spec.dtype);
  if (itemsize == 0)
    c.fail(Checker::join(path, "dtype"), "\"" + shown(spec.dtype) +
                                             "\" is not one of float32, float16, bfloat16, float64, int8, "
                                             "int16, int32, int64, uint8, bool");
  spec.shape = read_dims(c, t, path, "shape");
  unsigned __int128 bytes = itemsize;
  for (int64_t d : spec.shape) {
    bytes *= uint64_t(d);
    if (bytes > uint64_t(kMaxI64)) bytes = uint64_t(kMaxI64) + 1;  // saturate: never equals a valid size
  }
  spec.bytes = bytes > uint64_t(kMaxI64) ? kTooManyBytes : uint64_t(bytes);
  return spec;
}

}  // namespace

void read_signature_side(const Checker& c, const JsonValue& sig, const char* side, BufferRole role, Manifest& m,
                         std::vector<TensorSpec>& out) {
  const std::string spath = Checker::join("signature", side);
  const auto& entries = c.array(sig, "signature", side);
  std::map<std::string, size_t> names;
  for (size_t j = 0; j < entries.size(); ++j) {
    const std::string path = Checker::at(spath, j);
    const JsonValue& t = c.typed(entries[j], path, Type::kObject, "an object");
    TensorSpec spec = read_tensor_basics(c, t, path);
    if (!names.emplace(spec.name, j).second)
      c.fail(Checker::join(path, "name"), "\"" + shown(spec.name) + "\" is not unique");
    spec.buffer = c.index(t, path, "buffer", m.buffers.size(), "buffers");
    const BufferSpec& buf = m.buffers[spec.buffer];
    if (buf.role != role || buf.io != j)
      c.fail(Checker::join(path, "buffer"), std::to_string(spec.buffer) + " is not the " + role_name(role) +
                                                " buffer with io " + std::to_string(j));
    if (spec.bytes != buf.bytes)
      c.fail(Checker::join(path, "shape"), "holds " + (spec.bytes == kTooManyBytes ? std::string("more than 2^63") : std::to_string(spec.bytes)) +
                                               " bytes of " + spec.dtype + ", buffer " + std::to_string(spec.buffer) +
                                               " " + std::to_string(buf.bytes));
    if (const JsonValue* w = t.find("warp_dtype"))
      spec.warp_dtype = c.typed(*w, Checker::join(path, "warp_dtype"), Type::kString, "a string").string;
    if (t.find("logical_shape")) spec.logical_shape = read_dims(c, t, path, "logical_shape");
    out.push_back(std::move(spec));
  }
  // Every buffer of this role must be named by the signature (io points back).
  for (size_t i = 0; i < m.buffers.size(); ++i) {
    const BufferSpec& buf = m.buffers[i];
    if (buf.role != role) continue;
    if (buf.io >= out.size())
      c.fail(Checker::join(Checker::at("buffers", i), "io"),
             std::to_string(buf.io) + " out of range (" + std::to_string(out.size()) + " " + side + ")");
    if (out[buf.io].buffer != i)
      c.fail(Checker::join(Checker::at("buffers", i), "io"),
             std::to_string(buf.io) + " points to signature." + side + "[" + std::to_string(buf.io) +
                 "], whose buffer is " + std::to_string(out[buf.io].buffer));
  }
}

Signature read_signature(std::string_view json) {
  // Mirrors leapp.bundle.parse_signature (docs/bundle-format.md section 5).
  Checker c("leapp signature: ");
  JsonValue root = parse_json(json, "leapp signature", kBundleJsonLimits);
  c.typed(root, "(root)", Type::kObject, "an object");
  Signature sig;
  sig.digest = c.string(root, "", "digest");
  bool hex = sig.digest.size() == 64;
  for (char ch : sig.digest) hex = hex && ((ch >= '0' && ch <= '9') || (ch >= 'a' && ch <= 'f'));
  if (!hex) c.fail("digest", "must be 64 lowercase hex digits (a sha256), got \"" + shown(sig.digest, 80) + "\"");
  sig.segment = c.string(root, "", "segment");
  c = Checker("leapp signature of '" + shown(sig.segment) + "': ");
  sig.has_inputs = true;
  for (const char* side : {"inputs", "outputs"}) {
    const auto& arr = c.array(root, "", side);
    auto& out = std::string(side) == "inputs" ? sig.inputs : sig.outputs;
    std::map<std::string, size_t> names;
    for (size_t j = 0; j < arr.size(); ++j) {
      const std::string path = Checker::at(side, j);
      c.typed(arr[j], path, Type::kObject, "an object");
      TensorSpec t = read_tensor_basics(c, arr[j], path);
      if (!names.emplace(t.name, j).second)
        c.fail(Checker::join(path, "name"), "\"" + shown(t.name) + "\" is used twice");
      if (const JsonValue* r = arr[j].find("batch_rule")) {
        const std::string rp = Checker::join(path, "batch_rule");
        if (r->type != Type::kArray || r->array.size() != 2)
          c.fail(rp, "must be [a, b], two integers in [-2^40, 2^40], got " + std::string(r->type_name()));
        t.batch_rule.a = c.integer(r->array[0], Checker::at(rp, 0), -kBundleMaxRuleCoefficient, kBundleMaxRuleCoefficient);
        t.batch_rule.b = c.integer(r->array[1], Checker::at(rp, 1), -kBundleMaxRuleCoefficient, kBundleMaxRuleCoefficient);
        if (t.shape.empty()) c.fail(rp, "is given for a 0-d tensor");
        t.has_batch_rule = true;
      }
      out.push_back(std::move(t));
    }
  }
  if (const JsonValue* batch = root.find("batch")) {
    c.typed(*batch, "batch", Type::kObject, "an object");
    sig.has_batch = true;
    read_batch_range(c, *batch, sig.batch_min, sig.batch_traced, sig.batch_max);
    if (std::none_of(sig.inputs.begin(), sig.inputs.end(),
                     [](const TensorSpec& t) { return t.has_batch_rule && t.batch_rule.a != 0; }))
      c.fail("batch", "is given but no input has a batch_rule [a, b] with a != 0");
  }
  return sig;
}

}  // namespace leapp::detail
