// ext/signing/src/trusted_key.cpp: a PEM public key and ECDSA verification with it, through libcrypto.
//
// Only the curves model-signing signs with (P-256, P-384, P-521), each with upstream's hash (sha256, sha384,
// sha512); any other key type is refused naming it, so a pinned RSA or Ed25519 key is an error, not a silent
// "no key verifies".
#include <cstdint>
#include <string>
#include <utility>
#include <vector>


#include "leapp/signing.h"
#include "libcrypto.h"
#include "verify_internal.h"

namespace leapp::signing::detail {

#ifndef LEAPP_NO_OPENSSL_HEADERS

namespace {

/// The label of the first PEM block ("PUBLIC KEY", "CERTIFICATE", ...), "" when there is none.
std::string pem_label(const std::string& pem) {
  const std::string begin = "-----BEGIN ";
  const size_t at = pem.find(begin);
  if (at == std::string::npos) return "";
  const size_t end = pem.find("-----", at + begin.size());
  if (end == std::string::npos || end - at > 80) return "";
  return pem.substr(at + begin.size(), end - at - begin.size());
}

/// The key as PEM SubjectPublicKeyInfo, 64 base64 characters a line: the bytes model signing hashes into
/// publicKey.hint (the trusted key file itself may be laid out otherwise).
std::string pem_of(const Crypto& c, EVP_PKEY* pkey) {
  // a key read from a compressed point is written compressed by OpenSSL, uncompressed by model signing
  if (c.EVP_PKEY_set_utf8_string_param(pkey, "point-format", "uncompressed") != 1)
    throw SignatureProblem("cannot verify signatures: libcrypto cannot set the key's point format (" + crypto_errors(c) + ")");
  const int n = c.i2d_PUBKEY(pkey, nullptr);
  if (n <= 0) throw SignatureProblem("cannot verify signatures: i2d_PUBKEY failed in libcrypto (" + crypto_errors(c) + ")");
  std::string der(size_t(n), '\0');
  unsigned char* p = reinterpret_cast<unsigned char*>(der.data());
  c.i2d_PUBKEY(pkey, &p);
  static const char* alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string b64;
  for (size_t i = 0; i < der.size(); i += 3) {
    const size_t left = der.size() - i;
    uint32_t v = uint32_t(uint8_t(der[i])) << 16;
    if (left > 1) v |= uint32_t(uint8_t(der[i + 1])) << 8;
    if (left > 2) v |= uint32_t(uint8_t(der[i + 2]));
    b64 += alphabet[(v >> 18) & 63];
    b64 += alphabet[(v >> 12) & 63];
    b64 += left > 1 ? alphabet[(v >> 6) & 63] : '=';
    b64 += left > 2 ? alphabet[v & 63] : '=';
  }
  std::string pem = "-----BEGIN PUBLIC KEY-----\n";
  for (size_t i = 0; i < b64.size(); i += 64) pem += b64.substr(i, 64) + "\n";
  return pem + "-----END PUBLIC KEY-----\n";
}

}  // namespace

TrustedKey::TrustedKey(const std::string& pem, std::string name) : name_(std::move(name)) {
  if (pem.size() > kMaxKeyBytes)
    throw SignatureProblem(name_ + ": " + std::to_string(pem.size()) + " bytes, more than a PEM public key may have (" +
                           std::to_string(kMaxKeyBytes) + ")");
  const std::string label = pem_label(pem);
  if (label.empty()) throw SignatureProblem(name_ + ": not a PEM public key (no '-----BEGIN PUBLIC KEY-----' block)");
  if (label.find("PRIVATE KEY") != std::string::npos)
    throw SignatureProblem(name_ + ": a private key (" + label + "); trust takes the public key only (openssl pkey "
                           "-pubout)");
  if (label.find("CERTIFICATE") != std::string::npos)
    throw SignatureProblem(name_ + ": a certificate; trust takes its public key (openssl x509 -pubkey -noout -in "
                           "CERT)");
  if (label != "PUBLIC KEY")
    throw SignatureProblem(name_ + ": a PEM '" + label + "' block; trust takes a 'PUBLIC KEY' (SubjectPublicKeyInfo)");
  const Crypto& c = crypto();
  c.ERR_clear_error();
  BIO* bio = c.BIO_new_mem_buf(pem.data(), int(pem.size()));
  if (!bio) throw SignatureProblem(name_ + ": cannot read the key (BIO_new_mem_buf failed)");
  EVP_PKEY* pkey = c.PEM_read_bio_PUBKEY(bio, nullptr, nullptr, nullptr);
  c.BIO_free(bio);
  if (!pkey) throw SignatureProblem(name_ + ": not a valid PEM public key (" + crypto_errors(c) + ")");
  pkey_ = pkey;  // a throwing constructor runs no destructor: each refusal below frees it first
  if (c.EVP_PKEY_get_base_id(pkey) != EVP_PKEY_EC) {
    const char* type = c.EVP_PKEY_get0_type_name(pkey);
    c.EVP_PKEY_free(pkey);
    pkey_ = nullptr;
    throw SignatureProblem(name_ + ": a key of type " + std::string(type ? type : "unknown") +
                           "; model signing keys are elliptic curve keys of P-256, P-384 or P-521");
  }
  char group[64] = {0};
  size_t group_len = 0;
  if (c.EVP_PKEY_get_group_name(pkey, group, sizeof group, &group_len) != 1) group[0] = '\0';
  const std::string curve(group);
  if (curve == "prime256v1" || curve == "P-256") hash_bits_ = 256;
  else if (curve == "secp384r1" || curve == "P-384") hash_bits_ = 384;
  else if (curve == "secp521r1" || curve == "P-521") hash_bits_ = 512;
  if (!hash_bits_) {
    c.EVP_PKEY_free(pkey);
    pkey_ = nullptr;
    throw SignatureProblem(name_ + ": an elliptic curve key of curve '" + (curve.empty() ? "unknown" : curve) +
                           "'; model signing supports P-256, P-384 and P-521");
  }
  hint_ = sha256_hex(pem_of(c, pkey));
}

TrustedKey::~TrustedKey() {
  if (pkey_) crypto().EVP_PKEY_free(static_cast<EVP_PKEY*>(pkey_));
}

TrustedKey::TrustedKey(TrustedKey&& other) noexcept
    : name_(std::move(other.name_)), hint_(std::move(other.hint_)), pkey_(other.pkey_), hash_bits_(other.hash_bits_) {
  other.pkey_ = nullptr;
}

bool TrustedKey::verifies(const std::string& message, const std::string& signature) const {
  const Crypto& c = crypto();
  const EVP_MD* md = hash_bits_ == 256 ? c.EVP_sha256() : hash_bits_ == 384 ? c.EVP_sha384() : c.EVP_sha512();
  DigestContext ctx(c);
  c.ERR_clear_error();
  if (c.EVP_DigestVerifyInit(ctx.ctx, nullptr, md, nullptr, static_cast<EVP_PKEY*>(pkey_)) != 1)
    throw SignatureProblem(name_ + ": cannot verify with this key (" + crypto_errors(c) + ")");
  const int ok = c.EVP_DigestVerify(ctx.ctx, reinterpret_cast<const unsigned char*>(signature.data()), signature.size(),
                                    reinterpret_cast<const unsigned char*>(message.data()), message.size());
  c.ERR_clear_error();  // a malformed DER signature queues errors: it simply does not verify
  return ok == 1;
}

bool TrustedKey::is_key_of(const std::string& der, const std::string& field) const {
  const Crypto& c = crypto();
  c.ERR_clear_error();
  const unsigned char* p = reinterpret_cast<const unsigned char*>(der.data());
  X509* cert = c.d2i_X509(nullptr, &p, long(der.size()));
  if (!cert) throw SignatureProblem(field + ": not a DER X.509 certificate (" + crypto_errors(c) + ")");
  const bool whole = p == reinterpret_cast<const unsigned char*>(der.data()) + der.size();
  EVP_PKEY* key = whole ? c.X509_get0_pubkey(cert) : nullptr;  // owned by cert
  const bool same = key && c.EVP_PKEY_eq(key, static_cast<EVP_PKEY*>(pkey_)) == 1;
  c.X509_free(cert);
  c.ERR_clear_error();
  if (!whole) throw SignatureProblem(field + ": bytes after the DER X.509 certificate");
  return same;
}

std::string untrusted(const std::string& sig, size_t keys) {
  return sig + ": signed by a key not in the trust list (" + std::to_string(keys) + (keys == 1 ? " key" : " keys") +
         " trusted)";
}

std::vector<const TrustedKey*> keys_of(const Envelope& env, const std::vector<TrustedKey>& keys, const std::string& sig) {
  std::vector<const TrustedKey*> out;
  if (!env.certificates.empty()) {
    // every certificate must be one (upstream parses the whole chain); the leaf's key must be trusted
    const std::string field = sig + ": verificationMaterial.x509CertificateChain.certificates[";
    for (size_t i = 1; i < env.certificates.size(); ++i) keys.front().is_key_of(env.certificates[i], field + std::to_string(i) + "]");
    for (const TrustedKey& k : keys)
      if (k.is_key_of(env.certificates[0], field + "0]")) out.push_back(&k);
  } else {
    // upstream refuses a hint that is not the sha256 of the key it is given, even when that key signed
    for (const TrustedKey& k : keys)
      if (env.key_hint.empty() || k.hint() == env.key_hint) out.push_back(&k);
  }
  if (out.empty()) throw SignatureProblem(untrusted(sig, keys.size()));
  return out;
}

std::string sha256_hex(const std::string& data) {
  const Crypto& c = crypto();
  DigestContext ctx(c);
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (c.EVP_DigestInit_ex(ctx.ctx, c.EVP_sha256(), nullptr) != 1 ||
      c.EVP_DigestUpdate(ctx.ctx, data.data(), data.size()) != 1 || c.EVP_DigestFinal_ex(ctx.ctx, out, &len) != 1)
    throw SignatureProblem("cannot verify signatures: sha256 failed in libcrypto (" + crypto_errors(c) + ")");
  return hex_digest(out, len);
}

#endif

std::string hex_digest(const unsigned char* bytes, unsigned int len) {
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (unsigned int i = 0; i < len; ++i) {
    s += hex[bytes[i] >> 4];
    s += hex[bytes[i] & 15];
  }
  return s;
}

}  // namespace leapp::signing::detail
