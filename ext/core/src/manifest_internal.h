// ext/core/src/manifest_internal.h: what the manifest's readers share (internal).
//
// The rules of docs/bundle-format.md sections 2 and 5 are read in three files, one per job: manifest.cpp (the
// manifest's tables: modules, kernels, CPU code, buffers, ops, and read_manifest's order), manifest_signature.cpp
// (tensor entries: the manifest's signature and an op's signature attribute) and manifest_dynamic.cpp (the
// dynamic-batch rules and Warp's launch grid). This header holds the Checker they all report through, so each
// error names its JSON path the same way, and the few functions one file calls in another.
#pragma once

#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "json.h"
#include "leapp/runtime.h"

namespace leapp::detail {

using Type = JsonValue::Type;

/// A manifest's and a signature's JSON: the bundle's bounds, and no NUL in any string (docs/bundle-format.md §2).
inline const JsonLimits kBundleJsonLimits{kJsonMaxDepth, kJsonMaxValues, "docs/bundle-format.md", true};

constexpr int64_t kMaxI64 = std::numeric_limits<int64_t>::max();
constexpr int64_t kMaxU32 = std::numeric_limits<uint32_t>::max();
constexpr uint64_t kTooManyBytes = std::numeric_limits<uint64_t>::max();  // prod(shape) * itemsize overflowed

/// Reports a broken rule as std::invalid_argument("<prefix><JSON path> <why>"); its readers check a value's
/// presence, type and range before they use it.
class Checker {
 public:
  explicit Checker(std::string prefix) : prefix_(std::move(prefix)) {}

  void set_segment(const std::string& segment) { prefix_ = "leapp bundle '" + shown(segment) + "': "; }

  [[noreturn]] void fail(const std::string& path, const std::string& why) const {
    throw std::invalid_argument(prefix_ + path + " " + why);
  }

  const JsonValue& member(const JsonValue& obj, const std::string& path, const char* key) const {
    const JsonValue* v = obj.find(key);
    if (v == nullptr) fail(join(path, key), "is missing");
    return *v;
  }

  const JsonValue& typed(const JsonValue& v, const std::string& path, Type type, const char* name) const {
    if (v.type != type) fail(path, std::string("must be ") + name + ", got " + v.type_name());
    return v;
  }

  const JsonValue& object(const JsonValue& obj, const std::string& path, const char* key) const {
    return typed(member(obj, path, key), join(path, key), Type::kObject, "an object");
  }

  const std::vector<JsonValue>& array(const JsonValue& obj, const std::string& path, const char* key) const {
    return typed(member(obj, path, key), join(path, key), Type::kArray, "an array").array;
  }

  /// fn(element, path, index) for each element of the top-level array `key`, each checked to be an object.
  template <class Fn>
  void each_object(const JsonValue& root, const char* key, Fn&& fn) const {
    const auto& items = array(root, "", key);
    for (size_t i = 0; i < items.size(); ++i) {
      const std::string path = at(key, i);
      fn(typed(items[i], path, Type::kObject, "an object"), path, i);
    }
  }

  std::string string(const JsonValue& obj, const std::string& path, const char* key) const {
    return typed(member(obj, path, key), join(path, key), Type::kString, "a string").string;
  }

  int64_t integer(const JsonValue& v, const std::string& path, int64_t lo, int64_t hi) const {
    typed(v, path, Type::kInt, "an integer");
    if (v.int_overflow) fail(path, "is out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    if (v.integer < lo || v.integer > hi)
      fail(path, std::to_string(v.integer) + " out of range [" + std::to_string(lo) + ", " + std::to_string(hi) +
                     "]");
    return v.integer;
  }

  int64_t integer(const JsonValue& obj, const std::string& path, const char* key, int64_t lo, int64_t hi) const {
    return integer(member(obj, path, key), join(path, key), lo, hi);
  }

  /// An index into a table of `count` `things`: "... 9 out of range (7 buffers)".
  uint32_t index(const JsonValue& obj, const std::string& path, const char* key, size_t count,
                 const char* things) const {
    const std::string p = join(path, key);
    const JsonValue& v = typed(member(obj, path, key), p, Type::kInt, "an integer");
    if (v.int_overflow || v.integer < 0 || uint64_t(v.integer) >= count) {
      std::string shown = v.int_overflow ? "(too large)" : std::to_string(v.integer);
      fail(p, shown + " out of range (" + std::to_string(count) + " " + things + ")");
    }
    return uint32_t(v.integer);
  }

  static std::string join(const std::string& path, const char* key) {
    return path.empty() ? std::string(key) : path + "." + key;
  }
  static std::string at(const std::string& path, size_t i) { return path + "[" + std::to_string(i) + "]"; }

 private:
  std::string prefix_;
};

inline const char* role_name(BufferRole r) {
  switch (r) {
    case BufferRole::kInput: return "input";
    case BufferRole::kOutput: return "output";
    case BufferRole::kScratch: return "scratch";
    case BufferRole::kConstant: return "constant";
  }
  return "?";
}

/// `batch`'s {min, traced, max} (manifest_dynamic.cpp).
void read_batch_range(const Checker& c, const JsonValue& batch, int64_t& min, int64_t& traced, int64_t& max);

/// The manifest's `batch` and every dynamic-batch rule, after the static fields are read (manifest_dynamic.cpp).
void read_dynamic(const Checker& c, const JsonValue& root, const std::vector<std::string_view>& blobs,
                  uint32_t min_reader_version, Manifest& m);

/// signature.inputs or signature.outputs of a manifest, checked against its buffers (manifest_signature.cpp).
void read_signature_side(const Checker& c, const JsonValue& sig, const char* side, BufferRole role, Manifest& m,
                         std::vector<TensorSpec>& out);

}  // namespace leapp::detail
