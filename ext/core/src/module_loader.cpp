// ext/core/src/module_loader.cpp: binary choice (docs/bundle-format.md section 3) and module loading.
//
// A cubin for the device's SM family avoids the driver's PTX JIT, whose
// accepted PTX ISA is capped by the driver version (a CUDA 13.0 driver rejects
// Warp 1.19's ISA 9.4 with error 222); PTX stays the fallback for new GPUs.
// Every candidate is tried in order and each failure is kept for the message.
#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "replay_internal.h"

namespace leapp {

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

namespace detail {
namespace {

std::string binary_name(const BinarySpec& b) {
  return std::string(b.kind == BinaryKind::kPtx ? "ptx" : "cubin") + " sm_" + std::to_string(b.arch);
}

/// The ISA of a PTX text (".version 9.4" -> "9.4"), or "" when it has none near the top.
std::string ptx_isa_of(std::string_view ptx) {
  size_t at = ptx.substr(0, 4096).find(".version");
  if (at == std::string_view::npos) return "";
  size_t i = at + 8;
  while (i < ptx.size() && (ptx[i] == ' ' || ptx[i] == '\t')) ++i;
  size_t j = i;
  while (j < ptx.size() && j - i < 8 && ((ptx[j] >= '0' && ptx[j] <= '9') || ptx[j] == '.')) ++j;
  return std::string(ptx.substr(i, j - i));
}

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

std::string archs_present(const ModuleSpec& module) {
  std::string s;
  for (const BinarySpec& b : module.binaries) s += (s.empty() ? "" : ", ") + binary_name(b);
  return s;
}

}  // namespace

std::string cuda_version_text(int version) {
  return std::to_string(version / 1000) + "." + std::to_string((version % 1000) / 10);
}

LoadedModule load_module(const CudaDriver& d, const Bundle& bundle, uint32_t index, const DeviceAttrs& dev) {
  const Manifest& m = bundle.manifest();
  const ModuleSpec& module = m.modules.at(index);
  const std::string isa = m.producer_value("ptx_isa").empty() ? "unknown" : m.producer_value("ptx_isa");
  const std::string cc = std::to_string(dev.cc_major) + "." + std::to_string(dev.cc_minor);
  const std::string arch = std::to_string(10 * dev.cc_major + dev.cc_minor);
  const std::string where = "leapp segment '" + m.segment + "': module " + std::to_string(index) +
                            (module.name.empty() ? "" : " '" + module.name + "'");
  const std::string context = "device " + std::to_string(dev.ordinal) + " (" + dev.name + ", compute capability " + cc +
                              "), CUDA driver " + cuda_version_text(d.version) + "; the bundle holds " +
                              archs_present(module) + " (PTX ISA " + isa + ")";

  std::vector<BinarySpec> candidates = binary_candidates(module, dev.cc_major, dev.cc_minor);
  if (candidates.empty())
    throw std::runtime_error(where + " has no binary for " + context + ". Re-export with a cubin for sm_" + arch +
                             " or PTX for an arch <= " + arch + ".");

  std::string attempts;
  CUresult last = CUDA_SUCCESS;
  bool ptx_too_new = false;
  std::string rejected_isa = isa;  // the ISA the driver refused: from the PTX text itself when it says
  for (const BinarySpec& b : candidates) {
    std::string_view image = bundle.blob(b.blob);
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
      std::string own = ptx_isa_of(image);
      if (!own.empty()) rejected_isa = own;
    }
    std::string jit(log);
    while (!jit.empty() && (jit.back() == '\n' || jit.back() == ' ')) jit.pop_back();
    attempts += "\n  " + binary_name(b) + ": " + cu_error_text(r) + " [code " + std::to_string(r) + "]" +
                (jit.empty() ? "" : " JIT log: " + jit);
  }
  std::string msg = where + " could not be loaded on " + context + ". Tried:" + attempts;
  if (ptx_too_new)
    msg += "\nCUDA_ERROR_UNSUPPORTED_PTX_VERSION (222): the CUDA " + cuda_version_text(d.version) +
           " driver cannot JIT-compile PTX ISA " + rejected_isa +
           " (a driver reads PTX only up to its own CUDA version). Update the driver to one that reads PTX ISA " +
           rejected_isa + ", or re-export the bundle with a cubin for sm_" + arch + ".";
  if (last == CUDA_SUCCESS) throw std::runtime_error(msg);  // nothing reached the driver
  throw CudaError(last, msg);
}

}  // namespace detail
}  // namespace leapp
