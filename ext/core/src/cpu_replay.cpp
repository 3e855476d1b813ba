// ext/core/src/cpu_replay.cpp: replaying a segment's ops on the CPU from its CPU code (leapp::run_segment_cpu).
//
// A bundle's cpu_code (docs/bundle-format.md, "CPU code") is an ELF shared object of Warp's CPU entries,
// compiled at export. It is loaded once per bundle digest, from memory: the blob (covered by the digest
// the bundle parser checked) is written into a sealed memfd and dlopen'ed through /proc/self/fd, so no
// file another process could swap is ever opened. Each kernel's layout table (field count, struct size,
// launch-bounds size, then each field's offset and size) is checked against every launch's packed
// parameters before anything runs; a bundle that launches no kernel (copies and memsets only) needs no CPU
// code and loads nothing. A call then runs the ops in order on the calling thread: inits,
// memsets and copies as memset/memcpy, launches as one call of the kernel's entry with its
// launch_bounds_t and its argument struct (the packed parameters, relocated to host addresses). The
// loaded code and the constants are shared and never written; scratch, addresses and parameter bytes
// are the calling thread's own, so concurrent calls share no mutable state and start no threads.
#include <dlfcn.h>
#include <link.h>
#include <sys/mman.h>
#include <unistd.h>
#include <fcntl.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "json.h"
#include "manifest.h"
#include "replay_internal.h"
#include "segment_cache.h"

namespace leapp {
namespace {

#if defined(__x86_64__)
constexpr const char* kThisMachine = "x86_64";
#elif defined(__aarch64__)
constexpr const char* kThisMachine = "aarch64";
#else
constexpr const char* kThisMachine = "";
#endif

using Entry = void (*)(void* dim, void* args);

/// One kernel's CPU entry and the layout of its argument struct.
struct CpuKernel {
  Entry entry = nullptr;
  uint64_t dim_bytes = 0;
  uint64_t args_bytes = 0;
  std::vector<uint64_t> offsets, sizes;  // per argument (parameter i + 1)
};

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

/// A segment's CPU code, loaded: immutable once made.
struct CpuSegment {
  std::string digest;  // the bundle's
  void* handle = nullptr;
  int fd = -1;  // the memfd the code was loaded from, open while it is loaded (see fd_path)
  std::vector<CpuKernel> kernels;  // per manifest kernel; entry null when no launch uses it
  std::unique_ptr<uint8_t, FreeDeleter> constants;
  std::vector<uint64_t> constant_offsets;  // per buffer (constants only)
  ~CpuSegment() {
    if (handle) dlclose(handle);
    if (fd >= 0) close(fd);
  }
};

std::mutex& table_mutex() {
  static auto* m = new std::mutex();
  return *m;
}

std::map<std::string, std::shared_ptr<const CpuSegment>>& table() {
  static auto* t = new std::map<std::string, std::shared_ptr<const CpuSegment>>();
  return *t;
}

std::string where(const Manifest& m) { return "leapp segment '" + detail::shown(m.segment) + "'"; }

/// dlopen's name for a memfd. glibc matches an open request against loaded objects by name first, so a name
/// must never be one an object still loaded was opened under: the fd stays open (its number taken) while the
/// object is loaded, and a number an older object still answers to (one dlclose did not unload) is skipped.
std::string fd_path(int fd) { return "/proc/self/fd/" + std::to_string(fd); }

void* load_from_memory(const Manifest& m, std::string_view image, int& fd_out) {
  int fd = memfd_create("leapp-cpu-code", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) throw std::runtime_error(where(m) + ": memfd_create failed: " + std::strerror(errno));
  auto fail = [&](const std::string& what) {
    int e = errno;
    close(fd);
    throw std::runtime_error(where(m) + ": " + what + ": " + std::strerror(e));
  };
  size_t done = 0;
  while (done < image.size()) {
    ssize_t n = write(fd, image.data() + done, image.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("writing the CPU code to memory failed");
    done += size_t(n);
  }
  // Sealed: nothing (not even another process through /proc) can change the bytes the digest covered.
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
    fail("sealing the CPU code failed");
  for (int tries = 0; void* stale = dlopen(fd_path(fd).c_str(), RTLD_NOW | RTLD_NOLOAD); ++tries) {
    dlclose(stale);  // NOLOAD took a reference
    int other = fcntl(fd, F_DUPFD_CLOEXEC, fd + 1);
    if (other < 0 || tries > 64) fail("no free file descriptor name for the CPU code");
    close(fd);
    fd = other;
  }
  void* handle = dlopen(fd_path(fd).c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* error = dlerror();
    close(fd);
    throw std::runtime_error(where(m) + ": loading its CPU code (" + kThisMachine + ") failed: " +
                             (error ? error : "dlopen failed"));
  }
  fd_out = fd;
  return handle;
}

/// `name` as the CPU code itself defines it: dlsym also searches the object's dependencies (the C library), and an
/// entry must never resolve to one of theirs.
void* defined_here(void* handle, const std::string& name) {
  void* sym = dlsym(handle, name.c_str());
  if (!sym) return nullptr;
  link_map* map = nullptr;
  Dl_info info{};
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) != 0 || !map || dladdr(sym, &info) == 0) return nullptr;
  return reinterpret_cast<uintptr_t>(info.dli_fbase) == uintptr_t(map->l_addr) ? sym : nullptr;
}

/// Reads and checks the layout table of kernel `k` against every launch of it.
CpuKernel bind_kernel(const Manifest& m, void* handle, uint32_t k) {
  const KernelSpec& spec = m.kernels[k];
  CpuKernel kernel;
  auto fail = [&](const std::string& why) {
    throw std::invalid_argument(where(m) + ": kernels[" + std::to_string(k) + "] CPU entry '" + spec.cpu_entry +
                                "': " + why);
  };
  kernel.entry = reinterpret_cast<Entry>(defined_here(handle, spec.cpu_entry));
  if (!kernel.entry) fail("not defined by the CPU code");
  const auto* table = static_cast<const uint64_t*>(defined_here(handle, spec.cpu_entry + "_leapp_args"));
  if (!table) fail("its layout table '" + spec.cpu_entry + "_leapp_args' is not defined by the CPU code");
  // Read no further than the table's own symbol: the bundle parser checked its size and contents in the file
  // (docs/export-cpu.md section 4), and this bounds the read again in memory.
  Dl_info info{};
  void* extra = nullptr;
  const int found = dladdr1(table, &info, &extra, RTLD_DL_SYMENT);
  const auto* symbol = static_cast<const ElfW(Sym)*>(extra);
  if (found == 0 || !symbol ||
      info.dli_saddr != table || symbol->st_size < 24)
    fail("its layout table's symbol is not found or holds fewer than 24 bytes");
  const uint64_t fields = table[0];
  if (fields > 4096 || symbol->st_size / 8 < 3 + 2 * fields)
    fail("its layout table declares " + std::to_string(fields) + " arguments in " +
         std::to_string(symbol->st_size) + " bytes");
  kernel.args_bytes = table[1];
  kernel.dim_bytes = table[2];
  if (kernel.args_bytes > (uint64_t(1) << 20) || kernel.dim_bytes == 0 || kernel.dim_bytes > 64)
    fail("its layout table declares an argument struct of " + std::to_string(kernel.args_bytes) +
         " bytes and launch bounds of " + std::to_string(kernel.dim_bytes));
  for (uint64_t i = 0; i < fields; ++i) {
    const uint64_t offset = table[3 + 2 * i], size = table[4 + 2 * i];
    if (size == 0 || offset > kernel.args_bytes || size > kernel.args_bytes - offset)
      fail("argument " + std::to_string(i) + " at [" + std::to_string(offset) + ", +" + std::to_string(size) +
           ") lies outside its " + std::to_string(kernel.args_bytes) + "-byte struct");
    kernel.offsets.push_back(offset);
    kernel.sizes.push_back(size);
  }
  for (size_t i = 0; i < m.ops.size(); ++i) {
    const OpSpec& op = m.ops[i];
    if (op.kind != OpKind::kLaunch || op.kernel != k) continue;
    const std::string at = "ops[" + std::to_string(i) + "]";
    if (op.param_sizes.size() != fields + 1)
      fail(at + " passes " + std::to_string(op.param_sizes.size() - 1) + " arguments, the CPU entry takes " +
           std::to_string(fields));
    if (op.param_sizes[0] != kernel.dim_bytes)
      fail(at + " passes " + std::to_string(op.param_sizes[0]) + " bytes of launch bounds, the CPU entry takes " +
           std::to_string(kernel.dim_bytes));
    for (uint64_t a = 0; a < fields; ++a)
      if (op.param_sizes[a + 1] != kernel.sizes[a])
        fail(at + " argument " + std::to_string(a) + " has " + std::to_string(op.param_sizes[a + 1]) +
             " bytes, the CPU entry's has " + std::to_string(kernel.sizes[a]));
  }
  return kernel;
}

/// `code` is null for a bundle without kernels (copies and memsets only): nothing is loaded.
std::shared_ptr<const CpuSegment> prepare(const Bundle& bundle, const CpuCodeSpec* code) {
  const Manifest& m = bundle.manifest();
  auto seg = std::make_shared<CpuSegment>();
  seg->digest = bundle.digest();
  if (code) seg->handle = load_from_memory(m, bundle.cpu_code_image(*code), seg->fd);  // decoded once, at parse
  std::vector<bool> launched(m.kernels.size(), false);
  for (const OpSpec& op : m.ops)
    if (op.kind == OpKind::kLaunch) launched[op.kernel] = true;
  seg->kernels.resize(m.kernels.size());
  for (uint32_t k = 0; k < m.kernels.size(); ++k)
    if (launched[k]) seg->kernels[k] = bind_kernel(m, seg->handle, k);
  uint64_t total = 0;
  seg->constant_offsets.assign(m.buffers.size(), 0);
  for (size_t i = 0; i < m.buffers.size(); ++i) {
    if (m.buffers[i].role != BufferRole::kConstant) continue;
    seg->constant_offsets[i] = total;
    total = detail::round_up(total + m.buffers[i].bytes, detail::kSubAlignment);
  }
  if (total) {
    check_segment_memory(bundle, m.dynamic ? m.batch_traced : 0);  // before allocating: sizes from a file
    seg->constants.reset(static_cast<uint8_t*>(std::aligned_alloc(detail::kSubAlignment, total)));
    if (!seg->constants)
      throw std::runtime_error(where(m) + ": cannot allocate its " + std::to_string(total) + " bytes of constants");
    for (size_t i = 0; i < m.buffers.size(); ++i) {
      const BufferSpec& b = m.buffers[i];
      if (b.role != BufferRole::kConstant) continue;
      std::string_view blob = bundle.blob(b.init_index);
      std::memcpy(seg->constants.get() + seg->constant_offsets[i], blob.data(), blob.size());
    }
  }
  return seg;
}

/// The bundle's loaded CPU code from the table, loaded on first use.
std::shared_ptr<const CpuSegment> cpu_segment(const Bundle& bundle, const CpuCodeSpec* code) {
  std::lock_guard<std::mutex> lock(table_mutex());
  auto& slot = table()[bundle.digest()];
  if (!slot) {
    try {
      slot = prepare(bundle, code);
    } catch (...) {
      table().erase(bundle.digest());
      throw;
    }
  }
  return slot;
}

/// Per-call state of this thread: addresses, parameter bytes, the argument struct, scratch, spans.
struct CpuCallState {
  std::vector<uint8_t*> addr;
  std::vector<uint8_t> params;
  std::vector<uint64_t> args;  // 8-byte aligned argument struct
  std::unique_ptr<uint8_t, FreeDeleter> scratch;
  uint64_t scratch_capacity = 0;
  std::vector<uint64_t> scratch_offsets;
  // The last segment run, for the next call's lookup without the table's lock. Weak: release_cpu_code unloads the
  // code (and closes its memfd) once no call is running it, whatever this thread ran last.
  std::weak_ptr<const CpuSegment> last;
};

uint8_t* scratch_for(CpuCallState& s, const Bundle& bundle, int64_t batch, uint64_t need) {
  if (need > s.scratch_capacity) {
    check_segment_memory(bundle, batch);  // before allocating: the sizes come from a file
    s.scratch.reset(static_cast<uint8_t*>(std::aligned_alloc(detail::kSubAlignment, need)));
    s.scratch_capacity = s.scratch ? need : 0;
    if (!s.scratch)
      throw std::runtime_error(where(bundle.manifest()) + ": cannot allocate its " + std::to_string(need) +
                               " bytes of scratch" +
                               (bundle.manifest().dynamic ? " at batch " + std::to_string(batch) : std::string()));
  }
  return s.scratch.get();
}

}  // namespace

const CpuCodeSpec* cpu_code_for_this_machine(const Bundle& bundle) {
  for (const CpuCodeSpec& code : bundle.manifest().cpu_code)
    if (code.machine == kThisMachine) return &code;
  return nullptr;
}

bool runs_on_this_cpu(const Bundle& bundle) {
  return cpu_code_for_this_machine(bundle) != nullptr || bundle.manifest().kernels.empty();
}

std::string cpu_code_refusal(const Bundle& bundle) {
  const Manifest& m = bundle.manifest();
  if (runs_on_this_cpu(bundle)) return "";
  std::string machines;
  for (const CpuCodeSpec& code : m.cpu_code) machines += (machines.empty() ? "" : ", ") + code.machine;
  return where(m) + " holds no CPU code for this machine (" + std::string(*kThisMachine ? kThisMachine : "unknown") +
         ")" + (machines.empty() ? std::string(": it was exported for CUDA devices only (export it with "
                                               "LEAPP_CPU_CODE=1, or trace it on the CPU, docs/export-cpu.md)")
                                 : "; it holds CPU code for " + machines);
}

void run_segment_cpu(const Bundle& bundle, const std::vector<HostSpan>& inputs, const std::vector<HostSpan>& outputs) {
  const Manifest& m = bundle.manifest();
  const CpuCodeSpec* code = cpu_code_for_this_machine(bundle);  // null for copies and memsets only
  if (!runs_on_this_cpu(bundle)) throw std::runtime_error(cpu_code_refusal(bundle));
  thread_local CpuCallState s;
  const int64_t batch = detail::checked_host_batch(bundle, inputs, outputs);

  std::shared_ptr<const CpuSegment> held = s.last.lock();  // held for this call: a release cannot unload it
  if (!held || held->digest != bundle.digest()) {
    held = cpu_segment(bundle, code);
    s.last = held;
  }
  const CpuSegment& seg = *held;
  const uint64_t need = detail::scratch_layout(m, batch, s.scratch_offsets);
  uint8_t* scratch = need ? scratch_for(s, bundle, batch, need) : nullptr;

  s.addr.resize(m.buffers.size());
  for (size_t i = 0; i < m.buffers.size(); ++i) {
    const BufferSpec& b = m.buffers[i];
    switch (b.role) {
      case BufferRole::kInput: s.addr[i] = static_cast<uint8_t*>(inputs[b.io].ptr); break;
      case BufferRole::kOutput: s.addr[i] = static_cast<uint8_t*>(outputs[b.io].ptr); break;
      case BufferRole::kScratch: s.addr[i] = scratch + s.scratch_offsets[i]; break;
      case BufferRole::kConstant: s.addr[i] = seg.constants.get() + seg.constant_offsets[i]; break;
    }
  }
  for (size_t i = 0; i < m.buffers.size(); ++i) {
    const BufferSpec& b = m.buffers[i];
    const uint64_t nbytes = m.dynamic ? uint64_t(b.bytes_rule.at(batch)) : b.bytes;
    if (b.init == BufferInit::kZero)
      std::memset(s.addr[i], 0, size_t(nbytes));
    else if (b.init == BufferInit::kInput)
      std::memcpy(s.addr[i], inputs[b.init_index].ptr, size_t(nbytes));
  }
  for (const OpSpec& op : m.ops) {
    switch (op.kind) {
      case OpKind::kLaunch: {
        if (op.sized && op.size_rule.at(batch) == 0) break;  // Warp skips empty launches
        const CpuKernel& kernel = seg.kernels[op.kernel];
        std::string_view blob = bundle.blob(op.params_blob);
        s.params.resize(blob.size());
        std::memcpy(s.params.data(), blob.data(), blob.size());
        for (const RelocSpec& rel : op.relocs) {
          const uint64_t a = uint64_t(reinterpret_cast<uintptr_t>(s.addr[rel.buffer])) +
                             (m.dynamic ? uint64_t(rel.buffer_offset_rule.at(batch)) : rel.buffer_offset);
          std::memcpy(s.params.data() + op.param_offsets[rel.param] + rel.offset, &a, sizeof(a));
        }
        for (const PatchSpec& patch : op.patches) {
          const uint64_t v = uint64_t(patch.rule.at(batch));
          std::memcpy(s.params.data() + op.param_offsets[patch.param] + patch.offset, &v, patch.width);
        }
        s.args.resize((kernel.args_bytes + 7) / 8 + 1);
        auto* args = reinterpret_cast<uint8_t*>(s.args.data());
        for (size_t a = 0; a < kernel.offsets.size(); ++a)
          std::memcpy(args + kernel.offsets[a], s.params.data() + op.param_offsets[a + 1], size_t(kernel.sizes[a]));
        // launch_bounds_t is read in place: 8-byte aligned in the blob copy (the writer aligns parameter 0)
        alignas(8) uint8_t dim[64];
        std::memcpy(dim, s.params.data() + op.param_offsets[0], size_t(kernel.dim_bytes));
        kernel.entry(dim, args);
        break;
      }
      case OpKind::kMemset: {
        const uint64_t n = m.dynamic ? uint64_t(op.bytes_rule.at(batch)) : op.bytes;
        const uint64_t off = m.dynamic ? uint64_t(op.dst_offset_rule.at(batch)) : op.dst_offset;
        if (n) std::memset(s.addr[op.dst] + off, op.value, size_t(n));
        break;
      }
      case OpKind::kCopy: {
        const uint64_t n = m.dynamic ? uint64_t(op.bytes_rule.at(batch)) : op.bytes;
        const uint64_t dst = m.dynamic ? uint64_t(op.dst_offset_rule.at(batch)) : op.dst_offset;
        const uint64_t src = m.dynamic ? uint64_t(op.src_offset_rule.at(batch)) : op.src_offset;
        if (n) std::memmove(s.addr[op.dst] + dst, s.addr[op.src] + src, size_t(n));
        break;
      }
    }
  }
}

size_t release_cpu_code(std::string_view digest) {
  std::lock_guard<std::mutex> lock(table_mutex());
  size_t released = 0;
  for (auto it = table().begin(); it != table().end();) {
    if (digest.empty() || it->first == digest) {
      it = table().erase(it);  // calls in flight (and each thread's last segment) keep theirs alive
      ++released;
    } else {
      ++it;
    }
  }
  return released;
}

}  // namespace leapp
