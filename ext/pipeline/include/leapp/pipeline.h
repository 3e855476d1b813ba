// leapp/pipeline.h: run a leapp export folder from C++ (docs/deploy.md).
//
//   auto pipeline = leapp::Pipeline::open("exports/go2");            // checks what leapp.load checks
//   for (const leapp::TensorInfo& t : pipeline->inputs()) ...         // names, dtypes, shapes, metadata
//   pipeline->run({{"quat", quat_ptr}, ...}, {{"actions", out_ptr}});  // caller-owned buffers
//   pipeline->reset();                                                // state: back to its initial values
//
// The folder's wiring is read from pipeline.json, the JSON twin of pipeline.yaml (one schema:
// leapp/pipeline_format/pipeline.schema.json); artifacts are checked (containment, sha256) as
// leapp.load checks them and refused with the same texts. ONNX nodes run in ONNX Runtime (found
// and loaded at run time) with leapp's WarpSegment op library registered; PT2 nodes run from the
// AOTInductor package `leapp aoti` recorded, through the plugin libleapp_pipeline_aoti.so (libtorch),
// loaded only when an export has such a node. Errors are
// leapp::PipelineError. No CUDA link dependency: device mode uses the driver through dlopen.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace leapp {

/// An export folder is inconsistent or was refused, or a run got wrong inputs (texts as leapp.load's).
class PipelineError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A signed export was refused (PipelineOptions::trusted_keys, $LEAPP_TRUST; docs/deploy.md, "Signed exports"):
/// unsigned, signed by a key not trusted, a file changed, added, removed or linked, a hostile model.sig, or a file
/// changed after its signature was checked. what() names the file or the signature problem, as leapp.load does.
class SignatureError : public PipelineError {
 public:
  using PipelineError::PipelineError;
};

/// PipelineOptions::only_node names no node of the export (what() lists the nodes).
class NodeNotFound : public PipelineError {
 public:
  using PipelineError::PipelineError;
};

/// A named value at a boundary: torch's dtype name ("float32"), static shape, C-order bytes.
struct TensorInfo {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  size_t element_size = 0;
  /// The user's metadata (annotate.input_tensors(..., metadata=)) as compact JSON text, e.g.
  /// {"kind":"joint_positions","units":"rad"}; "{}" when none was declared (docs/pipeline-format.md).
  std::string metadata = "{}";
  /// Dynamic batch (docs/recorder.md section 1.0): dim 0 may be any size in [batch_min, batch_max] (shape holds
  /// the traced one); both 0 for a static tensor. Pipeline::set_batch chooses the batch of the next runs.
  int64_t batch_min = 0, batch_max = 0;
  size_t byte_size() const;
  /// The shape and bytes at `batch` (dim 0 replaced when the tensor has a dynamic batch; batch 0: the traced shape).
  std::vector<int64_t> shape_at(int64_t batch) const;
  size_t byte_size(int64_t batch) const;
};

/// A state the pipeline carries from one run to the next (Pipeline::state_infos): named "node/input", with the node
/// input's dtype, shape and metadata; `output` is the node's output that updates it.
struct StateInfo : TensorInfo {
  std::string node, input, output;
};

/// One node as the wiring describes it, and how this process runs it.
struct NodeInfo {
  std::string name;
  std::string backend;   ///< "onnx", "pt2" (runs from its AOTInductor package) or "torchscript" (refused at open)
  std::string artifact;  ///< the resolved path of its artifact
  std::string device;    ///< the device it was exported on ("cpu", "cuda:0")
  std::string execution; ///< "ort-cpu", "ort-cuda", "aoti-cpu", "aoti-cuda", or "unopened" (PipelineOptions::only_node)
  std::vector<TensorInfo> inputs, outputs;
};

/// Where the caller's buffers live. kDevice runs every ONNX node on ONNX Runtime's CUDA EP and every PT2 node's
/// (CUDA) AOTInductor package on `stream`.
enum class Memory { kHost, kDevice };

struct PipelineOptions {
  Memory memory = Memory::kHost;
  int device_index = 0;          ///< kDevice: the CUDA device of the buffers
  /// kDevice: the CUstream (= cudaStream_t) all work is enqueued on. nullptr: a stream the pipeline makes, blocking
  /// (ordered with the caller's work on the legacy default stream, as that stream would be; a program built with
  /// per-thread default streams passes its own).
  void* stream = nullptr;
  std::string onnxruntime_library;  ///< libonnxruntime.so to load; "" = search (docs/deploy.md)
  std::string ort_op_library;       ///< libleapp_warp_ort.so to register; "" = search
  std::string aoti_plugin;          ///< libleapp_pipeline_aoti.so (PT2 nodes' AOTInductor packages); "" = search
  std::string torch_op_library;     ///< libleapp_warp_torch.so for those packages; "" = search
  /// ONNX Runtime's threads, set explicitly for a control loop (docs/deploy.md, "Threads"): each session runs
  /// its nodes one after another (sequential execution, one inter-op thread) with `intra_op_threads` intra-op
  /// threads counting the caller's (1, the default: the caller's thread alone, no pool), and pool threads
  /// that sleep when idle unless `spin` (ORT's own default spins, keeping a core busy between steps).
  /// 0: ORT's default, one per physical core.
  int intra_op_threads = 1;
  bool spin = false;
  /// Open this node alone, for run_node (leapp-run --node): the other nodes' files are checked (containment,
  /// sha256) but no runtime is opened for them, so a PT2 node elsewhere needs no AOTInductor package and
  /// run() refuses. "" (the default): every node. An unknown name throws NodeNotFound.
  std::string only_node;
  /// kDevice: run() as one CUDA graph once the same buffers come back (docs/deploy.md, "A step as one CUDA
  /// graph"): the first run with a set of input and output buffers (and batch) runs node by node, the second
  /// captures the step on the stream and launches it, later runs with those buffers launch the graph.
  /// graph_reason() says why steps run node by node. $LEAPP_PIPELINE_GRAPH=0 turns it off too.
  bool cuda_graph = true;
  /// Signed exports (docs/deploy.md, "Signed exports"): paths of PEM public keys (EC P-256/384/521). Non-empty: the
  /// folder must carry model.sig signed by one of them, checked before any of its files is parsed or any code is
  /// mapped, and every file read afterwards must be the bytes signed; refusals throw SignatureError. Empty: the
  /// keys $LEAPP_TRUST names (':'-separated paths), if set; else no signature is required.
  std::vector<std::string> trusted_keys;
};

class Pipeline {
 public:
  /// Opens EXPORT_DIR (or its pipeline.yaml/pipeline.json): reads and checks the wiring and every artifact, opens every node.
  static std::unique_ptr<Pipeline> open(const std::string& export_dir, const PipelineOptions& options = {});
  /// Checks the wiring and every artifact (containment, sha256) without opening a runtime; throws PipelineError.
  /// The signature first, as open() checks it (options.trusted_keys, $LEAPP_TRUST); the other options are unused.
  static void check(const std::string& export_dir, const PipelineOptions& options = {});
  ~Pipeline();
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  const std::string& name() const;
  const std::vector<TensorInfo>& inputs() const;   ///< the pipeline's inputs, in pipeline.yaml order
  const std::vector<TensorInfo>& outputs() const;  ///< the pipeline's outputs
  const std::vector<NodeInfo>& nodes() const;      ///< in execution order

  /// Runs every node; every pipeline input and output by name, each a buffer of byte_size() in options.memory.
  /// Thread-safe: run, run_node, reset, set_batch and set_timing take the pipeline's lock, one call at a time.
  /// kDevice: enqueued on options.stream; returns without waiting (synchronize() waits).
  void run(const std::map<std::string, const void*>& inputs, const std::map<std::string, void*>& outputs);
  /// Runs one node alone on its own inputs and outputs (NodeInfo), by name.
  void run_node(const std::string& node, const std::map<std::string, const void*>& inputs,
                const std::map<std::string, void*>& outputs);
  /// Waits until the work enqueued on options.stream is done (kHost: returns at once).
  void synchronize();

  /// State (docs/deploy.md, "State"): values a node carries from one run to the next (annotate.state_tensors).
  /// The pipeline owns them: run() feeds each to its node and, after a run that succeeded, copies the node's
  /// update into it; a run that throws leaves them as they were. run_node() neither reads nor changes them (the
  /// caller passes the node's state inputs). One StateInfo per state, in pipeline.yaml's edge order; empty for a
  /// pipeline without state.
  const std::vector<StateInfo>& state_infos() const;
  /// The pipeline's buffer of state `name` (options.memory's kind, byte_size() bytes): what the next run reads.
  /// Its address stays for the pipeline's life; kDevice: read it after synchronize() (download()). An unknown name
  /// throws PipelineError listing the states.
  const void* state(const std::string& name) const;
  /// Every state back to its initial value (initial_values.safetensors, checked at open). kDevice: on the stream.
  void reset();
  /// The states named in `values` set from the caller's buffers (options.memory's kind, byte_size() bytes each,
  /// copied; kDevice: on the stream); the others keep their values. Every name is checked before anything is
  /// copied (an unknown one throws PipelineError).
  void reset(const std::map<std::string, const void*>& values);

  /// Dynamic batch: the batch of the following runs (every tensor with a batch range then has that dim 0, and its
  /// buffers byte_size(batch) bytes). Throws PipelineError naming the range when `batch` is outside a range, or when
  /// the export has no dynamic batch. Grows the pipeline's intermediate buffers when needed (kDevice: waits for
  /// the stream first); a steady batch allocates nothing.
  void set_batch(int64_t batch);
  /// The batch set_batch chose (0: the traced shapes).
  int64_t batch() const;

  /// A buffer of options.memory's kind (kDevice: device memory from the driver leapp loads, no CUDA link needed),
  /// freed when the last copy of the pointer goes. For programs without their own CUDA allocator (examples/cpp).
  std::shared_ptr<void> allocate(size_t bytes);
  /// Host bytes into a buffer of options.memory's kind, and back (kDevice: enqueued on options.stream).
  void upload(void* buffer, const void* host, size_t bytes);
  void download(void* host, const void* buffer, size_t bytes);
  /// Why run() goes node by node ("" while steps are CUDA graphs; see PipelineOptions::cuda_graph).
  const std::string& graph_reason() const;
  /// Step graphs captured, and runs that launched one, since open.
  int64_t graph_captures() const;
  int64_t graph_replays() const;
  /// Seconds each node took in the last run() (host wall clock; kDevice: each node is synchronised when timing is
  /// on, and the step then runs node by node, not as a graph).
  void set_timing(bool on);
  const std::vector<double>& last_node_seconds() const;

  struct Impl;

 private:
  explicit Pipeline(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace leapp
