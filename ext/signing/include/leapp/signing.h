// leapp/signing.h: verify a signed export folder (model.sig, the OpenSSF model-signing format; docs/signing.md).
//
// One verifier for both readers: leapp._native.verify_folder (Python) and leapp::Pipeline / leapp-run (C++)
// call verify_folder below, so they accept and refuse the same folders with the same texts. The signature is
// a Sigstore bundle whose DSSE envelope signs an in-toto statement listing every file's sha256; it is checked
// with ECDSA (P-256/384/521) by OpenSSL's libcrypto, loaded with dlopen("libcrypto.so.3") the first time a
// folder is verified (nothing is loaded while no trust is configured).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace leapp::signing {

/// A folder's signature was refused, or no verification is possible here (no libcrypto, a bad trusted key);
/// what() names the file, the field or the key, and the problem.
class SignatureProblem : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

inline constexpr const char* kDefaultSignature = "model.sig";
inline constexpr size_t kMaxSignatureBytes = size_t(16) << 20;  ///< model.sig at most 16 MiB
inline constexpr size_t kMaxKeyBytes = size_t(64) << 10;        ///< a trusted key's PEM at most 64 KiB
inline constexpr size_t kMaxTrustedKeys = 64;
inline constexpr int kMaxJsonDepth = 16;                        ///< the bundle and the statement
inline constexpr size_t kMaxJsonValues = size_t(1) << 21;
inline constexpr size_t kMaxResources = 100000;                 ///< files a signature may list
inline constexpr size_t kMaxIgnorePaths = 256;
inline constexpr size_t kMaxPathBytes = 4096;                   ///< a relative path, and each component at most 255
inline constexpr size_t kMaxWalkEntries = size_t(1) << 20;      ///< files and folders under the export
inline constexpr int kMaxWalkDepth = 64;

/// Relative path (POSIX, '/'-separated) -> lower-case sha256 hex of the file, as the signature lists them.
using SignedDigests = std::map<std::string, std::string>;

/// Verifies `folder` against its signature and returns the signed digest of every file. `trusted_key_pems` are
/// PEM public keys (SubjectPublicKeyInfo) of P-256, P-384 or P-521; the folder verifies if one of them made the
/// signature. `key_names` (optional, parallel to the keys, e.g. their paths) name a key in errors, else
/// "trusted key N". `signature` relative: inside the folder (and left out of the files); absolute: anywhere.
/// Checks, in this order (docs/signing.md): the keys; the signature file present, regular, at most 16 MiB;
/// strict JSON; the bundle's fields; strict base64; the payload type; the ECDSA signature against each key;
/// the statement's fields; the folder walked (no symbolic link, no special file, anywhere; extra and missing
/// files named, sorted); every file hashed (1 MiB at a time) and compared; the subject digest.
/// Throws SignatureProblem.
SignedDigests verify_folder(const std::string& folder, const std::vector<std::string>& trusted_key_pems,
                            const std::string& signature = kDefaultSignature,
                            const std::vector<std::string>& key_names = {});

/// A trusted key's PEM text read from `path` (at most kMaxKeyBytes, a regular file); SignatureProblem naming
/// the path otherwise. The key itself is checked by verify_folder.
std::string read_key_file(const std::string& path);

/// The key paths $LEAPP_TRUST names (':'-separated; empty entries skipped); empty when it is unset or empty.
std::vector<std::string> policy_key_paths();

}  // namespace leapp::signing
