// aoti_run: runs an AOTInductor package of a leapp node from C++, with no Python in the process.
//
//   aoti_run OP_LIBRARY PACKAGE DEVICE IN_DIR OUT_DIR
//
// 1. dlopen(OP_LIBRARY) (libleapp_warp_torch.so): its static initialisers register
//    leapp::warp_segment in torch's dispatcher. RTLD_LOCAL is enough: the package's
//    proxy executor finds the op through the dispatcher, never through dlsym.
//    This must happen before the package is loaded (the loader resolves the op then).
//    "-" loads nothing (a package without leapp ops, for diagnosis).
// 2. torch::inductor::AOTIModelPackageLoader(PACKAGE, "model", false, 1, device index).
// 3. Inputs from IN_DIR/inputs.txt, one line per input in the node's order:
//    "<file> <dtype> <rank> <dim>...", the file holding the raw C-order bytes.
//    They are moved to DEVICE ("cpu", "cuda", "cuda:1").
// 4. run(), outputs back on the CPU, written as OUT_DIR/output_<i>.bin plus
//    OUT_DIR/outputs.txt in the same format.
// Exit status: 0 ok, 1 a C++ exception (printed), 2 usage or the op library did not load.
#include <dlfcn.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>

namespace {

const std::vector<std::pair<std::string, at::ScalarType>>& dtypes() {
  static const std::vector<std::pair<std::string, at::ScalarType>> table = {
      {"float32", at::kFloat}, {"float64", at::kDouble}, {"float16", at::kHalf}, {"bfloat16", at::kBFloat16},
      {"int8", at::kChar},     {"uint8", at::kByte},     {"int16", at::kShort},  {"int32", at::kInt},
      {"int64", at::kLong},    {"bool", at::kBool}};
  return table;
}

at::ScalarType dtype_of(const std::string& name) {
  for (const auto& [n, t] : dtypes())
    if (n == name) return t;
  throw std::invalid_argument("unknown dtype '" + name + "'");
}

std::string name_of(at::ScalarType type) {
  for (const auto& [n, t] : dtypes())
    if (t == type) return n;
  throw std::invalid_argument(std::string("output dtype ") + c10::toString(type) + " has no name here");
}

std::vector<char> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<at::Tensor> read_inputs(const std::string& dir) {
  std::ifstream list(dir + "/inputs.txt");
  if (!list) throw std::runtime_error("cannot open " + dir + "/inputs.txt");
  std::vector<at::Tensor> inputs;
  std::string line;
  while (std::getline(list, line)) {
    if (line.empty()) continue;
    std::istringstream fields(line);
    std::string file, dtype;
    int64_t rank = 0;
    fields >> file >> dtype >> rank;
    std::vector<int64_t> shape(rank);
    for (auto& d : shape) fields >> d;
    if (!fields) throw std::invalid_argument("bad line in inputs.txt: '" + line + "'");
    auto tensor = at::empty(shape, at::TensorOptions().dtype(dtype_of(dtype)));
    auto bytes = read_file(dir + "/" + file);
    if (bytes.size() != tensor.nbytes())
      throw std::invalid_argument(file + ": " + std::to_string(bytes.size()) + " bytes, the input needs " +
                                  std::to_string(tensor.nbytes()));
    std::copy(bytes.begin(), bytes.end(), static_cast<char*>(tensor.data_ptr()));
    inputs.push_back(std::move(tensor));
  }
  return inputs;
}

void write_outputs(const std::vector<at::Tensor>& outputs, const std::string& dir) {
  std::ofstream list(dir + "/outputs.txt");
  for (size_t i = 0; i < outputs.size(); ++i) {
    auto out = outputs[i].to(at::kCPU).contiguous();
    std::string file = "output_" + std::to_string(i) + ".bin";
    std::ofstream(dir + "/" + file, std::ios::binary)
        .write(static_cast<const char*>(out.data_ptr()), static_cast<std::streamsize>(out.nbytes()));
    list << file << ' ' << name_of(out.scalar_type()) << ' ' << out.dim();
    for (auto d : out.sizes()) list << ' ' << d;
    list << '\n';
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 6) {
    std::cerr << "usage: aoti_run OP_LIBRARY PACKAGE DEVICE IN_DIR OUT_DIR\n";
    return 2;
  }
  if (std::string(argv[1]) != "-" && dlopen(argv[1], RTLD_NOW | RTLD_LOCAL) == nullptr) {
    std::cerr << "aoti_run: cannot load the op library: " << dlerror() << '\n';
    return 2;
  }
  try {
    const c10::Device device(argv[3]);
    const c10::DeviceIndex index = device.is_cuda() ? (device.has_index() ? device.index() : 0) : -1;
    torch::inductor::AOTIModelPackageLoader loader(argv[2], "model", false, 1, index);
    auto inputs = read_inputs(argv[4]);
    for (auto& t : inputs) t = t.to(device);
    auto outputs = loader.run(inputs);
    write_outputs(outputs, argv[5]);
    std::cout << "aoti_run: " << inputs.size() << " inputs, " << outputs.size() << " outputs on " << device << '\n';
  } catch (const std::exception& e) {
    std::cerr << "aoti_run: error: " << e.what() << '\n';
    return 1;
  }
  return 0;
}
