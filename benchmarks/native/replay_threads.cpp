// benchmarks/native/replay_threads.cpp: run_segment from C++ threads, for timing and for sanitizers.
//
//   replay_threads BUNDLE bench  [--calls N]
//       one thread, run_segment alone in a loop on a stream of its own (no copies, no
//       synchronisation): nanoseconds per call, best and median of 7 rounds.
//   replay_threads BUNDLE stress [--threads T] [--calls N] [--stream shared|legacy|null|per-thread|own]
//                                [--release-every-ms M]
//       T threads, each call: its own input copied in, run_segment, outputs copied out, the
//       stream synchronised, every output byte compared with a single-threaded reference.
//       With --release-every-ms, one more thread calls release_segments() every M ms
//       meanwhile (built with LEAPP_HAVE_RELEASE: trees older than that API lack it).
//       Exit status 1 when any call was wrong.
//
// Only the driver API and leapp/runtime.h are used, so the same program runs against
// tests/runtime/mock_cuda (built by benchmarks/replay_threads.py) and against a real GPU.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "leapp/runtime.h"

namespace {

using leapp::CUcontext;
using leapp::CUdeviceptr;
using leapp::CUstream;

struct Args {
  std::string bundle, mode, stream = "shared";
  int threads = 8, calls = 0, release_every_ms = 0;
};

[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr, "replay_threads: %s\nusage: replay_threads BUNDLE bench|stress [--threads T] [--calls N] "
                       "[--stream shared|legacy|null|per-thread|own] [--release-every-ms M]\n", why);
  std::exit(2);
}

void check(leapp::CUresult r, const char* what) {
  if (r != leapp::CUDA_SUCCESS) {
    std::fprintf(stderr, "replay_threads: %s failed: %s\n", what, leapp::cu_error_text(r).c_str());
    std::exit(3);
  }
}

/// Device buffers for one call's inputs and outputs, and host copies of them.
struct Buffers {
  std::vector<CUdeviceptr> in, out;
  std::vector<leapp::DeviceSpan> in_spans, out_spans;
  std::vector<std::vector<uint8_t>> host_out;
};

void release(const leapp::CudaDriver& d, Buffers& b) {
  for (CUdeviceptr p : b.in) d.cuMemFree(p);
  for (CUdeviceptr p : b.out) d.cuMemFree(p);
  b = Buffers{};
}

Buffers allocate(const leapp::CudaDriver& d, const leapp::Manifest& m) {
  Buffers b;
  for (const leapp::TensorSpec& t : m.inputs) {
    CUdeviceptr p = 0;
    check(d.cuMemAlloc(&p, t.bytes), "cuMemAlloc");
    b.in.push_back(p);
    b.in_spans.push_back({p, t.bytes});
  }
  for (const leapp::TensorSpec& t : m.outputs) {
    CUdeviceptr p = 0;
    check(d.cuMemAlloc(&p, t.bytes), "cuMemAlloc");
    b.out.push_back(p);
    b.out_spans.push_back({p, t.bytes});
    b.host_out.emplace_back(t.bytes);
  }
  return b;
}

/// Random inputs: float32 tensors get values in [-4, 4), everything else random bytes.
std::vector<std::vector<uint8_t>> random_inputs(const leapp::Manifest& m, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<uint8_t>> out;
  for (const leapp::TensorSpec& t : m.inputs) {
    std::vector<uint8_t> bytes(t.bytes);
    if (t.dtype == "float32") {
      std::uniform_real_distribution<float> u(-4.0f, 4.0f);
      for (size_t i = 0; i + 4 <= bytes.size(); i += 4) {
        float v = u(rng);
        std::memcpy(&bytes[i], &v, 4);
      }
    } else {
      for (uint8_t& v : bytes) v = uint8_t(rng());
    }
    out.push_back(std::move(bytes));
  }
  return out;
}

/// One checked call: inputs in, replay, outputs out, synchronise; false when an output differs.
bool call_and_compare(const leapp::CudaDriver& d, const leapp::Bundle& bundle, Buffers& b,
                      const std::vector<std::vector<uint8_t>>& inputs, const std::vector<std::vector<uint8_t>>* want,
                      CUstream s) {
  for (size_t j = 0; j < inputs.size(); ++j)
    check(d.cuMemcpyHtoDAsync(b.in[j], inputs[j].data(), inputs[j].size(), s), "cuMemcpyHtoDAsync");
  leapp::run_segment(bundle, b.in_spans, b.out_spans, s, 0);
  for (size_t j = 0; j < b.out.size(); ++j)
    check(d.cuMemcpyDtoHAsync(b.host_out[j].data(), b.out[j], b.host_out[j].size(), s), "cuMemcpyDtoHAsync");
  check(d.cuStreamSynchronize(s), "cuStreamSynchronize");
  if (want == nullptr) return true;
  for (size_t j = 0; j < b.out.size(); ++j)
    if (std::memcmp(b.host_out[j].data(), (*want)[j].data(), b.host_out[j].size()) != 0) return false;
  return true;
}

bool is_own(const std::string& name) { return name == "own"; }

CUstream stream_named(const leapp::CudaDriver& d, const std::string& name, CUstream shared) {
  if (name == "shared") return shared;
  if (name == "legacy") return leapp::cu_stream_legacy();
  if (name == "null") return nullptr;
  if (name == "per-thread") return leapp::cu_stream_per_thread();
  if (name == "own") {
    CUstream s = nullptr;
    check(d.cuStreamCreate(&s, leapp::CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    return s;
  }
  usage("unknown --stream");
}

int bench(const leapp::CudaDriver& d, const leapp::Bundle& bundle, CUstream s, int calls) {
  Buffers b = allocate(d, bundle.manifest());
  auto inputs = random_inputs(bundle.manifest(), 1);
  call_and_compare(d, bundle, b, inputs, nullptr, s);  // warm: module, constants, scratch
  std::vector<double> rounds;
  for (int r = 0; r < 7; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) leapp::run_segment(bundle, b.in_spans, b.out_spans, s, 0);
    auto t1 = std::chrono::steady_clock::now();
    check(d.cuStreamSynchronize(s), "cuStreamSynchronize");
    rounds.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / calls);
  }
  release(d, b);
  std::sort(rounds.begin(), rounds.end());
  std::printf("{\"mode\": \"bench\", \"calls\": %d, \"best_ns\": %.1f, \"median_ns\": %.1f}\n", calls, rounds[0],
              rounds[rounds.size() / 2]);
  std::fflush(stdout);  // sanitizers may end the process without flushing
  return 0;
}

int stress(const leapp::CudaDriver& d, const leapp::Bundle& bundle, CUcontext ctx, const Args& a, CUstream shared) {
  const leapp::Manifest& m = bundle.manifest();
  constexpr int kSets = 16;
  std::vector<std::vector<std::vector<uint8_t>>> inputs, want;
  {
    CUstream own = stream_named(d, "own", nullptr);
    Buffers b = allocate(d, m);
    for (int k = 0; k < kSets; ++k) {
      inputs.push_back(random_inputs(m, uint32_t(1000 + k)));
      call_and_compare(d, bundle, b, inputs.back(), nullptr, own);
      want.push_back(b.host_out);
    }
    release(d, b);
    d.cuStreamDestroy(own);
  }
  std::atomic<long> wrong{0}, done{0};
  std::atomic<bool> stop{false};
  std::atomic<long> releases{0};
  std::thread releaser;
  if (a.release_every_ms > 0) {
#ifdef LEAPP_HAVE_RELEASE
    releaser = std::thread([&] {
      while (!stop.load()) {
        releases.fetch_add(long(leapp::release_segments()));
        std::this_thread::sleep_for(std::chrono::milliseconds(a.release_every_ms));
      }
    });
#else
    usage("--release-every-ms needs a build with LEAPP_HAVE_RELEASE");
#endif
  }
  std::vector<std::thread> threads;
  for (int t = 0; t < a.threads; ++t)
    threads.emplace_back([&, t] {
      check(d.cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
      CUstream s = stream_named(d, a.stream, shared);
      Buffers b = allocate(d, m);
      for (int i = 0; i < a.calls; ++i) {
        int k = (t * 7 + i) % kSets;
        if (!call_and_compare(d, bundle, b, inputs[k], &want[k], s)) wrong.fetch_add(1);
        done.fetch_add(1);
      }
      release(d, b);
      if (is_own(a.stream)) d.cuStreamDestroy(s);
    });
  for (std::thread& th : threads) th.join();
  stop.store(true);
  if (releaser.joinable()) releaser.join();
  std::printf("{\"mode\": \"stress\", \"stream\": \"%s\", \"threads\": %d, \"calls\": %ld, \"wrong\": %ld, "
              "\"released\": %ld}\n", a.stream.c_str(), a.threads, done.load(), wrong.load(), releases.load());
  std::fflush(stdout);
  return wrong.load() == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) usage("missing arguments");
  Args a;
  a.bundle = argv[1];
  a.mode = argv[2];
  for (int i = 3; i < argc; ++i) {
    std::string k = argv[i];
    if (i + 1 >= argc) usage("option without a value");
    std::string v = argv[++i];
    if (k == "--threads") a.threads = std::stoi(v);
    else if (k == "--calls") a.calls = std::stoi(v);
    else if (k == "--stream") a.stream = v;
    else if (k == "--release-every-ms") a.release_every_ms = std::stoi(v);
    else usage("unknown option");
  }
  std::ifstream f(a.bundle, std::ios::binary);
  if (!f) usage("cannot read the bundle file");
  std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  try {
    std::shared_ptr<const leapp::Bundle> bundle = leapp::intern_bundle(bytes.data(), bytes.size());
    const leapp::CudaDriver& d = leapp::driver();
    leapp::CUdevice dev = 0;
    check(d.cuDeviceGet(&dev, 0), "cuDeviceGet");
    CUcontext ctx = nullptr;
    check(d.cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
    check(d.cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
    CUstream shared = stream_named(d, "own", nullptr);
    int status = 2;
    if (a.mode == "bench") {
      status = bench(d, *bundle, shared, a.calls > 0 ? a.calls : 200000);
    } else if (a.mode == "stress") {
      if (a.calls <= 0) a.calls = 2000;
      status = stress(d, *bundle, ctx, a, shared);
    } else {
      usage("mode must be bench or stress");
    }
#ifdef LEAPP_HAVE_RELEASE
    leapp::release_segments();  // leaves nothing behind for leak checkers
#endif
    d.cuStreamDestroy(shared);
    return status;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "replay_threads: %s\n", e.what());
    return 3;
  }
}
