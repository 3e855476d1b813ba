// ext/pipeline/src/aoti_host.cpp: see aoti_host.h.
#include "aoti_host.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>

#include "leapp/pipeline.h"
#include "ort_runtime.h"
#include "sha256.h"
#include "signed_files.h"

namespace fs = std::filesystem;

namespace leapp::pipeline_detail {
namespace {

std::string where_of(const Description& d, size_t index) {
  return "pipeline '" + d.name + "' node '" + d.nodes[index].name + "'";
}

std::string field_of(const Description& d, size_t index) {
  return d.file + ": nodes[" + std::to_string(index) + "].aoti";
}

std::string rerun_hint(const Description& d, size_t index) {
  return "run `leapp aoti " + d.folder + " " + d.nodes[index].name + "` again";
}

/// The package's bytes after containment, presence and sha256 checks (the bytes hashed are the bytes returned).
std::string checked_bytes(const Description& d, size_t index, std::string* path_out) {
  const NodeDescription& n = d.nodes[index];
  const std::string where = where_of(d, index), field = field_of(d, index);
  std::string path = contained_path(d.folder, n.aoti_path, field + ".path (" + where + ")");
  if (!is_regular_file(path))
    throw PipelineError(where + ": AOTInductor package " + path + " is missing (" + field + ".path); " + rerun_hint(d, index));
  std::string data = read_artifact(path, where);  // bounded by LEAPP_MAX_ARTIFACT_BYTES before it is read
  check_signed(d.signed_files.get(), path, data, where);  // a signed export: the bytes signed, before any other check
  auto digest = leapp::detail::sha256(data.data(), data.size());
  std::string actual = leapp::detail::to_hex(digest.data(), digest.size());
  if (actual != n.aoti_sha256)
    throw PipelineError(where + ": AOTInductor package " + path + " has sha256 " + actual + " but pipeline.yaml records " +
                        n.aoti_sha256 + " (" + field + ".sha256); the file changed after `leapp aoti` recorded it: " +
                        rerun_hint(d, index));
  if (path_out) *path_out = path;
  return data;
}

/// A private copy (a fresh 0700 folder) of bytes already checked, so the loader reads exactly them.
struct PrivateCopy {
  std::string folder, file;
  explicit PrivateCopy(const std::string& data) {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/leapp-aoti-XXXXXX";
    std::vector<char> buffer(pattern.begin(), pattern.end());
    buffer.push_back('\0');
    if (!mkdtemp(buffer.data())) throw PipelineError("cannot make a private folder " + pattern + ": " + std::strerror(errno));
    folder = buffer.data();
    file = folder + "/package.pt2";
    int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    bool ok = fd >= 0;
    for (size_t done = 0; ok && done < data.size();) {
      ssize_t n = ::write(fd, data.data() + done, data.size() - done);
      if (n < 0 && errno == EINTR) continue;
      ok = n > 0;
      done += ok ? size_t(n) : 0;
    }
    if (fd >= 0 && ::close(fd) != 0) ok = false;
    if (!ok) {
      std::string why = std::strerror(errno);
      remove();
      throw PipelineError("cannot write a private copy of an AOTInductor package to " + file + ": " + why);
    }
  }
  void remove() {
    std::error_code ec;
    fs::remove_all(folder, ec);
  }
  ~PrivateCopy() { remove(); }
};

const LeappAotiPlugin& load_plugin(const std::string& path, const std::string& where) {
  static std::mutex mutex;
  static std::map<std::string, const LeappAotiPlugin*> loaded;
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = loaded.find(path); it != loaded.end()) return *it->second;
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = dlerror();
    throw PipelineError(where + ": cannot load leapp's AOTInductor plugin " + path + ": " + (why ? why : "dlopen failed") +
                        " (it needs the libtorch it was built against: torch installed in the same environment)");
  }
  auto entry = reinterpret_cast<LeappAotiPluginEntry>(dlsym(handle, LEAPP_AOTI_PLUGIN_SYMBOL));
  const LeappAotiPlugin* plugin = entry ? entry() : nullptr;
  if (!plugin || plugin->abi != LEAPP_AOTI_PLUGIN_ABI)
    throw PipelineError(where + ": " + path + " is not leapp's AOTInductor plugin of this leapp (no " +
                        LEAPP_AOTI_PLUGIN_SYMBOL + " of ABI " + std::to_string(LEAPP_AOTI_PLUGIN_ABI) +
                        "): reinstall leapp");
  loaded[path] = plugin;  // the handle stays open: models and torch's registrations outlive one pipeline
  return *plugin;
}

std::string release(const std::string& version) { return version.substr(0, version.find('+')); }

}  // namespace

std::string aoti_plugin_path(const std::string& requested) {
  if (!requested.empty()) return requested;
  if (const char* env = std::getenv("LEAPP_PIPELINE_AOTI_PLUGIN"); env && *env) return env;
  return package_file("libleapp_pipeline_aoti.so");
}

std::string torch_op_library(const std::string& requested) {
  if (!requested.empty()) return requested;
  if (const char* env = std::getenv("LEAPP_WARP_PT2_CUSTOM_OP_LIBRARY"); env && *env) return env;
  return package_file("libleapp_warp_torch.so");
}

void verify_aoti_package(const Description& d, size_t index) { checked_bytes(d, index, nullptr); }

bool op_library_replays_on_cpu(const std::string& op_library) {
  void* handle = op_library.empty() ? nullptr : dlopen(op_library.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (!handle) return true;
  using Query = int (*)();
  auto query = reinterpret_cast<Query>(dlsym(handle, "leapp_warp_torch_replays_on_cpu"));
  const bool replays = query && query() != 0;
  dlclose(handle);  // NOLOAD took a reference; the plugin's stays
  return replays;
}

AotiModel open_aoti_node(const Description& d, size_t index, const std::string& plugin_path,
                         const std::string& op_library, int device_index) {
  const NodeDescription& n = d.nodes[index];
  const std::string where = where_of(d, index);
  std::string package;
  std::string data = checked_bytes(d, index, &package);
  if (plugin_path.empty())
    throw PipelineError(where + ": a pt2 node runs from its AOTInductor package (" + n.aoti_path + ") through leapp's "
                        "plugin libleapp_pipeline_aoti.so, which was not found (next to libleapp_pipeline.so, or "
                        "$LEAPP_PIPELINE_AOTI_PLUGIN); it is built when torch is installed before leapp "
                        "(docs/deploy.md). Or export the node with export_with='onnx'");
  if (op_library.empty() && n.segments)
    throw PipelineError(where + ": the node has Warp segments and leapp's torch op library libleapp_warp_torch.so "
                        "was not found (next to libleapp_pipeline.so, or $LEAPP_WARP_PT2_CUSTOM_OP_LIBRARY)");
  const LeappAotiPlugin& plugin = load_plugin(plugin_path, where);
  if (release(n.aoti_torch) != release(plugin.torch_version))
    throw PipelineError(where + ": its AOTInductor package " + package + " was compiled by torch " + n.aoti_torch + " (" +
                        field_of(d, index) + ".torch), and leapp's plugin " + plugin_path + " runs libtorch " +
                        plugin.torch_version + "; a package runs on the torch release that compiled it: " +
                        "run `leapp aoti " + d.folder + " " + n.name + "` with this torch");
  PrivateCopy copy(data);
  char error[4096] = {0};
  void* model = plugin.open(copy.file.c_str(), op_library.c_str(), device_index, error, sizeof(error));
  if (!model)
    throw PipelineError(where + ": cannot open AOTInductor package " + package + ": " + error);
  const LeappAotiPlugin* p = &plugin;
  return AotiModel{p, std::shared_ptr<void>(model, [p](void* m) { p->close(m); }), package};
}

namespace {

class AotiGraphPool final : public CaptureResources {
 public:
  AotiGraphPool(const LeappAotiPlugin* plugin, int device_index) : plugin_(plugin), device_index_(device_index) {}
  void* begin(CUstream stream) override {
    char error[2048] = {0};
    void* pool = plugin_->begin_graph_pool(device_index_, stream, error, sizeof(error));
    if (!pool) throw PipelineError(std::string("torch's allocator refused a private pool: ") + error);
    return pool;
  }
  void end(void* held) noexcept override { plugin_->end_graph_pool(held); }
  void release(void* held) noexcept override { plugin_->release_graph_pool(held); }

 private:
  const LeappAotiPlugin* plugin_;
  int device_index_;
};

}  // namespace

std::unique_ptr<CaptureResources> aoti_graph_pool(const LeappAotiPlugin* plugin, int device_index) {
  if (!plugin || !plugin->begin_graph_pool || !plugin->end_graph_pool || !plugin->release_graph_pool) return nullptr;
  return std::make_unique<AotiGraphPool>(plugin, device_index);
}

}  // namespace leapp::pipeline_detail
