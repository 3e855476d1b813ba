// ext/core/src/module_loader.cpp: binary choice (docs/bundle-format.md section 3) and module loading.
//
// A cubin for the device's SM family avoids the driver's PTX JIT, whose
// accepted PTX ISA is capped by the driver version (a CUDA 13.0 driver rejects
// Warp 1.19's ISA 9.4 with error 222); PTX stays the fallback for new GPUs.
// choose_binary() is the one implementation of the choice: the loader tries
// its candidates in order (each failure is kept for the message), and
// `leapp inspect` / `leapp doctor` report it through leapp._native.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "manifest.h"
#include "replay_internal.h"

namespace leapp {
namespace {

std::string binary_name(const BinarySpec& b) {
  return std::string(b.kind == BinaryKind::kPtx ? "ptx" : "cubin") + " sm_" + std::to_string(b.arch);
}

std::string cc_text(uint32_t arch) { return std::to_string(arch / 10) + "." + std::to_string(arch % 10); }

std::string version_text(int version) {  // 13040 -> "13.4"
  return std::to_string(version / 1000) + "." + std::to_string((version % 1000) / 10);
}

/// {major, minor} of "9.4"; {0, 0} when `s` is not of that form.
std::pair<int, int> parse_isa(const std::string& s) {
  if (!detail::is_ptx_isa_text(s)) return {0, 0};
  size_t dot = s.find('.');
  return {std::stoi(s.substr(0, dot)), std::stoi(s.substr(dot + 1))};
}

std::string isa_text(std::pair<int, int> isa) { return std::to_string(isa.first) + "." + std::to_string(isa.second); }

// (CUDA version, newest PTX ISA its driver JIT reads), from the PTX ISA release notes.
// CUDA 13.x reads ISA 9.x (13.0 -> 9.0 ... 13.4 -> 9.4; measured: a 13.0 driver refuses 9.1-9.4).
struct IsaRow {
  int cuda;
  int major, minor;
};
constexpr IsaRow kIsaTable[] = {
    {10000, 6, 3}, {10010, 6, 4}, {10020, 6, 5}, {11000, 7, 0}, {11010, 7, 1}, {11020, 7, 2}, {11030, 7, 3},
    {11040, 7, 4}, {11050, 7, 5}, {11060, 7, 6}, {11070, 7, 7}, {11080, 7, 8}, {12000, 8, 0}, {12010, 8, 1},
    {12020, 8, 2}, {12030, 8, 3}, {12040, 8, 4}, {12050, 8, 5}, {12060, 8, 5}, {12080, 8, 7}, {12090, 8, 8},
    {13000, 9, 0}, {13010, 9, 1}, {13020, 9, 2}, {13030, 9, 3}, {13040, 9, 4},
};

/// The CUDA major version of producer.cuda_toolkit ("13.4" -> 13), 0 when it is not a version.
int toolkit_major(const Manifest& m) {
  const std::string tk = m.producer_value("cuda_toolkit");
  size_t digits = 0;
  while (digits < tk.size() && digits < 3 && tk[digits] >= '0' && tk[digits] <= '9') ++digits;
  if (digits == 0 || (digits < tk.size() && tk[digits] != '.')) return 0;
  return std::stoi(tk.substr(0, digits));
}

bool isa_less(std::pair<int, int> a, std::pair<int, int> b) { return a < b; }

}  // namespace

std::pair<int, int> driver_ptx_isa(int driver_version) {
  if (driver_version <= 0) return {0, 0};
  if (driver_version >= 14000) return {99, 99};
  if (driver_version >= 13000) return {9, (driver_version % 1000) / 10};  // 13.x reads 9.x
  std::pair<int, int> best{0, 0};
  for (const IsaRow& row : kIsaTable)
    if (row.cuda <= driver_version) best = {row.major, row.minor};
  return best;
}

int ptx_isa_min_driver(int isa_major, int isa_minor) {
  for (const IsaRow& row : kIsaTable)
    if (!isa_less({row.major, row.minor}, {isa_major, isa_minor})) return row.cuda;
  if (isa_major == 9 && isa_minor < 100) return 13000 + 10 * isa_minor;  // the 13.x rule beyond the table
  return 0;
}

std::vector<BinarySpec> binary_candidates(const ModuleSpec& module, int cc_major, int cc_minor) {
  const int arch = 10 * cc_major + cc_minor;
  std::vector<BinarySpec> out;
  // 1. exact cubin
  for (const BinarySpec& b : module.binaries)
    if (b.kind == BinaryKind::kCubin && int(b.arch) == arch) {
      out.push_back(b);
      break;
    }
  // 2. same major, lower minor: highest first
  std::vector<BinarySpec> family;
  for (const BinarySpec& b : module.binaries)
    if (b.kind == BinaryKind::kCubin && int(b.arch) / 10 == cc_major && int(b.arch) % 10 < cc_minor)
      family.push_back(b);
  std::stable_sort(family.begin(), family.end(), [](const BinarySpec& a, const BinarySpec& b) { return a.arch > b.arch; });
  out.insert(out.end(), family.begin(), family.end());
  // 3. PTX with arch <= the device's: highest first
  std::vector<BinarySpec> ptx;
  for (const BinarySpec& b : module.binaries)
    if (b.kind == BinaryKind::kPtx && int(b.arch) <= arch) ptx.push_back(b);
  std::stable_sort(ptx.begin(), ptx.end(), [](const BinarySpec& a, const BinarySpec& b) { return a.arch > b.arch; });
  out.insert(out.end(), ptx.begin(), ptx.end());
  return out;
}

BinaryChoice choose_binary(const Manifest& manifest, uint32_t module, int cc_major, int cc_minor, int driver_version,
                           const std::string& device) {
  if (module >= manifest.modules.size())
    throw std::invalid_argument("module " + std::to_string(module) + " out of range (" +
                                std::to_string(manifest.modules.size()) + " modules)");
  const ModuleSpec& spec = manifest.modules[module];
  const int arch = 10 * cc_major + cc_minor;
  const std::string cc = std::to_string(cc_major) + "." + std::to_string(cc_minor);
  const std::pair<int, int> reads = driver_ptx_isa(driver_version);
  const std::string driver = driver_version > 0 ? "CUDA " + version_text(driver_version) + " driver" : "";
  const int tk_major = toolkit_major(manifest);
  BinaryChoice out;

  for (const BinarySpec& b : spec.binaries) {
    out.holdings += (out.holdings.empty() ? "" : ", ") + binary_name(b);
    if (b.kind == BinaryKind::kPtx) out.holdings += " (PTX ISA " + (b.ptx_isa.empty() ? "unknown" : b.ptx_isa) + ")";
  }

  std::vector<BinarySpec> order = binary_candidates(spec, cc_major, cc_minor);
  std::vector<BinaryOption> later;  // candidates expected to fail: tried after the others
  std::pair<int, int> newest_refused{0, 0};
  bool cubin_refused = false;
  for (const BinarySpec& b : order) {
    BinaryOption o{b, true, ""};
    if (b.kind == BinaryKind::kCubin) {
      o.reason = int(b.arch) == arch ? "exact match for compute capability " + cc
                                     : "SASS for " + cc_text(b.arch) + " runs on " + cc + " (same major, lower minor)";
      if (driver_version > 0 && tk_major > 0 && driver_version / 1000 < tk_major) {
        o.expected = false;
        cubin_refused = true;
        o.reason += "; but it was built by CUDA " + manifest.producer_value("cuda_toolkit") + " and a " + driver +
                    " predates CUDA " + std::to_string(tk_major) + ".0";
      }
    } else {
      const std::pair<int, int> isa = parse_isa(b.ptx_isa);
      o.reason = "driver JIT of compute_" + std::to_string(b.arch) + " PTX" +
                 (b.ptx_isa.empty() ? " (ISA unknown)" : " (ISA " + b.ptx_isa + ")") + " for " + cc;
      if (driver_version > 0 && isa.first > 0) {
        if (isa_less(reads, isa)) {
          o.expected = false;
          if (isa_less(newest_refused, isa)) newest_refused = isa;
          const int need = ptx_isa_min_driver(isa.first, isa.second);
          o.reason += "; but the " + driver + " reads PTX up to ISA " + isa_text(reads) + " (ISA " + b.ptx_isa +
                      (need ? " needs CUDA " + version_text(need) + " or later)" : " is newer than any known driver)");
        } else {
          o.reason += reads.first == 99 ? "; the " + driver + " reads it"
                                        : "; the " + driver + " reads PTX up to ISA " + isa_text(reads);
        }
      }
    }
    (o.expected ? out.candidates : later).push_back(std::move(o));
  }
  if (!out.candidates.empty()) out.chosen = 0;
  out.candidates.insert(out.candidates.end(), later.begin(), later.end());

  for (const BinarySpec& b : spec.binaries) {
    if (std::any_of(order.begin(), order.end(), [&](const BinarySpec& c) { return c.blob == b.blob && c.kind == b.kind && c.arch == b.arch; }))
      continue;
    BinaryOption o{b, false, ""};
    if (b.kind == BinaryKind::kCubin)
      o.reason = "SASS for " + cc_text(b.arch) + " runs only on compute capability " + std::to_string(b.arch / 10) +
                 ".x with minor >= " + std::to_string(b.arch % 10);
    else
      o.reason = "PTX for compute_" + std::to_string(b.arch) + " needs compute capability " + cc_text(b.arch) +
                 " or later";
    out.excluded.push_back(std::move(o));
  }

  const std::string who = (device.empty() ? std::string("a GPU") : device) + " (compute capability " + cc + ")";
  if (out.chosen >= 0) {
    const BinaryOption& c = out.candidates[out.chosen];
    out.summary = binary_name(c.binary) + ": " + c.reason;
    return out;
  }
  out.summary = "no binary fits " + who + (driver.empty() ? "" : " with the " + driver) + ": the bundle holds " +
                out.holdings + ".";
  if (order.empty()) {
    out.summary += " None runs on compute capability " + cc + ".";
    out.summary += arch < 75 ? " leapp exports for compute capability 7.5 and later (CUDA 13 dropped older GPUs)."
                             : " Re-export with a cubin for sm_" + std::to_string(arch) +
                                   " (LEAPP_CUDA_ARCHS) or PTX for an arch <= " + std::to_string(arch) + ".";
    return out;
  }
  if (newest_refused.first > 0) {
    const int need = ptx_isa_min_driver(newest_refused.first, newest_refused.second);
    out.summary += " Its PTX is ISA " + isa_text(newest_refused) + ", this driver reads PTX up to ISA " +
                   isa_text(reads) + ".";
    out.summary += need ? " Update the driver to CUDA " + version_text(need) + " or later, or" : " Either";
    out.summary += " re-export with " +
                   (cubin_refused ? std::string() : "a cubin for sm_" + std::to_string(arch) + " or with ") +
                   "PTX of an older ISA (leapp[ptx-compat], docs/portability.md).";
  }
  if (cubin_refused)
    out.summary += " Its cubins were built by CUDA " + manifest.producer_value("cuda_toolkit") +
                   ": they need a CUDA " + std::to_string(tk_major) + ".0 driver or later.";
  return out;
}

namespace detail {
namespace {

uint64_t read_u64(std::string_view b, size_t at) {
  uint64_t v = 0;
  std::memcpy(&v, b.data() + at, 8);
  return v;
}
uint32_t read_u32(std::string_view b, size_t at) {
  uint32_t v = 0;
  std::memcpy(&v, b.data() + at, 4);
  return v;
}
uint16_t read_u16(std::string_view b, size_t at) {
  uint16_t v = 0;
  std::memcpy(&v, b.data() + at, 2);
  return v;
}

/// Why a cubin blob is not a well-bounded ELF64 image, or "" when it is. The
/// bundle hashes prove integrity, not validity, and the driver trusts the
/// ELF's own offsets: every table and section must lie inside the blob.
std::string elf_problem(std::string_view b) {
  if (b.size() < 64 || b.substr(0, 4) != std::string_view("\x7f" "ELF", 4)) return "not an ELF image";
  if (b[4] != 2 || b[5] != 1) return "not a 64-bit little-endian ELF image";
  const uint64_t size = b.size();
  const uint64_t phoff = read_u64(b, 32), shoff = read_u64(b, 40);
  const uint64_t phentsize = read_u16(b, 54), phnum = read_u16(b, 56);
  const uint64_t shentsize = read_u16(b, 58), shnum = read_u16(b, 60);
  if (phnum && (phentsize < 56 || phoff > size || phentsize * phnum > size - phoff))
    return "its program header table lies outside the image";
  if (shnum && (shentsize < 64 || shoff > size || shentsize * shnum > size - shoff))
    return "its section header table lies outside the image";
  for (uint64_t i = 0; i < shnum; ++i) {
    const size_t at = size_t(shoff + i * shentsize);
    const uint32_t type = read_u32(b, at + 4);
    const uint64_t offset = read_u64(b, at + 24), length = read_u64(b, at + 32);
    if (type != 8 /* SHT_NOBITS */ && (offset > size || length > size - offset))
      return "section " + std::to_string(i) + " lies outside the image";
  }
  for (uint64_t i = 0; i < phnum; ++i) {
    const size_t at = size_t(phoff + i * phentsize);
    const uint64_t offset = read_u64(b, at + 8), length = read_u64(b, at + 32);
    if (offset > size || length > size - offset) return "segment " + std::to_string(i) + " lies outside the image";
  }
  return "";
}

}  // namespace

std::string cuda_version_text(int version) { return version_text(version); }

LoadedModule load_module(const CudaDriver& d, const Bundle& bundle, uint32_t index, const DeviceAttrs& dev) {
  const Manifest& m = bundle.manifest();
  const ModuleSpec& module = m.modules.at(index);
  const std::string cc = std::to_string(dev.cc_major) + "." + std::to_string(dev.cc_minor);
  const std::string arch = std::to_string(10 * dev.cc_major + dev.cc_minor);
  const std::string where = "leapp segment '" + m.segment + "': module " + std::to_string(index) +
                            (module.name.empty() ? "" : " '" + module.name + "'");
  int driver = d.version;
  try {
    driver = assumed_driver_version(d.version);  // $LEAPP_ASSUME_DRIVER: choose as an older driver would
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(where + " cannot be loaded: " + e.what());
  }
  const bool assumed = driver != d.version;
  const BinaryChoice choice = choose_binary(m, index, dev.cc_major, dev.cc_minor, driver, dev.name);
  const std::string context = "device " + std::to_string(dev.ordinal) + " (" + dev.name + ", compute capability " + cc +
                              "), CUDA driver " + cuda_version_text(d.version) +
                              (assumed ? " loading as a CUDA " + cuda_version_text(driver) +
                                             " driver would (LEAPP_ASSUME_DRIVER)"
                                       : std::string()) +
                              "; the bundle holds " + choice.holdings;

  if (choice.candidates.empty())
    throw std::runtime_error(where + " has no binary for " + context + ". Re-export with a cubin for sm_" + arch +
                             " or PTX for an arch <= " + arch + ".");

  std::string attempts;
  CUresult last = CUDA_SUCCESS;
  bool ptx_too_new = false;
  std::string rejected_isa;  // the ISA the driver refused
  for (const BinaryOption& option : choice.candidates) {
    if (assumed && !option.expected) continue;  // the older driver would refuse it: never let this one accept it
    const BinarySpec& b = option.binary;
    const std::string decoded = b.encoding == BinaryEncoding::kRaw ? std::string() : bundle.binary_image(b);
    std::string_view image = b.encoding == BinaryEncoding::kRaw ? bundle.blob(b.blob) : std::string_view(decoded);
    if (b.kind == BinaryKind::kCubin) {
      std::string problem = elf_problem(image);
      if (!problem.empty()) {  // never hand the driver an image whose offsets point outside it
        attempts += "\n  " + binary_name(b) + ": not loaded: " + problem + " (" + std::to_string(image.size()) + " bytes)";
        continue;
      }
    }
    char log[4096] = {0};
    int options[2] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
    void* values[2] = {log, reinterpret_cast<void*>(uintptr_t(sizeof(log) - 1))};
    CUmodule mod = nullptr;
    CUresult r = d.cuModuleLoadDataEx(&mod, image.data(), 2, options, values);
    if (r == CUDA_SUCCESS) return {mod, binary_name(b)};
    last = r;
    if (b.kind == BinaryKind::kPtx && r == CUDA_ERROR_UNSUPPORTED_PTX_VERSION) {
      ptx_too_new = true;
      if (rejected_isa.empty()) rejected_isa = b.ptx_isa.empty() ? "unknown" : b.ptx_isa;
    }
    std::string jit(log);
    while (!jit.empty() && (jit.back() == '\n' || jit.back() == ' ')) jit.pop_back();
    attempts += "\n  " + binary_name(b) + ": " + cu_error_text(r) + " [code " + std::to_string(r) + "]" +
                (jit.empty() ? "" : " JIT log: " + jit);
  }
  std::string msg = where + " could not be loaded on " + context + ". Tried:" + attempts;
  const bool family_cubin = std::any_of(choice.candidates.begin(), choice.candidates.end(),
                                        [](const BinaryOption& o) { return o.binary.kind == BinaryKind::kCubin; });
  if (ptx_too_new) {
    const std::pair<int, int> reads = driver_ptx_isa(driver);
    const std::pair<int, int> isa = parse_isa(rejected_isa);
    const int need = isa.first ? ptx_isa_min_driver(isa.first, isa.second) : 0;
    msg += "\nCUDA_ERROR_UNSUPPORTED_PTX_VERSION (222): the CUDA " + cuda_version_text(driver) +
           " driver cannot JIT-compile PTX ISA " + rejected_isa + " (it reads PTX up to ISA " +
           (reads.first ? isa_text(reads) : std::string("unknown")) +
           "; a driver reads PTX only up to its own CUDA version). Update the driver to " +
           (need ? "CUDA " + version_text(need) + " or later" : "one that reads PTX ISA " + rejected_isa) +
           ", or re-export the bundle with " + (family_cubin ? std::string() : "a cubin for sm_" + arch + " or with ") +
           "PTX of an older ISA (leapp[ptx-compat], docs/portability.md).";
    const size_t cubins = choice.summary.find(" Its cubins were built");
    if (choice.chosen < 0 && cubins != std::string::npos) msg += "\n" + choice.summary.substr(cubins + 1);
  } else if (choice.chosen < 0) {
    msg += "\n" + choice.summary;
  }
  if (last == CUDA_SUCCESS) throw std::runtime_error(msg);  // nothing reached the driver
  throw CudaError(last, msg);
}

}  // namespace detail
}  // namespace leapp
