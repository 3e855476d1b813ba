// ext/core/src/manifest.h: manifest and signature field checks (internal).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "leapp/runtime.h"

namespace leapp::detail {

/// Parses the manifest JSON and checks every field rule of docs/bundle-format.md
/// section 2. `blobs` are the (already hash-checked) blob bytes, for index and
/// length checks; compressed binaries are decoded to check them (section 1.1), which a file may use only
/// when its header's `min_reader_version` >= 2. Throws std::invalid_argument("leapp bundle '<segment>':
/// <field> ...").
Manifest read_manifest(std::string_view json, const std::vector<std::string_view>& blobs,
                       uint32_t min_reader_version);

/// The PTX ISA of a PTX text: the first ".version" in its first 4096 bytes, then spaces or
/// tabs, then "<1-3 digits>.<1-3 digits>" (e.g. "9.4"); "" when there is none of that form.
std::string ptx_isa_of(std::string_view ptx);

/// Whether `s` is "<1-3 digits>.<1-3 digits>".
bool is_ptx_isa_text(std::string_view s);

/// Warp's grid for `size` threads of `block_dim` (docs/export-cuda.md section 3): grid-stride kernels
/// ceil(size / block) capped at max_blocks (> 0) or 2^31 - 1; lean kernels spread over x, y, z.
void launch_grid(uint64_t size, uint32_t block_dim, bool grid_stride, uint32_t max_blocks, uint32_t grid[3]);

/// Parses an op's `signature` attribute (see leapp::Signature).
Signature read_signature(std::string_view json);

}  // namespace leapp::detail
