// ext/core/src/manifest.h: manifest and signature field checks (internal).
#pragma once

#include <string_view>
#include <vector>

#include "leapp/runtime.h"

namespace leapp::detail {

/// Parses the manifest JSON and checks every field rule of docs/bundle-format.md
/// section 2. `blobs` are the (already hash-checked) blob bytes, for index and
/// length checks. Throws std::invalid_argument("leapp bundle '<segment>': <field> ...").
Manifest read_manifest(std::string_view json, const std::vector<std::string_view>& blobs);

/// Parses an op's `signature` attribute (see leapp::Signature).
Signature read_signature(std::string_view json);

}  // namespace leapp::detail
