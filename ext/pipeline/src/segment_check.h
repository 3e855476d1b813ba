// ext/pipeline/src/segment_check.h: a node's `segments` entries checked against the bundles its artifact holds (internal).
//
// pipeline.yaml's segment entries are claims an edited folder can change with every digest recomputed; the
// bundles inside the artifact (sha256-checked) are what runs. leapp.load (leapp/runtime/segment_check.py) and
// this runner check the same, with the same texts, so both give one verdict: the count, each digest (the
// WarpSegment's `signature` attribute) and each producer.cpu_code claim against the bundle's own CPU code
// (docs/pipeline-format.md, "Segments").
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "description.h"

namespace leapp::pipeline_detail {

/// An ONNX node's segments against its model `model` (the bytes read from `model_path`); `files`: the node's checked
/// extra files as (resolved path, bytes), where external data comes from. Returns how many of the node's segments
/// hold CPU code for this machine (from the bundles); throws PipelineError on the first disagreement.
size_t check_onnx_segments(const Description& d, size_t index, const std::string& model_path, const std::string& model,
                           const std::vector<std::pair<std::string, const std::string*>>& files);

/// Whether a producer.cpu_code note names this machine (leapp.bundle.format.cpu_code_runs_here): the claim of a PT2
/// node's segments, whose bundles inside an AOTInductor package this runner cannot read (docs/pipeline-format.md).
bool claims_this_machine(const std::string& note);

}  // namespace leapp::pipeline_detail
