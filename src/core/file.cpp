#include "coremesh/core/file.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>

#include "coremesh/core/error.hpp"
#include "coremesh/core/log.hpp"

namespace coremesh {
namespace fs = std::filesystem;

namespace {
void fsync_path(const std::string& path, int flags) {
  int fd = ::open(path.c_str(), flags | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

// What to do when writing `bytes` bytes into `dir` failed with `err`.
std::string write_hint(int err, const fs::path& dir, size_t bytes) {
  const double mib = double(bytes) / double(1 << 20);
  const std::string size = mib >= 0.1 ? fmt::format("{:.1f} MiB", mib) : fmt::format("{} bytes", bytes);
  if (err == ENOSPC || err == EDQUOT)
    return fmt::format("free at least {} on the file system of '{}' (df -h '{}'), or write elsewhere", size,
                       dir.string(), dir.string());
  if (err == EFBIG) return fmt::format("raise the file size limit (ulimit -f) above {}", size);
  if (err == EROFS) return fmt::format("'{}' is on a read-only file system: write elsewhere", dir.string());
  return fmt::format("check the disk and the permissions of '{}'", dir.string());
}
}  // namespace

void write_file_atomic(const std::string& path, const std::string& bytes) {
  write_file_atomic(path, std::vector<std::string_view>{bytes});
}

void write_file_atomic(const std::string& path, const std::vector<std::string_view>& pieces) {
  size_t total = 0;
  for (std::string_view piece : pieces) total += piece.size();
  fs::path target(path);
  CM_CHECK(!path.empty(), "name the file to write", "no file name given");
  std::error_code ec;
  CM_CHECK(!fs::is_directory(target, ec), fmt::format("name a file, such as '{}'", (target / "NAME").string()),
           "cannot write '{}': it is a directory", path);
  fs::path dir = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  fs::create_directories(dir, ec);
  // the directory's own error (read-only file system, permission), not the ENOENT of the file in it
  CM_CHECK(!ec || fs::is_directory(dir), write_hint(ec.value(), dir, total), "cannot create the directory '{}' to "
           "write '{}': {}", dir.string(), path, ec.message());
  std::string tmp = (dir / ("." + target.filename().string() + ".tmp." + std::to_string(::getpid()))).string();
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  CM_CHECK(fd >= 0, write_hint(errno, dir, total), "cannot create '{}' to write '{}': {}", tmp, path,
           std::strerror(errno));
  // Any failure: the temporary goes, `path` keeps what it held.
  auto fail = [&](const std::string& what, int err) {
    ::unlink(tmp.c_str());
    const std::string kept = fs::exists(target, ec) ? "it keeps its previous contents" : "no partial file was left";
    CM_THROW(InvalidArgument, write_hint(err, dir, total), "cannot write '{}' ({} bytes): {}: {}; {}", path,
             total, what, std::strerror(err), kept);
  };
  size_t done = 0;
  for (std::string_view piece : pieces) {
    for (size_t at = 0; at < piece.size();) {
      ssize_t w = ::write(fd, piece.data() + at, piece.size() - at);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        const int err = w < 0 ? errno : ENOSPC;  // 0 bytes written: nothing more fits
        ::close(fd);
        fail(fmt::format("write failed after {} bytes", done), err);
      }
      at += size_t(w), done += size_t(w);
    }
  }
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    fail("fsync failed", err);
  }
  if (::close(fd) != 0) fail("close failed", errno);
  if (::rename(tmp.c_str(), path.c_str()) != 0) fail(fmt::format("renaming '{}' failed", tmp), errno);
  fsync_path(dir.string(), O_RDONLY | O_DIRECTORY);
}

std::shared_ptr<FileLock> FileLock::acquire(const std::string& path, const std::string& what,
                                           const std::string& hint) {
  static std::mutex mutex;
  static std::map<std::string, std::weak_ptr<FileLock>> held;  // by absolute path
  std::error_code ec;
  if (fs::path(path).has_parent_path()) fs::create_directories(fs::path(path).parent_path(), ec);
  const std::string key = fs::weakly_canonical(fs::absolute(path), ec).string();
  std::lock_guard lock(mutex);
  if (auto mine = held[key].lock()) return mine;
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  CM_CHECK(fd >= 0, write_hint(errno, fs::path(path).parent_path(), 0), "cannot create the lock file '{}': {}", path,
           std::strerror(errno));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    char pid[32] = {};
    const ssize_t n = ::pread(fd, pid, sizeof pid - 1, 0);
    ::close(fd);
    CM_CHECK(err != EWOULDBLOCK, hint, "{} is in use by another run (process {}, lock '{}')", what,
             n > 0 ? std::string(pid, size_t(n)) : std::string("?"), path);
    // a file system without flock (some network ones): the run goes on unguarded
    CM_LOG_WARN("cannot lock '{}' ({}): nothing keeps another run out of {}", path, std::strerror(err), what);
    return nullptr;
  }
  const std::string me = std::to_string(::getpid());
  // The PID only names the holder in a message: a failed write costs nothing more.
  [[maybe_unused]] const bool named = ::ftruncate(fd, 0) == 0 && ::pwrite(fd, me.data(), me.size(), 0) > 0;
  std::shared_ptr<FileLock> mine(new FileLock(fd));
  held[key] = mine;
  return mine;
}

FileLock::~FileLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

}  // namespace coremesh
