// Files written so that a reader sees the old contents or the new, never a part.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace coremesh {

// Replaces `path` by `bytes`: a temporary file beside it (.NAME.tmp.PID, never
// a name the user may have), fsync, rename over `path`, fsync of the
// directory (created if missing). On failure `path` keeps what it held, the
// temporary is removed, and the error says what to change (disk full, ...).
void write_file_atomic(const std::string& path, const std::string& bytes);
// The same for pieces written one after the other (none is copied).
void write_file_atomic(const std::string& path, const std::vector<std::string_view>& pieces);

// An exclusive advisory lock (flock) on `path` (created, with this PID in
// it), held while a handle lives and released by the kernel if the process
// dies: no stale lock survives a crash. The lock is the process's: a second
// acquire of the same path here shares it. Throws with `hint` and the
// holder's PID if another process holds it; returns nullptr (with a
// warning) on a file system without flock.
class FileLock {
 public:
  static std::shared_ptr<FileLock> acquire(const std::string& path, const std::string& what, const std::string& hint);
  ~FileLock();
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  explicit FileLock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

}  // namespace coremesh
