// Files written so that a reader sees the old contents or the new, never a part.
#pragma once

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

}  // namespace coremesh
