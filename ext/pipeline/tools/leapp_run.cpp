// leapp-run: run a leapp export folder on raw input files (docs/deploy.md).
//
//   leapp-run EXPORT_DIR --in IN_DIR --out OUT_DIR [--node NAME] [--time N] [--steps K] [--device cpu|cuda] ...
//   leapp-run EXPORT_DIR --describe   (what a deployment routes by: names, dtypes, shapes, metadata, state)
//
// IN_DIR/<input>.bin holds each pipeline input as raw little-endian C-order bytes (dtype and shape from
// the export's wiring); OUT_DIR/<output>.bin is written the same way. --steps K: the files hold K steps one after
// another, run in order with the pipeline's state carried (every run carries it, --time and --rate too);
// OUT_DIR/state/<node>/<input>.bin holds each state after the process's last run. With --node, one node runs alone on
// its own inputs and outputs (Pipeline::run_node; leapp.testing localises a mismatch with it). --trust PUB.pem (repeatable)
// or $LEAPP_TRUST: the export must be signed by one of the keys (docs/deploy.md, "Signed exports"). Exit status: 0 done,
// 1 the export was refused (a refused signature too) or a run failed, 2 bad usage or bad input files (missing, wrong
// byte count).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "leapp/cuda_driver.h"
#include "leapp/pipeline.h"

namespace fs = std::filesystem;

namespace {

constexpr const char* kUsage =
    "usage: leapp-run EXPORT_DIR --in IN_DIR --out OUT_DIR [--node NAME] [--time N] [--device cpu|cuda] [--threads N]\n"
    "                 [--spin] [--batch N] [--rate HZ --duration S] [--no-graph] [--steps K] [--trust PUB.pem]...\n"
    "       leapp-run EXPORT_DIR --check   (the wiring and the artifacts' sha256 only; exit 1 with the reason)\n"
    "       leapp-run EXPORT_DIR --describe   (open it; print each input, output and state: dtype, shape, metadata)\n"
    "  --trust PUB.pem (repeatable): run only an export whose model.sig one of these EC public keys signed; without\n"
    "  it, $LEAPP_TRUST (':'-separated key paths) when set. A refused signature exits 1 (docs/deploy.md).\n"
    "  IN_DIR/<input>.bin: each pipeline input, raw little-endian C-order bytes; writes OUT_DIR/<output>.bin.\n"
    "  --steps K: each file holds K steps one after another (K times the bytes), run in order.\n"
    "  State (docs/deploy.md, \"State\"): every run carries it, --time and --rate runs too; after the last run\n"
    "  OUT_DIR/state/<node>/<input>.bin holds each state (what a next run would read).\n"
    "  --node NAME: run that node alone; its own inputs and outputs are the files.\n"
    "  --batch N: a dynamic-batch export (dynamic_batch=) run at N: dim 0 of every batched file is N.\n"
    "  --threads N: ONNX Runtime's intra-op threads per session, the caller's included (default 1; 0: one per\n"
    "  core); --spin: let them spin between steps (default: they sleep).\n"
    "  --rate HZ --duration S: run the step at HZ for S seconds, as a control loop, and print its latency\n"
    "  percentiles (p50, p99, p99.9, max) and missed deadlines.\n"
    "  --time N: run N more times and print each node's median time. --device cuda: device buffers, ONNX Runtime's\n"
    "  CUDA EP on one stream (default cpu: host buffers, CPU EP); from the second run on, a step is one CUDA graph\n"
    "  launch (docs/deploy.md) and --time prints the whole step's median. --no-graph: run node by node.\n";

struct UsageError {
  std::string text;
};

std::string tensor_line(const char* kind, const leapp::TensorInfo& t) {
  std::string shape;
  for (size_t i = 0; i < t.shape.size(); ++i) shape += (i ? ", " : "") + std::to_string(t.shape[i]);
  return std::string(kind) + " " + t.name + " " + t.dtype + "[" + shape + "] " + t.metadata + "\n";
}

/// --describe: the pipeline's and each node's inputs and outputs, one line each, metadata as JSON.
void describe(const leapp::Pipeline& pipeline) {
  std::string out = "pipeline " + pipeline.name() + "\n";
  for (const leapp::TensorInfo& t : pipeline.inputs()) out += tensor_line("input", t);
  for (const leapp::TensorInfo& t : pipeline.outputs()) out += tensor_line("output", t);
  for (const leapp::StateInfo& s : pipeline.state_infos()) {  // state node/input <- node/output dtype[shape] {...}
    const std::string line = tensor_line("state", s);
    out += "state " + s.name + " <- " + s.node + "/" + s.output + line.substr(6 + s.name.size());
  }
  for (const leapp::NodeInfo& node : pipeline.nodes()) {
    out += "node " + node.name + " " + node.backend + " " + node.execution + "\n";
    for (const leapp::TensorInfo& t : node.inputs) out += "  " + tensor_line("input", t);
    for (const leapp::TensorInfo& t : node.outputs) out += "  " + tensor_line("output", t);
  }
  std::fputs(out.c_str(), stdout);
}

/// A pipeline name used as a file name must be one plain name: it comes from an untrusted file.
std::string file_for(const fs::path& dir, const std::string& name) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
      name.find('\0') != std::string::npos)
    throw leapp::PipelineError("the export names a value '" + name + "', which cannot be a file name in " + dir.string());
  return (dir / (name + ".bin")).string();
}

/// `data` resized to `bytes` for input or output `t`: leapp.pipeline_format bounds every tensor (MAX_TENSOR_BYTES),
/// and a machine that still cannot give the bytes gets an error naming them, not a bare std::bad_alloc.
void sized(std::vector<char>& data, size_t bytes, const char* what, const leapp::TensorInfo& t) {
  try {
    data.resize(bytes);
  } catch (const std::bad_alloc&) {
    throw leapp::PipelineError(std::string("cannot allocate ") + std::to_string(bytes) + " bytes for " + what + " '" +
                               t.name + "': out of memory");
  }
}

std::vector<char> read_input(const std::string& path, const leapp::TensorInfo& t, int64_t batch, size_t steps) {
  const size_t expected = t.byte_size(batch) * steps;  // at most 10^4 steps of at most 1 GiB: no wrap
  std::error_code ec;
  if (!fs::is_regular_file(path, ec))
    throw UsageError{"input '" + t.name + "': " + path + " is missing (expected " + std::to_string(expected) +
                     " bytes of " + t.dtype + ")"};
  const uintmax_t size = fs::file_size(path, ec);  // checked before reading: a 3 GiB file is refused unread
  std::vector<char> data;
  if (!ec && size == expected) {
    std::ifstream f(path, std::ios::binary);
    sized(data, expected, "input", t);
    if (!f.read(data.data(), std::streamsize(expected)) || f.peek() != std::char_traits<char>::eof())
      data.resize(0);  // changed while read: reported as the size found below
  }
  if (ec || size != expected || data.size() != expected) {
    const uintmax_t found = ec ? 0 : size;
    std::string what = t.dtype + "[";
    const std::vector<int64_t> dims = t.shape_at(batch);
    for (size_t i = 0; i < dims.size(); ++i) what += (i ? ", " : "") + std::to_string(dims[i]);
    what += "]";
    if (t.batch_max > 0)
      what += " at batch " + std::to_string(batch ? batch : t.shape[0]) + " of " + std::to_string(t.batch_min) + ".." +
              std::to_string(t.batch_max) + " (--batch N)";
    throw UsageError{"input '" + t.name + "': " + path + " has " + std::to_string(found) + " bytes, expected " +
                     std::to_string(expected) + " (" + (steps > 1 ? std::to_string(steps) + " steps of " : "") + what +
                     ", little-endian, C order)"};
  }
  return data;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n == 0 ? 0.0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// The `p`-th percentile (nearest rank) of sorted `v`.
double percentile(const std::vector<double>& v, double p) {
  if (v.empty()) return 0.0;
  size_t rank = size_t(std::ceil(p / 100.0 * double(v.size())));
  return v[std::min(v.size(), std::max<size_t>(rank, 1)) - 1];
}

/// --rate/--duration: `step` (run and wait) started at absolute times t0 + k / rate, as a control loop does;
/// each step's latency is measured, a step that ends after its period is a missed deadline, and a step that
/// starts late (the previous one overran) is counted too. The loop itself allocates nothing.
template <class Step>
void fixed_rate(long rate, double duration, Step&& step, const std::string& name, const std::string& device) {
  using clock = std::chrono::steady_clock;
  const auto period = std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(1.0 / double(rate)));
  const size_t steps = std::max<size_t>(1, size_t(double(rate) * duration));
  std::vector<double> latency(steps);
  size_t missed = 0, late = 0;
  const auto t0 = clock::now() + period;
  for (size_t k = 0; k < steps; ++k) {
    const auto due = t0 + period * long(k);
    std::this_thread::sleep_until(due);
    const auto start = clock::now();
    if (start > due + period) ++late;
    step();
    const auto end = clock::now();
    latency[k] = std::chrono::duration<double, std::micro>(end - start).count();
    if (end > due + period) ++missed;
  }
  std::sort(latency.begin(), latency.end());
  std::printf("pipeline '%s': %zu steps at %ld Hz on %s (period %.1f us), latency (us): p50 %.1f  p99 %.1f  "
              "p99.9 %.1f  max %.1f; missed deadlines %zu (%.3f%%), late starts %zu\n",
              name.c_str(), steps, rate, device.c_str(), 1e6 / double(rate), percentile(latency, 50),
              percentile(latency, 99), percentile(latency, 99.9), latency.back(), missed,
              100.0 * double(missed) / double(steps), late);
}

int run(int argc, char** argv) {
  std::string export_dir, in_dir, out_dir, device = "cpu", node;
  long repeat = 0, threads = 1, batch = 0, rate = 0, steps = 1;
  double duration = 0;
  bool check_only = false, describe_only = false, spin = false, graph = true;
  std::vector<std::string> trust;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw UsageError{a + " needs a value"};
      return argv[++i];
    };
    auto count = [&](const std::string& text) {
      char* end = nullptr;
      long n = std::strtol(text.c_str(), &end, 10);
      if (text.empty() || *end || n < 0 || n > 1000000) throw UsageError{a + ": expected a count, got '" + text + "'"};
      return n;
    };
    if (a == "--in") in_dir = value();
    else if (a == "--out") out_dir = value();
    else if (a == "--time") repeat = count(value());
    else if (a == "--steps") {
      steps = count(value());
      if (steps == 0 || steps > 10000) throw UsageError{a + ": from 1 to 10000 steps, got '" + argv[i] + "'"};
    }
    else if (a == "--threads") {
      threads = count(value());
      const long cap = std::max<long>(1, long(std::thread::hardware_concurrency())) * 4;
      if (threads > cap)  // ONNX Runtime starts them all at once: 20000 threads took 1.4 GB
        throw UsageError{a + ": at most " + std::to_string(cap) + " (4 per CPU of this machine), got " +
                         std::to_string(threads)};
    }
    else if (a == "--batch") {
      batch = count(value());
      if (batch == 0) throw UsageError{a + ": a batch is at least 1, got '0'"};
    }
    else if (a == "--device") device = value();
    else if (a == "--node") node = value();
    else if (a == "--trust") trust.push_back(value());
    else if (a == "--spin") spin = true;
    else if (a == "--no-graph") graph = false;
    else if (a == "--rate") {
      rate = count(value());
      if (rate == 0 || rate > 100000) throw UsageError{a + ": a rate in Hz from 1 to 100000, got '" + argv[i] + "'"};
    }
    else if (a == "--duration") {
      const std::string text = value();
      char* end = nullptr;
      duration = std::strtod(text.c_str(), &end);
      if (text.empty() || *end || !(duration > 0 && duration <= 86400))
        throw UsageError{a + ": seconds, more than 0 and at most 86400, got '" + text + "'"};
    }
    else if (a == "--check") check_only = true;
    else if (a == "--describe") describe_only = true;
    else if (a == "-h" || a == "--help") {
      std::cout << kUsage;
      return 0;
    } else if (!a.empty() && a[0] == '-') throw UsageError{"unknown option " + a};
    else if (export_dir.empty()) export_dir = a;
    else throw UsageError{"one EXPORT_DIR, got '" + export_dir + "' and '" + a + "'"};
  }
  leapp::PipelineOptions options;
  options.trusted_keys = trust;  // empty: $LEAPP_TRUST's keys, if any (Pipeline::open reads it)
  if (check_only && !export_dir.empty()) {  // the wiring and the artifacts' digests, no runtime opened
    leapp::Pipeline::check(export_dir, options);
    std::printf("%s: ok\n", export_dir.c_str());
    return 0;
  }
  if (describe_only && !export_dir.empty()) {
    describe(*leapp::Pipeline::open(export_dir, options));
    return 0;
  }
  if (export_dir.empty() || in_dir.empty() || out_dir.empty()) throw UsageError{"EXPORT_DIR, --in and --out are required"};
  if ((rate > 0) != (duration > 0)) throw UsageError{"--rate and --duration go together"};
  if (rate > 0 && repeat > 0) throw UsageError{"--rate runs a fixed-rate loop, --time back-to-back runs: one of them"};
  if (rate > 0 && double(rate) * duration > 1e8) throw UsageError{"--rate times --duration: at most 10^8 steps"};
  if (device != "cpu" && device != "cuda") throw UsageError{"--device: cpu or cuda, got '" + device + "'"};

  options.memory = device == "cuda" ? leapp::Memory::kDevice : leapp::Memory::kHost;
  options.intra_op_threads = int(threads);
  options.spin = spin;
  options.only_node = node;  // --node: the others need no runtime (a PT2 node elsewhere, no package)
  options.cuda_graph = graph;
  std::unique_ptr<leapp::Pipeline> pipeline;
  try {
    pipeline = leapp::Pipeline::open(export_dir, options);
  } catch (const leapp::NodeNotFound& e) {
    throw UsageError{std::string("--node: ") + e.what()};
  }
  if (batch > 0) pipeline->set_batch(batch);

  const std::vector<leapp::TensorInfo>* in_specs = &pipeline->inputs();
  const std::vector<leapp::TensorInfo>* out_specs = &pipeline->outputs();
  if (!node.empty()) {
    auto it = std::find_if(pipeline->nodes().begin(), pipeline->nodes().end(),
                           [&](const leapp::NodeInfo& n) { return n.name == node; });
    in_specs = &it->inputs;
    out_specs = &it->outputs;
  }
  auto run_once = [&](const std::map<std::string, const void*>& in, const std::map<std::string, void*>& out) {
    if (node.empty()) pipeline->run(in, out);
    else pipeline->run_node(node, in, out);
  };

  // --steps K: every file holds K steps; host_in and host_out are one step's, the step run now
  const size_t k_steps = size_t(steps);
  std::vector<std::vector<char>> all_in, host_in, host_out, all_out;
  for (const leapp::TensorInfo& t : *in_specs) {
    all_in.push_back(read_input(file_for(in_dir, t.name), t, batch, k_steps));
    sized(host_in.emplace_back(), t.byte_size(batch), "input", t);
  }
  for (const leapp::TensorInfo& t : *out_specs) {
    file_for(out_dir, t.name);
    sized(host_out.emplace_back(), t.byte_size(batch), "output", t);
    sized(all_out.emplace_back(), t.byte_size(batch) * k_steps, "output", t);
  }
  // the state after the last run (run() carries it; --node runs one node on its own inputs and carries none)
  const std::vector<leapp::StateInfo> no_state;
  const std::vector<leapp::StateInfo>& states = node.empty() ? pipeline->state_infos() : no_state;
  const fs::path state_dir = fs::path(out_dir) / "state";
  std::vector<std::vector<char>> last_state;
  for (const leapp::StateInfo& s : states) {
    file_for(state_dir, s.node);  // the node's name is a folder there: one plain name too
    file_for(state_dir / s.node, s.input);
    sized(last_state.emplace_back(), s.byte_size(), "state", s);
  }
  std::map<std::string, const void*> ins;
  std::map<std::string, void*> outs;
  std::vector<leapp::CUdeviceptr> device_buffers;
  const bool on_device = options.memory == leapp::Memory::kDevice;
  auto buffer = [&](const std::vector<char>& host) -> void* {
    if (!on_device) return const_cast<char*>(host.data());
    leapp::CUdeviceptr p = 0;
    LEAPP_CHECK_CU(leapp::driver().cuMemAlloc(&p, std::max<size_t>(host.size(), 1)));
    device_buffers.push_back(p);
    return reinterpret_cast<void*>(p);
  };
  for (size_t i = 0; i < host_in.size(); ++i) ins[(*in_specs)[i].name] = buffer(host_in[i]);
  for (size_t i = 0; i < host_out.size(); ++i) outs[(*out_specs)[i].name] = buffer(host_out[i]);

  for (size_t k = 0; k < k_steps; ++k) {
    for (size_t i = 0; i < host_in.size(); ++i) {
      std::memcpy(host_in[i].data(), all_in[i].data() + k * host_in[i].size(), host_in[i].size());
      if (on_device)
        LEAPP_CHECK_CU(leapp::driver().cuMemcpyHtoDAsync(leapp::CUdeviceptr(ins[(*in_specs)[i].name]), host_in[i].data(),
                                                         host_in[i].size(), leapp::cu_stream_legacy()));
    }
    run_once(ins, outs);
    pipeline->synchronize();
    if (on_device)
      for (size_t i = 0; i < host_out.size(); ++i)
        LEAPP_CHECK_CU(leapp::driver().cuMemcpyDtoHAsync(host_out[i].data(), leapp::CUdeviceptr(outs[(*out_specs)[i].name]),
                                                         host_out[i].size(), leapp::cu_stream_legacy()));
    pipeline->synchronize();
    if (on_device) LEAPP_CHECK_CU(leapp::driver().cuStreamSynchronize(leapp::cu_stream_legacy()));
    for (size_t i = 0; i < host_out.size(); ++i)
      std::memcpy(all_out[i].data() + k * host_out[i].size(), host_out[i].data(), host_out[i].size());
  }
  auto write = [](const std::string& path, const std::vector<char>& data) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(data.data(), std::streamsize(data.size()));
    if (!f) throw leapp::PipelineError("cannot write " + path);
  };
  fs::create_directories(out_dir);
  for (size_t i = 0; i < all_out.size(); ++i) write(file_for(out_dir, (*out_specs)[i].name), all_out[i]);

  const bool graphed = node.empty() && pipeline->graph_reason().empty();
  if (on_device && (repeat > 0 || rate > 0)) {
    if (graphed) std::printf("step: one CUDA graph launch from the second run on\n");
    else std::printf("step: node by node (%s)\n", node.empty() ? pipeline->graph_reason().c_str() : "--node");
  }
  if (repeat > 0 && graphed) {  // per-node times would need a synchronisation between nodes: the whole step
    std::vector<double> totals;
    totals.reserve(size_t(repeat));
    for (long r = 0; r < repeat; ++r) {
      const auto start = std::chrono::steady_clock::now();
      run_once(ins, outs);
      pipeline->synchronize();
      totals.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    std::printf("pipeline '%s': %ld runs on %s, median of the whole step (ms):\n  %-24s %10.4f  (cuda-graph)\n"
                "graph captures %lld, graph launches %lld\n", pipeline->name().c_str(), repeat, device.c_str(), "step",
                1e3 * median(totals), static_cast<long long>(pipeline->graph_captures()),
                static_cast<long long>(pipeline->graph_replays()));
  } else if (repeat > 0) {
    pipeline->set_timing(true);
    size_t n_nodes = pipeline->nodes().size();
    std::vector<std::vector<double>> per_node(n_nodes);
    std::vector<double> totals;
    for (auto& v : per_node) v.reserve(size_t(repeat));  // no allocation inside the timed loop
    totals.reserve(size_t(repeat));
    for (long r = 0; r < repeat; ++r) {
      run_once(ins, outs);
      pipeline->synchronize();
      const std::vector<double>& s = pipeline->last_node_seconds();
      double total = 0;
      for (size_t n = 0; n < n_nodes && n < s.size(); ++n) per_node[n].push_back(s[n]), total += s[n];
      totals.push_back(total);
    }
    std::printf("pipeline '%s': %ld runs on %s, median per node (ms):\n", pipeline->name().c_str(), repeat,
                device.c_str());
    for (size_t n = 0; n < n_nodes; ++n) {
      const leapp::NodeInfo& info = node.empty() ? pipeline->nodes()[n] :  // --node: its one timing comes first
          *std::find_if(pipeline->nodes().begin(), pipeline->nodes().end(), [&](const auto& i) { return i.name == node; });
      if (!node.empty() && n > 0) break;
      std::printf("  %-24s %10.4f  (%s)\n", info.name.c_str(), 1e3 * median(per_node[n]), info.execution.c_str());
    }
    std::printf("  %-24s %10.4f\n", "total", 1e3 * median(totals));
  }
  if (rate > 0) {  // activation: one more step before the loop (on the device it captures the step's graph)
    run_once(ins, outs);
    pipeline->synchronize();
  }
  if (rate > 0) fixed_rate(rate, duration, [&] {
      run_once(ins, outs);
      pipeline->synchronize();
    }, pipeline->name(), device);
  for (size_t s = 0; s < states.size(); ++s) {  // after every run: --steps, --time and --rate all carried it
    pipeline->download(last_state[s].data(), pipeline->state(states[s].name), last_state[s].size());
    pipeline->synchronize();
    fs::create_directories(state_dir / states[s].node);
    write(file_for(state_dir / states[s].node, states[s].input), last_state[s]);
  }
  for (leapp::CUdeviceptr p : device_buffers) leapp::driver().cuMemFree(p);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "leapp-run: %s\n", e.text.c_str());
    if (e.text.find("input '") != 0) std::fputs(kUsage, stderr);
    return 2;
  } catch (const std::bad_alloc&) {  // what no check above named (ONNX Runtime's own allocations, say)
    std::fprintf(stderr, "leapp-run: out of memory (std::bad_alloc) while opening or running %s\n",
                 argc > 1 ? argv[1] : "the export");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "leapp-run: %s\n", e.what());
    return 1;
  }
}
