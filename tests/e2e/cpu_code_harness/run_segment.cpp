// tests/e2e/cpu_code_harness/run_segment.cpp: one segment bundle run through leapp's runtime on the CPU
// (leapp::run_segment_cpu), built from ext/core alone: no CUDA, no ONNX Runtime, no torch. The tests build it
// for another machine and run it under an emulator, so that an export's CPU code for that machine runs
// through the same loader and checks as on it (tests/e2e/test_cpu_code_aarch64.py).
//
//   run_segment BUNDLE OUT_DIR INPUT_FILE...
//
// Inputs are raw bytes in signature order; output i is written to OUT_DIR/output_<i>.bin.
#include <cstdio>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

#include "leapp/runtime.h"

namespace {

std::vector<char> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot read " + path);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: run_segment BUNDLE OUT_DIR INPUT_FILE...\n");
    return 2;
  }
  try {
    const std::vector<char> bytes = read_file(argv[1]);
    const auto bundle = leapp::Bundle::parse(bytes.data(), bytes.size());
    const leapp::Manifest& m = bundle->manifest();
    if (m.dynamic) throw std::runtime_error("segment '" + m.segment + "' has a dynamic batch: give a static one");
    if (size_t(argc - 3) != m.inputs.size())
      throw std::runtime_error("segment '" + m.segment + "' takes " + std::to_string(m.inputs.size()) +
                               " inputs, " + std::to_string(argc - 3) + " given");
    std::vector<std::vector<char>> inputs, outputs;
    std::vector<leapp::HostSpan> in_spans, out_spans;
    for (size_t i = 0; i < m.inputs.size(); ++i) {
      inputs.push_back(read_file(argv[3 + i]));
      if (inputs.back().size() != m.inputs[i].bytes)
        throw std::runtime_error("input " + std::to_string(i) + " ('" + m.inputs[i].name + "') has " +
                                 std::to_string(inputs.back().size()) + " bytes, the segment takes " +
                                 std::to_string(m.inputs[i].bytes));
    }
    for (const leapp::TensorSpec& t : m.outputs) outputs.emplace_back(t.bytes);
    for (auto& v : inputs) in_spans.push_back({v.data(), v.size()});
    for (auto& v : outputs) out_spans.push_back({v.data(), v.size()});
    leapp::run_segment_cpu(*bundle, in_spans, out_spans);
    for (size_t i = 0; i < outputs.size(); ++i) {
      const std::string path = std::string(argv[2]) + "/output_" + std::to_string(i) + ".bin";
      std::ofstream f(path, std::ios::binary | std::ios::trunc);
      f.write(outputs[i].data(), std::streamsize(outputs[i].size()));
      if (!f) throw std::runtime_error("cannot write " + path);
    }
    std::printf("ran segment '%s' from its CPU code\n", m.segment.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "run_segment: %s\n", e.what());
    return 1;
  }
}
