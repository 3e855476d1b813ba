// ext/pipeline/src/description.h: pipeline.json read and checked as leapp.pipeline_format checks pipeline.yaml (internal).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace leapp::pipeline_detail {

struct SignedFiles;  // signed_files.h

struct Spec {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::string metadata = "{}";  ///< the entry's `metadata` as compact JSON text ("{}" without one)
  int64_t batch_min = 0, batch_max = 0;  ///< dynamic batch: dim 0 in [batch_min, batch_max]; (0, 0): static
};

/// One entry of a node's `segments`: what the readers check against the bundles the artifact holds.
struct SegmentDescription {
  std::string id, digest;
  std::string cpu_code = "none";  ///< producer.cpu_code: "x86_64, aarch64" or "none: why" (a claim)
};

struct NodeDescription {
  std::string name, backend, artifact, sha256, device;
  std::vector<std::pair<std::string, std::string>> files;  ///< (path, sha256): ONNX external data
  std::vector<Spec> inputs, outputs;
  size_t segments = 0;
  std::vector<SegmentDescription> segment_list;
  bool has_aoti = false;  ///< the node's `aoti` entry: the AOTInductor package `leapp aoti` recorded (PT2 nodes)
  std::string aoti_path, aoti_sha256, aoti_torch;
};

struct Edge {
  std::string from_node, from_output, to_node, to_input;
  bool feedback = false;
  bool state = false;  ///< `state: true`: a value the pipeline carries from the node's run to its next (from == to)
};

struct PipelineInput {
  Spec spec;
  std::vector<std::pair<std::string, std::string>> consumers;  ///< (node, input)
};

struct PipelineOutput {
  Spec spec;
  std::string node, output;
};

struct Description {
  std::string folder;     ///< the folder as Python's str(Path(arg)) shows it
  std::string yaml_file;  ///< folder/pipeline.yaml as shown
  std::string file;       ///< folder/pipeline.json as shown: the file the messages name
  std::string name;
  std::vector<NodeDescription> nodes;
  std::vector<Edge> edges;
  std::vector<PipelineInput> inputs;
  std::vector<PipelineOutput> outputs;
  /// `initial_values`, present exactly when some edge is a state edge: the safetensors file of their initial
  /// values (initial_values.h reads it), relative to the folder, and its sha256.
  bool has_initial_values = false;
  std::string initial_values_path, initial_values_sha256;
  /// A signed export verified at open (PipelineOptions::trusted_keys, $LEAPP_TRUST): every file read is compared
  /// with its signed digest (signed_files.h); null when no trust is configured.
  std::shared_ptr<const SignedFiles> signed_files;
};

constexpr const char* kPipelineYaml = "pipeline.yaml";
constexpr const char* kPipelineJson = "pipeline.json";
constexpr const char* kTwinDigestKey = "pipeline_yaml_sha256";

/// The export folder `arg` names (the folder itself, or the parent of a file in it), as Python shows it.
std::string export_folder(const std::string& arg);

/// Reads `path` (an export folder or a file in it); throws leapp::PipelineError. With `signed_files` (the folder
/// verified), pipeline.json and pipeline.yaml must be the bytes signed.
Description read_description(const std::string& path, std::shared_ptr<const SignedFiles> signed_files = nullptr);

/// leapp.pipeline_format.contained_path: the resolved folder/rel, or PipelineError naming `where`.
std::string contained_path(const std::string& folder, const std::string& rel, const std::string& where);

/// Lower-case hex sha256 of a file (read in chunks).
std::string sha256_file(const std::string& path);

/// leapp.pipeline_format.max_artifact_bytes: $LEAPP_MAX_ARTIFACT_BYTES, default 4 GiB; PipelineError when the
/// variable is not a positive count.
uint64_t max_artifact_bytes();

/// PipelineError (leapp.pipeline_format.read_bounded's text) when `size` bytes of `path` exceed max_artifact_bytes().
void check_artifact_size(const std::string& path, uint64_t size, const std::string& where);

/// leapp.pipeline_format.read_bounded, same text: the bytes of `path`, refused before reading (PipelineError
/// naming `where`) when the file holds more than max_artifact_bytes().
std::string read_artifact(const std::string& path, const std::string& where);

/// Whether `path` names a regular file (symlinks followed), as Python's Path.is_file().
bool is_regular_file(const std::string& path);

/// Python's str(Path(a) / b) for display.
std::string join_shown(const std::string& folder, const std::string& name);

}  // namespace leapp::pipeline_detail
