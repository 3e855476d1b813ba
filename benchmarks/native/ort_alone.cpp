// benchmarks/native/ort_alone.cpp: ONNX Runtime alone on some models, as leapp-run drives it: one session per
// model (sequential execution, one intra-op and one inter-op thread, no spinning), an IoBinding bound once to
// buffers of each input's and output's size, then `Run` STEPS times. The floor of what a step on those models
// costs in host allocations and time, without leapp (benchmarks/step_allocations.py, tests/runtime).
//
//   ort_alone STEPS MODEL.onnx [MODEL.onnx ...]
#include <onnxruntime_cxx_api.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

namespace {

size_t element_size(ONNXTensorElementDataType t) {
  switch (t) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT64: return 8;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16: return 2;
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8:
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL: return 1;
    default: return 4;
  }
}

struct Model {
  std::vector<char> bytes;
  std::unique_ptr<Ort::Session> session;
  std::unique_ptr<Ort::IoBinding> binding;
  std::vector<std::vector<char>> buffers;
};

void bind(Model& m, const Ort::MemoryInfo& memory, bool input, size_t i) {
  Ort::AllocatorWithDefaultOptions alloc;
  Ort::TypeInfo type = input ? m.session->GetInputTypeInfo(i) : m.session->GetOutputTypeInfo(i);
  auto info = type.GetTensorTypeAndShapeInfo();
  std::vector<int64_t> shape = info.GetShape();
  size_t count = 1;
  for (int64_t& d : shape) count *= size_t(d = d > 0 ? d : 1);  // a dynamic dim: 1
  m.buffers.emplace_back(count * element_size(info.GetElementType()) + 8, 0);
  Ort::Value value = Ort::Value::CreateTensor(memory, m.buffers.back().data(), count * element_size(info.GetElementType()),
                                              shape.data(), shape.size(), info.GetElementType());
  std::string name = input ? m.session->GetInputNameAllocated(i, alloc).get() : m.session->GetOutputNameAllocated(i, alloc).get();
  if (input) m.binding->BindInput(name.c_str(), value);
  else m.binding->BindOutput(name.c_str(), value);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: ort_alone STEPS MODEL.onnx [MODEL.onnx ...]\n");
    return 2;
  }
  const long steps = std::atol(argv[1]);
  Ort::Env env(ORT_LOGGING_LEVEL_WARNING, "ort_alone");
  Ort::SessionOptions options;
  options.SetExecutionMode(ORT_SEQUENTIAL);
  options.SetInterOpNumThreads(1);
  options.SetIntraOpNumThreads(1);
  options.AddConfigEntry("session.intra_op.allow_spinning", "0");
  options.AddConfigEntry("session.inter_op.allow_spinning", "0");
  Ort::MemoryInfo memory = Ort::MemoryInfo::CreateCpu(OrtDeviceAllocator, OrtMemTypeDefault);
  std::vector<std::unique_ptr<Model>> models;
  for (int a = 2; a < argc; ++a) {
    auto m = std::make_unique<Model>();
    std::ifstream f(argv[a], std::ios::binary);
    m->bytes.assign(std::istreambuf_iterator<char>(f), {});
    m->session = std::make_unique<Ort::Session>(env, m->bytes.data(), m->bytes.size(), options);
    m->binding = std::make_unique<Ort::IoBinding>(*m->session);
    m->buffers.reserve(m->session->GetInputCount() + m->session->GetOutputCount());
    for (size_t i = 0; i < m->session->GetInputCount(); ++i) bind(*m, memory, true, i);
    for (size_t i = 0; i < m->session->GetOutputCount(); ++i) bind(*m, memory, false, i);
    models.push_back(std::move(m));
  }
  Ort::RunOptions run;
  for (long k = 0; k < steps; ++k)
    for (auto& m : models) m->session->Run(run, *m->binding);
  std::printf("ort_alone: %ld steps of %zu model(s)\n", steps, models.size());
  return 0;
}
