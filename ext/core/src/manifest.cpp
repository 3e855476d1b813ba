// ext/core/src/manifest.cpp: every field rule of docs/bundle-format.md section 2.
//
// Each check names the field by its JSON path ("ops[3].relocs[0].buffer") so a
// corrupt or hand-edited bundle says exactly what is wrong. Nothing here
// trusts an index or a length before checking it against what it points into.
#include "manifest.h"

#include <algorithm>
#include <cstring>
#include <tuple>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>

#include "elf_check.h"
#include "json.h"
#include "lz4_block.h"

namespace leapp::detail {
namespace {

using Type = JsonValue::Type;

/// A manifest's and a signature's JSON: the bundle's bounds, and no NUL in any string (docs/bundle-format.md §2).
const JsonLimits kBundleJsonLimits{kJsonMaxDepth, kJsonMaxValues, "docs/bundle-format.md", true};

constexpr int64_t kMaxI64 = std::numeric_limits<int64_t>::max();
constexpr int64_t kMaxU32 = std::numeric_limits<uint32_t>::max();
constexpr uint64_t kTooManyBytes = std::numeric_limits<uint64_t>::max();  // prod(shape) * itemsize overflowed

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

const char* role_name(BufferRole r) {
  switch (r) {
    case BufferRole::kInput: return "input";
    case BufferRole::kOutput: return "output";
    case BufferRole::kScratch: return "scratch";
    case BufferRole::kConstant: return "constant";
  }
  return "?";
}

/// Section 1.1 for a binary entry (modules[m].binaries[b] or cpu_code[c]) whose `bs.blob` is read: its optional
/// `encoding` and `decoded_bytes` into `bs`, the block decoded and checked; returns the binary's bytes. A block
/// that several entries name is decoded once (`decoded_blobs`, as Python's reader keeps it); an entry declaring
/// another size for it decodes it again, only to report why it fails.
std::string_view decoded_image(const Checker& c, const JsonValue& bin, const std::string& bpath,
                               const std::vector<std::string_view>& blobs, uint32_t min_reader_version,
                               std::map<uint32_t, std::string>& decoded_blobs, BinarySpec& bs) {
  std::string_view data = blobs[bs.blob];
  bs.decoded_bytes = data.size();
  if (const JsonValue* enc = bin.find("encoding")) {  // format version 2, section 1.1
    const std::string epath = Checker::join(bpath, "encoding");
    const std::string& name = c.typed(*enc, epath, Type::kString, "a string").string;
    if (name != kBundleEncodingLz4Block)
      c.fail(epath, "\"" + shown(name) + "\" is not \"" + kBundleEncodingLz4Block + "\"");
    if (min_reader_version < kBundleEncodingMinReader)
      c.fail(epath, "is used by a file whose min_reader_version is " + std::to_string(min_reader_version) +
                        " (a compressed binary needs " + std::to_string(kBundleEncodingMinReader) +
                        ": older readers would take the block for the binary)");
    bs.encoding = BinaryEncoding::kLz4Block;
    bs.decoded_bytes = uint64_t(c.integer(bin, bpath, "decoded_bytes", 0, int64_t(kBundleMaxBufferBytes)));
    auto known = decoded_blobs.find(bs.blob);
    if (known == decoded_blobs.end() || known->second.size() != bs.decoded_bytes) {
      std::string decoded;
      try {
        decoded = leapp::lz4_block_decode(data, bs.decoded_bytes);
      } catch (const std::invalid_argument& e) {
        c.fail(Checker::join(bpath, "blob"), std::to_string(bs.blob) + " (" + std::to_string(data.size()) +
                                                 " bytes, decoded_bytes " + std::to_string(bs.decoded_bytes) +
                                                 "): " + e.what());
      }
      if (known == decoded_blobs.end()) known = decoded_blobs.emplace(bs.blob, std::move(decoded)).first;
    }
    data = known->second;
  } else if (bin.find("decoded_bytes") != nullptr) {
    c.fail(Checker::join(bpath, "decoded_bytes"), "is given without an encoding");
  }
  return data;
}

void read_modules(const Checker& c, const JsonValue& root, const std::vector<std::string_view>& blobs,
                  uint32_t min_reader_version, std::map<uint32_t, std::string>& decoded_blobs, Manifest& m) {
  c.each_object(root, "modules", [&](const JsonValue& mod, const std::string& path, size_t) {
    ModuleSpec spec;
    std::map<std::pair<BinaryKind, int64_t>, size_t> seen;  // (kind, arch) -> first binary
    spec.name = c.string(mod, path, "name");
    const auto& binaries = c.array(mod, path, "binaries");
    if (binaries.empty()) c.fail(Checker::join(path, "binaries"), "is empty (a module needs at least one binary)");
    for (size_t b = 0; b < binaries.size(); ++b) {
      const std::string bpath = Checker::at(Checker::join(path, "binaries"), b);
      const JsonValue& bin = c.typed(binaries[b], bpath, Type::kObject, "an object");
      BinarySpec bs;
      const std::string kind = c.string(bin, bpath, "kind");
      if (kind == "ptx")
        bs.kind = BinaryKind::kPtx;
      else if (kind == "cubin")
        bs.kind = BinaryKind::kCubin;
      else
        c.fail(Checker::join(bpath, "kind"), "\"" + shown(kind) + "\" is not \"ptx\" or \"cubin\"");
      const int64_t arch = c.integer(bin, bpath, "arch", 10, kMaxI64);
      auto first = seen.emplace(std::make_pair(bs.kind, arch), b);
      if (!first.second)
        c.fail(bpath, "is a second " + kind + " for arch " + std::to_string(arch) + " (first: binaries[" +
                          std::to_string(first.first->second) + "])");
      // Archs beyond u32 fit no device: keep them unmatchable instead of truncating.
      bs.arch = arch > int64_t(kMaxU32) ? uint32_t(kMaxU32) : uint32_t(arch);
      bs.blob = c.index(bin, bpath, "blob", blobs.size(), "blobs");
      const std::string_view data = decoded_image(c, bin, bpath, blobs, min_reader_version, decoded_blobs, bs);
      if (bs.kind == BinaryKind::kPtx && (data.empty() || data.back() != '\0'))
        c.fail(Checker::join(bpath, "blob"), std::to_string(bs.blob) + " is PTX but not NUL-terminated");
      // cubin bytes are not inspected (the driver judges them at load time)
      if (bs.kind == BinaryKind::kPtx) bs.ptx_isa = ptx_isa_of(data);
      if (const JsonValue* isa = bin.find("ptx_isa")) {  // optional: the ISA the writer recorded
        const std::string ipath = Checker::join(bpath, "ptx_isa");
        const std::string& text = c.typed(*isa, ipath, Type::kString, "a string").string;
        if (bs.kind != BinaryKind::kPtx) c.fail(ipath, "is given for a cubin (only PTX has an ISA version)");
        if (!is_ptx_isa_text(text)) c.fail(ipath, "\"" + shown(text) + "\" is not a PTX ISA version such as \"9.0\"");
        if (text != bs.ptx_isa)
          c.fail(ipath, "\"" + text + "\" differs from the PTX text's .version" +
                            (bs.ptx_isa.empty() ? std::string(" (none in its first 4096 bytes)") : " " + bs.ptx_isa));
      }
      spec.binaries.push_back(bs);
    }
    m.modules.push_back(std::move(spec));
  });
}

void read_kernels(const Checker& c, const JsonValue& root, Manifest& m) {
  c.each_object(root, "kernels", [&](const JsonValue& k, const std::string& path, size_t) {
    KernelSpec spec;
    spec.module = c.index(k, path, "module", m.modules.size(), "modules");
    spec.entry = c.string(k, path, "entry");
    if (spec.entry.empty()) c.fail(Checker::join(path, "entry"), "is empty");
    if (const JsonValue* key = k.find("key"))
      spec.key = c.typed(*key, Checker::join(path, "key"), Type::kString, "a string").string;
    spec.block_dim = uint32_t(c.integer(k, path, "block_dim", 1, 1024));
    spec.smem_bytes = uint32_t(c.integer(k, path, "smem_bytes", 0, kMaxU32));
    if (const JsonValue* cpu = k.find("cpu_entry")) {
      spec.cpu_entry = c.typed(*cpu, Checker::join(path, "cpu_entry"), Type::kString, "a string").string;
      if (spec.cpu_entry.empty()) c.fail(Checker::join(path, "cpu_entry"), "is empty");
    }
    m.kernels.push_back(std::move(spec));
  });
}

void read_cpu_code(const Checker& c, const JsonValue& root, const std::vector<std::string_view>& blobs,
                   uint32_t min_reader_version, std::map<uint32_t, std::string>& decoded_blobs, Manifest& m) {
  if (root.find("cpu_code") == nullptr) {
    for (size_t k = 0; k < m.kernels.size(); ++k)
      if (!m.kernels[k].cpu_entry.empty())
        c.fail(Checker::at("kernels", k) + ".cpu_entry", "is given, but the manifest has no cpu_code");
    return;
  }
  if (c.array(root, "", "cpu_code").empty()) c.fail("cpu_code", "is empty (leave it out when there is no CPU code)");
  std::vector<std::string> entries;  // the object is checked against its entries: they come first
  for (size_t k = 0; k < m.kernels.size(); ++k) {
    const std::string& entry = m.kernels[k].cpu_entry;
    if (entry.empty())
      c.fail(Checker::at("kernels", k) + ".cpu_entry", "is missing (with cpu_code every kernel names its CPU entry)");
    if (entry.find('\0') != std::string::npos) c.fail(Checker::at("kernels", k) + ".cpu_entry", "contains a NUL byte");
    entries.push_back(entry);
  }
  c.each_object(root, "cpu_code", [&](const JsonValue& code, const std::string& path, size_t i) {
    CpuCodeSpec spec;
    spec.machine = c.string(code, path, "machine");
    uint16_t elf_machine = 0;
    if (spec.machine == "x86_64")
      elf_machine = kElfMachineX86_64;
    else if (spec.machine == "aarch64")
      elf_machine = kElfMachineAarch64;
    else
      c.fail(Checker::join(path, "machine"), "\"" + shown(spec.machine) + "\" is not \"x86_64\" or \"aarch64\"");
    for (size_t j = 0; j < m.cpu_code.size(); ++j)
      if (m.cpu_code[j].machine == spec.machine)
        c.fail(path, "is a second CPU code for " + spec.machine + " (first: cpu_code[" + std::to_string(j) + "])");
    spec.image.kind = BinaryKind::kCpu;
    spec.image.blob = c.index(code, path, "blob", blobs.size(), "blobs");
    if (code.find("decoded_bytes"))  // bounded before anything is decoded
      c.integer(code, path, "decoded_bytes", 0, int64_t(kBundleMaxCpuCodeBytes));
    const std::string_view data = decoded_image(c, code, path, blobs, min_reader_version, decoded_blobs, spec.image);
    // Before anything maps it (docs/export-cpu.md section 4): the same rules as leapp/bundle/elf.py.
    const std::string problem = cpu_code_problem(data, elf_machine, spec.machine, entries);
    if (!problem.empty()) c.fail(Checker::join(path, "blob"), std::to_string(spec.image.blob) + ": " + problem);
    if (spec.image.encoding != BinaryEncoding::kRaw) {  // kept: the loader maps these bytes, decoded only here
      auto known = decoded_blobs.find(spec.image.blob);
      spec.decoded = std::make_shared<const std::string>(std::move(known->second));
      decoded_blobs.erase(known);
    }
    (void)i;
    m.cpu_code.push_back(std::move(spec));
  });
}

void read_buffers(const Checker& c, const JsonValue& root, const std::vector<std::string_view>& blobs,
                  Manifest& m) {
  c.each_object(root, "buffers", [&](const JsonValue& b, const std::string& path, size_t i) {
    BufferSpec spec;
    int64_t id = c.integer(b, path, "id", 0, kMaxI64);
    if (uint64_t(id) != i) c.fail(Checker::join(path, "id"), std::to_string(id) + " is not its index " + std::to_string(i));
    spec.bytes = uint64_t(c.integer(b, path, "bytes", 1, int64_t(kBundleMaxBufferBytes)));
    const std::string role = c.string(b, path, "role");
    if (role == "input")
      spec.role = BufferRole::kInput;
    else if (role == "output")
      spec.role = BufferRole::kOutput;
    else if (role == "scratch")
      spec.role = BufferRole::kScratch;
    else if (role == "constant")
      spec.role = BufferRole::kConstant;
    else
      c.fail(Checker::join(path, "role"), "\"" + shown(role) + "\" is not input, output, scratch or constant");
    if (spec.role == BufferRole::kInput || spec.role == BufferRole::kOutput)
      spec.io = uint32_t(std::min<int64_t>(c.integer(b, path, "io", 0, kMaxI64), kMaxU32));  // checked below

    const std::string ipath = Checker::join(path, "init");
    const JsonValue& init = c.member(b, path, "init");
    if (init.type == Type::kString) {
      if (init.string == "none")
        spec.init = BufferInit::kNone;
      else if (init.string == "zero")
        spec.init = BufferInit::kZero;
      else
        c.fail(ipath, "\"" + shown(init.string) + "\" is not \"none\", \"zero\", {\"blob\": n} or {\"input\": j}");
    } else if (init.type == Type::kObject && init.find("blob") && !init.find("input")) {
      spec.init = BufferInit::kBlob;
      spec.init_index = c.index(init, ipath, "blob", blobs.size(), "blobs");
      if (blobs[spec.init_index].size() != spec.bytes)
        c.fail(Checker::join(ipath, "blob"), std::to_string(spec.init_index) + " has " +
                                                  std::to_string(blobs[spec.init_index].size()) +
                                                  " bytes, the buffer " + std::to_string(spec.bytes));
    } else if (init.type == Type::kObject && init.find("input") && !init.find("blob")) {
      spec.init = BufferInit::kInput;
      spec.init_index = uint32_t(std::min<int64_t>(c.integer(init, ipath, "input", 0, kMaxI64), kMaxU32));
    } else {
      c.fail(ipath, "must be \"none\", \"zero\", {\"blob\": n} or {\"input\": j}");
    }
    bool ok = false;
    switch (spec.role) {
      case BufferRole::kInput: ok = spec.init == BufferInit::kNone; break;
      case BufferRole::kOutput: ok = spec.init != BufferInit::kBlob; break;
      case BufferRole::kScratch: ok = spec.init == BufferInit::kNone || spec.init == BufferInit::kZero; break;
      case BufferRole::kConstant: ok = spec.init == BufferInit::kBlob; break;
    }
    if (!ok) {
      const char* rule = spec.role == BufferRole::kInput     ? "an input buffer's init must be \"none\""
                         : spec.role == BufferRole::kOutput  ? "an output buffer's init must be none, zero or {\"input\": j}"
                         : spec.role == BufferRole::kScratch ? "a scratch buffer's init must be \"none\" or \"zero\""
                                                             : "a constant buffer needs init {\"blob\": n}";
      c.fail(ipath, std::string("is not allowed: ") + rule);
    }
    m.buffers.push_back(spec);
  });
  // What the runtime allocates and holds per device (scratch also per stream).
  // Each term is <= 2^40 and there are < 2^20 buffers: the sum cannot overflow.
  uint64_t owned = 0;
  for (const BufferSpec& b : m.buffers)
    if (b.role == BufferRole::kScratch || b.role == BufferRole::kConstant) owned += b.bytes;
  if (owned > kBundleMaxOwnedBytes)
    c.fail("buffers", "hold " + std::to_string(owned) + " bytes of scratch and constant memory, more than " +
                          std::to_string(kBundleMaxOwnedBytes) + " (2^40)");
}

void read_range(const Checker& c, const std::string& path, uint64_t offset, uint64_t bytes, uint64_t size,
                const char* what) {
  if (offset > size || bytes > size - offset)
    c.fail(path, "range [" + std::to_string(offset) + ", " + std::to_string(offset) + " + " + std::to_string(bytes) +
                     ") exceeds " + what + " of " + std::to_string(size) + " bytes");
}

void read_launch(const Checker& c, const JsonValue& op, const std::string& path,
                 const std::vector<std::string_view>& blobs, const Manifest& m, OpSpec& spec) {
  spec.kind = OpKind::kLaunch;
  spec.kernel = c.index(op, path, "kernel", m.kernels.size(), "kernels");
  const KernelSpec& kernel = m.kernels[spec.kernel];
  for (const char* key : {"grid", "block"}) {
    const std::string p = Checker::join(path, key);
    const auto& dims = c.array(op, path, key);
    if (dims.size() != 3) c.fail(p, "must have 3 entries, got " + std::to_string(dims.size()));
    uint32_t* out = std::string(key) == "grid" ? spec.grid : spec.block;
    for (size_t d = 0; d < 3; ++d) out[d] = uint32_t(c.integer(dims[d], Checker::at(p, d), 1, kMaxU32));
  }
  uint64_t threads = uint64_t(spec.block[0]) * spec.block[1] * spec.block[2];
  if (threads > 1024)
    c.fail(Checker::join(path, "block"), "has " + std::to_string(threads) + " threads (at most 1024)");
  if (spec.block[0] != kernel.block_dim)
    c.fail(Checker::join(path, "block") + "[0]", std::to_string(spec.block[0]) + " differs from kernels[" +
                                                     std::to_string(spec.kernel) + "].block_dim " +
                                                     std::to_string(kernel.block_dim));
  spec.smem = uint32_t(c.integer(op, path, "smem", 0, kMaxU32));

  const std::string ppath = Checker::join(path, "params");
  const JsonValue& params = c.object(op, path, "params");
  spec.params_blob = c.index(params, ppath, "blob", blobs.size(), "blobs");
  const uint64_t blob_size = blobs[spec.params_blob].size();
  const auto& offsets = c.array(params, ppath, "offsets");
  const auto& sizes = c.array(params, ppath, "sizes");
  if (offsets.empty()) c.fail(Checker::join(ppath, "offsets"), "is empty (parameter 0 is launch_bounds_t)");
  if (offsets.size() != sizes.size())
    c.fail(Checker::join(ppath, "sizes"), "has " + std::to_string(sizes.size()) + " entries, offsets " +
                                              std::to_string(offsets.size()));
  for (size_t i = 0; i < offsets.size(); ++i) {
    const std::string op_ = Checker::at(Checker::join(ppath, "offsets"), i);
    uint64_t off = uint64_t(c.integer(offsets[i], op_, 0, kMaxI64));
    uint64_t size = uint64_t(c.integer(sizes[i], Checker::at(Checker::join(ppath, "sizes"), i), 1, kMaxI64));
    read_range(c, op_, off, size, blob_size, ("params blob " + std::to_string(spec.params_blob)).c_str());
    spec.param_offsets.push_back(off);
    spec.param_sizes.push_back(size);
  }

  const auto& relocs = c.array(op, path, "relocs");
  for (size_t r = 0; r < relocs.size(); ++r) {
    const std::string rpath = Checker::at(Checker::join(path, "relocs"), r);
    const JsonValue& rel = c.typed(relocs[r], rpath, Type::kObject, "an object");
    RelocSpec rs;
    rs.param = c.index(rel, rpath, "param", spec.param_sizes.size(), "parameters");
    rs.offset = uint64_t(c.integer(rel, rpath, "offset", 0, kMaxI64));
    const uint64_t psize = spec.param_sizes[rs.param];
    if (psize < 8 || rs.offset > psize - 8)
      c.fail(Checker::join(rpath, "offset"), std::to_string(rs.offset) + " + 8 exceeds parameter " +
                                                 std::to_string(rs.param) + " of " + std::to_string(psize) +
                                                 " bytes");
    rs.buffer = c.index(rel, rpath, "buffer", m.buffers.size(), "buffers");
    rs.buffer_offset = uint64_t(c.integer(rel, rpath, "buffer_offset", 0, kMaxI64));
    if (rs.buffer_offset > m.buffers[rs.buffer].bytes)
      c.fail(Checker::join(rpath, "buffer_offset"), std::to_string(rs.buffer_offset) + " exceeds buffer " +
                                                        std::to_string(rs.buffer) + " of " +
                                                        std::to_string(m.buffers[rs.buffer].bytes) + " bytes");
    spec.relocs.push_back(rs);
  }
}

void check_writable(const Checker& c, const std::string& path, const Manifest& m, uint32_t buffer) {
  BufferRole role = m.buffers[buffer].role;
  if (role == BufferRole::kInput || role == BufferRole::kConstant)
    c.fail(path, std::to_string(buffer) + " is an " + role_name(role) + " buffer, which the ops must not write");
}

void read_ops(const Checker& c, const JsonValue& root, const std::vector<std::string_view>& blobs, Manifest& m) {
  c.each_object(root, "ops", [&](const JsonValue& op, const std::string& path, size_t) {
    OpSpec spec;
    const std::string kind = c.string(op, path, "op");
    if (kind == "launch") {
      read_launch(c, op, path, blobs, m, spec);
    } else if (kind == "memset") {
      spec.kind = OpKind::kMemset;
      spec.dst = c.index(op, path, "buffer", m.buffers.size(), "buffers");
      check_writable(c, Checker::join(path, "buffer"), m, spec.dst);
      spec.dst_offset = uint64_t(c.integer(op, path, "offset", 0, kMaxI64));
      spec.bytes = uint64_t(c.integer(op, path, "bytes", 1, int64_t(kBundleMaxBufferBytes)));
      spec.value = uint8_t(c.integer(op, path, "value", 0, 255));
      read_range(c, path, spec.dst_offset, spec.bytes, m.buffers[spec.dst].bytes,
                 ("buffer " + std::to_string(spec.dst)).c_str());
    } else if (kind == "copy") {
      spec.kind = OpKind::kCopy;
      spec.dst = c.index(op, path, "dst", m.buffers.size(), "buffers");
      check_writable(c, Checker::join(path, "dst"), m, spec.dst);
      spec.dst_offset = uint64_t(c.integer(op, path, "dst_offset", 0, kMaxI64));
      spec.src = c.index(op, path, "src", m.buffers.size(), "buffers");
      spec.src_offset = uint64_t(c.integer(op, path, "src_offset", 0, kMaxI64));
      spec.bytes = uint64_t(c.integer(op, path, "bytes", 1, int64_t(kBundleMaxBufferBytes)));
      read_range(c, Checker::join(path, "dst"), spec.dst_offset, spec.bytes, m.buffers[spec.dst].bytes,
                 ("buffer " + std::to_string(spec.dst)).c_str());
      read_range(c, Checker::join(path, "src"), spec.src_offset, spec.bytes, m.buffers[spec.src].bytes,
                 ("buffer " + std::to_string(spec.src)).c_str());
      if (spec.src == spec.dst && spec.src_offset < spec.dst_offset + spec.bytes &&
          spec.dst_offset < spec.src_offset + spec.bytes)
        c.fail(path, "copies buffer " + std::to_string(spec.src) + " [" + std::to_string(spec.src_offset) + ", +" +
                         std::to_string(spec.bytes) + ") onto the overlapping [" + std::to_string(spec.dst_offset) +
                         ", +" + std::to_string(spec.bytes) + ")");
    } else {
      c.fail(Checker::join(path, "op"), "\"" + shown(kind) + "\" is not launch, memset or copy");
    }
    m.ops.push_back(std::move(spec));
  });
}

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


// --- dynamic batch (docs/bundle-format.md, "Dynamic batch") ----------------------------------------------
// Every rule [a, b] has |a|, |b| <= 2^40 and batches are <= 2^31 - 1, so a * batch + b fits an int64, and
// sums of up to 2^18 such values (scratch + constant bytes) stay below 2^63. Each range rule is checked at
// batch.min and batch.max: rules are affine, so it then holds for every batch in between.

/// `batch`'s {min, traced, max}: integers with 1 <= min <= traced <= max <= 2^31 - 1 (manifest and signature alike).
void read_batch_range(const Checker& c, const JsonValue& batch, int64_t& min, int64_t& traced, int64_t& max) {
  min = c.integer(batch, "batch", "min", 1, kBundleMaxBatch);
  max = c.integer(batch, "batch", "max", 1, kBundleMaxBatch);
  traced = c.integer(batch, "batch", "traced", 1, kBundleMaxBatch);
  if (!(min <= traced && traced <= max))
    c.fail("batch", "must have min <= traced <= max, got min " + std::to_string(min) + ", traced " +
                        std::to_string(traced) + ", max " + std::to_string(max));
}

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

}  // namespace

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

namespace {
}  // namespace

/// Every output is written by an op (a launch's relocation into it, a memset or a copy onto it) or filled by its init:
/// a segment writing none of an output would hand the caller memory nothing wrote (docs/bundle-format.md §2).
void check_outputs_written(const Checker& c, const Manifest& m) {
  std::vector<bool> written(m.buffers.size(), false);
  for (const OpSpec& op : m.ops) {
    if (op.kind != OpKind::kLaunch) written[op.dst] = true;
    for (const RelocSpec& r : op.relocs) written[r.buffer] = true;
  }
  for (size_t i = 0; i < m.buffers.size(); ++i) {
    const BufferSpec& b = m.buffers[i];
    if (b.role == BufferRole::kOutput && b.init == BufferInit::kNone && !written[i])
      c.fail(Checker::at("buffers", i), "is signature.outputs[" + std::to_string(b.io) +
                                            "], which no op writes and no init fills (a call would return memory "
                                            "nothing wrote)");
  }
}

Manifest read_manifest(std::string_view json, const std::vector<std::string_view>& blobs,
                       uint32_t min_reader_version) {
  Checker c("leapp bundle: manifest ");
  JsonValue root = parse_json(json, "leapp bundle: manifest", kBundleJsonLimits);
  Manifest m;
  c.typed(root, "(root)", Type::kObject, "an object");
  const std::string format = c.string(root, "", "format");
  if (format != kBundleManifestFormat) c.fail("format", "\"" + shown(format) + "\" is not \"leapp.warp.bundle\"");
  m.segment = c.string(root, "", "segment");
  c.set_segment(m.segment);
  m.source = c.string(root, "", "source");
  const JsonValue& producer = c.object(root, "", "producer");
  for (const auto& kv : producer.object) {
    c.typed(kv.second, "producer." + shown(kv.first, 80), Type::kString, "a string");
    m.producer.emplace_back(kv.first, kv.second.string);
  }
  std::map<uint32_t, std::string> decoded_blobs;  // blob -> its decoded bytes (decoded_image)
  read_modules(c, root, blobs, min_reader_version, decoded_blobs, m);
  read_kernels(c, root, m);
  read_cpu_code(c, root, blobs, min_reader_version, decoded_blobs, m);
  read_buffers(c, root, blobs, m);
  read_ops(c, root, blobs, m);
  const JsonValue& sig = c.object(root, "", "signature");
  read_signature_side(c, sig, "inputs", BufferRole::kInput, m, m.inputs);
  read_signature_side(c, sig, "outputs", BufferRole::kOutput, m, m.outputs);
  for (size_t i = 0; i < m.buffers.size(); ++i) {
    const BufferSpec& buf = m.buffers[i];
    if (buf.init != BufferInit::kInput) continue;
    const std::string p = Checker::join(Checker::join(Checker::at("buffers", i), "init"), "input");
    if (buf.init_index >= m.inputs.size())
      c.fail(p, std::to_string(buf.init_index) + " out of range (" + std::to_string(m.inputs.size()) + " inputs)");
    if (m.inputs[buf.init_index].bytes != buf.bytes)
      c.fail(p, std::to_string(buf.init_index) + " has " + std::to_string(m.inputs[buf.init_index].bytes) +
                    " bytes, the buffer " + std::to_string(buf.bytes));
  }
  check_outputs_written(c, m);
  read_dynamic(c, root, blobs, min_reader_version, m);
  return m;
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

bool is_ptx_isa_text(std::string_view s) {
  size_t dot = s.find('.');
  auto digits = [](std::string_view d) {
    return !d.empty() && d.size() <= 3 && std::all_of(d.begin(), d.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
  };
  return dot != std::string_view::npos && digits(s.substr(0, dot)) && digits(s.substr(dot + 1));
}

std::string ptx_isa_of(std::string_view ptx) {
  std::string_view head = ptx.substr(0, 4096);
  size_t at = head.find(".version");
  if (at == std::string_view::npos) return "";
  size_t i = at + 8, spaces = 0;
  while (i < head.size() && (head[i] == ' ' || head[i] == '\t')) ++i, ++spaces;
  size_t j = i;
  while (j < head.size() && ((head[j] >= '0' && head[j] <= '9') || head[j] == '.')) ++j;
  std::string_view isa = head.substr(i, j - i);
  return spaces > 0 && is_ptx_isa_text(isa) ? std::string(isa) : "";
}

}  // namespace leapp::detail
