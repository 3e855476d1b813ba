// ext/pipeline/src/signed_files.h: a signed export verified before anything is read, then read once (internal).
//
// Pipeline::open and Pipeline::check verify the folder (leapp/signing.h) before pipeline.json is parsed or any
// code mapped, when PipelineOptions::trusted_keys or $LEAPP_TRUST names keys; afterwards every file the runner
// reads (pipeline.json, pipeline.yaml, artifacts, ONNX external data, initial values, AOTInductor packages) is
// compared, bytes as read, with its signed digest: a file swapped after the check is refused, as leapp.load does.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "leapp/signing.h"

namespace leapp::pipeline_detail {

struct SignedFiles {
  std::string root;  ///< the folder's canonical path: files are looked up relative to it
  leapp::signing::SignedDigests digests;
};

/// The keys to trust: `trusted_keys` (paths) when given, else $LEAPP_TRUST's; empty: no verification.
std::vector<std::string> trusted_key_paths(const std::vector<std::string>& trusted_keys);

/// Verifies the export `arg` names against `key_paths` (non-empty); throws leapp::SignatureError.
std::shared_ptr<const SignedFiles> verify_export(const std::string& arg, const std::vector<std::string>& key_paths);

/// With `signed_files`: `data`, just read from `path`, must be the file's signed bytes; leapp::SignatureError
/// naming `where` otherwise (also for a file the signature does not cover). Without: nothing.
void check_signed(const SignedFiles* signed_files, const std::string& path, const std::string& data,
                  const std::string& where);

/// check_signed for a file hashed in chunks (`actual`: its sha256 hex).
void check_signed_digest(const SignedFiles* signed_files, const std::string& path, const std::string& actual,
                         const std::string& where);

}  // namespace leapp::pipeline_detail
