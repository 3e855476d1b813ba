// ext/signing/src/libcrypto.h: OpenSSL's libcrypto, loaded at run time (internal).
//
// dlopen("libcrypto.so.3") the first time a key is used; every function pointer is typed from OpenSSL's own
// headers (decltype), so a prototype cannot drift. Nothing here runs while no trust is configured.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#ifndef LEAPP_NO_OPENSSL_HEADERS
#include <openssl/bio.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#define LEAPP_CRYPTO_FUNCTIONS(X)                                                                                   \
  X(OpenSSL_version_num) X(ERR_get_error) X(ERR_clear_error) X(ERR_error_string_n) X(BIO_new_mem_buf) X(BIO_free) \
  X(PEM_read_bio_PUBKEY) X(EVP_PKEY_free) X(EVP_PKEY_get_base_id) X(EVP_PKEY_get0_type_name)                      \
  X(EVP_PKEY_get_group_name) X(EVP_MD_CTX_new) X(EVP_MD_CTX_free) X(EVP_sha256) X(EVP_sha384) X(EVP_sha512)        \
  X(EVP_DigestInit_ex) X(EVP_DigestUpdate) X(EVP_DigestFinal_ex) X(EVP_DigestVerifyInit) X(EVP_DigestVerify)        \
  X(i2d_PUBKEY) X(EVP_PKEY_eq) X(d2i_X509) X(X509_free) X(X509_get0_pubkey)            \
  X(EVP_PKEY_set_utf8_string_param)

namespace leapp::signing::detail {

struct Crypto {
#define LEAPP_CRYPTO_POINTER(name) decltype(&::name) name = nullptr;
  LEAPP_CRYPTO_FUNCTIONS(LEAPP_CRYPTO_POINTER)
#undef LEAPP_CRYPTO_POINTER
};

/// The loaded library (once per process); throws SignatureProblem saying why it cannot be used.
const Crypto& crypto();

/// OpenSSL's queued error texts ("" when none), and the queue cleared.
std::string crypto_errors(const Crypto& c);

/// An EVP_MD_CTX freed when it goes.
struct DigestContext {
  explicit DigestContext(const Crypto& c);
  ~DigestContext();
  DigestContext(const DigestContext&) = delete;
  DigestContext& operator=(const DigestContext&) = delete;
  const Crypto& c;
  EVP_MD_CTX* ctx;
};

}  // namespace leapp::signing::detail
#else
namespace leapp::signing::detail {
struct Crypto;
const Crypto& crypto();  ///< always throws: this build has no OpenSSL headers
}  // namespace leapp::signing::detail
#endif
