// ext/signing/src/libcrypto.cpp: see libcrypto.h.
#include "libcrypto.h"

#include <dlfcn.h>

#include <mutex>

#include "leapp/signing.h"

namespace leapp::signing::detail {

#ifndef LEAPP_NO_OPENSSL_HEADERS

namespace {

struct Loaded {
  Crypto c;
  std::string error;  ///< why the library cannot be used; "" when it can
};

Loaded load() {
  Loaded out;
  void* handle = dlopen("libcrypto.so.3", RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = dlerror();
    out.error = std::string("cannot verify signatures: OpenSSL's libcrypto.so.3 could not be loaded (") +
                (why ? why : "unknown error") + "); install OpenSSL 3 (e.g. the libssl3 package)";
    return out;
  }
#define LEAPP_CRYPTO_RESOLVE(name)                                                                          \
  out.c.name = reinterpret_cast<decltype(out.c.name)>(dlsym(handle, #name));                                \
  if (!out.c.name) {                                                                                        \
    out.error = "cannot verify signatures: libcrypto.so.3 has no " #name " (OpenSSL 3.0 or newer is needed)"; \
    return out;                                                                                             \
  }
  LEAPP_CRYPTO_FUNCTIONS(LEAPP_CRYPTO_RESOLVE)
#undef LEAPP_CRYPTO_RESOLVE
  if (out.c.OpenSSL_version_num() < 0x30000000UL)
    out.error = "cannot verify signatures: libcrypto.so.3 reports a version before OpenSSL 3.0";
  return out;  // the handle stays open for the process's life: the pointers point into it
}

}  // namespace

const Crypto& crypto() {
  static const Loaded loaded = load();  // thread-safe once (C++11 static initialisation)
  if (!loaded.error.empty()) throw SignatureProblem(loaded.error);
  return loaded.c;
}

std::string crypto_errors(const Crypto& c) {
  std::string out;
  while (unsigned long e = c.ERR_get_error()) {
    char buf[256];
    c.ERR_error_string_n(e, buf, sizeof buf);
    out += (out.empty() ? "" : "; ") + std::string(buf);
  }
  return out;
}

DigestContext::DigestContext(const Crypto& crypto) : c(crypto), ctx(crypto.EVP_MD_CTX_new()) {
  if (!ctx) throw SignatureProblem("cannot verify signatures: EVP_MD_CTX_new failed (out of memory)");
}

DigestContext::~DigestContext() { c.EVP_MD_CTX_free(ctx); }

#else

const Crypto& crypto() {
  throw SignatureProblem(
      "cannot verify signatures: this leapp was built without OpenSSL's headers (install libssl-dev and rebuild "
      "leapp)");
}

#endif

}  // namespace leapp::signing::detail
