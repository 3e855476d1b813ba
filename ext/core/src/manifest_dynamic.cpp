// ext/core/src/manifest_dynamic.cpp: the dynamic-batch rules of docs/bundle-format.md ("Dynamic batch").
//
// Kept apart from manifest.cpp because these rules are a second pass: they are read after every static field
// of the manifest is checked, and each is checked against those static values at batch.traced and against its
// bounds at batch.min and batch.max. Warp's launch grid lives here too: a size_rule is checked by the grid it
// gives, and the replay computes the same grid for each call's batch.
#include <algorithm>
#include <cstring>
#include <string>
#include <tuple>

#include "manifest.h"
#include "manifest_internal.h"

namespace leapp::detail {
namespace {

// --- dynamic batch (docs/bundle-format.md, "Dynamic batch") ----------------------------------------------
// Every rule [a, b] has |a|, |b| <= 2^40 and batches are <= 2^31 - 1, so a * batch + b fits an int64, and
// sums of up to 2^18 such values (scratch + constant bytes) stay below 2^63. Each range rule is checked at
// batch.min and batch.max: rules are affine, so it then holds for every batch in between.

class Dynamic {
 public:
  Dynamic(const Checker& c, Manifest& m) : c_(c), m_(m) {}

  Rule rule(const JsonValue& v, const std::string& path) const {
    if (v.type != Type::kArray || v.array.size() != 2)
      c_.fail(path, "must be an array of two integers [a, b] (a * batch + b), got " + std::string(v.type_name()));
    Rule r;
    r.a = c_.integer(v.array[0], Checker::at(path, 0), -kBundleMaxRuleCoefficient, kBundleMaxRuleCoefficient);
    r.b = c_.integer(v.array[1], Checker::at(path, 1), -kBundleMaxRuleCoefficient, kBundleMaxRuleCoefficient);
    return r;
  }

  /// The rule at `key` of `obj` (checked to give `value` at the traced batch), or {0, value} when absent.
  Rule optional(const JsonValue& obj, const std::string& path, const char* key, int64_t value, bool* present = nullptr) const {
    const JsonValue* v = obj.find(key);
    if (present) *present = v != nullptr;
    if (v == nullptr) return Rule{0, value};
    const std::string p = Checker::join(path, key);
    if (!m_.dynamic) c_.fail(p, "is a dynamic-batch rule, but the manifest has no batch");
    Rule r = rule(*v, p);
    if (r.at(m_.batch_traced) != value)
      c_.fail(p, text(r) + " gives " + std::to_string(r.at(m_.batch_traced)) + " at batch.traced " +
                     std::to_string(m_.batch_traced) + ", but the static value is " + std::to_string(value));
    return r;
  }

  void within(const Rule& r, const std::string& path, int64_t lo, int64_t hi) const {
    for (int e = 0; e < 2; ++e) {
      int64_t batch = e == 0 ? m_.batch_min : m_.batch_max;
      int64_t v = r.at(batch);
      if (v < lo || v > hi)
        c_.fail(path, text(r) + " gives " + std::to_string(v) + " at " + end_name(e) + " " + std::to_string(batch) +
                          ", outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    }
  }

  static std::string text(const Rule& r) { return "[" + std::to_string(r.a) + ", " + std::to_string(r.b) + "]"; }
  static const char* end_name(int e) { return e == 0 ? "batch.min" : "batch.max"; }
  int64_t end(int e) const { return e == 0 ? m_.batch_min : m_.batch_max; }

 private:
  const Checker& c_;
  Manifest& m_;
};

uint64_t grid_x_lean_blocks(uint64_t total, uint32_t block) { return std::max<uint64_t>(1, std::min<uint64_t>(total, (uint64_t(1) << 24) / block)); }

}  // namespace

/// `batch`'s {min, traced, max}: integers with 1 <= min <= traced <= max <= 2^31 - 1 (manifest and signature alike).
void read_batch_range(const Checker& c, const JsonValue& batch, int64_t& min, int64_t& traced, int64_t& max) {
  min = c.integer(batch, "batch", "min", 1, kBundleMaxBatch);
  max = c.integer(batch, "batch", "max", 1, kBundleMaxBatch);
  traced = c.integer(batch, "batch", "traced", 1, kBundleMaxBatch);
  if (!(min <= traced && traced <= max))
    c.fail("batch", "must have min <= traced <= max, got min " + std::to_string(min) + ", traced " +
                        std::to_string(traced) + ", max " + std::to_string(max));
}

void read_dynamic(const Checker& c, const JsonValue& root, const std::vector<std::string_view>& blobs,
                  uint32_t min_reader_version, Manifest& m) {
  if (const JsonValue* batch = root.find("batch")) {
    c.typed(*batch, "batch", Type::kObject, "an object");
    if (min_reader_version < kBundleDynamicBatchMinReader)
      c.fail("batch", "is used by a file whose min_reader_version is " + std::to_string(min_reader_version) +
                          " (dynamic-batch rules need " + std::to_string(kBundleDynamicBatchMinReader) +
                          ": an older reader would replay the traced batch only)");
    m.dynamic = true;
    read_batch_range(c, *batch, m.batch_min, m.batch_traced, m.batch_max);
  }
  Dynamic dyn(c, m);
  const auto& buffers = c.array(root, "", "buffers");
  for (size_t i = 0; i < m.buffers.size(); ++i) {
    const std::string path = Checker::at("buffers", i);
    BufferSpec& b = m.buffers[i];
    bool present = false;
    b.bytes_rule = dyn.optional(buffers[i], path, "bytes_rule", int64_t(b.bytes), &present);
    if (!present) continue;
    if (b.role == BufferRole::kConstant) c.fail(Checker::join(path, "bytes_rule"), "is given for a constant buffer (constants never change size)");
    dyn.within(b.bytes_rule, Checker::join(path, "bytes_rule"), 1, int64_t(kBundleMaxBufferBytes));
  }
  if (m.dynamic) {
    for (int e = 0; e < 2; ++e) {
      int64_t owned = 0;
      for (const BufferSpec& b : m.buffers)
        if (b.role == BufferRole::kScratch || b.role == BufferRole::kConstant) owned += b.bytes_rule.at(dyn.end(e));
      if (owned > int64_t(kBundleMaxOwnedBytes))
        c.fail("buffers", "hold " + std::to_string(owned) + " bytes of scratch and constant memory at " +
                              Dynamic::end_name(e) + " " + std::to_string(dyn.end(e)) + ", more than 2^40");
    }
  }
  for (size_t i = 0; i < m.buffers.size(); ++i) {
    const BufferSpec& b = m.buffers[i];
    if (b.init != BufferInit::kInput) continue;
    const BufferSpec& src = m.buffers[m.inputs[b.init_index].buffer];
    if (src.bytes_rule != b.bytes_rule)
      c.fail(Checker::join(Checker::at("buffers", i), "init"), "copies signature input " + std::to_string(b.init_index) +
                                                                 ", whose size rule " + Dynamic::text(src.bytes_rule) +
                                                                 " differs from the buffer's " + Dynamic::text(b.bytes_rule));
  }
  const JsonValue& sig = c.object(root, "", "signature");
  bool follows = false;
  for (int side = 0; side < 2; ++side) {
    const char* name = side == 0 ? "inputs" : "outputs";
    auto& specs = side == 0 ? m.inputs : m.outputs;
    const auto& entries = c.array(sig, "signature", name);
    for (size_t j = 0; j < specs.size(); ++j) {
      TensorSpec& t = specs[j];
      const std::string path = Checker::at(Checker::join("signature", name), j);
      const Rule& brule = m.buffers[t.buffer].bytes_rule;
      const JsonValue* v = entries[j].find("batch_rule");
      if (v == nullptr) {
        if (brule.a != 0)
          c.fail(path, "has no batch_rule, but buffer " + std::to_string(t.buffer) + " has bytes_rule " + Dynamic::text(brule));
        continue;
      }
      if (t.shape.empty()) c.fail(Checker::join(path, "batch_rule"), "is given for a 0-d tensor");
      t.batch_rule = dyn.optional(entries[j], path, "batch_rule", t.shape[0]);
      t.has_batch_rule = true;
      dyn.within(t.batch_rule, Checker::join(path, "batch_rule"), 1, int64_t(kBundleMaxBufferBytes));
      // row bytes: bytes / shape[0] (shape[0] >= 1 at the traced batch, and bytes = shape[0] * row exactly)
      t.row_bytes = t.bytes / uint64_t(t.shape[0]);
      if (t.row_bytes == 0 || t.row_bytes > kBundleMaxBufferBytes ||
          brule != Rule{t.batch_rule.a * int64_t(t.row_bytes), t.batch_rule.b * int64_t(t.row_bytes)})
        c.fail(Checker::join(path, "batch_rule"), Dynamic::text(t.batch_rule) + " with rows of " + std::to_string(t.row_bytes) +
                                                     " bytes does not match buffer " + std::to_string(t.buffer) +
                                                     "'s bytes_rule " + Dynamic::text(brule));
      if (side == 0 && t.batch_rule.a != 0 && !follows) {
        follows = true;
        m.batch_input = uint32_t(j);
      }
    }
  }
  if (m.dynamic && !follows)
    c.fail("signature.inputs", "has no input with a batch_rule [a, b], a != 0 (the runtime reads the batch from one)");

  const auto& ops = c.array(root, "", "ops");
  for (size_t i = 0; i < m.ops.size(); ++i) {
    OpSpec& op = m.ops[i];
    const JsonValue& j = ops[i];
    const std::string path = Checker::at("ops", i);
    if (op.kind == OpKind::kLaunch) {
      const auto& relocs = c.array(j, path, "relocs");
      for (size_t r = 0; r < op.relocs.size(); ++r) {
        RelocSpec& rel = op.relocs[r];
        const std::string rpath = Checker::at(Checker::join(path, "relocs"), r);
        bool present = false;
        rel.buffer_offset_rule = dyn.optional(relocs[r], rpath, "buffer_offset_rule", int64_t(rel.buffer_offset), &present);
        if (!present) continue;
        for (int e = 0; e < 2; ++e) {
          int64_t v = rel.buffer_offset_rule.at(dyn.end(e)), n = m.buffers[rel.buffer].bytes_rule.at(dyn.end(e));
          if (v < 0 || v > n)
            c.fail(Checker::join(rpath, "buffer_offset_rule"), "gives " + std::to_string(v) + " at " + Dynamic::end_name(e) +
                                                                 ", outside [0, " + std::to_string(n) + "]");
        }
      }
      const char* keys[] = {"size_rule", "grid_stride", "max_blocks", "patches"};
      int present = 0;
      for (const char* k : keys) present += j.find(k) != nullptr;
      if (present == 0) continue;
      if (present != 4) c.fail(path, "has some of size_rule, grid_stride, max_blocks, patches but not all (they go together)");
      if (!m.dynamic) c.fail(Checker::join(path, "size_rule"), "is a dynamic-batch rule, but the manifest has no batch");
      op.sized = true;
      op.size_rule = dyn.rule(*j.find("size_rule"), Checker::join(path, "size_rule"));
      dyn.within(op.size_rule, Checker::join(path, "size_rule"), 0, kMaxI64);
      const JsonValue& gs = *j.find("grid_stride");
      if (gs.type != Type::kBool) c.fail(Checker::join(path, "grid_stride"), std::string("must be true or false, got ") + gs.type_name());
      op.grid_stride = gs.boolean;
      op.max_blocks = uint32_t(c.integer(j, path, "max_blocks", 0, kMaxU32));
      uint32_t grid[3];
      launch_grid(uint64_t(op.size_rule.at(m.batch_traced)), op.block[0], op.grid_stride, op.max_blocks, grid);
      if (grid[0] != op.grid[0] || grid[1] != op.grid[1] || grid[2] != op.grid[2])
        c.fail(Checker::join(path, "grid"), "is not the grid of size_rule " + Dynamic::text(op.size_rule) + " at batch.traced");
      const auto& patches = c.array(j, path, "patches");

      std::vector<std::tuple<uint32_t, uint64_t, uint64_t>> spans;  // (param, begin, end)
      for (const RelocSpec& rel : op.relocs) spans.emplace_back(rel.param, rel.offset, rel.offset + 8);
      std::string_view blob = blobs[op.params_blob];
      for (size_t q = 0; q < patches.size(); ++q) {
        const std::string ppath = Checker::at(Checker::join(path, "patches"), q);
        const JsonValue& pj = c.typed(patches[q], ppath, Type::kObject, "an object");
        PatchSpec ps;
        ps.param = c.index(pj, ppath, "param", op.param_sizes.size(), "parameters");
        ps.offset = uint64_t(c.integer(pj, ppath, "offset", 0, kMaxI64));
        ps.width = uint32_t(c.integer(pj, ppath, "width", 0, 8));
        if (ps.width != 4 && ps.width != 8) c.fail(Checker::join(ppath, "width"), "must be 4 or 8, got " + std::to_string(ps.width));
        const uint64_t psize = op.param_sizes[ps.param];
        if (ps.offset > psize || ps.width > psize - ps.offset)
          c.fail(Checker::join(ppath, "offset"), std::to_string(ps.offset) + " + width " + std::to_string(ps.width) +
                                                     " exceeds parameter " + std::to_string(ps.param) + " of " + std::to_string(psize) + " bytes");
        for (const auto& sp : spans)
          if (std::get<0>(sp) == ps.param && ps.offset < std::get<2>(sp) && std::get<1>(sp) < ps.offset + ps.width)
            c.fail(ppath, "overlaps a relocation or an earlier patch of parameter " + std::to_string(ps.param));
        spans.emplace_back(ps.param, ps.offset, ps.offset + ps.width);
        ps.rule = dyn.rule(c.member(pj, ppath, "rule"), Checker::join(ppath, "rule"));
        dyn.within(ps.rule, Checker::join(ppath, "rule"), 0, ps.width == 4 ? kMaxU32 : kMaxI64);
        uint64_t stat = 0;
        std::memcpy(&stat, blob.data() + op.param_offsets[ps.param] + ps.offset, ps.width);
        if (ps.rule.at(m.batch_traced) != int64_t(stat))
          c.fail(Checker::join(ppath, "rule"), Dynamic::text(ps.rule) + " gives " + std::to_string(ps.rule.at(m.batch_traced)) +
                                                   " at batch.traced, but the bytes it patches hold " + std::to_string(stat));
        op.patches.push_back(ps);
      }
    } else {
      const bool memset = op.kind == OpKind::kMemset;
      op.bytes_rule = dyn.optional(j, path, "bytes_rule", int64_t(op.bytes));
      op.dst_offset_rule = dyn.optional(j, path, memset ? "offset_rule" : "dst_offset_rule", int64_t(op.dst_offset));
      op.src_offset_rule = memset ? Rule{0, 0} : dyn.optional(j, path, "src_offset_rule", int64_t(op.src_offset));
      if (!m.dynamic) continue;
      dyn.within(op.bytes_rule, Checker::join(path, "bytes_rule"), 1, int64_t(kBundleMaxBufferBytes));
      for (int e = 0; e < 2; ++e) {
        const int64_t batch = dyn.end(e), n = op.bytes_rule.at(batch);
        const int64_t d = op.dst_offset_rule.at(batch), dn = m.buffers[op.dst].bytes_rule.at(batch);
        if (d < 0 || d + n > dn)
          c.fail(path, "writes [" + std::to_string(d) + ", +" + std::to_string(n) + ") of buffer " + std::to_string(op.dst) +
                           " of " + std::to_string(dn) + " bytes at " + Dynamic::end_name(e) + " " + std::to_string(batch));
        if (memset) continue;
        const int64_t sidx = op.src_offset_rule.at(batch), sn = m.buffers[op.src].bytes_rule.at(batch);
        if (sidx < 0 || sidx + n > sn)
          c.fail(path, "reads [" + std::to_string(sidx) + ", +" + std::to_string(n) + ") of buffer " + std::to_string(op.src) +
                           " of " + std::to_string(sn) + " bytes at " + Dynamic::end_name(e) + " " + std::to_string(batch));
        if (op.src == op.dst && sidx < d + n && d < sidx + n)
          c.fail(path, "copies overlapping ranges of buffer " + std::to_string(op.src) + " at " + Dynamic::end_name(e));
      }
    }
  }
}

void launch_grid(uint64_t size, uint32_t block_dim, bool grid_stride, uint32_t max_blocks, uint32_t grid[3]) {
  const uint64_t total = (size + block_dim - 1) / block_dim;
  if (grid_stride) {
    const uint64_t cap = max_blocks > 0 ? max_blocks : uint64_t(0x7fffffff);
    grid[0] = uint32_t(std::max<uint64_t>(1, std::min(total, cap)));
    grid[1] = grid[2] = 1;
    return;
  }
  const uint64_t gx = grid_x_lean_blocks(total, block_dim);
  const uint64_t remaining = (total + gx - 1) / gx;
  const uint64_t gy = std::max<uint64_t>(1, std::min<uint64_t>(remaining, 65535));
  const uint64_t gz = std::max<uint64_t>(1, std::min<uint64_t>((remaining + gy - 1) / gy, 65535));
  grid[0] = uint32_t(gx);
  grid[1] = uint32_t(gy);
  grid[2] = uint32_t(gz);
}

}  // namespace leapp::detail
