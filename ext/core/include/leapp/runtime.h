// ext/core/include/leapp/runtime.h: the API every front end (Python, ORT, torch) uses.
//
// Data flow: bytes -> Bundle::parse (validates everything, see
// docs/bundle-format.md) -> run_segment (device pointers on a stream) or
// run_segment_host (host memory staged through pinned buffers). Errors are
// standard exceptions that each front end maps to its own error channel:
//   std::invalid_argument  corrupt bundle, bad signature, wrong inputs/outputs
//   leapp::DriverUnavailable  no libcuda.so.1 / cuInit failed
//   leapp::CudaError (a std::runtime_error)  a failed driver call
//   std::runtime_error  no usable binary for the device, other runtime failures
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "leapp/bundle_format.h"
#include "leapp/cuda_driver.h"

namespace leapp {

// --- the validated manifest (docs/bundle-format.md section 2) -------------------

/// A dynamic-batch rule: a * batch + b (docs/bundle-format.md, "Dynamic batch"). A static value v is {0, v}.
/// |a|, |b| <= 2^40 and batch <= 2^31 - 1, so the value fits an int64.
struct Rule {
  int64_t a = 0;
  int64_t b = 0;
  int64_t at(int64_t batch) const { return a * batch + b; }
  bool operator==(const Rule& o) const { return a == o.a && b == o.b; }
  bool operator!=(const Rule& o) const { return !(*this == o); }
};

/// Writes a rule's value (little-endian, `width` 4 or 8 bytes) at byte `offset` of parameter `param`.
struct PatchSpec {
  uint32_t param = 0;
  uint64_t offset = 0;
  uint32_t width = 4;
  Rule rule;
};

struct BinarySpec {
  BinaryKind kind = BinaryKind::kPtx;
  uint32_t arch = 0;  ///< compute capability * 10 + minor
  uint32_t blob = 0;  ///< index into the blob table
  BinaryEncoding encoding = BinaryEncoding::kRaw;  ///< how the blob stores the binary (section 1.1)
  uint64_t decoded_bytes = 0;  ///< the binary's size (the blob's length when kRaw)
  /// PTX only: the ISA of the text's `.version` directive ("9.0"), "" when it has none
  /// (the optional manifest field `ptx_isa`, when present, was checked against it).
  std::string ptx_isa;
};

struct ModuleSpec {
  std::string name;
  std::vector<BinarySpec> binaries;  ///< at least one
};

struct KernelSpec {
  uint32_t module = 0;
  std::string entry;  ///< exact symbol, e.g. "scale_1a2b3c4d_cuda_kernel_forward"
  std::string key;    ///< Warp's kernel key (may be empty); for messages
  uint32_t block_dim = 0;
  uint32_t smem_bytes = 0;  ///< dynamic shared memory
  std::string cpu_entry;    ///< the CPU code's entry symbol, e.g. "scale_1a2b3c4d_cpu_forward" ("": no CPU code)
};

/// cpu_code[c]: one ELF shared object holding the segment's kernels compiled for a CPU (docs/bundle-format.md,
/// "CPU code"); its blob passed the ELF header checks for `machine`.
struct CpuCodeSpec {
  std::string machine;  ///< "x86_64" or "aarch64"
  BinarySpec image;     ///< kind kCpu: its blob and encoding
  /// The object's bytes when its blob is compressed: decoded once, by the parse that checked them (the loader
  /// maps these, never a second decode); null when the blob holds the object as it is. Use cpu_code_image().
  std::shared_ptr<const std::string> decoded;
};

struct BufferSpec {
  uint64_t bytes = 0;
  BufferRole role = BufferRole::kScratch;
  uint32_t io = 0;  ///< signature index (inputs and outputs only)
  BufferInit init = BufferInit::kNone;
  uint32_t init_index = 0;  ///< blob (kBlob) or signature input (kInput)
  Rule bytes_rule;          ///< {0, bytes} unless the manifest gives bytes_rule
};

struct RelocSpec {
  uint32_t param = 0;
  uint64_t offset = 0;  ///< byte offset inside the parameter
  uint32_t buffer = 0;
  uint64_t buffer_offset = 0;
  Rule buffer_offset_rule;  ///< {0, buffer_offset} unless given
};

struct OpSpec {
  OpKind kind = OpKind::kLaunch;
  // kLaunch
  uint32_t kernel = 0;
  uint32_t grid[3] = {1, 1, 1};
  uint32_t block[3] = {1, 1, 1};
  uint32_t smem = 0;
  uint32_t params_blob = 0;
  std::vector<uint64_t> param_offsets;  ///< parameter i at [offsets[i], offsets[i] + sizes[i]) of the blob
  std::vector<uint64_t> param_sizes;
  std::vector<RelocSpec> relocs;
  // kMemset: `dst` at `dst_offset`, `bytes` bytes of `value`
  // kCopy:   `bytes` bytes from `src` at `src_offset` to `dst` at `dst_offset`
  uint32_t dst = 0;
  uint64_t dst_offset = 0;
  uint32_t src = 0;
  uint64_t src_offset = 0;
  uint64_t bytes = 0;
  uint8_t value = 0;
  // Dynamic batch (all {0, static} when the manifest gives no rule):
  bool sized = false;       ///< launch: size_rule given; the grid is computed from it
  Rule size_rule;           ///< launch: threads
  bool grid_stride = true;  ///< launch
  uint32_t max_blocks = 0;  ///< launch
  std::vector<PatchSpec> patches;
  Rule dst_offset_rule, src_offset_rule, bytes_rule;  ///< memset (dst = buffer) and copy
};

/// One entry of signature.inputs / signature.outputs.
struct TensorSpec {
  std::string name;
  uint32_t buffer = 0;
  std::string dtype;  ///< torch dtype name: "float32", "int64", ...
  std::vector<int64_t> shape;
  std::string warp_dtype;
  std::vector<int64_t> logical_shape;
  uint64_t bytes = 0;  ///< prod(shape) * itemsize(dtype) == buffers[buffer].bytes
  bool has_batch_rule = false;  ///< dim 0 = batch_rule.at(batch)
  Rule batch_rule;
  uint64_t row_bytes = 0;       ///< bytes of one dim-0 row (itemsize * prod(shape[1:]))
};

struct Manifest {
  std::string segment;
  std::string source;
  std::vector<std::pair<std::string, std::string>> producer;
  std::vector<ModuleSpec> modules;
  std::vector<KernelSpec> kernels;
  std::vector<BufferSpec> buffers;
  std::vector<OpSpec> ops;
  std::vector<TensorSpec> inputs;
  std::vector<TensorSpec> outputs;
  std::vector<CpuCodeSpec> cpu_code;  ///< empty: the segment runs on CUDA devices only
  // Dynamic batch: present iff the manifest has "batch".
  bool dynamic = false;
  int64_t batch_traced = 0, batch_min = 0, batch_max = 0;
  uint32_t batch_input = 0;  ///< the signature input the runtime reads the batch from

  /// producer[key], or "" when absent.
  std::string producer_value(std::string_view key) const;

  /// An input's or output's bytes at `batch` (its traced bytes when the batch is fixed).
  uint64_t bytes_at(const TensorSpec& t, int64_t batch) const {
    return dynamic ? uint64_t(buffers[t.buffer].bytes_rule.at(batch)) : t.bytes;
  }
  /// An input's or output's dim 0 at `batch` (the traced one without a batch rule); `t.shape` is not empty.
  int64_t dim0_at(const TensorSpec& t, int64_t batch) const {
    return dynamic && t.has_batch_rule ? t.batch_rule.at(batch) : t.shape[0];
  }
};

// --- bundles ---------------------------------------------------------------------

/// A validated, immutable bundle. It owns a copy of the bytes.
class Bundle {
 public:
  /// Validates `size` bytes at `data` in the order of docs/bundle-format.md and
  /// copies them. Throws std::invalid_argument naming the field that is wrong,
  /// e.g. "leapp bundle 'obs/warp_segment_0': ops[3].relocs[0].buffer 9 out of range (7 buffers)".
  static std::shared_ptr<const Bundle> parse(const void* data, size_t size);

  const std::string& digest() const { return digest_; }  ///< hex of the trailing sha256
  const std::string& segment() const { return manifest_.segment; }
  const Manifest& manifest() const { return manifest_; }
  std::string_view manifest_json() const;
  /// The bytes of blob `index` (validated to exist when the manifest names it).
  std::string_view blob(uint32_t index) const;
  /// The binary's image: its blob, decoded when the manifest gives it an encoding (a copy then; only the
  /// binary a loader picks is decoded at load). Throws std::invalid_argument naming the bundle and blob.
  std::string binary_image(const BinarySpec& binary) const;
  /// The bytes of a CPU code object, as the parse checked them (no copy, no decode).
  std::string_view cpu_code_image(const CpuCodeSpec& code) const {
    return code.decoded ? std::string_view(*code.decoded) : blob(code.image.blob);
  }
  size_t blob_count() const { return blobs_.size(); }
  size_t size() const { return bytes_.size(); }
  /// The whole file.
  std::string_view bytes() const { return {reinterpret_cast<const char*>(bytes_.data()), bytes_.size()}; }

 private:
  Bundle() = default;
  std::vector<uint8_t> bytes_;
  std::vector<std::pair<uint64_t, uint64_t>> blobs_;  // (offset, length)
  uint64_t manifest_offset_ = 0;
  uint64_t manifest_size_ = 0;
  std::string digest_;
  Manifest manifest_;
};

/// Parses `data` once per digest while anything holds the result (front ends
/// share one table, so a bundle used by several sessions or ops is validated
/// once). The table holds no bundle alive: a bundle is freed, and its entry
/// dropped, with its last shared_ptr; interning the bytes again parses again.
std::shared_ptr<const Bundle> intern_bundle(const void* data, size_t size);
/// A bundle interned before and still held somewhere, or nullptr.
std::shared_ptr<const Bundle> find_bundle(std::string_view digest);
/// Entries in the bundle table (bundles alive that intern_bundle made).
size_t interned_bundle_count();

/// The `decoded_bytes` bytes of one LZ4 block under the rules of docs/bundle-format.md section 1.1 (the
/// decoder of compressed binaries). Throws std::invalid_argument "LZ4 block: <why>" for any block that
/// breaks them, whatever its bytes.
std::string lz4_block_decode(std::string_view block, uint64_t decoded_bytes);

/// Lower-case hex SHA-256 of `size` bytes (the bundle digest is this of bytes [0, size - 32)).
std::string sha256_hex(const void* data, size_t size);

/// Bytes per element of a signature dtype name, 0 when the name is not one of them.
size_t dtype_itemsize(std::string_view dtype);

// --- segment signatures (the op attribute) ---------------------------------------

/// The `signature` string an exported op carries (compact JSON):
/// {"digest": "<hex>", "segment": "...", "inputs": [...], "outputs": [{"name", "dtype", "shape"}, ...]}.
/// Only "outputs" is required; "digest" and "inputs" are checked against the bundle when present.
struct Signature {
  std::string digest;
  std::string segment;
  bool has_inputs = false;
  std::vector<TensorSpec> inputs;   ///< name, dtype, shape and batch_rule only
  std::vector<TensorSpec> outputs;  ///< name, dtype, shape and batch_rule only
  /// Dynamic batch: what the op's fake kernel sizes outputs from (check_signature: the bundle's own).
  bool has_batch = false;
  int64_t batch_min = 0, batch_max = 0, batch_traced = 0;
};

/// Parses a signature string; throws std::invalid_argument naming the field.
Signature parse_signature(std::string_view json);

/// Throws std::invalid_argument when `sig` does not describe `bundle` (digest,
/// output count, names, dtypes, shapes; inputs likewise when present; a dynamic
/// batch's range and every batch_rule equal to the bundle's, none for a fixed bundle).
void check_signature(const Bundle& bundle, const Signature& sig);

// --- replay ----------------------------------------------------------------------

struct DeviceSpan {
  CUdeviceptr ptr = 0;
  uint64_t bytes = 0;
};

struct HostSpan {
  void* ptr = nullptr;
  uint64_t bytes = 0;
};

/// Replays the segment on `stream` (0 = legacy default stream) of CUDA device
/// `device` (-1: the device of the stream's context, else of the current
/// context, else 0). `inputs`/`outputs` are device pointers with their byte
/// sizes, in signature order; each must hold exactly the signature's bytes.
///
/// Modules are loaded once per (CUcontext, bundle digest); constants uploaded
/// once per context; scratch allocated once per (context, digest, stream) and
/// reused, so after the first call nothing is allocated, synchronised or
/// loaded: the call only enqueues work and is safe inside CUDA graph capture.
/// The caller's current context is restored. Thread-safe, also for threads
/// sharing one stream: a call's enqueues are never interleaved with another
/// call of the same segment on that stream. Scratch of the per-thread default
/// stream is freed when its thread exits; everything else stays until
/// release_segments() (docs/runtime.md, "Resources").
void run_segment(const Bundle& bundle, const std::vector<DeviceSpan>& inputs,
                 const std::vector<DeviceSpan>& outputs, CUstream stream, int device);

/// Dynamic batch (docs/bundle-format.md): the batch of a call whose input Manifest::batch_input (the one the
/// batch is read from) has `batch_input_bytes` bytes; 0 for a bundle without a dynamic batch. Throws
/// std::invalid_argument naming the segment and the input when it is not a whole batch in [min, max].
/// run_segment checks every input and output size at that batch.
int64_t segment_batch(const Bundle& bundle, uint64_t batch_input_bytes);

/// Runs the segment on host memory. With CPU code for this machine, that is run_segment_cpu. Otherwise it
/// copies inputs into pinned staging buffers,
/// replays on a stream of leapp's own on `device` (-1: env LEAPP_CUDA_DEVICE,
/// else 0), copies the outputs back and waits. Staging sets (stream, pinned and
/// device buffers) are pooled per (digest, device), so concurrent callers never
/// share one. Used by the ORT CPU execution provider.
void run_segment_host(const Bundle& bundle, const std::vector<HostSpan>& inputs,
                      const std::vector<HostSpan>& outputs, int device);

/// The bytes one call of a segment takes beyond its inputs, as the runtime lays them out (docs/runtime.md, "Memory").
struct SegmentMemory {
  uint64_t outputs = 0;    ///< its outputs at the batch (allocated by the op, ONNX Runtime or the caller)
  uint64_t scratch = 0;    ///< its scratch buffers, 256-byte aligned (allocated by the runtime, per stream or thread)
  uint64_t constants = 0;  ///< its constant buffers, 256-byte aligned (allocated by the runtime once per segment)
};
/// What a call of `bundle` at `batch` takes (the batch is ignored without a dynamic batch). Allocates nothing.
SegmentMemory segment_memory(const Bundle& bundle, int64_t batch);
/// The most one segment call may take: env LEAPP_MAX_SEGMENT_BYTES (bytes, read once), default 4 GiB.
uint64_t segment_memory_limit();
/// Throws std::runtime_error naming the segment, the batch and each size when a call at `batch` would take more
/// than segment_memory_limit(). The op libraries call it before they allocate outputs, the runtime before scratch.
void check_segment_memory(const Bundle& bundle, int64_t batch);

/// The bundle's CPU code for the machine this library was built for (docs/bundle-format.md, "CPU code"), or
/// nullptr when it holds none.
const CpuCodeSpec* cpu_code_for_this_machine(const Bundle& bundle);

/// Whether run_segment_cpu runs the bundle on this machine: it holds CPU code for it, or it launches no kernel (a
/// segment of copies and memsets only needs no compiled code: memmove and memset run it on any machine).
bool runs_on_this_cpu(const Bundle& bundle);

/// Why run_segment_cpu cannot run the bundle here, naming the segment, this machine and the machines it has
/// CPU code for; "" when it can.
std::string cpu_code_refusal(const Bundle& bundle);

/// Runs the segment on host memory with its CPU code, on the calling thread (docs/runtime.md, "CPU code"):
/// no CUDA driver, no Warp, no compiler, no thread of its own. The CPU code is loaded once per digest from
/// memory (a sealed memfd), its layout tables checked against every launch; constants are shared and
/// read-only; scratch, addresses and parameter bytes are per thread, so concurrent calls are safe. Inputs and
/// outputs are checked as run_segment checks them. A bundle that launches no kernel runs without CPU code. Throws
/// std::runtime_error (cpu_code_refusal) when the bundle has no CPU code for this machine and launches a kernel, std::invalid_argument for bad spans or a layout that does not match.
void run_segment_cpu(const Bundle& bundle, const std::vector<HostSpan>& inputs, const std::vector<HostSpan>& outputs);

/// Unloads the CPU code of segment `digest` (every segment when empty) once no call or thread still holds it
/// (each thread keeps the last segment it ran); returns how many were dropped from the table.
size_t release_cpu_code(std::string_view digest = {});

/// The device run_segment_host uses for device == -1 (env LEAPP_CUDA_DEVICE, else 0).
int default_host_device();

/// Device and host allocations made by the runtime so far (scratch, constants,
/// staging). Stays constant once every (segment, device, stream) is warm.
uint64_t allocation_count();

/// Device and host frees made by the runtime so far (release_segments, thread exits).
uint64_t free_count();

/// Frees what replay keeps for segment `digest` (every segment when empty) in
/// every context: modules, constants, the scratch of every stream, and idle
/// run_segment_host staging sets. Calls enqueueing that segment right now are
/// waited for; each affected context is then synchronised (cuCtxSynchronize),
/// so work already queued finishes before its memory is freed. A later call
/// prepares the segment again. The caller must ensure that no CUDA graph that
/// captured these segments is replayed afterwards (it holds their addresses)
/// and that no stream of an affected context is being captured (the
/// synchronisation would fail: nothing of that context is freed then, and the
/// error says so; a later call retries). Returns the number of (context,
/// segment) preparations released. Throws std::runtime_error listing what
/// could not be freed; without a driver it returns 0.
size_t release_segments(std::string_view digest = {});

/// A caller that owns the graph of capture `capture_id` (cuStreamGetCaptureInfo's id) and says when it is
/// gone: calls recorded in that capture keep their scratch in this runtime's table, without the CUDA user
/// object that otherwise ties it to the graph. A graph holding user objects makes the driver track every
/// launch on a thread of its own, which allocates host memory at each launch; leapp's C++ Pipeline adopts
/// the captures of its step graphs (docs/deploy.md, "Allocations in a step"). Call before the capture
/// records a call; release_capture(capture_id) once the graph and its instances are destroyed and their
/// launches done (the next new scratch entry, or release_segments(), then frees that scratch).
void adopt_capture(uint64_t capture_id);
void release_capture(uint64_t capture_id);

/// Whether `stream` is being captured into a CUDA graph (false without a driver).
bool stream_is_capturing(CUstream stream);

/// The binaries of `module` a device of compute capability major.minor may
/// load, best first (docs/bundle-format.md section 3): the exact cubin, then
/// the highest same-major cubin of a lower minor, then the highest PTX with
/// arch <= the device's. Empty when none fits. Exposed for tests and diagnostics.
std::vector<BinarySpec> binary_candidates(const ModuleSpec& module, int cc_major, int cc_minor);

// --- binary choice with the driver version (docs/bundle-format.md section 3) ---------

/// The newest PTX ISA a driver of CUDA version `driver_version` (cuDriverGetVersion,
/// 13000 = 13.0) JIT-compiles, as {major, minor}: CUDA 12.9 reads 8.8, 13.0 reads 9.0,
/// 13.x reads 9.x. {0, 0} when the version is 0 (unknown); {99, 99} for a driver of
/// a later major version than 13 (it reads every ISA known today).
std::pair<int, int> driver_ptx_isa(int driver_version);

/// The oldest CUDA driver version (e.g. 13040) whose JIT reads PTX ISA major.minor;
/// 0 when that ISA is newer than every CUDA release known to this code.
int ptx_isa_min_driver(int isa_major, int isa_minor);

/// One binary of a module, judged for a device and driver.
struct BinaryOption {
  BinarySpec binary;
  /// Whether loading it is expected to work: false when the driver version predicts a
  /// refusal (PTX of a newer ISA than the driver reads; a cubin of a newer CUDA major
  /// version than the driver). Always true when the driver version is unknown (0).
  bool expected = true;
  std::string reason;  ///< why it is a candidate, or why it is expected to fail / cannot run
};

/// Which binary of a module loads on a device, and why (docs/bundle-format.md section 3).
struct BinaryChoice {
  /// binary_candidates() order, those expected to load first: the order the loader tries.
  std::vector<BinaryOption> candidates;
  std::vector<BinaryOption> excluded;  ///< binaries that cannot run on the device at all, each with why
  int chosen = -1;                     ///< index into candidates of the expected binary; -1: none is expected to load
  std::string holdings;                ///< "ptx sm_75 (PTX ISA 9.4), cubin sm_80, cubin sm_90"
  /// One line: "cubin sm_90: exact match for compute capability 9.0", or, when chosen == -1,
  /// the reason no binary fits (device, driver, what the bundle holds, the fix).
  std::string summary;
};

/// The choice for modules[module] of `manifest` on a device of compute capability
/// cc_major.cc_minor named `device` (may be empty) under a CUDA driver of version
/// `driver_version` (0: unknown, no driver-based predictions). The runtime's loader
/// tries exactly `candidates` in order; `leapp inspect` and `leapp doctor` report it.
/// Throws std::invalid_argument for a module index out of range.
BinaryChoice choose_binary(const Manifest& manifest, uint32_t module, int cc_major, int cc_minor, int driver_version,
                           const std::string& device = "");

}  // namespace leapp
