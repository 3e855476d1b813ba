// ext/signing/src/verify_folder.cpp: verify_folder's steps in their documented order (leapp/signing.h).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "leapp/signing.h"
#include "libcrypto.h"
#include "verify_internal.h"

namespace leapp::signing {

namespace {

/// A regular file's bytes from `fd` (already open), at most `limit`; `what` names it in errors.
std::string read_bounded(int fd, const std::string& what, size_t limit, const std::string& too_big) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw SignatureProblem(what + ": cannot be examined: " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) throw SignatureProblem(what + ": not a regular file");
  if (uint64_t(st.st_size) > limit)
    throw SignatureProblem(what + ": " + std::to_string(uint64_t(st.st_size)) + " bytes, " + too_big);
  std::string data;
  char chunk[1 << 16];
  for (;;) {
    const ssize_t got = ::read(fd, chunk, sizeof chunk);
    if (got < 0) {
      if (errno == EINTR) continue;
      throw SignatureProblem(what + ": cannot be read: " + std::strerror(errno));
    }
    if (got == 0) break;
    if (data.size() + size_t(got) > limit)  // grew after fstat
      throw SignatureProblem(what + ": more than " + std::to_string(limit) + " bytes, " + too_big);
    data.append(chunk, size_t(got));
  }
  return data;
}

std::string joined(const std::vector<std::string>& names) {
  std::string out;
  const size_t shown = std::min<size_t>(names.size(), 20);
  for (size_t i = 0; i < shown; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > shown) out += " and " + std::to_string(names.size() - shown) + " more";
  return out;
}

}  // namespace

std::string read_key_file(const std::string& path) {
  detail::Fd f(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
  if (f.fd < 0) throw SignatureProblem("trusted key " + path + ": cannot be opened: " + std::strerror(errno));
  return read_bounded(f.fd, "trusted key " + path, kMaxKeyBytes, "more than a PEM public key may have");
}

std::vector<std::string> policy_key_paths() {
  std::vector<std::string> out;
  const char* raw = std::getenv("LEAPP_TRUST");
  const std::string text = raw ? raw : "";
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(':', start);
    if (end == std::string::npos) end = text.size();
    if (end > start) out.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

SignedDigests verify_folder(const std::string& folder_arg, const std::vector<std::string>& trusted_key_pems,
                            const std::string& signature, const std::vector<std::string>& key_names) {
#ifdef LEAPP_NO_OPENSSL_HEADERS
  (void)folder_arg, (void)trusted_key_pems, (void)signature, (void)key_names;
  detail::crypto();  // throws: this build cannot verify
  return {};
#else
  using namespace detail;
  std::string folder = folder_arg;
  while (folder.size() > 1 && folder.back() == '/') folder.pop_back();
  // 1. the trust configuration itself
  if (trusted_key_pems.empty()) throw SignatureProblem("no trusted key given: verification needs at least one");
  if (trusted_key_pems.size() > kMaxTrustedKeys)
    throw SignatureProblem(std::to_string(trusted_key_pems.size()) + " trusted keys, more than " +
                           std::to_string(kMaxTrustedKeys));
  if (!key_names.empty() && key_names.size() != trusted_key_pems.size())
    throw SignatureProblem("verify_folder: " + std::to_string(key_names.size()) + " key names for " +
                           std::to_string(trusted_key_pems.size()) + " keys");
  std::vector<TrustedKey> keys;
  for (size_t i = 0; i < trusted_key_pems.size(); ++i)
    keys.emplace_back(trusted_key_pems[i], key_names.empty() ? "trusted key " + std::to_string(i + 1) : key_names[i]);

  // the folder, never through a symbolic link (upstream refuses a linked model path too)
  struct stat fst {};
  if (::lstat(folder.c_str(), &fst) != 0) throw SignatureProblem(folder + ": cannot be opened: " + std::strerror(errno));
  if (S_ISLNK(fst.st_mode)) throw SignatureProblem(folder + ": is a symbolic link; verify the folder it points to");
  if (!S_ISDIR(fst.st_mode)) throw SignatureProblem(folder + ": not a folder");
  Fd root(::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (root.fd < 0) throw SignatureProblem(folder + ": cannot be opened: " + std::strerror(errno));

  // 2. the signature file: present, regular, bounded
  const bool inside = signature.empty() || signature.front() != '/';
  if (inside) {
    if (const std::string why = path_problem(signature); !why.empty())
      throw SignatureProblem("signature path '" + signature + "' " + why);
  }
  const std::string sig = inside ? folder + "/" + signature : signature;
  Fd sig_fd(inside ? open_beneath(root.fd, signature)
                   : ::open(sig.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
  if (sig_fd.fd < 0) {
    if (errno == ENOENT) throw SignatureProblem(sig + ": missing; the export is not signed (trust is configured)");
    if (errno == ELOOP) throw SignatureProblem(sig + ": a symbolic link; a signed export may hold none");
    throw SignatureProblem(sig + ": cannot be opened: " + std::strerror(errno));
  }
  const std::string text = read_bounded(sig_fd.fd, sig, kMaxSignatureBytes, "more than the 16 MiB a model signature may have");

  // 3-5. JSON, bundle fields, base64, payload type
  const Envelope env = read_bundle(text, sig);
  // 6. the signature, by one of the trusted keys the bundle names (its key hint or leaf certificate)
  const std::string message = pae(env.payload_type, env.payload);
  bool verified = false;
  for (const TrustedKey* key : keys_of(env, keys, sig)) verified = verified || key->verifies(message, env.signature);
  if (!verified) throw SignatureProblem(untrusted(sig, keys.size()));
  // 7. the statement
  const Statement st = read_statement(env.payload, sig);

  // 8. the folder: exactly the signed files (upstream's default ignored paths, the signature, the signed ones)
  std::vector<std::string> ignore = {".git", ".gitattributes", ".github", ".gitignore"};
  if (inside) ignore.push_back(signature);
  ignore.insert(ignore.end(), st.ignore_paths.begin(), st.ignore_paths.end());
  const std::vector<std::string> files = walk_folder(root.fd, folder, ignore);
  SignedDigests digests(st.resources.begin(), st.resources.end());
  std::vector<std::string> extra, missing;
  for (const std::string& f : files)
    if (!digests.count(f)) extra.push_back(f);
  const std::set<std::string> present(files.begin(), files.end());
  for (const auto& [name, digest] : digests)
    if (!present.count(name)) missing.push_back(name);
  if (!extra.empty() || !missing.empty()) {
    std::string why;
    if (!extra.empty()) why += "files the signature does not list: " + joined(extra);
    if (!missing.empty()) why += std::string(why.empty() ? "" : "; ") + "files the signature lists are missing: " + joined(missing);
    throw SignatureProblem(folder + ": " + why + " (signature " + sig + ")");
  }
  // 9. every file hashed and compared, in sorted order
  std::vector<char> buffer(size_t(1) << 20);
  for (const auto& [name, digest] : digests) {
    const std::string actual = hash_file(root.fd, folder, name, buffer);
    if (actual != digest)
      throw SignatureProblem(folder + "/" + name + ": sha256 " + actual + " differs from the signed " + digest +
                             "; the file changed after it was signed");
  }
  // 10. the subject digest, as upstream computes it: sha256 over the resources' raw digests in document order
  std::string raw;
  for (const auto& [name, digest] : st.resources)
    for (size_t i = 0; i < digest.size(); i += 2) raw += char(std::stoi(digest.substr(i, 2), nullptr, 16));
  const std::string subject = sha256_hex(raw);
  if (subject != st.subject_digest)
    throw SignatureProblem(sig + ": statement subject[0].digest.sha256 " + st.subject_digest +
                           " is not the digest of its resources (" + subject + ")");
  return digests;
#endif
}

}  // namespace leapp::signing
