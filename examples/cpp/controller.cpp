// controller: a minimal robot control loop on a leapp export (examples/cpp/README.md).
//
//   controller EXPORT_DIR [--steps N] [--device cpu|cuda] [--dump DIR]
//
// Opens the export once (every check leapp.load makes), allocates one buffer per pipeline input and
// output, then runs N control steps: "read the sensors" (new input values, uploaded), run the whole
// pipeline, wait for it, "send the actions" (download). It prints the steps' wall time (median, p90,
// max; per-node times: leapp-run --time). --dump DIR writes the last step's inputs and outputs as DIR/<name>.in.bin
// and DIR/<name>.out.bin (raw little-endian C order), so they can be checked against leapp.load.
#include <leapp/pipeline.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace {

/// Sensor values of step `step`: a smooth deterministic signal in [-1, 1] (a robot would read its state here).
void read_sensors(const leapp::TensorInfo& t, int step, std::vector<char>& host) {
  const size_t n = t.byte_size() / t.element_size;
  for (size_t i = 0; i < n; ++i) {
    double v = std::sin(0.37 * double(i) + 0.05 * double(step));
    if (t.dtype == "float32") {
      float f = float(v);
      std::memcpy(host.data() + i * 4, &f, 4);
    } else if (t.dtype == "float64") {
      std::memcpy(host.data() + i * 8, &v, 8);
    } else {  // integer and other inputs: zeros (this example fills floating-point observations only)
      std::memset(host.data() + i * t.element_size, 0, t.element_size);
    }
  }
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(q * double(v.size() - 1) + 0.5))];
}

void write(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), std::streamsize(bytes.size()));
  if (!f) throw std::runtime_error("cannot write " + path);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: controller EXPORT_DIR [--steps N] [--device cpu|cuda] [--dump DIR]\n");
    return 2;
  }
  int steps = 1000;
  std::string device = "cpu", dump;
  for (int i = 2; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--steps") steps = std::atoi(argv[i + 1]);
    else if (a == "--device") device = argv[i + 1];
    else if (a == "--dump") dump = argv[i + 1];
    else {
      std::fprintf(stderr, "controller: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  try {
    leapp::PipelineOptions options;
    options.memory = device == "cuda" ? leapp::Memory::kDevice : leapp::Memory::kHost;  // kDevice: on a stream of the pipeline's
    auto pipeline = leapp::Pipeline::open(argv[1], options);

    std::map<std::string, const void*> inputs;
    std::map<std::string, void*> outputs;
    std::vector<std::shared_ptr<void>> buffers;  // pipeline->allocate: host or device memory, as opened
    std::vector<std::vector<char>> host_in, host_out;
    for (const leapp::TensorInfo& t : pipeline->inputs()) {
      buffers.push_back(pipeline->allocate(t.byte_size()));
      inputs[t.name] = buffers.back().get();
      host_in.emplace_back(t.byte_size());
      std::printf("input  %-12s %s x %zu bytes\n", t.name.c_str(), t.dtype.c_str(), t.byte_size());
    }
    for (const leapp::TensorInfo& t : pipeline->outputs()) {
      buffers.push_back(pipeline->allocate(t.byte_size()));
      outputs[t.name] = buffers.back().get();
      host_out.emplace_back(t.byte_size());
      std::printf("output %-12s %s x %zu bytes\n", t.name.c_str(), t.dtype.c_str(), t.byte_size());
    }
    for (const leapp::NodeInfo& n : pipeline->nodes()) std::printf("node   %-12s %s\n", n.name.c_str(), n.execution.c_str());
    if (device == "cuda")  // the same buffers every step: from step 1 on, one CUDA graph launch per step
      std::printf("step   %s\n", pipeline->graph_reason().empty() ? "one CUDA graph" : pipeline->graph_reason().c_str());

    std::vector<double> step_seconds;
    for (int step = 0; step < steps; ++step) {
      auto start = std::chrono::steady_clock::now();
      for (size_t i = 0; i < host_in.size(); ++i) {
        const leapp::TensorInfo& t = pipeline->inputs()[i];
        read_sensors(t, step, host_in[i]);
        pipeline->upload(const_cast<void*>(inputs[t.name]), host_in[i].data(), t.byte_size());
      }
      pipeline->run(inputs, outputs);
      for (size_t i = 0; i < host_out.size(); ++i) {
        const leapp::TensorInfo& t = pipeline->outputs()[i];
        pipeline->download(host_out[i].data(), outputs[t.name], t.byte_size());
      }
      pipeline->synchronize();  // the actions are on the host: send them to the motors here
      step_seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    if (!step_seconds.empty()) step_seconds.erase(step_seconds.begin());  // step 0: first-call work (warm-up)
    std::printf("%d steps on %s; per step (us, after step 0): median %.1f  p90 %.1f  max %.1f\n", steps, device.c_str(),
                1e6 * percentile(step_seconds, 0.5), 1e6 * percentile(step_seconds, 0.9),
                1e6 * percentile(step_seconds, 1.0));
    if (device == "cuda")  // and why not, when a capture was refused
      std::printf("graph captures %lld, graph launches %lld%s%s\n", static_cast<long long>(pipeline->graph_captures()),
                  static_cast<long long>(pipeline->graph_replays()), pipeline->graph_reason().empty() ? "" : "; ",
                  pipeline->graph_reason().c_str());
    if (!dump.empty()) {
      for (size_t i = 0; i < host_in.size(); ++i) write(dump + "/" + pipeline->inputs()[i].name + ".in.bin", host_in[i]);
      for (size_t i = 0; i < host_out.size(); ++i) write(dump + "/" + pipeline->outputs()[i].name + ".out.bin", host_out[i]);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "controller: %s\n", e.what());
    return 1;
  }
  return 0;
}
