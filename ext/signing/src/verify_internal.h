// ext/signing/src/verify_internal.h: the steps verify_folder runs, one file each (internal).
#pragma once

#include <unistd.h>

#include <string>
#include <utility>
#include <vector>

namespace leapp::signing::detail {

/// A file descriptor this scope owns: closed when it ends.
struct Fd {
  int fd;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

/// `len` digest bytes as lower-case hex (how model signing writes digests).
std::string hex_digest(const unsigned char* bytes, unsigned int len);

/// A trusted key loaded from PEM: EC P-256/384/521 only, with the hash upstream pairs with the curve.
class TrustedKey {
 public:
  /// Throws SignatureProblem naming `name` (not PEM, not a public key, another key type or curve).
  TrustedKey(const std::string& pem, std::string name);
  ~TrustedKey();
  TrustedKey(TrustedKey&& other) noexcept;
  TrustedKey(const TrustedKey&) = delete;
  TrustedKey& operator=(const TrustedKey&) = delete;
  TrustedKey& operator=(TrustedKey&&) = delete;
  /// True when `signature` (DER ECDSA) over `message` verifies with this key.
  bool verifies(const std::string& message, const std::string& signature) const;
  const std::string& name() const { return name_; }
  /// sha256 hex of the key's PEM (SubjectPublicKeyInfo), as model signing writes publicKey.hint.
  const std::string& hint() const { return hint_; }
  /// True when the DER X.509 certificate's public key is this key; SignatureProblem naming `field` when `der`
  /// is not exactly one certificate.
  bool is_key_of(const std::string& der, const std::string& field) const;

 private:
  std::string name_, hint_;
  void* pkey_ = nullptr;  ///< EVP_PKEY*
  int hash_bits_ = 0;     ///< 256, 384 or 512
};

/// The DSSE envelope of a bundle and what identifies its key, decoded: checks the file's JSON, the bundle's
/// fields (unknown fields, nulls and types at every level, as model signing's reader refuses them), base64,
/// payload type.
struct Envelope {
  std::string payload_type, payload, signature;
  std::string key_hint;                   ///< verificationMaterial.publicKey.hint; "" when absent or empty
  std::vector<std::string> certificates;  ///< x509CertificateChain's DER certificates, leaf first; or none
};
Envelope read_bundle(const std::string& text, const std::string& sig_name);

/// The trusted keys that may have signed `env`: those its publicKey.hint names (all when it has none), or
/// the one its leaf certificate holds; refuses with untrusted() when there are none.
std::vector<const TrustedKey*> keys_of(const Envelope& env, const std::vector<TrustedKey>& keys, const std::string& sig);

/// "SIG: signed by a key not in the trust list (N keys trusted)": the one text for a wrong key, however found.
std::string untrusted(const std::string& sig, size_t keys);

/// DSSE's pre-authentication encoding of the payload: what the signature signs.
std::string pae(const std::string& payload_type, const std::string& payload);

/// The in-toto statement's fields leapp uses, checked (types, bounds, canonical paths, no duplicates).
struct Statement {
  std::string subject_digest;                                ///< subject[0].digest.sha256
  std::vector<std::pair<std::string, std::string>> resources;  ///< (name, sha256 hex), document order
  std::vector<std::string> ignore_paths;                     ///< predicate.serialization.ignore_paths
};
Statement read_statement(const std::string& payload, const std::string& sig_name);

/// `rel` is a relative POSIX path without empty, '.' or '..' components, at most kMaxPathBytes (255 a
/// component), no NUL; otherwise why not (a sentence fragment), "" when it is fine.
std::string path_problem(const std::string& rel);

/// Every regular file under the folder open as `root_fd`, relative and sorted, minus those under an ignored
/// path; refuses a symbolic link or a special file anywhere (ignored paths included), naming it.
std::vector<std::string> walk_folder(int root_fd, const std::string& folder, const std::vector<std::string>& ignored);

/// A file beneath `root_fd` opened without following any symbolic link on the way; -1 and errno otherwise.
int open_beneath(int root_fd, const std::string& rel);

/// The sha256 hex of `rel` beneath `root_fd`, read `buffer.size()` bytes at a time with libcrypto.
std::string hash_file(int root_fd, const std::string& folder, const std::string& rel, std::vector<char>& buffer);

/// The sha256 of `data` with libcrypto (the subject digest).
std::string sha256_hex(const std::string& data);

}  // namespace leapp::signing::detail
