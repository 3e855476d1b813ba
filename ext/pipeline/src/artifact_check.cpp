// ext/pipeline/src/artifact_check.cpp: a node's files contained, sized and digested before anything opens them.
//
// Apart from pipeline.cpp because Pipeline::check (every node) and open_node.cpp (one node) both run them.
#include "artifact_check.h"

#include <cstdint>
#include <filesystem>
#include <system_error>
#include <utility>
#include <vector>

#include "aoti_host.h"
#include "leapp/pipeline.h"
#include "segment_check.h"
#include "sha256.h"
#include "signed_files.h"

namespace leapp::pipeline_detail {

namespace {

/// The steps read_checked and verify_file share: the path contained and present, before anything reads it.
std::string present_path(const Description& d, const std::string& where, const std::string& rel,
                         const std::string& field) {
  std::string path = contained_path(d.folder, rel, field + " (" + where + ")");
  if (!is_regular_file(path)) throw PipelineError(where + ": artifact " + path + " is missing");
  return path;
}

void check_digest(const std::string& where, const std::string& path, const std::string& actual,
                  const std::string& expected) {
  if (actual != expected)
    throw PipelineError(where + ": artifact " + path + " has sha256 " + actual + " but pipeline.yaml records " +
                        expected + "; the file changed after export");
}

}  // namespace

/// leapp.pipeline_format.read_checked, same order and texts: contained, present, at most
/// LEAPP_MAX_ARTIFACT_BYTES (checked before reading), same sha256 over the bytes read.
CheckedFile read_checked(const Description& d, const std::string& where, const std::string& rel,
                         const std::string& expected, const std::string& field) {
  std::string path = present_path(d, where, rel, field);
  std::string data = read_artifact(path, where);
  const auto digest = leapp::detail::sha256(data.data(), data.size());
  const std::string actual = leapp::detail::to_hex(digest.data(), digest.size());
  check_signed_digest(d.signed_files.get(), path, actual, where);  // a signed export: the bytes signed, first
  check_digest(where, path, actual, expected);
  return {path, std::move(data)};
}

/// read_checked without keeping the bytes (--check, the PT2 beside an AOTInductor package): the size limit
/// first, then the sha256 over the file read in chunks.
std::string verify_file(const Description& d, const std::string& where, const std::string& rel,
                        const std::string& expected, const std::string& field) {
  std::string path = present_path(d, where, rel, field);
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(path, ec);
  if (!ec) check_artifact_size(path, size, where);
  const std::string actual = sha256_file(path);
  check_signed_digest(d.signed_files.get(), path, actual, where);
  check_digest(where, path, actual, expected);
  return path;
}

/// Every artifact and extra file of every node, as leapp.load checks them before opening a node.
void verify_files(const Description& d) {
  for (size_t i = 0; i < d.nodes.size(); ++i) {
    const NodeDescription& n = d.nodes[i];
    const std::string where = "pipeline '" + d.name + "' node '" + n.name + "'";
    const std::string field = d.file + ": nodes[" + std::to_string(i) + "]";
    if (n.backend == "onnx") {  // and the bundles the model holds, parsed (CPU code checked) as opening would: no map
      const CheckedFile model = read_checked(d, where, n.artifact, n.sha256, field + ".artifact");
      std::vector<CheckedFile> checked;
      for (size_t f = 0; f < n.files.size(); ++f)
        checked.push_back(read_checked(d, where, n.files[f].first, n.files[f].second,
                                       field + ".files[" + std::to_string(f) + "].path"));
      std::vector<std::pair<std::string, const std::string*>> files;
      for (const CheckedFile& file : checked) files.emplace_back(file.path, &file.data);
      try {
        check_onnx_segments(d, i, model.path, model.data, files);
      } catch (const std::invalid_argument& e) {
        throw PipelineError(where + ": cannot open " + model.path + " (onnx; is the file corrupt or truncated?): "
                            "PipelineError: " + std::filesystem::path(model.path).filename().string() + " is " + e.what());
      }
      continue;
    }
    verify_file(d, where, n.artifact, n.sha256, field + ".artifact");
    for (size_t f = 0; f < n.files.size(); ++f)
      verify_file(d, where, n.files[f].first, n.files[f].second, field + ".files[" + std::to_string(f) + "].path");
    if (n.backend == "pt2" && n.has_aoti) verify_aoti_package(d, i);
  }
}

}  // namespace leapp::pipeline_detail
