// ext/pipeline/src/signed_files.cpp: see signed_files.h.
#include "signed_files.h"

#include <filesystem>
#include <system_error>

#include "description.h"
#include "leapp/pipeline.h"
#include "sha256.h"

namespace leapp::pipeline_detail {

std::vector<std::string> trusted_key_paths(const std::vector<std::string>& trusted_keys) {
  return trusted_keys.empty() ? leapp::signing::policy_key_paths() : trusted_keys;  // explicit keys replace the policy
}

std::shared_ptr<const SignedFiles> verify_export(const std::string& arg, const std::vector<std::string>& key_paths) {
  const std::string folder = export_folder(arg);
  auto out = std::make_shared<SignedFiles>();
  try {
    std::vector<std::string> pems;
    for (const std::string& path : key_paths) pems.push_back(leapp::signing::read_key_file(path));
    out->digests = leapp::signing::verify_folder(folder, pems, leapp::signing::kDefaultSignature, key_paths);
  } catch (const leapp::signing::SignatureProblem& e) {
    throw SignatureError(e.what());
  }
  std::error_code ec;
  out->root = std::filesystem::canonical(folder, ec).string();
  if (ec) throw SignatureError(folder + ": cannot be resolved after its signature was checked: " + ec.message());
  return out;
}

void check_signed_digest(const SignedFiles* s, const std::string& path, const std::string& actual,
                         const std::string& where) {
  if (!s) return;
  std::error_code ec;
  const std::string real = std::filesystem::weakly_canonical(path, ec).string();
  const std::string prefix = s->root == "/" ? "/" : s->root + "/";
  const std::string rel = !ec && real.compare(0, prefix.size(), prefix) == 0 ? real.substr(prefix.size()) : "";
  const auto it = s->digests.find(rel);
  if (rel.empty() || it == s->digests.end())
    throw SignatureError(where + ": " + path + " is not covered by the export's signature (" +
                         std::string(leapp::signing::kDefaultSignature) + " does not list it)");
  if (it->second != actual)
    throw SignatureError(where + ": " + path + " changed after its signature was checked (sha256 " + actual +
                         ", signed " + it->second + ")");
}

void check_signed(const SignedFiles* s, const std::string& path, const std::string& data, const std::string& where) {
  if (!s) return;
  const auto digest = leapp::detail::sha256(data.data(), data.size());
  check_signed_digest(s, path, leapp::detail::to_hex(digest.data(), digest.size()), where);
}

}  // namespace leapp::pipeline_detail
