// ext/pipeline/src/description.cpp: see description.h. Each refusal repeats the text of
// leapp/pipeline_format/reader.py or paths.py (tests/runtime/test_cpp_pipeline.py compares them).
#include "description.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <vector>

#include "json.h"
#include "json_text.h"
#include "leapp/pipeline.h"
#include "pyrepr.h"
#include "schema.h"
#include "sha256.h"
#include "signed_files.h"
#include "yaml_text.h"

namespace fs = std::filesystem;

namespace leapp::pipeline_detail {
namespace {

using leapp::detail::JsonValue;
using T = JsonValue::Type;

// leapp/pipeline_format/format.py
constexpr const char* kFormat = "leapp.pipeline";
constexpr int64_t kVersion = 1;
constexpr size_t kMaxFileBytes = size_t(16) << 20;
constexpr int kMaxDepth = 32;
constexpr size_t kMaxValues = 200000;

[[noreturn]] void fail(const std::string& text) { throw PipelineError(text); }

/// Python's str(Path(p)): '//' and '.' components collapsed, no trailing '/'.
std::string shown_path(const std::string& p) {
  if (p.empty()) return ".";
  std::string out = p[0] == '/' ? "/" : "";
  size_t start = 0;
  while (start <= p.size()) {
    size_t end = p.find('/', start);
    if (end == std::string::npos) end = p.size();
    std::string part = p.substr(start, end - start);
    if (!part.empty() && part != ".") out += (out.empty() || out == "/" ? "" : "/") + part;
    start = end + 1;
  }
  return out.empty() ? "." : out;
}

/// At most `limit` + 1 bytes of `path` (one more tells a larger file). A link is followed, as Python's reader
/// follows it (contained_path checked where it leads); a signed export holds none (leapp/signing.h).
std::string read_bounded(const std::string& path, size_t limit) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(path + ": cannot be read: " + std::strerror(errno));
  std::string data(limit + 1, '\0');
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t got = ::read(fd, data.data() + done, data.size() - done);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      const int saved = errno;
      ::close(fd);
      fail(path + ": cannot be read: " + std::strerror(saved));
    }
    if (got == 0) break;
    done += size_t(got);
  }
  ::close(fd);
  data.resize(done);
  return data;
}

std::string spec_text(const Spec& s) {
  std::string out = s.dtype + "[";
  for (size_t i = 0; i < s.shape.size(); ++i) out += (i ? ", " : "") + std::to_string(s.shape[i]);
  return out + "]";
}

Spec spec_of(const JsonValue& v) {
  Spec s;
  s.name = v.find("name")->string;
  s.dtype = v.find("dtype")->string;
  for (const JsonValue& d : v.find("shape")->array) s.shape.push_back(d.integer);
  if (const JsonValue* metadata = v.find("metadata")) s.metadata = json_text(*metadata);  // the schema checked it
  if (const JsonValue* batch = v.find("batch")) {  // the schema checked: integers in [1, 2^31 - 1], at least two
    s.batch_min = batch->array[0].integer;
    s.batch_max = batch->array[1].integer;
  }
  return s;
}

/// The description's fields, after the schema has accepted it (every required key is there, typed).
Description convert(const JsonValue& root) {
  Description d;
  d.name = root.find("name")->string;
  for (const JsonValue& n : root.find("nodes")->array) {
    NodeDescription node;
    node.name = n.find("name")->string;
    node.backend = n.find("backend")->string;
    node.artifact = n.find("artifact")->string;
    node.sha256 = n.find("sha256")->string;
    node.device = n.find("device")->string;
    for (const JsonValue& f : n.find("files")->array) node.files.emplace_back(f.find("path")->string, f.find("sha256")->string);
    for (const JsonValue& s : n.find("inputs")->array) node.inputs.push_back(spec_of(s));
    for (const JsonValue& s : n.find("outputs")->array) node.outputs.push_back(spec_of(s));
    node.segments = n.find("segments")->array.size();
    for (const JsonValue& seg : n.find("segments")->array) {  // the schema checked the keys and their types
      SegmentDescription entry{seg.find("id")->string, seg.find("digest")->string};
      if (const JsonValue* cpu = seg.find("producer")->find("cpu_code")) entry.cpu_code = cpu->string;
      node.segment_list.push_back(std::move(entry));
    }
    if (const JsonValue* aoti = n.find("aoti")) {  // optional; the schema has checked its keys
      node.has_aoti = true;
      node.aoti_path = aoti->find("path")->string;
      node.aoti_sha256 = aoti->find("sha256")->string;
      node.aoti_torch = aoti->find("torch")->string;
    }
    d.nodes.push_back(std::move(node));
  }
  for (const JsonValue& e : root.find("edges")->array) {
    const JsonValue* feedback = e.find("feedback");
    const JsonValue* state = e.find("state");
    d.edges.push_back(Edge{e.find("from_node")->string, e.find("from_output")->string, e.find("to_node")->string,
                           e.find("to_input")->string, feedback && feedback->boolean, state && state->boolean});
  }
  if (const JsonValue* initial = root.find("initial_values")) {  // the schema checked its keys and their types
    d.has_initial_values = true;
    const JsonValue* path = initial->find("path");
    const JsonValue* sha256 = initial->find("sha256");
    if (path) d.initial_values_path = path->string;
    if (sha256) d.initial_values_sha256 = sha256->string;
  }
  for (const JsonValue& i : root.find("inputs")->array) {
    PipelineInput in{spec_of(i), {}};
    for (const JsonValue& c : i.find("consumers")->array) in.consumers.emplace_back(c.find("node")->string, c.find("input")->string);
    d.inputs.push_back(std::move(in));
  }
  for (const JsonValue& o : root.find("outputs")->array)
    d.outputs.push_back(PipelineOutput{spec_of(o), o.find("node")->string, o.find("output")->string});
  return d;
}

/// reader._unique: name -> index; refuses a name given twice.
std::map<std::string, size_t> unique(const std::vector<const std::string*>& names, const std::string& field,
                                     const std::string& file, const std::string& what) {
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < names.size(); ++i) {
    auto [it, fresh] = index.emplace(*names[i], i);
    if (!fresh)
      fail(file + ": " + field + "[" + std::to_string(i) + "].name: " + what + " " + repr_str(*names[i]) + " is also " +
           field + "[" + std::to_string(it->second) + "]");
  }
  return index;
}

template <class Entries>
std::vector<const std::string*> names_of(const Entries& entries) {
  std::vector<const std::string*> out;
  for (const auto& e : entries) out.push_back(&e.name);
  return out;
}

/// reader._check_references, in the same order and with the same texts.
void check_references(const Description& d, const std::string& file) {
  auto node_index = unique(names_of(d.nodes), "nodes", file, "node");
  std::vector<std::string> node_names;
  for (const auto& n : d.nodes) node_names.push_back(n.name);
  for (size_t n = 0; n < d.nodes.size(); ++n) {
    unique(names_of(d.nodes[n].inputs), "nodes[" + std::to_string(n) + "].inputs", file, "input");
    unique(names_of(d.nodes[n].outputs), "nodes[" + std::to_string(n) + "].outputs", file, "output");
  }
  std::map<std::pair<std::string, std::string>, std::string> fed;
  std::map<std::pair<std::string, std::string>, std::string> state_outputs;  // (node, output) -> the state edge
  auto port = [&](const std::string& field, const std::string& node, const std::string& name, bool inputs,
                  const char* node_key, const char* name_key) -> const Spec& {
    auto it = node_index.find(node);
    if (it == node_index.end())
      fail(file + ": " + field + "." + node_key + ": no node " + repr_str(node) + " (nodes: " + repr_names(node_names) + ")");
    const auto& side = inputs ? d.nodes[it->second].inputs : d.nodes[it->second].outputs;
    // a Python dict keeps the last of two equal names; _unique has refused duplicates above
    for (const Spec& s : side)
      if (s.name == name) return s;
    std::vector<std::string> names;
    for (const Spec& s : side) names.push_back(s.name);
    fail(file + ": " + field + "." + name_key + ": node " + repr_str(node) + " has no " + (inputs ? "input " : "output ") +
         repr_str(name) + " (" + (inputs ? "inputs: " : "outputs: ") + repr_names(names) + ")");
  };
  auto feed = [&](const std::string& field, const std::string& node, const std::string& name) {
    auto [it, fresh] = fed.emplace(std::make_pair(node, name), field);
    if (!fresh)
      fail(file + ": " + field + ": input " + repr_str(name) + " of node " + repr_str(node) + " is already fed by " + it->second);
  };
  auto same = [&](const std::string& field, const Spec& a, const Spec& b, const char* text) {
    if (a.dtype != b.dtype || a.shape != b.shape)
      fail(file + ": " + field + ": " + text + " " + spec_text(a) + " to " + spec_text(b));
  };
  for (size_t e = 0; e < d.edges.size(); ++e) {
    const Edge& edge = d.edges[e];
    std::string field = "edges[" + std::to_string(e) + "]";
    const Spec& src = port(field, edge.from_node, edge.from_output, false, "from_node", "from_output");
    const Spec& dst = port(field, edge.to_node, edge.to_input, true, "to_node", "to_input");
    same(field, src, dst, "joins");
    bool forward = node_index[edge.from_node] < node_index[edge.to_node];
    if (edge.state) {  // a value the node carries to its own next run: feedback to itself, feeding its input
      if (!edge.feedback)
        fail(file + ": " + field + ".state: a state edge needs 'feedback: true' (it carries the value to the next step)");
      if (edge.from_node != edge.to_node)
        fail(file + ": " + field + ".state: a state edge goes from a node to itself, not from " +
             repr_str(edge.from_node) + " to " + repr_str(edge.to_node));
      feed(field, edge.to_node, edge.to_input);
      state_outputs[{edge.from_node, edge.from_output}] = field;  // Python's dict: the last edge names it
    } else if (edge.feedback) {
      if (forward)
        fail(file + ": " + field + ".feedback: an edge to a later node is not feedback (nodes run in the listed order)");
    } else if (!forward) {
      fail(file + ": " + field + ": goes from " + repr_str(edge.from_node) + " back to " + repr_str(edge.to_node) +
           " without 'feedback: true' (nodes run in the listed order)");
    } else {
      feed(field, edge.to_node, edge.to_input);
    }
  }
  std::vector<const std::string*> input_names;
  for (const auto& i : d.inputs) input_names.push_back(&i.spec.name);
  unique(input_names, "inputs", file, "pipeline input");
  for (size_t i = 0; i < d.inputs.size(); ++i)
    for (size_t c = 0; c < d.inputs[i].consumers.size(); ++c) {
      std::string field = "inputs[" + std::to_string(i) + "].consumers[" + std::to_string(c) + "]";
      const auto& [node, input] = d.inputs[i].consumers[c];
      const Spec& spec = port(field, node, input, true, "node", "input");
      same(field, d.inputs[i].spec, spec, "feeds");
      feed(field, node, input);
    }
  for (size_t n = 0; n < d.nodes.size(); ++n)
    for (size_t i = 0; i < d.nodes[n].inputs.size(); ++i) {
      const std::string& name = d.nodes[n].inputs[i].name;
      if (!fed.count({d.nodes[n].name, name}))
        fail(file + ": nodes[" + std::to_string(n) + "].inputs[" + std::to_string(i) + "]: input " + repr_str(name) +
             " of node " + repr_str(d.nodes[n].name) + " is fed by no edge and no pipeline input");
    }
  std::vector<const std::string*> output_names;
  for (const auto& o : d.outputs) output_names.push_back(&o.spec.name);
  unique(output_names, "outputs", file, "pipeline output");
  for (size_t o = 0; o < d.outputs.size(); ++o) {
    std::string field = "outputs[" + std::to_string(o) + "]";
    const Spec& spec = port(field, d.outputs[o].node, d.outputs[o].output, false, "node", "output");
    same(field, spec, d.outputs[o].spec, "returns");
    if (auto it = state_outputs.find({d.outputs[o].node, d.outputs[o].output}); it != state_outputs.end())
      fail(file + ": " + field + ": output " + repr_str(d.outputs[o].output) + " of node " + repr_str(d.outputs[o].node) +
           " is the state update of " + it->second + ", never a pipeline output");
  }
  if (!state_outputs.empty() && !d.has_initial_values) {
    std::vector<std::string> fields;
    for (const auto& kv : state_outputs) fields.push_back(kv.second);
    std::sort(fields.begin(), fields.end());
    fail(file + ": initial_values: missing (the state edges " + repr_names(fields) + " need their initial values)");
  }
  if (state_outputs.empty() && d.has_initial_values)
    fail(file + ": initial_values: present, but no edge has 'state: true'");
}

/// reader.validate_description: format, version, schema, cross-references.
void validate(const JsonValue& root, const std::string& file) {
  if (root.type != T::kObject) fail(file + ": expected a mapping at the top level, got " + describe(root));
  const JsonValue* format = root.find("format");
  if (!format || format->type != T::kString || format->string != kFormat)
    fail(file + ": not a leapp pipeline description (format must be " + repr_str(kFormat) + ")");
  const JsonValue* version = root.find("version");
  if (!version || version->type != T::kInt || version->int_overflow || version->integer != kVersion)
    fail(file + ": unsupported pipeline.yaml version " + (version ? repr(*version, false) : "None") +
         " (this leapp reads " + std::to_string(kVersion) + ")");
  std::string problem = schema_error(root);
  if (!problem.empty()) fail(file + ": " + problem);
}

std::string regenerate_hint(const std::string& folder) {
  return "run `leapp write-json " + folder + "` to write it from pipeline.yaml (docs/pipeline-format.md, 'pipeline.json')";
}

/// posixpath.join(a, b) and posixpath.split(p), as the Python reader's path resolution uses them.
std::string py_join(const std::string& a, const std::string& b) {
  if (!b.empty() && b[0] == '/') return b;
  return a.empty() || a.back() == '/' ? a + b : a + "/" + b;
}

std::pair<std::string, std::string> py_split(const std::string& p) {
  const size_t i = p.rfind('/') + 1;  // npos + 1: no '/', the head is empty
  std::string head = p.substr(0, i);
  if (head.find_first_not_of('/') != std::string::npos) head.erase(head.find_last_not_of('/') + 1);
  return {head, p.substr(i)};
}

using Resolved = std::map<std::string, std::optional<std::string>>;  // a link -> its resolution (none: under way)

/// posixpath._joinrealpath (CPython 3.10-3.12), non-strict: `rest` resolved onto `path` component by component,
/// every symbolic link followed also when its target does not exist. False at a loop, `path` then being what
/// was resolved with the rest as it is. A link that cannot be read throws (Python raises its OSError), and so
/// does a chain of more than 1,000 links (Python's recursion limit; a bound on this recursion's stack).
bool join_real(std::string& path, std::string rest, Resolved& seen, const std::string& failed, int depth = 0) {
  if (!rest.empty() && rest[0] == '/') {
    rest.erase(0, 1);
    path = "/";
  }
  while (!rest.empty()) {
    const size_t cut = rest.find('/');
    const std::string name = rest.substr(0, cut);
    rest = cut == std::string::npos ? std::string() : rest.substr(cut + 1);
    if (name.empty() || name == ".") continue;
    if (name == "..") {
      if (path.empty()) {
        path = "..";
      } else {
        auto [head, tail] = py_split(path);
        path = tail == ".." ? py_join(py_join(head, ".."), "..") : head;
      }
      continue;
    }
    const std::string next = py_join(path, name);
    struct stat st {};
    if (::lstat(next.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) {  // Python: an lstat error is not a link
      path = next;
      continue;
    }
    if (auto it = seen.find(next); it != seen.end()) {
      if (it->second) {
        path = *it->second;
        continue;
      }
      path = py_join(next, rest);
      return false;
    }
    if (depth >= 1000) fail(failed + "more than 1000 symbolic links in a chain at " + repr_str(next));
    seen[next] = std::nullopt;
    std::vector<char> target(4096);
    const ssize_t n = ::readlink(next.c_str(), target.data(), target.size());
    if (n < 0 || size_t(n) == target.size())
      fail(failed + std::strerror(n < 0 ? errno : ENAMETOOLONG) + ": " + repr_str(next));
    if (!join_real(path, std::string(target.data(), size_t(n)), seen, failed, depth + 1)) {
      path = py_join(path, rest);
      return false;
    }
    seen[next] = path;
  }
  return true;
}

/// pathlib.Path(path).resolve() (non-strict) for an absolute `path`: os.path.realpath, then normpath; `loop`
/// set when a symbolic link loop stopped it.
std::string py_resolve(const std::string& path, bool& loop, const std::string& failed) {
  std::string resolved;
  Resolved seen;
  loop = !join_real(resolved, path, seen, failed);
  std::string normal = fs::path(resolved).lexically_normal().string();
  while (normal.size() > 1 && normal.back() == '/') normal.pop_back();
  return normal;
}

}  // namespace

bool is_regular_file(const std::string& p) {
  struct stat st;
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

std::string join_shown(const std::string& folder, const std::string& name) {
  return folder == "." ? name : folder == "/" ? "/" + name : folder + "/" + name;
}

std::string contained_path(const std::string& folder, const std::string& rel, const std::string& where) {
  if (rel.empty()) fail(where + ": expected a non-empty relative path, got " + repr_str(rel));
  // The components as pathlib keeps them before it resolves: '.' and empty ones name nothing ("a/./b", "a//b"
  // and "a/." are "a/b", "a/b" and "a").
  bool dotdot = false;
  std::string normal;
  for (size_t start = 0; start <= rel.size();) {
    size_t end = rel.find('/', start);
    if (end == std::string::npos) end = rel.size();
    const std::string part = rel.substr(start, end - start);
    dotdot = dotdot || part == "..";
    if (!part.empty() && part != ".") normal = py_join(normal, part);
    start = end + 1;
  }
  if (rel.find('\0') != std::string::npos || rel[0] == '/' || dotdot)
    fail(where + ": path " + repr_str(rel) + " leaves the pipeline folder " + folder +
         " (paths are relative, without '..')");
  // Resolved as Python's reader resolves it (pathlib's resolve: dangling links followed, a component it cannot
  // look at taken as it is, only loops refused), so that both readers open the same file for any spelling and
  // name the same path in what they say.
  std::error_code ec;
  const std::string failed = where + ": path " + repr_str(rel) + " cannot be resolved in " + folder + ": ";
  const std::string absolute_folder = fs::absolute(folder, ec).string();
  if (ec) fail(failed + ec.message());
  bool folder_loop = false, loop = false;  // the folder exists and is a directory: no loop there
  const fs::path base = py_resolve(absolute_folder, folder_loop, failed);
  const fs::path path = py_resolve(py_join(absolute_folder, normal), loop, failed);  // at a loop: as far as it got
  struct stat st;
  if (loop || (::stat(path.c_str(), &st) != 0 && errno == ELOOP))  // Python: "Symlink loop from '...'"
    fail(failed + "Symlink loop from " + repr_str(path.string()));
  bool inside = false;
  for (fs::path p = path.parent_path(); !p.empty(); p = p.parent_path()) {
    if (p == base) {
      inside = true;
      break;
    }
    if (p == p.root_path()) break;
  }
  if (!inside)
    fail(where + ": path " + repr_str(rel) + " leaves the pipeline folder " + folder + " (it resolves to " +
         path.string() + ")");
  return path.string();
}

/// An artifact's path (contained_path resolved it) opened for reading without following a symbolic link that
/// appeared since (Python: O_NOFOLLOW, pipeline_format.read_checked); closed when it goes.
struct ArtifactFd {
  int fd = -1;
  /// Throws PipelineError(`failed` + strerror) when the file cannot be opened.
  ArtifactFd(const std::string& path, const std::string& failed) : fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC)) {
    if (fd < 0) throw PipelineError(failed + std::strerror(errno));
  }
  ~ArtifactFd() { ::close(fd); }
  ArtifactFd(const ArtifactFd&) = delete;
  ArtifactFd& operator=(const ArtifactFd&) = delete;
  /// Up to `n` bytes into `out`; the count read (0 at the end).
  size_t read(char* out, size_t n, const std::string& path, const std::string& where) const {
    for (;;) {
      const ssize_t got = ::read(fd, out, n);
      if (got >= 0) return size_t(got);
      if (errno != EINTR) throw PipelineError(where + ": cannot read " + path + ": " + std::strerror(errno));
    }
  }
};

std::string sha256_file(const std::string& path) {
  const ArtifactFd f(path, path + ": cannot be read: ");
  leapp::detail::Sha256Stream hash;
  std::vector<char> chunk(1 << 20);
  while (const size_t got = f.read(chunk.data(), chunk.size(), path, path)) hash.update(chunk.data(), got);
  auto digest = hash.digest();
  return leapp::detail::to_hex(digest.data(), digest.size());
}

uint64_t max_artifact_bytes() {
  const char* raw = std::getenv("LEAPP_MAX_ARTIFACT_BYTES");
  std::string text = raw ? raw : "";
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.erase(0, 1);
  if (text.empty()) return uint64_t(4) << 30;
  uint64_t n = 0;
  auto r = std::from_chars(text.data(), text.data() + text.size(), n);
  if (r.ec != std::errc() || r.ptr != text.data() + text.size() || n == 0)
    throw PipelineError("LEAPP_MAX_ARTIFACT_BYTES=" + repr_str(text) + " is not a positive number of bytes");
  return n;
}

void check_artifact_size(const std::string& path, uint64_t size, const std::string& where) {
  const uint64_t limit = max_artifact_bytes();
  if (size > limit)
    throw PipelineError(where + ": " + path + " has " + std::to_string(size) + " bytes, more than the limit of " +
                        std::to_string(limit) + " (LEAPP_MAX_ARTIFACT_BYTES)");
}

std::string read_artifact(const std::string& path, const std::string& where) {
  const ArtifactFd f(path, where + ": cannot open " + path + ": ");
  struct stat st {};
  if (::fstat(f.fd, &st) != 0 || !S_ISREG(st.st_mode))  // the file opened, not whatever the path names now
    throw PipelineError(where + ": " + path + " is not a regular file");
  check_artifact_size(path, uint64_t(st.st_size), where);
  std::string data(size_t(st.st_size), '\0');
  size_t done = 0;
  while (done < data.size()) {
    const size_t got = f.read(data.data() + done, data.size() - done, path, where);
    if (got == 0) break;
    done += got;
  }
  char extra = 0;
  if (done != data.size() || f.read(&extra, 1, path, where) != 0)
    throw PipelineError(where + ": " + path + " changed size while it was read");
  return data;
}

/// Every tensor entry with its field path, in the order Python's reader checks them: each node's inputs
/// and outputs, then the pipeline's inputs and outputs.
std::vector<std::pair<std::string, const JsonValue*>> tensor_entries(const JsonValue& root) {
  std::vector<std::pair<std::string, const JsonValue*>> entries;
  const auto& nodes = root.find("nodes")->array;
  for (size_t n = 0; n < nodes.size(); ++n)
    for (const char* side : {"inputs", "outputs"}) {
      const auto& list = nodes[n].find(side)->array;
      for (size_t i = 0; i < list.size(); ++i)
        entries.emplace_back("nodes[" + std::to_string(n) + "]." + side + "[" + std::to_string(i) + "]", &list[i]);
    }
  for (const char* side : {"inputs", "outputs"}) {
    const auto& list = root.find(side)->array;
    for (size_t i = 0; i < list.size(); ++i) entries.emplace_back(std::string(side) + "[" + std::to_string(i) + "]", &list[i]);
  }
  return entries;
}

// leapp/pipeline_format/metadata.py
constexpr int kMaxMetadataDepth = 8;  // nesting of lists and mappings, the metadata mapping being 1
constexpr size_t kMaxMetadataBytes = size_t(16) << 10;  // one tensor's metadata as compact JSON

/// metadata._problem for what the schema and the JSON parser leave: the nesting depth (the parser
/// refuses NaN and infinities, the schema nulls and other types). The path of the first list or
/// mapping too deep, depth first in document order, as Python names it; empty when none.
std::string too_deep(const JsonValue& v, const std::string& path, int depth) {
  if (v.type != T::kArray && v.type != T::kObject) return {};
  if (depth > kMaxMetadataDepth) return path;
  if (v.type == T::kArray) {
    for (size_t i = 0; i < v.array.size(); ++i) {
      std::string deep = too_deep(v.array[i], path + "[" + std::to_string(i) + "]", depth + 1);
      if (!deep.empty()) return deep;
    }
  } else {
    for (const auto& [key, item] : v.object) {
      std::string deep = too_deep(item, path + "." + key, depth + 1);
      if (!deep.empty()) return deep;
    }
  }
  return {};
}

/// metadata.ABS_MAX_KEY's rule: a number (not a bool), 0 < value <= the largest double, as Python compares it.
bool positive_finite(const JsonValue& v) {
  if (v.type == T::kFloat) return v.number > 0.0;  // the parser refuses infinities and NaN
  if (v.type != T::kInt) return false;
  if (!v.int_overflow) return v.integer > 0;
  if (v.string.empty() || v.string[0] == '-') return false;
  errno = 0;
  std::strtod(v.string.c_str(), nullptr);  // beyond the largest double: ERANGE
  return errno != ERANGE;
}

/// The first `n` code points of UTF-8 text (Python's f"{text:.60}").
std::string cut_code_points(const std::string& text, size_t n) {
  size_t i = 0, points = 0;
  while (i < text.size() && points < n) {
    ++points;
    ++i;
    while (i < text.size() && (static_cast<unsigned char>(text[i]) & 0xC0) == 0x80) ++i;
  }
  return text.substr(0, i);
}

/// Tensors' metadata within its limits: depth, then size as compact JSON (the text TensorInfo::metadata
/// hands out). Python's pipeline_format.reader._check_metadata: the same order and texts.
void check_metadata(const JsonValue& root, const std::string& file) {
  for (const auto& [field, entry] : tensor_entries(root)) {
    const JsonValue* metadata = entry->find("metadata");
    if (metadata == nullptr) continue;
    const std::string where = field + ".metadata";
    std::string deep = too_deep(*metadata, where, 1);
    if (!deep.empty()) fail(file + ": " + deep + ": nested deeper than " + std::to_string(kMaxMetadataDepth) + " levels");
    if (const JsonValue* bound = metadata->type == T::kObject ? metadata->find("abs_max") : nullptr) {
      if (!positive_finite(*bound))
        fail(file + ": " + where + ".abs_max: " + cut_code_points(repr(*bound, false), 60) +
             " is not a positive finite number (the largest magnitude of a value)");
    }
    const size_t size = json_text(*metadata).size();
    if (size > kMaxMetadataBytes)
      fail(file + ": " + where + ": " + std::to_string(size) + " bytes as JSON, more than " +
           std::to_string(kMaxMetadataBytes) + " (metadata labels a tensor)");
  }
}

/// A tensor's optional `batch: [min, max]` (dynamic batch) after the schema: exactly two values, min < max and
/// the traced dim 0 inside. Python's pipeline_format.reader._check_batches: the same order and texts.
void check_batches(const JsonValue& root, const std::string& file) {
  for (const auto& [field, entry] : tensor_entries(root)) {
    const JsonValue* batch = entry->find("batch");
    if (batch == nullptr) continue;
    const std::string where = file + ": " + field + ".batch: ";
    if (batch->array.size() != 2)
      fail(where + "must be [min, max], got " + std::to_string(batch->array.size()) + " values");
    const int64_t lo = batch->array[0].integer, hi = batch->array[1].integer;
    if (!(lo < hi)) fail(where + "min " + std::to_string(lo) + " must be below max " + std::to_string(hi));
    const auto& shape = entry->find("shape")->array;
    if (shape.empty() || shape[0].integer < lo || shape[0].integer > hi) {
      std::string text = "[";
      for (size_t d = 0; d < shape.size(); ++d) text += (d ? ", " : "") + std::to_string(shape[d].integer);
      fail(where + "dim 0 of shape " + text + "] must lie in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    }
  }
}

// leapp/pipeline_format/format.py: MAX_TENSOR_BYTES, MAX_PIPELINE_BYTES, MAX_INT, DTYPE_BYTES
constexpr uint64_t kMaxTensorBytes = uint64_t(1) << 30;
constexpr uint64_t kMaxPipelineBytes = uint64_t(1) << 32;
constexpr uint64_t kMaxInt = (uint64_t(1) << 63) - 1;

size_t dtype_bytes(const std::string& dtype) {
  static const std::map<std::string, size_t> sizes = {
      {"bool", 1},      {"uint8", 1},      {"int8", 1},        {"int16", 2},          {"int32", 4},
      {"int64", 8},     {"uint16", 2},     {"uint32", 4},      {"uint64", 8},         {"float16", 2},
      {"bfloat16", 2},  {"float32", 4},    {"float64", 8},     {"complex32", 4},      {"complex64", 8},
      {"complex128", 16}, {"float8_e4m3fn", 1}, {"float8_e4m3fnuz", 1}, {"float8_e5m2", 1}, {"float8_e5m2fnuz", 1}};
  auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;  // the schema's enum has refused any other name
}

/// reader.tensor_bytes: the bytes of the tensor, kMaxInt + 1 past kMaxInt (counted in 128 bits, so no product of a
/// count up to 2^63 and a dimension up to 2^63 - 1 wraps).
uint64_t tensor_bytes(const std::string& dtype, const std::vector<int64_t>& shape) {
  for (int64_t d : shape)
    if (d == 0) return 0;
  unsigned __int128 n = dtype_bytes(dtype);
  for (int64_t d : shape) {
    n *= static_cast<unsigned __int128>(d);
    if (n > kMaxInt) return kMaxInt + 1;
  }
  return uint64_t(n);
}

std::string bytes_text(uint64_t n) {
  return n > kMaxInt ? "more than " + std::to_string(kMaxInt) + " bytes" : std::to_string(n) + " bytes";
}

/// Python's pipeline_format.reader._check_sizes: every tensor at most kMaxTensorBytes (a dynamic batch at its
/// maximum), all of them at most kMaxPipelineBytes; the same order and texts. Before Pipeline::open allocates
/// anything from these shapes.
void check_sizes(const Description& d, const std::string& file) {
  struct Entry {
    std::string field, what;
    const Spec* spec;
  };
  std::vector<Entry> entries;
  for (size_t n = 0; n < d.nodes.size(); ++n)
    for (const bool inputs : {true, false}) {
      const auto& list = inputs ? d.nodes[n].inputs : d.nodes[n].outputs;
      const std::string side = inputs ? "inputs" : "outputs";
      for (size_t i = 0; i < list.size(); ++i)
        entries.push_back({"nodes[" + std::to_string(n) + "]." + side + "[" + std::to_string(i) + "]",
                           "node " + repr_str(d.nodes[n].name) + " " + side.substr(0, side.size() - 1) + " " +
                               repr_str(list[i].name),
                           &list[i]});
    }
  for (size_t i = 0; i < d.inputs.size(); ++i)
    entries.push_back({"inputs[" + std::to_string(i) + "]", "pipeline input " + repr_str(d.inputs[i].spec.name),
                       &d.inputs[i].spec});
  for (size_t i = 0; i < d.outputs.size(); ++i)
    entries.push_back({"outputs[" + std::to_string(i) + "]", "pipeline output " + repr_str(d.outputs[i].spec.name),
                       &d.outputs[i].spec});
  uint64_t total = 0;
  for (const Entry& e : entries) {
    Spec at = *e.spec;
    const bool batched = at.batch_max > 0 && !at.shape.empty();
    if (batched) at.shape[0] = at.batch_max;
    const uint64_t n = tensor_bytes(at.dtype, at.shape);
    if (n > kMaxTensorBytes)
      fail(file + ": " + e.field + " (" + e.what + "): " + spec_text(at) +
           (batched ? " at its batch maximum " + std::to_string(at.batch_max) : std::string()) + " is " + bytes_text(n) +
           ", more than the " + std::to_string(kMaxTensorBytes) + " bytes a tensor may hold (MAX_TENSOR_BYTES, "
           "docs/pipeline-format.md)");
    total += n;  // at most 200,000 entries of at most 2^30 bytes: no wrap
  }
  if (total > kMaxPipelineBytes)
    fail(file + ": its " + std::to_string(entries.size()) + " tensor entries hold " + std::to_string(total) +
         " bytes in all, more than the " + std::to_string(kMaxPipelineBytes) + " bytes a pipeline's tensors may hold "
         "(MAX_PIPELINE_BYTES, docs/pipeline-format.md)");
}

std::string export_folder(const std::string& arg) {
  std::string folder = shown_path(arg);
  if (is_regular_file(folder)) {  // Python: a file's parent (pipeline.yaml given instead of its folder)
    size_t slash = folder.rfind('/');
    folder = slash == std::string::npos ? "." : slash == 0 ? "/" : folder.substr(0, slash);
  }
  return folder;
}

Description read_description(const std::string& arg, std::shared_ptr<const SignedFiles> signed_files) {
  const std::string folder = export_folder(arg);
  const std::string yaml_file = join_shown(folder, kPipelineYaml);
  const std::string file = join_shown(folder, kPipelineJson);
  if (!is_regular_file(yaml_file)) fail("no pipeline.yaml in " + folder);
  contained_path(folder, kPipelineYaml, yaml_file);
  if (!is_regular_file(file))
    fail("no pipeline.json in " + folder + " (the JSON twin of pipeline.yaml that leapp's C++ runner reads; exports "
         "made before leapp wrote it have none): " + regenerate_hint(folder));
  contained_path(folder, kPipelineJson, file);
  std::string data = read_bounded(file, kMaxFileBytes);
  if (data.size() > kMaxFileBytes)
    fail(file + ": larger than " + std::to_string(kMaxFileBytes) + " bytes (leapp writes a few KiB per node)");
  check_signed(signed_files.get(), file, data, file);  // the bytes parsed are the bytes signed
  JsonValue root;
  try {
    root = leapp::detail::parse_json(data, file, {kMaxDepth, kMaxValues, "docs/pipeline-format.md"});
  } catch (const std::invalid_argument& e) {
    fail(e.what());
  }
  // the twin must be of the pipeline.yaml beside it: checked first, a stale twin is not worth validating
  if (root.type == T::kObject) {
    const JsonValue* digest = root.find(kTwinDigestKey);
    // Python reads pipeline.yaml bounded, and refuses a larger one with this text: never hash it whole
    const std::string yaml_bytes = read_bounded(yaml_file, kMaxFileBytes);
    if (yaml_bytes.size() > kMaxFileBytes)
      fail(yaml_file + ": larger than " + std::to_string(kMaxFileBytes) + " bytes (leapp writes a few KiB per node)");
    check_signed(signed_files.get(), yaml_file, yaml_bytes, yaml_file);
    const auto yaml_digest = leapp::detail::sha256(yaml_bytes.data(), yaml_bytes.size());
    std::string actual = leapp::detail::to_hex(yaml_digest.data(), yaml_digest.size());
    if (!digest || digest->type != T::kString)
      fail(file + ": " + kTwinDigestKey + ": missing (the sha256 of the pipeline.yaml it was made from): " +
           regenerate_hint(folder));
    if (digest->string != actual)
      fail(file + ": " + kTwinDigestKey + ": " + repr(*digest, true) + " is not the sha256 of " + yaml_file + " (" +
           actual + "): pipeline.yaml changed after pipeline.json was written; " + regenerate_hint(folder));
    // a digest recomputed over an edited pipeline.yaml is not enough: it must be the twin's rendering
    if (const auto diff = first_difference(root, yaml_bytes, kTwinDigestKey)) {  // the twin less its digest
      const std::string& path = diff->expected.path;
      fail(file + ": " + yaml_file + " differs from it at line " + std::to_string(diff->line) + " (" +
           (path.empty() ? std::string("after the last field") : leapp::detail::shown(path)) +
           "), where leapp writes `" + leapp::detail::shown(diff->expected.text) +
           "`: the two descriptions of one export must say the same (leapp-run reads pipeline.json, leapp.load "
           "pipeline.yaml); " + regenerate_hint(folder));
    }
  }
  validate(root, file);
  Description d = convert(root);
  check_references(d, file);
  check_metadata(root, file);
  check_batches(root, file);
  check_sizes(d, file);
  d.folder = folder;
  d.signed_files = std::move(signed_files);
  d.yaml_file = yaml_file;
  d.file = file;
  return d;
}

}  // namespace leapp::pipeline_detail
