// ext/signing/src/bundle.cpp: model.sig's Sigstore bundle and the in-toto statement it signs, read strictly.
//
// The fields are model-signing 1.1.1's (its _signing/sign_sigstore_pb.py, _signing/signing.py, manifest.py):
// mediaType v0.3, a DSSE envelope of payload type in-toto JSON with one signature, a statement of predicate
// v1.0 whose serialization is "files" with sha256. Anything else is refused naming the field: a hostile file
// reaches no further than the check that refuses it.
#include <algorithm>
#include <initializer_list>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "json.h"
#include "leapp/signing.h"
#include "verify_internal.h"

namespace leapp::signing::detail {

namespace {

using leapp::detail::JsonValue;
using leapp::detail::shown;
using T = JsonValue::Type;

constexpr const char* kBundleMediaType = "application/vnd.dev.sigstore.bundle.v0.3+json";
constexpr const char* kPayloadType = "application/vnd.in-toto+json";
constexpr const char* kStatementType = "https://in-toto.io/Statement/v1";
constexpr const char* kPredicateType = "https://model_signing/signature/v1.0";

[[noreturn]] void fail(const std::string& sig, const std::string& text) { throw SignatureProblem(sig + ": " + text); }

JsonValue parse(const std::string& text, const std::string& what) {
  leapp::detail::JsonLimits limits;
  limits.max_depth = kMaxJsonDepth;
  limits.max_values = kMaxJsonValues;
  limits.document = "docs/signing.md";
  limits.refuse_nul = true;
  try {
    return leapp::detail::parse_json(text, what, limits);
  } catch (const std::invalid_argument& e) {
    throw SignatureProblem(e.what());
  }
}

/// The member `key` of object `v` (at `path`) with type `type`; refuses a missing or mistyped member.
const JsonValue& member(const std::string& sig, const JsonValue& v, const std::string& path, const char* key, T type,
                        const char* type_name) {
  const JsonValue* m = v.find(key);
  const std::string field = path.empty() ? key : path + "." + key;
  if (!m) fail(sig, field + ": missing");
  if (m->type != type) fail(sig, field + ": " + m->type_name() + ", expected " + type_name);
  return *m;
}

const JsonValue& object(const std::string& sig, const JsonValue& v, const std::string& path, const char* key) {
  return member(sig, v, path, key, T::kObject, "an object");
}
const JsonValue& array(const std::string& sig, const JsonValue& v, const std::string& path, const char* key) {
  return member(sig, v, path, key, T::kArray, "an array");
}
const std::string& string(const std::string& sig, const JsonValue& v, const std::string& path, const char* key) {
  return member(sig, v, path, key, T::kString, "a string").string;
}

/// An optional member: nullptr when absent, else it must have `type` (a null is refused: model signing never
/// writes one, and leapp reads no field as absent that the document spells out).
const JsonValue* optional(const std::string& sig, const JsonValue& v, const std::string& path, const char* key, T type,
                          const char* type_name) {
  return v.find(key) ? &member(sig, v, path, key, type, type_name) : nullptr;
}

/// An array element that must be an object.
const JsonValue& element(const std::string& sig, const JsonValue& v, const std::string& field) {
  if (v.type != T::kObject) fail(sig, field + ": " + v.type_name() + ", expected an object");
  return v;
}

/// Refuses a member of object `v` (at `path`) that is not one of `known`, naming it: model signing's reader
/// (sigstore-models, extra fields forbidden) refuses them too, so leapp never accepts a bundle upstream refuses.
void known_fields(const std::string& sig, const JsonValue& v, const std::string& path,
                  std::initializer_list<const char*> known) {
  for (const auto& [key, value] : v.object) {
    if (std::any_of(known.begin(), known.end(), [&](const char* k) { return key == k; })) continue;
    std::string names;
    for (const char* k : known) names += (names.empty() ? "" : ", ") + std::string(k);
    fail(sig, (path.empty() ? "the bundle" : path) + ": unknown field '" + shown(key) + "' (expected " + names + ")");
  }
}

/// verificationMaterial: exactly one of a public key (its hint kept) or a certificate chain (its certificates'
/// base64 kept, decoded with the other base64 fields); no transparency-log entries or timestamps, which leapp
/// does not check and so does not accept on trust.
void read_material(const std::string& sig, const JsonValue& m, Envelope& out, std::vector<std::string>& certs64) {
  const std::string at = "verificationMaterial";
  known_fields(sig, m, at, {"publicKey", "x509CertificateChain", "certificate", "tlogEntries", "timestampVerificationData"});
  const JsonValue* key = optional(sig, m, at, "publicKey", T::kObject, "an object");
  const JsonValue* chain = optional(sig, m, at, "x509CertificateChain", T::kObject, "an object");
  const JsonValue* cert = optional(sig, m, at, "certificate", T::kObject, "an object");
  if (int(key != nullptr) + int(chain != nullptr) + int(cert != nullptr) != 1)
    fail(sig, at + ": " + (key || chain || cert ? "more than one" : "none") +
                  " of publicKey, x509CertificateChain, certificate; a bundle identifies its key exactly once");
  if (key) {
    known_fields(sig, *key, at + ".publicKey", {"hint", "rawBytes", "keyDetails"});
    if (const JsonValue* hint = optional(sig, *key, at + ".publicKey", "hint", T::kString, "a string")) out.key_hint = hint->string;
    // written by model signing 1.0 and dropped unread by 1.1's reader; leapp reads them no more
    optional(sig, *key, at + ".publicKey", "rawBytes", T::kString, "a string");
    optional(sig, *key, at + ".publicKey", "keyDetails", T::kString, "a string");
  }
  if (chain) {
    known_fields(sig, *chain, at + ".x509CertificateChain", {"certificates"});
    const JsonValue& certs = array(sig, *chain, at + ".x509CertificateChain", "certificates");
    if (certs.array.empty()) fail(sig, at + ".x509CertificateChain.certificates: empty; the leaf certificate comes first");
    for (size_t i = 0; i < certs.array.size(); ++i) {
      const std::string field = at + ".x509CertificateChain.certificates[" + std::to_string(i) + "]";
      const JsonValue& c = element(sig, certs.array[i], field);
      known_fields(sig, c, field, {"rawBytes"});
      certs64.push_back(string(sig, c, field, "rawBytes"));
    }
  }
  if (cert)
    fail(sig, at + ".certificate: a single certificate (a keyless Sigstore signature, checked through a transparency "
                   "log); model signing's key and certificate signatures carry publicKey or x509CertificateChain");
  if (const JsonValue* tlog = optional(sig, m, at, "tlogEntries", T::kArray, "an array"); tlog && !tlog->array.empty())
    fail(sig, at + ".tlogEntries: " + std::to_string(tlog->array.size()) +
                  " transparency-log entries; leapp does not check them, and model signing's key and certificate "
                  "signatures have none");
  if (optional(sig, m, at, "timestampVerificationData", T::kObject, "an object"))
    fail(sig, at + ".timestampVerificationData: signed timestamps; leapp does not check them, and model signing's "
                   "key and certificate signatures have none");
}

/// `value` must be `expected`; the text names what leapp accepts.
void expect(const std::string& sig, const std::string& field, const std::string& value, const char* expected,
            const std::string& why = "") {
  if (value != expected)
    fail(sig, field + " is '" + shown(value) + "', expected '" + expected + "'" + (why.empty() ? "" : "; " + why));
}

/// Strict base64 (RFC 4648 section 4): the standard alphabet, padded to a multiple of 4, no whitespace, zero
/// unused bits; the field is named with the first offending character.
std::string base64(const std::string& sig, const std::string& field, const std::string& text) {
  auto bad = [&](size_t i, const std::string& why) {
    fail(sig, field + ": invalid base64 (" + why + " at character " + std::to_string(i) + ")");
  };
  if (text.size() % 4) bad(text.size(), "length " + std::to_string(text.size()) + " is not a multiple of 4");
  size_t pad = 0;
  if (!text.empty() && text.back() == '=') pad = text.size() >= 2 && text[text.size() - 2] == '=' ? 2 : 1;
  std::string out;
  out.reserve(text.size() / 4 * 3);
  uint32_t acc = 0;
  int bits = 0;
  for (size_t i = 0; i < text.size() - pad; ++i) {
    const unsigned char ch = static_cast<unsigned char>(text[i]);
    int v = -1;
    if (ch >= 'A' && ch <= 'Z') v = ch - 'A';
    else if (ch >= 'a' && ch <= 'z') v = ch - 'a' + 26;
    else if (ch >= '0' && ch <= '9') v = ch - '0' + 52;
    else if (ch == '+') v = 62;
    else if (ch == '/') v = 63;
    if (v < 0) bad(i, ch == '=' ? "padding before the end" : "'" + shown(std::string(1, char(ch))) + "' is not in its alphabet");
    acc = (acc << 6) | uint32_t(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += char((acc >> bits) & 0xFF);
    }
  }
  if (bits && (acc & ((1u << bits) - 1))) bad(text.size() - pad - 1, "non-zero unused bits");
  return out;
}

bool is_sha256_hex(const std::string& s) {
  if (s.size() != 64) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

}  // namespace

std::string pae(const std::string& payload_type, const std::string& payload) {
  return "DSSEv1 " + std::to_string(payload_type.size()) + " " + payload_type + " " + std::to_string(payload.size()) +
         " " + payload;
}

Envelope read_bundle(const std::string& text, const std::string& sig) {
  const JsonValue doc = parse(text, sig);
  if (doc.type != T::kObject) fail(sig, std::string("the document is ") + doc.type_name() + ", expected a Sigstore bundle object");
  if (doc.find("messageSignature"))
    fail(sig, "messageSignature: a signature over a single message; model signing signs a DSSE envelope");
  known_fields(sig, doc, "", {"mediaType", "verificationMaterial", "dsseEnvelope"});
  expect(sig, "mediaType", string(sig, doc, "", "mediaType"), kBundleMediaType,
         "leapp reads the bundles model signing 1.x writes");
  Envelope out;
  std::vector<std::string> certs64;
  read_material(sig, object(sig, doc, "", "verificationMaterial"), out, certs64);
  const JsonValue& env = object(sig, doc, "", "dsseEnvelope");
  known_fields(sig, env, "dsseEnvelope", {"payload", "payloadType", "signatures"});
  const std::string& payload64 = string(sig, env, "dsseEnvelope", "payload");
  const std::string& type = string(sig, env, "dsseEnvelope", "payloadType");
  const JsonValue& sigs = array(sig, env, "dsseEnvelope", "signatures");
  if (sigs.array.size() != 1)
    fail(sig, "dsseEnvelope.signatures: " + std::to_string(sigs.array.size()) +
                  " signatures; model signing writes exactly one");
  const JsonValue& first = element(sig, sigs.array[0], "dsseEnvelope.signatures[0]");
  known_fields(sig, first, "dsseEnvelope.signatures[0]", {"sig", "keyid"});
  const std::string& sig64 = string(sig, first, "dsseEnvelope.signatures[0]", "sig");
  optional(sig, first, "dsseEnvelope.signatures[0]", "keyid", T::kString, "a string");
  out.payload = base64(sig, "dsseEnvelope.payload", payload64);
  out.signature = base64(sig, "dsseEnvelope.signatures[0].sig", sig64);
  if (out.signature.empty()) fail(sig, "dsseEnvelope.signatures[0].sig: empty");
  for (size_t i = 0; i < certs64.size(); ++i) {
    const std::string field = "verificationMaterial.x509CertificateChain.certificates[" + std::to_string(i) + "].rawBytes";
    out.certificates.push_back(base64(sig, field, certs64[i]));
    if (out.certificates.back().empty()) fail(sig, field + ": empty");
  }
  expect(sig, "dsseEnvelope.payloadType", type, kPayloadType);
  out.payload_type = type;
  return out;
}

std::string path_problem(const std::string& rel) {
  if (rel.empty()) return "is empty";
  if (rel.size() > kMaxPathBytes) return "is longer than " + std::to_string(kMaxPathBytes) + " bytes";
  if (rel.find('\0') != std::string::npos) return "holds a NUL character";
  if (rel.front() == '/') return "is absolute";
  size_t start = 0;
  while (start <= rel.size()) {
    size_t end = rel.find('/', start);
    if (end == std::string::npos) end = rel.size();
    const std::string part = rel.substr(start, end - start);
    if (part.empty()) return "has an empty component";
    if (part == "." || part == "..") return "has a '" + part + "' component";
    if (part.size() > 255) return "has a component longer than 255 bytes";
    start = end + 1;
  }
  return "";
}

Statement read_statement(const std::string& payload, const std::string& sig) {
  const std::string what = sig + ": statement (dsseEnvelope.payload)";
  const JsonValue doc = parse(payload, what);
  if (doc.type != T::kObject) fail(what, std::string("the document is ") + doc.type_name() + ", expected an object");
  expect(what, "_type", string(what, doc, "", "_type"), kStatementType);
  const std::string& predicate_type = string(what, doc, "", "predicateType");
  expect(what, "predicateType", predicate_type, kPredicateType,
         "signatures of model signing before 1.0 are not accepted: sign again");
  const JsonValue& subjects = array(what, doc, "", "subject");
  if (subjects.array.size() != 1)
    fail(what, "subject: " + std::to_string(subjects.array.size()) + " subjects, expected exactly one");
  if (subjects.array[0].type != T::kObject) fail(what, std::string("subject[0]: ") + subjects.array[0].type_name() + ", expected an object");
  string(what, subjects.array[0], "subject[0]", "name");
  Statement out;
  out.subject_digest = string(what, object(what, subjects.array[0], "subject[0]", "digest"), "subject[0].digest", "sha256");
  if (!is_sha256_hex(out.subject_digest))
    fail(what, "subject[0].digest.sha256 '" + shown(out.subject_digest) + "' is not 64 lower-case hex digits");
  const JsonValue& predicate = object(what, doc, "", "predicate");
  const JsonValue& ser = object(what, predicate, "predicate", "serialization");
  const std::string& method = string(what, ser, "predicate.serialization", "method");
  expect(what, "predicate.serialization.method", method, "files",
         "leapp accepts folders signed file by file (model_signing's default), not '" + shown(method) + "'");
  const std::string& hash_type = string(what, ser, "predicate.serialization", "hash_type");
  expect(what, "predicate.serialization.hash_type", hash_type, "sha256", "leapp accepts sha256 only");
  member(what, ser, "predicate.serialization", "allow_symlinks", T::kBool, "a boolean");  // leapp refuses links either way
  if (const JsonValue* ignore = ser.find("ignore_paths")) {
    if (ignore->type != T::kArray)
      fail(what, std::string("predicate.serialization.ignore_paths: ") + ignore->type_name() + ", expected an array");
    if (ignore->array.size() > kMaxIgnorePaths)
      fail(what, "predicate.serialization.ignore_paths: more than " + std::to_string(kMaxIgnorePaths) + " paths");
    for (size_t i = 0; i < ignore->array.size(); ++i) {
      const JsonValue& p = ignore->array[i];
      const std::string field = "predicate.serialization.ignore_paths[" + std::to_string(i) + "]";
      if (p.type != T::kString) fail(what, field + ": " + p.type_name() + ", expected a string");
      // upstream records paths relative to the folder and drops those outside it; leapp refuses them instead
      if (const std::string why = path_problem(p.string); !why.empty()) fail(what, field + " '" + shown(p.string) + "' " + why);
      out.ignore_paths.push_back(p.string);
    }
  }
  const JsonValue& resources = array(what, predicate, "predicate", "resources");
  if (resources.array.size() > kMaxResources)
    fail(what, "predicate.resources: " + std::to_string(resources.array.size()) + " files, more than " +
                   std::to_string(kMaxResources));
  std::vector<std::string> names;
  for (size_t i = 0; i < resources.array.size(); ++i) {
    const JsonValue& r = resources.array[i];
    const std::string field = "predicate.resources[" + std::to_string(i) + "]";
    if (r.type != T::kObject) fail(what, field + ": " + r.type_name() + ", expected an object");
    const std::string& name = string(what, r, field, "name");
    if (const std::string why = path_problem(name); !why.empty()) fail(what, field + ".name '" + shown(name) + "' " + why);
    expect(what, field + ".algorithm", string(what, r, field, "algorithm"), "sha256");
    const std::string& digest = string(what, r, field, "digest");
    if (!is_sha256_hex(digest)) fail(what, field + ".digest '" + shown(digest) + "' is not 64 lower-case hex digits");
    out.resources.emplace_back(name, digest);
    names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  for (size_t i = 1; i < names.size(); ++i)
    if (names[i] == names[i - 1]) fail(what, "predicate.resources: '" + shown(names[i]) + "' is listed twice");
  return out;
}

}  // namespace leapp::signing::detail
