// ext/core/src/elf_check.h: the rules a CPU code object meets before anything maps it (docs/export-cpu.md
// section 4), the C++ reader's copy of leapp/bundle/elf.py: same rules, same order, same words.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace leapp::detail {

constexpr uint64_t kElfMaxLoadSpan = uint64_t(256) << 20;  ///< the address span of an object's PT_LOAD segments

/// Why the CPU code object `image` for `machine` ("x86_64" or "aarch64", e_machine `elf_machine`) may not be
/// loaded for these CPU entries; "" when it may. Reads only `image`; never maps or runs it.
std::string cpu_code_problem(std::string_view image, uint16_t elf_machine, const std::string& machine,
                             const std::vector<std::string>& entries);

/// The ELF header identity rules (magic, class, data, e_type, e_machine) of the first 64 bytes; "" when they hold.
std::string elf_problem(std::string_view data, uint16_t machine, const std::string& name);

}  // namespace leapp::detail
