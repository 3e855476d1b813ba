// ext/core/src/manifest.cpp: every field rule of docs/bundle-format.md section 2.
//
// Each check names the field by its JSON path ("ops[3].relocs[0].buffer") so a
// corrupt or hand-edited bundle says exactly what is wrong. Nothing here
// trusts an index or a length before checking it against what it points into.
//
// The dynamic-batch rules are in manifest_dynamic.cpp, the tensor entries of a signature in
// manifest_signature.cpp; manifest_internal.h holds the Checker all three report through.
#include "manifest.h"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>

#include "elf_check.h"
#include "json.h"
#include "lz4_block.h"
#include "manifest_internal.h"

namespace leapp::detail {
namespace {

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

}  // namespace

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
