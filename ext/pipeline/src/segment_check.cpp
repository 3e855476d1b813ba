// ext/pipeline/src/segment_check.cpp: see segment_check.h. The texts are leapp/runtime/segment_check.py's.
#include "segment_check.h"

#include <cctype>
#include <filesystem>
#include <set>
#include <stdexcept>

#include "json.h"
#include "leapp/pipeline.h"
#include "leapp/runtime.h"
#include "onnx_external.h"
#include "pyrepr.h"

namespace leapp::pipeline_detail {
namespace {

namespace fs = std::filesystem;

const char* this_machine() {
#if defined(__x86_64__)
  return "x86_64";
#elif defined(__aarch64__)
  return "aarch64";
#else
  return "?";
#endif
}

std::string strip(const std::string& s) {
  size_t a = 0, b = s.size();
  while (a < b && std::isspace(static_cast<unsigned char>(s[a]))) ++a;
  while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1]))) --b;
  return s.substr(a, b - a);
}

/// The machines a producer.cpu_code note claims: none for "none..." (and no note), else its comma-separated names.
std::set<std::string> claimed(const std::string& note) {
  std::set<std::string> out;
  if (note.rfind("none", 0) == 0) return out;
  for (size_t start = 0; start <= note.size();) {
    size_t end = note.find(',', start);
    if (end == std::string::npos) end = note.size();
    out.insert(strip(note.substr(start, end - start)));
    start = end + 1;
  }
  return out;
}

/// The `digest` of a signature attribute ("" when it is not a JSON object with a string digest).
std::string signature_digest(const std::string& signature) {
  try {
    const leapp::detail::JsonValue v = leapp::detail::parse_json(signature, "signature", {32, 100000, "signature"});
    const leapp::detail::JsonValue* digest = v.type == leapp::detail::JsonValue::Type::kObject ? v.find("digest") : nullptr;
    return digest && digest->type == leapp::detail::JsonValue::Type::kString ? digest->string : "";
  } catch (const std::exception&) {
    return "";
  }
}

/// The bundle bytes of `seg`; false when there are none (not a uint8 initializer, external data outside the files).
bool bundle_bytes(const WarpSegmentNode& seg, const std::string& model_path,
                  const std::vector<std::pair<std::string, const std::string*>>& files, std::string& out) {
  if (!seg.has_bundle) return false;
  if (!seg.external) {
    out = seg.raw;
    return true;
  }
  if (seg.location.empty()) return false;
  std::error_code ec;
  const fs::path target = fs::weakly_canonical(fs::path(model_path).parent_path() / seg.location, ec);
  if (ec) return false;
  for (const auto& [path, data] : files) {
    if (fs::weakly_canonical(path, ec) != target || ec) continue;
    const uint64_t size = data->size();
    if (seg.offset > size) return false;
    const uint64_t length = seg.length < 0 ? size - seg.offset : uint64_t(seg.length);
    if (length > size - seg.offset) return false;
    out = data->substr(size_t(seg.offset), size_t(length));
    return true;
  }
  return false;
}

/// A note that claims every machine: the segment launches no kernel (copies and memsets only), so it needs no CPU code
/// (leapp.bundle.format.COPY_ONLY_NOTE).
bool claims_any_machine(const std::string& note) { return note.rfind("any", 0) == 0; }

}  // namespace

bool claims_this_machine(const std::string& note) {
  return claims_any_machine(note) || claimed(note).count(this_machine()) > 0;
}

size_t check_onnx_segments(const Description& d, size_t index, const std::string& model_path, const std::string& model,
                           const std::vector<std::pair<std::string, const std::string*>>& files) {
  const NodeDescription& node = d.nodes[index];
  const std::string field = d.file + ": nodes[" + std::to_string(index) + "].segments";
  const std::string name = fs::path(model_path).filename().string();
  const std::vector<WarpSegmentNode> found = onnx_warp_segments(model);  // the model parsed before: well-formed
  if (found.size() != node.segment_list.size())
    throw PipelineError(field + ": " + std::to_string(node.segment_list.size()) + " Warp segment(s) listed, but " +
                        name + " holds " + std::to_string(found.size()) +
                        " (leapp.warp WarpSegment nodes): the description and the artifact disagree");
  size_t here = 0;
  for (size_t i = 0; i < found.size(); ++i) {
    const SegmentDescription& s = node.segment_list[i];
    const std::string at = field + "[" + std::to_string(i) + "]";
    const std::string which = "segment " + repr_str(s.id) + " of node " + repr_str(node.name);
    const std::string digest = signature_digest(found[i].signature);
    if (digest != s.digest)
      throw PipelineError(at + ".digest: " + which + " records digest " + s.digest + ", but " + name + " holds " +
                          repr_str(digest) + " there: the description and the artifact disagree");
    std::string bytes;
    if (!bundle_bytes(found[i], model_path, files, bytes))
      throw PipelineError(at + ": " + which + ": " + name + " holds no bundle for it (its WarpSegment's last input is "
                          "not a uint8 initializer, or its external data is not one of the node's files)");
    std::shared_ptr<const Bundle> bundle;
    try {
      bundle = Bundle::parse(bytes.data(), bytes.size());
    } catch (const std::exception& e) {
      throw PipelineError(at + ": " + which + ": its bundle in " + name + " cannot be read: " + e.what());
    }
    std::set<std::string> machines;
    std::string listed;
    for (const CpuCodeSpec& code : bundle->manifest().cpu_code) {
      machines.insert(code.machine);
      listed += (listed.empty() ? "" : ", ") + code.machine;
    }
    const size_t kernels = bundle->manifest().kernels.size();
    if (claims_any_machine(s.cpu_code)) {
      if (kernels || !machines.empty())
        throw PipelineError(at + ".producer.cpu_code: " + which + " claims it runs on any machine without CPU code (" +
                            repr_str(s.cpu_code) + "), but its bundle launches " + std::to_string(kernels) +
                            " kernel(s) and holds CPU code for " + (listed.empty() ? "no machine" : listed));
      ++here;
      continue;
    }
    if (claimed(s.cpu_code) != machines)
      throw PipelineError(at + ".producer.cpu_code: " + which + " claims CPU code for " + repr_str(s.cpu_code) +
                          ", but its bundle holds CPU code for " + (listed.empty() ? "no machine" : listed));
    here += machines.count(this_machine());
  }
  return here;
}

}  // namespace leapp::pipeline_detail
