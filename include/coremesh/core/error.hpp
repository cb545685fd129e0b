// Errors: exceptions that carry where they were raised and a hint that says
// how to fix the problem (llm.c's fail-fast style, but recoverable).
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace coremesh {

class Error : public std::runtime_error {
 public:
  Error(std::string message, std::string hint, const char* file, int line);

  const std::string& message() const noexcept { return message_; }
  const std::string& hint() const noexcept { return hint_; }
  const char* file() const noexcept { return file_; }
  int line() const noexcept { return line_; }

 private:
  std::string message_;
  std::string hint_;
  const char* file_;
  int line_;
};

// Raised for arguments the caller can change (bad shape, bad limit, ...).
class InvalidArgument : public Error {
  using Error::Error;
};

// Raised when a blocking wait exceeds its watchdog; the message names who
// waits for what.
class TimeoutError : public Error {
  using Error::Error;
};

// Raised on the host when work that ran asynchronously failed.
class KernelError : public Error {
  using Error::Error;
};

namespace detail {
[[noreturn]] void throw_error(int kind, std::string message, std::string hint, const char* file,
                              int line);
}  // namespace detail

}  // namespace coremesh

// CM_CHECK(cond, hint, fmt, args...): throw InvalidArgument unless cond holds.
#define CM_CHECK(cond, hint, ...)                                                           \
  do {                                                                                      \
    if (!(cond)) [[unlikely]]                                                               \
      ::coremesh::detail::throw_error(0, ::fmt::format(__VA_ARGS__), (hint), __FILE__, __LINE__); \
  } while (0)

// CM_THROW(Type, hint, fmt, args...): throw an error of the given class.
#define CM_THROW(Type, hint, ...) \
  throw Type(::fmt::format(__VA_ARGS__), (hint), __FILE__, __LINE__)

// Internal invariant: a failure is a bug in coremesh, not in the caller.
#define CM_ASSERT(cond)                                                                     \
  do {                                                                                      \
    if (!(cond)) [[unlikely]]                                                               \
      ::coremesh::detail::throw_error(1, "internal invariant failed: " #cond,               \
                                      "this is a coremesh bug; please report it", __FILE__, \
                                      __LINE__);                                            \
  } while (0)
