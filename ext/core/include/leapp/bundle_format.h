// ext/core/include/leapp/bundle_format.h: the on-disk layout of a leapp segment bundle.
//
// The binding contract is docs/bundle-format.md; this header mirrors its
// section 1 byte for byte (the Python writer in leapp/bundle packs the same
// structs with `struct`). All integers are little-endian; the reader copies
// the header and each table entry out of the buffer with memcpy, so nothing
// here is ever read in place from untrusted, possibly misaligned bytes.
#pragma once

#include <cstddef>
#include <cstdint>

namespace leapp {

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "leapp bundles are little-endian; this reader assumes a little-endian host"
#endif

// --- constants ---------------------------------------------------------------
constexpr char kBundleMagic[8] = {'L', 'E', 'A', 'P', 'P', 'W', 'B', '\0'};
constexpr uint32_t kBundleFormatVersion = 2;      ///< the version this code writes and reads
constexpr uint32_t kBundleReaderMinVersion = 1;   ///< oldest format_version this reader accepts
constexpr uint32_t kBundleReaderMaxVersion = 2;   ///< newest min_reader_version this reader accepts
// Compressed binaries (section 1.1, format version 2): a binary with `"encoding": "lz4-block"` is stored
// as one LZ4 block of `decoded_bytes`; a file using it has min_reader_version >= 2.
constexpr const char* kBundleEncodingLz4Block = "lz4-block";
constexpr uint32_t kBundleEncodingMinReader = 2;
constexpr int64_t kBundleMaxRuleCoefficient = int64_t(1) << 40;  ///< |a|, |b| of a dynamic-batch rule [a, b]
constexpr int64_t kBundleMaxBatch = (int64_t(1) << 31) - 1;       ///< batch.max
constexpr uint32_t kBundleDynamicBatchMinReader = 2;             ///< a file with "batch" has min_reader_version >= 2
constexpr uint64_t kBundleHeaderSize = 64;
constexpr uint64_t kBundleBlobEntrySize = 48;
constexpr uint64_t kBundleTrailerSize = 32;       ///< the whole-file sha256
constexpr uint64_t kBundleMinSize = kBundleHeaderSize + kBundleTrailerSize;  // 96
constexpr uint32_t kBundleMaxBlobCount = 65536;
constexpr uint64_t kBundleMaxManifestSize = 64ull << 20;  // 64 MiB
constexpr uint64_t kBundleAlignment = 8;
// Manifest JSON bounds (section 2, "JSON"): both readers refuse a manifest or a
// signature string beyond them, at the same boundary.
constexpr int kBundleMaxJsonDepth = 512;                   ///< nesting of arrays/objects, the top level being 1
constexpr uint64_t kBundleMaxJsonValues = uint64_t(1) << 20;  ///< values in one document (keys not counted)
// Declared sizes (section 2, "Resource bounds"): checked at parse time so no
// hostile number reaches cuMemAlloc or a size computation. 2^40 bytes (1 TiB)
// is several times any single GPU's memory, and 2^20 values of at most 2^40
// sum to at most 2^60, so no sum or offset + length of checked fields can
// overflow a u64 (or an i64).
constexpr uint64_t kBundleMaxBufferBytes = uint64_t(1) << 40;  ///< buffers[i].bytes, memset/copy bytes, a blob's length
constexpr uint64_t kBundleMaxOwnedBytes = uint64_t(1) << 40;   ///< sum of scratch + constant buffer bytes
constexpr const char* kBundleManifestFormat = "leapp.warp.bundle";
constexpr uint16_t kElfMachineX86_64 = 62;    ///< cpu_code[c].machine "x86_64": the ELF e_machine its blob declares
constexpr uint16_t kElfMachineAarch64 = 183;  ///< "aarch64"
constexpr uint64_t kBundleMaxCpuCodeBytes = uint64_t(64) << 20;  ///< a CPU code object's (decoded) size: 64 MiB

// --- packed structs ------------------------------------------------------------
#pragma pack(push, 1)
struct BundleHeader {
  char magic[8];                ///< kBundleMagic
  uint32_t format_version;      ///< the writer's version
  uint32_t min_reader_version;  ///< oldest reader that reads this file correctly
  uint64_t file_size;           ///< equals the buffer length
  uint64_t blob_table_offset;   ///< 64
  uint32_t blob_count;          ///< <= kBundleMaxBlobCount
  uint32_t flags;               ///< 0 (reserved)
  uint64_t manifest_offset;     ///< 8-aligned, >= end of the blob table
  uint64_t manifest_size;       ///< > 0, <= kBundleMaxManifestSize
  uint64_t reserved;            ///< 0
};  // 64 bytes

struct BundleBlobEntry {
  uint64_t offset;     ///< 8-aligned, >= end of the manifest
  uint64_t length;     ///< bytes
  uint8_t sha256[32];  ///< of the blob's bytes
};  // 48 bytes
#pragma pack(pop)

static_assert(sizeof(BundleHeader) == kBundleHeaderSize, "BundleHeader must be 64 bytes");
static_assert(sizeof(BundleBlobEntry) == kBundleBlobEntrySize, "BundleBlobEntry must be 48 bytes");
static_assert(offsetof(BundleHeader, file_size) == 16 && offsetof(BundleHeader, blob_count) == 32 &&
                  offsetof(BundleHeader, manifest_offset) == 40 && offsetof(BundleHeader, reserved) == 56,
              "BundleHeader field offsets follow docs/bundle-format.md section 1");
static_assert(offsetof(BundleBlobEntry, sha256) == 16, "BundleBlobEntry.sha256 is at byte 16");

// --- manifest enums (explicit values: they appear in logs and bindings) ----------
/// modules[m].binaries[b].kind
enum class BinaryKind : uint8_t {
  kPtx = 1,    ///< "ptx": NUL-terminated PTX text, JIT-compiled by the driver
  kCubin = 2,  ///< "cubin": SASS for one SM family
  kCpu = 3,    ///< cpu_code[c]: an ELF shared object (never in modules[m].binaries)
};

/// modules[m].binaries[b].encoding (format version 2)
enum class BinaryEncoding : uint8_t {
  kRaw = 0,       ///< no "encoding": the blob is the binary
  kLz4Block = 1,  ///< "lz4-block": the blob is one LZ4 block of `decoded_bytes` (section 1.1)
};

/// buffers[i].role
enum class BufferRole : uint8_t {
  kInput = 1,     ///< bound to signature.inputs[io]; never written by the ops
  kOutput = 2,    ///< bound to signature.outputs[io]
  kScratch = 3,   ///< runtime-owned, allocated once and reused
  kConstant = 4,  ///< runtime-owned, uploaded once per device from its init blob; read-only
};

/// buffers[i].init
enum class BufferInit : uint8_t {
  kNone = 0,   ///< "none": undefined before the first op
  kZero = 1,   ///< "zero": zeroed on the stream before the first op, every call
  kBlob = 2,   ///< {"blob": n}: constant bytes (constants only)
  kInput = 3,  ///< {"input": j}: copied from signature.inputs[j] every call (outputs only)
};

/// ops[k].op
enum class OpKind : uint8_t {
  kLaunch = 1,  ///< cuLaunchKernel with the packed, relocated parameters
  kMemset = 2,  ///< cuMemsetD8Async
  kCopy = 3,    ///< cuMemcpyDtoDAsync
};

}  // namespace leapp
