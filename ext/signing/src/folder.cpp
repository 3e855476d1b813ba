// ext/signing/src/folder.cpp: the export folder walked and its files hashed, never following a symbolic link.
//
// Everything goes through file descriptors (openat with O_NOFOLLOW, fstatat without following), so a link
// swapped in after the walk is refused at open rather than followed out of the folder. Upstream
// (model_signing's file serializer) refuses symbolic links and special files under the whole folder, ignored
// paths included; so does leapp, even for a link upstream would accept with allow_symlinks.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "leapp/signing.h"
#include "libcrypto.h"
#include "verify_internal.h"

namespace leapp::signing::detail {

namespace {

bool ignored(const std::string& rel, const std::vector<std::string>& ignore) {
  for (const std::string& p : ignore)
    if (rel == p || (rel.size() > p.size() && rel.compare(0, p.size(), p) == 0 && rel[p.size()] == '/')) return true;
  return false;
}

struct Walk {
  const std::string& folder;
  const std::vector<std::string>& ignore;
  std::vector<std::string> files;
  size_t entries = 0;

  [[noreturn]] void fail(const std::string& rel, const std::string& why) {
    throw SignatureProblem(folder + ": '" + rel + "' " + why);
  }

  void dir(int fd, const std::string& prefix, int depth) {
    if (depth > kMaxWalkDepth) fail(prefix, "is nested more than " + std::to_string(kMaxWalkDepth) + " folders deep");
    const int listing = ::dup(fd);
    DIR* d = listing < 0 ? nullptr : ::fdopendir(listing);
    if (!d) {
      if (listing >= 0) ::close(listing);
      throw SignatureProblem(folder + ": cannot list '" + (prefix.empty() ? "." : prefix) + "': " + std::strerror(errno));
    }
    std::vector<std::string> names;
    errno = 0;
    while (const dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name == "." || name == "..") continue;
      if (++entries > kMaxWalkEntries) {
        ::closedir(d);
        throw SignatureProblem(folder + ": more than " + std::to_string(kMaxWalkEntries) + " files and folders");
      }
      names.push_back(name);
    }
    ::closedir(d);
    std::sort(names.begin(), names.end());  // the same folder, the same first refusal
    for (const std::string& name : names) {
      const std::string rel = prefix.empty() ? name : prefix + "/" + name;
      if (rel.size() > kMaxPathBytes) fail(rel.substr(0, 200) + "...", "has a path longer than " + std::to_string(kMaxPathBytes) + " bytes");
      struct stat st {};
      if (::fstatat(fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0)
        fail(rel, std::string("cannot be examined: ") + std::strerror(errno));
      if (S_ISLNK(st.st_mode)) fail(rel, "is a symbolic link; a signed export may hold none");
      if (S_ISDIR(st.st_mode)) {
        Fd sub(::openat(fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
        if (sub.fd < 0) fail(rel, std::string("cannot be opened: ") + std::strerror(errno));
        dir(sub.fd, rel, depth + 1);
      } else if (S_ISREG(st.st_mode)) {
        if (!ignored(rel, ignore)) files.push_back(rel);
      } else {
        fail(rel, "is not a regular file or folder (a device, pipe or socket); a signed export may hold none");
      }
    }
  }
};

}  // namespace

std::vector<std::string> walk_folder(int root_fd, const std::string& folder, const std::vector<std::string>& ignore) {
  Walk walk{folder, ignore, {}, 0};
  walk.dir(root_fd, "", 1);
  std::sort(walk.files.begin(), walk.files.end());
  return walk.files;
}

int open_beneath(int root_fd, const std::string& rel) {
  int dir = root_fd;
  size_t start = 0;
  for (;;) {
    const size_t slash = rel.find('/', start);
    const std::string part = rel.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
    const bool last = slash == std::string::npos;
    // the last component: O_NONBLOCK so a pipe put in its place cannot block the open
    const int flags = last ? (O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK | O_NOCTTY)
                           : (O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    const int next = ::openat(dir, part.c_str(), flags);
    const int saved = errno;
    if (dir != root_fd) ::close(dir);
    if (next < 0) {
      errno = saved;
      return -1;
    }
    if (last) return next;
    dir = next;
    start = slash + 1;
  }
}

#ifndef LEAPP_NO_OPENSSL_HEADERS

std::string hash_file(int root_fd, const std::string& folder, const std::string& rel, std::vector<char>& buffer) {
  const std::string path = folder + "/" + rel;
  Fd f(open_beneath(root_fd, rel));
  if (f.fd < 0) throw SignatureProblem(path + ": cannot be opened: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(f.fd, &st) != 0 || !S_ISREG(st.st_mode))
    throw SignatureProblem(path + ": is not a regular file (it changed while the folder was verified)");
  const Crypto& c = crypto();
  DigestContext ctx(c);
  if (c.EVP_DigestInit_ex(ctx.ctx, c.EVP_sha256(), nullptr) != 1)
    throw SignatureProblem("cannot verify signatures: sha256 failed in libcrypto (" + crypto_errors(c) + ")");
  for (;;) {
    const ssize_t got = ::read(f.fd, buffer.data(), buffer.size());
    if (got < 0) {
      if (errno == EINTR) continue;
      throw SignatureProblem(path + ": cannot be read: " + std::strerror(errno));
    }
    if (got == 0) break;
    if (c.EVP_DigestUpdate(ctx.ctx, buffer.data(), size_t(got)) != 1)
      throw SignatureProblem("cannot verify signatures: sha256 failed in libcrypto (" + crypto_errors(c) + ")");
  }
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (c.EVP_DigestFinal_ex(ctx.ctx, out, &len) != 1)
    throw SignatureProblem("cannot verify signatures: sha256 failed in libcrypto (" + crypto_errors(c) + ")");
  return hex_digest(out, len);
}

#endif

}  // namespace leapp::signing::detail
