// ext/pipeline/src/artifact_check.h: a node's artifact and extra files contained, sized and digested (internal).
//
// leapp.pipeline_format.read_checked's steps, in its order and with its texts: the path inside the export folder,
// present, at most LEAPP_MAX_ARTIFACT_BYTES, the sha256 pipeline.yaml records. Pipeline::check runs them on every
// node (verify_files); open_node.cpp runs them on the node it opens.
#pragma once

#include <string>

#include "description.h"

namespace leapp::pipeline_detail {

/// A file a node names, as read once: `data` is what was hashed and what ONNX Runtime gets.
struct CheckedFile {
  std::string path;
  std::string data;
};

/// leapp.pipeline_format.read_checked, same order and texts: contained, present, at most
/// LEAPP_MAX_ARTIFACT_BYTES (checked before reading), same sha256 over the bytes read.
CheckedFile read_checked(const Description& d, const std::string& where, const std::string& rel,
                         const std::string& expected, const std::string& field);

/// read_checked without keeping the bytes (--check, the PT2 beside an AOTInductor package): the size limit
/// first, then the sha256 over the file read in chunks. Returns the contained path.
std::string verify_file(const Description& d, const std::string& where, const std::string& rel,
                        const std::string& expected, const std::string& field);

/// Every artifact and extra file of every node, as leapp.load checks them before opening a node.
void verify_files(const Description& d);

}  // namespace leapp::pipeline_detail
