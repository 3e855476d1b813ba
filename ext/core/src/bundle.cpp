// ext/core/src/bundle.cpp: the bundle reader (docs/bundle-format.md section 1) and the bundle table.
//
// The checks run in the documented order and each one is made before the
// value it guards is used: lengths before reads, the whole-file hash before
// any offset, every range with overflow-free arithmetic (a <= n && b <= n - a).
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>

#include "json.h"
#include "lz4_block.h"
#include "leapp/runtime.h"
#include "manifest.h"
#include "sha256.h"

namespace leapp {
namespace {

[[noreturn]] void fail(const std::string& why) { throw std::invalid_argument("leapp bundle: " + why); }

std::string num(uint64_t v) { return std::to_string(v); }

/// [offset, offset + length) inside [lo, hi), without overflow.
bool in_range(uint64_t offset, uint64_t length, uint64_t lo, uint64_t hi) {
  return offset >= lo && offset <= hi && length <= hi - offset;
}

}  // namespace

std::string Manifest::producer_value(std::string_view key) const {
  for (const auto& kv : producer)
    if (kv.first == key) return kv.second;
  return "";
}

std::string_view Bundle::manifest_json() const {
  return {reinterpret_cast<const char*>(bytes_.data() + manifest_offset_), size_t(manifest_size_)};
}

std::string_view Bundle::blob(uint32_t index) const {
  if (index >= blobs_.size())
    throw std::out_of_range("leapp bundle '" + detail::shown(segment()) + "': blob " + num(index) + " out of range (" +
                            num(blobs_.size()) + " blobs)");
  return {reinterpret_cast<const char*>(bytes_.data() + blobs_[index].first), size_t(blobs_[index].second)};
}

std::string Bundle::binary_image(const BinarySpec& binary) const {
  std::string_view data = blob(binary.blob);
  if (binary.encoding == BinaryEncoding::kRaw) return std::string(data);
  try {
    return lz4_block_decode(data, binary.decoded_bytes);
  } catch (const std::invalid_argument& e) {  // parse decoded it already; only a changed Bundle gets here
    throw std::invalid_argument("leapp bundle '" + detail::shown(segment()) + "': blob " + num(binary.blob) + ": " +
                                e.what());
  }
}

std::string lz4_block_decode(std::string_view block, uint64_t decoded_bytes) {
  if (decoded_bytes / detail::kLz4MaxRatio > block.size())  // before allocating: the ratio bound of 1.1
    throw std::invalid_argument("LZ4 block: declares " + num(decoded_bytes) + " decoded bytes, more than " +
                                num(detail::kLz4MaxRatio) + " x its " + num(block.size()) + " bytes");
  std::string out;
  try {
    out.assign(size_t(decoded_bytes), '\0');
  } catch (const std::bad_alloc&) {  // within the ratio bound, yet more than this host can hold
    throw std::invalid_argument("LZ4 block: cannot allocate the " + num(decoded_bytes) + " decoded bytes");
  }
  std::string why = detail::lz4_block_decode(reinterpret_cast<const uint8_t*>(block.data()), block.size(),
                                             reinterpret_cast<uint8_t*>(out.data()), decoded_bytes);
  if (!why.empty()) throw std::invalid_argument("LZ4 block: " + why);
  return out;
}

std::shared_ptr<const Bundle> Bundle::parse(const void* data, size_t size) {
  if (data == nullptr && size != 0) fail("null data");
  const auto* p = static_cast<const uint8_t*>(data);

  // 1. length, magic, versions, file_size, whole-file hash.
  if (size < kBundleMinSize)
    fail(num(size) + " bytes is too short for a bundle (at least " + num(kBundleMinSize) +
         ": a 64-byte header and a 32-byte sha256)");
  BundleHeader h;
  std::memcpy(&h, p, sizeof(h));
  if (std::memcmp(h.magic, kBundleMagic, sizeof(kBundleMagic)) != 0)
    fail("bad magic (not a leapp segment bundle; expected \"LEAPPWB\\0\")");
  const std::string supported =
      "this leapp reads " + num(kBundleReaderMinVersion) + ".." + num(kBundleReaderMaxVersion);
  if (h.format_version < kBundleReaderMinVersion)
    fail("unsupported bundle format version " + num(h.format_version) + " (" + supported + ")");
  if (h.min_reader_version < 1 || h.min_reader_version > h.format_version)
    fail("header min_reader_version " + num(h.min_reader_version) + " is not in [1, format_version " +
         num(h.format_version) + "]");
  if (h.min_reader_version > kBundleReaderMaxVersion)
    fail("unsupported bundle format version " + num(h.format_version) +
         (h.min_reader_version == h.format_version
              ? std::string()
              : ", which needs a reader of version " + num(h.min_reader_version) + " or later") +
         " (" + supported + ")");
  if (h.file_size != size)
    fail("file_size " + num(h.file_size) + " does not match the buffer length " + num(size) + " (truncated?)");
  const uint64_t body_end = size - kBundleTrailerSize;
  detail::Sha256Digest whole = detail::sha256(p, size_t(body_end));
  if (std::memcmp(whole.data(), p + body_end, 32) != 0)
    fail("whole-file sha256 mismatch (corrupted: stored " + detail::to_hex(p + body_end, 32) + ", computed " +
         detail::to_hex(whole.data(), 32) + ")");

  // 2. header fields, blob table and manifest ranges.
  if (h.flags != 0) fail("flags " + num(h.flags) + " must be 0");
  if (h.reserved != 0) fail("reserved header field " + num(h.reserved) + " must be 0");
  if (h.blob_table_offset != kBundleHeaderSize)
    fail("blob_table_offset " + num(h.blob_table_offset) + " must be " + num(kBundleHeaderSize));
  if (h.blob_count > kBundleMaxBlobCount)
    fail("blob_count " + num(h.blob_count) + " exceeds " + num(kBundleMaxBlobCount));
  const uint64_t table_bytes = uint64_t(h.blob_count) * kBundleBlobEntrySize;
  if (!in_range(h.blob_table_offset, table_bytes, kBundleHeaderSize, body_end))
    fail("blob table (" + num(h.blob_count) + " entries at " + num(h.blob_table_offset) +
         ") extends past the end of the data at " + num(body_end));
  const uint64_t table_end = h.blob_table_offset + table_bytes;
  if (h.manifest_offset % kBundleAlignment != 0) fail("manifest_offset " + num(h.manifest_offset) + " is not 8-aligned");
  if (h.manifest_offset < table_end)
    fail("manifest_offset " + num(h.manifest_offset) + " overlaps the blob table ending at " + num(table_end));
  if (h.manifest_size == 0 || h.manifest_size > kBundleMaxManifestSize)
    fail("manifest_size " + num(h.manifest_size) + " out of range [1, " + num(kBundleMaxManifestSize) + "]");
  if (!in_range(h.manifest_offset, h.manifest_size, kBundleHeaderSize, body_end))
    fail("manifest [" + num(h.manifest_offset) + ", +" + num(h.manifest_size) + ") extends past the end of the data at " +
         num(body_end));
  const uint64_t manifest_end = h.manifest_offset + h.manifest_size;

  // 3. blob ranges: inside [manifest end, body end), 8-aligned, no overlap; then hashes.
  std::vector<BundleBlobEntry> entries(h.blob_count);
  if (h.blob_count) std::memcpy(entries.data(), p + h.blob_table_offset, size_t(table_bytes));
  std::map<uint64_t, uint32_t> by_offset;  // start -> blob, to find overlaps
  for (uint32_t i = 0; i < h.blob_count; ++i) {
    const BundleBlobEntry& e = entries[i];
    if (e.offset % kBundleAlignment != 0) fail("blob " + num(i) + " offset " + num(e.offset) + " is not 8-aligned");
    if (e.length > kBundleMaxBufferBytes)
      fail("blob " + num(i) + " length " + num(e.length) + " exceeds " + num(kBundleMaxBufferBytes) + " (2^40)");
    if (!in_range(e.offset, e.length, manifest_end, body_end))
      fail("blob " + num(i) + " [" + num(e.offset) + ", +" + num(e.length) + ") is outside [" + num(manifest_end) +
           ", " + num(body_end) + ")");
    if (e.length == 0) continue;  // an empty range overlaps nothing
    auto next = by_offset.lower_bound(e.offset);
    if (next != by_offset.end() && next->first < e.offset + e.length)
      fail("blob " + num(i) + " overlaps blob " + num(next->second));
    if (next != by_offset.begin()) {
      auto prev = std::prev(next);
      if (prev->first + entries[prev->second].length > e.offset)
        fail("blob " + num(i) + " overlaps blob " + num(prev->second));
    }
    by_offset.emplace(e.offset, i);
  }
  std::vector<std::string_view> blob_views;
  blob_views.reserve(h.blob_count);
  for (uint32_t i = 0; i < h.blob_count; ++i) {
    const BundleBlobEntry& e = entries[i];
    detail::Sha256Digest d = detail::sha256(p + e.offset, size_t(e.length));
    if (std::memcmp(d.data(), e.sha256, 32) != 0) fail("blob " + num(i) + " sha256 mismatch (corrupted)");
    blob_views.emplace_back(reinterpret_cast<const char*>(p + e.offset), size_t(e.length));
  }

  // 4. the manifest.
  std::string_view json(reinterpret_cast<const char*>(p + h.manifest_offset), size_t(h.manifest_size));
  Manifest manifest = detail::read_manifest(json, blob_views, h.min_reader_version);

  std::shared_ptr<Bundle> b(new Bundle());
  b->bytes_.assign(p, p + size);
  for (const BundleBlobEntry& e : entries) b->blobs_.emplace_back(e.offset, e.length);
  b->manifest_offset_ = h.manifest_offset;
  b->manifest_size_ = h.manifest_size;
  b->digest_ = detail::to_hex(p + body_end, 32);
  b->manifest_ = std::move(manifest);
  return b;
}

// --- the process-wide bundle table ---------------------------------------------------
//
// Weak entries: the table never keeps a bundle alive. intern_bundle hands out a
// shared_ptr whose deleter drops the bundle's entry (unless the digest was
// interned again since) and then frees the bundle. No shared_ptr to a bundle is
// ever destroyed while the table's mutex is held, since that deleter takes it.

namespace {
struct BundleTable {
  std::mutex mutex;
  std::map<std::string, std::weak_ptr<const Bundle>, std::less<>> by_digest;
};
BundleTable& bundle_table() {
  static BundleTable* t = new BundleTable();  // leaked: used by op libraries until exit
  return *t;
}

/// The deleter of the shared_ptr intern_bundle hands out.
struct DropFromTable {
  std::shared_ptr<const Bundle> parsed;
  void operator()(const Bundle* b) {
    BundleTable& t = bundle_table();
    {
      std::lock_guard<std::mutex> lock(t.mutex);
      auto it = t.by_digest.find(b->digest());
      if (it != t.by_digest.end() && it->second.expired()) t.by_digest.erase(it);
    }
    parsed.reset();  // frees the bundle, outside the lock
  }
};

std::shared_ptr<const Bundle> lookup(BundleTable& t, std::string_view digest) {
  std::lock_guard<std::mutex> lock(t.mutex);
  auto it = t.by_digest.find(digest);
  return it == t.by_digest.end() ? nullptr : it->second.lock();
}
}  // namespace

std::shared_ptr<const Bundle> intern_bundle(const void* data, size_t size) {
  BundleTable& t = bundle_table();
  // Fast path: the same bytes were parsed before and are still held (the stored
  // digest is only a lookup key; identity is confirmed by comparing every byte).
  if (data != nullptr && size >= kBundleMinSize) {
    const auto* p = static_cast<const uint8_t*>(data);
    std::shared_ptr<const Bundle> known = lookup(t, detail::to_hex(p + size - kBundleTrailerSize, 32));
    if (known && known->bytes() == std::string_view(reinterpret_cast<const char*>(p), size)) return known;
  }
  std::shared_ptr<const Bundle> parsed = Bundle::parse(data, size);
  std::shared_ptr<const Bundle> existing, handed_out;
  {
    std::lock_guard<std::mutex> lock(t.mutex);
    std::weak_ptr<const Bundle>& slot = t.by_digest[parsed->digest()];
    existing = slot.lock();
    if (!existing) {
      const Bundle* raw = parsed.get();
      handed_out = std::shared_ptr<const Bundle>(raw, DropFromTable{parsed});
      slot = handed_out;
    }
  }
  return existing ? existing : handed_out;  // `parsed` (a duplicate when `existing`) is freed after the lock
}

std::shared_ptr<const Bundle> find_bundle(std::string_view digest) { return lookup(bundle_table(), digest); }

size_t interned_bundle_count() {
  BundleTable& t = bundle_table();
  std::lock_guard<std::mutex> lock(t.mutex);
  return t.by_digest.size();
}

std::string sha256_hex(const void* data, size_t size) {
  detail::Sha256Digest d = detail::sha256(data, size);
  return detail::to_hex(d.data(), d.size());
}

size_t dtype_itemsize(std::string_view dtype) {
  if (dtype == "float32" || dtype == "int32") return 4;
  if (dtype == "float16" || dtype == "bfloat16" || dtype == "int16") return 2;
  if (dtype == "float64" || dtype == "int64") return 8;
  if (dtype == "int8" || dtype == "uint8" || dtype == "bool") return 1;
  return 0;
}

Signature parse_signature(std::string_view json) { return detail::read_signature(json); }

void check_signature(const Bundle& bundle, const Signature& sig) {
  const std::string where = "leapp segment '" + detail::shown(bundle.segment()) + "': ";
  if (!sig.digest.empty() && sig.digest != bundle.digest())
    throw std::invalid_argument(where + "the op's signature names bundle " + sig.digest + " but the bundle is " +
                                bundle.digest() + " (signature and bundle belong to different segments)");
  // Dynamic batch: torch's fake kernel sizes the outputs from the signature's rules and range, the runtime
  // from the bundle's, so they must be the same ones (a graph compiled for other sizes would index past them).
  const Manifest& m = bundle.manifest();
  auto range = [](bool dynamic, int64_t lo, int64_t traced, int64_t hi) {
    return dynamic ? "dynamic batch " + std::to_string(lo) + ".." + std::to_string(hi) + " (traced " +
                         std::to_string(traced) + ")"
                   : std::string("a fixed batch");
  };
  if (sig.has_batch != m.dynamic || (m.dynamic && (sig.batch_min != m.batch_min || sig.batch_max != m.batch_max ||
                                                   sig.batch_traced != m.batch_traced)))
    throw std::invalid_argument(where + "the op's signature declares " +
                                range(sig.has_batch, sig.batch_min, sig.batch_traced, sig.batch_max) +
                                ", the bundle " + range(m.dynamic, m.batch_min, m.batch_traced, m.batch_max));
  auto compare = [&](const char* side, const std::vector<TensorSpec>& want, const std::vector<TensorSpec>& have) {
    if (want.size() != have.size())
      throw std::invalid_argument(where + "the signature lists " + std::to_string(want.size()) + " " + side +
                                  ", the bundle " + std::to_string(have.size()));
    for (size_t j = 0; j < want.size(); ++j) {
      if (want[j].dtype != have[j].dtype || want[j].shape != have[j].shape)
        throw std::invalid_argument(where + "signature " + side + "[" + std::to_string(j) + "] '" +
                                    detail::shown(want[j].name) + "' differs from the bundle's '" +
                                    detail::shown(have[j].name) + "' (dtype or shape)");
      if (want[j].has_batch_rule != have[j].has_batch_rule ||
          (want[j].has_batch_rule && want[j].batch_rule != have[j].batch_rule)) {
        auto rule = [](const TensorSpec& t) {
          return t.has_batch_rule ? "batch_rule [" + std::to_string(t.batch_rule.a) + ", " +
                                        std::to_string(t.batch_rule.b) + "]"
                                  : std::string("no batch_rule");
        };
        throw std::invalid_argument(where + "signature " + side + "[" + std::to_string(j) + "] '" +
                                    detail::shown(want[j].name) + "' has " + rule(want[j]) + ", the bundle's '" +
                                    detail::shown(have[j].name) + "' " + rule(have[j]));
      }
    }
  };
  compare("outputs", sig.outputs, m.outputs);
  if (sig.has_inputs) compare("inputs", sig.inputs, m.inputs);
}

}  // namespace leapp
