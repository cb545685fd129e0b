#include "coremesh/core/log.hpp"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <string>

#include "coremesh/core/env.hpp"
#include "coremesh/core/error.hpp"

namespace coremesh {
namespace {

LogLevel initial_level() {
  auto text = env::get("COREMESH_LOG_LEVEL");
  return text ? parse_log_level(*text) : LogLevel::warn;
}

std::atomic<int>& level_storage() {
  static std::atomic<int> level{static_cast<int>(initial_level())};
  return level;
}

}  // namespace

LogLevel parse_log_level(std::string_view text) {
  std::string lower(text);
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "trace") return LogLevel::trace;
  if (lower == "debug") return LogLevel::debug;
  if (lower == "info") return LogLevel::info;
  if (lower == "warn" || lower == "warning") return LogLevel::warn;
  if (lower == "error") return LogLevel::error;
  if (lower == "off") return LogLevel::off;
  CM_CHECK(false, "use one of trace, debug, info, warn, error, off",
           "unknown log level '{}' (COREMESH_LOG_LEVEL)", text);
  return LogLevel::off;
}

LogLevel log_level() { return static_cast<LogLevel>(level_storage().load(std::memory_order_relaxed)); }

void set_log_level(LogLevel level) { level_storage().store(static_cast<int>(level)); }

void log_write(LogLevel level, std::string_view text) {
  static constexpr const char* kNames[] = {"TRACE", "DEBUG", "INFO", "WARN", "ERROR", "OFF"};
  static std::mutex mutex;
  using namespace std::chrono;
  double seconds =
      duration<double>(steady_clock::now().time_since_epoch()).count();
  std::lock_guard lock(mutex);
  std::fprintf(stderr, "[coremesh %s %.6f] %.*s\n", kNames[static_cast<int>(level)], seconds,
               static_cast<int>(text.size()), text.data());
}

}  // namespace coremesh
