// Levelled logging to stderr. The level comes from COREMESH_LOG_LEVEL
// (trace, debug, info, warn, error, off; default warn) or set_log_level().
#pragma once

#include <fmt/format.h>

#include <string_view>

namespace coremesh {

enum class LogLevel { trace = 0, debug, info, warn, error, off };

LogLevel log_level();
void set_log_level(LogLevel level);
// Parses "debug", "INFO", ...; throws InvalidArgument on anything else.
LogLevel parse_log_level(std::string_view text);
void log_write(LogLevel level, std::string_view text);

template <typename... Args>
void log(LogLevel level, fmt::format_string<Args...> format, Args&&... args) {
  if (level < log_level()) return;
  log_write(level, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace coremesh

#define CM_LOG_DEBUG(...) ::coremesh::log(::coremesh::LogLevel::debug, __VA_ARGS__)
#define CM_LOG_INFO(...) ::coremesh::log(::coremesh::LogLevel::info, __VA_ARGS__)
#define CM_LOG_WARN(...) ::coremesh::log(::coremesh::LogLevel::warn, __VA_ARGS__)
#define CM_LOG_ERROR(...) ::coremesh::log(::coremesh::LogLevel::error, __VA_ARGS__)
