#include "coremesh/core/error.hpp"

#include <cstring>

namespace coremesh {
namespace {

std::string compose(const std::string& message, const std::string& hint, const char* file,
                    int line) {
  const char* base = std::strrchr(file, '/');
  std::string text = fmt::format("{} ({}:{})", message, base ? base + 1 : file, line);
  if (!hint.empty()) text += fmt::format("\n  HINT: {}", hint);
  return text;
}

}  // namespace

Error::Error(std::string message, std::string hint, const char* file, int line)
    : std::runtime_error(compose(message, hint, file, line)),
      message_(std::move(message)),
      hint_(std::move(hint)),
      file_(file),
      line_(line) {}

namespace detail {
void throw_error(int kind, std::string message, std::string hint, const char* file, int line) {
  if (kind == 0) throw InvalidArgument(std::move(message), std::move(hint), file, line);
  throw Error(std::move(message), std::move(hint), file, line);
}
}  // namespace detail

}  // namespace coremesh
