#include "coremesh/core/env.hpp"

#include <cstdlib>

#include "coremesh/core/error.hpp"

namespace coremesh::env {

std::optional<std::string> get(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

int64_t get_int(const char* name, int64_t fallback) {
  auto value = get(name);
  if (!value) return fallback;
  char* end = nullptr;
  long long parsed = std::strtoll(value->c_str(), &end, 10);
  CM_CHECK(end != value->c_str() && *end == '\0', fmt::format("set {} to a whole number", name),
           "environment variable {}='{}' is not an integer", name, *value);
  return parsed;
}

double get_double(const char* name, double fallback) {
  auto value = get(name);
  if (!value) return fallback;
  char* end = nullptr;
  double parsed = std::strtod(value->c_str(), &end);
  CM_CHECK(end != value->c_str() && *end == '\0', fmt::format("set {} to a number", name),
           "environment variable {}='{}' is not a number", name, *value);
  return parsed;
}

double wait_timeout_s() {
  constexpr const char* kName = "COREMESH_WAIT_TIMEOUT_S";
  const auto value = get(kName);
  if (value && (*value == "off" || *value == "inf")) return kNoWatchdogS;
  const double s = get_double(kName, 300.0);
  CM_CHECK(s >= 0, "set it to the seconds a wait may take, or 0 (or off) for no watchdog",
           "{}='{}' is not a number of seconds", kName, *value);
  return s == 0 ? kNoWatchdogS : std::min(s, kNoWatchdogS);
}

int64_t parse_size(const std::string& text) {
  char* end = nullptr;
  double number = std::strtod(text.c_str(), &end);
  CM_CHECK(end != text.c_str() && number >= 0, "write a size such as 4096, 64K, 256M or 2G",
           "'{}' is not a size", text);
  std::string unit(end);
  int64_t scale = 1;
  if (unit == "" || unit == "B") scale = 1;
  else if (unit == "K" || unit == "KB" || unit == "KiB") scale = int64_t{1} << 10;
  else if (unit == "M" || unit == "MB" || unit == "MiB") scale = int64_t{1} << 20;
  else if (unit == "G" || unit == "GB" || unit == "GiB") scale = int64_t{1} << 30;
  else CM_CHECK(false, "use one of the units K, M, G", "'{}' has an unknown unit '{}'", text, unit);
  const double bytes = number * static_cast<double>(scale);
  CM_CHECK(bytes < 0x1p62, "write a size below 4 EiB, such as 64M or 2G", "'{}' is too large a size", text);
  return static_cast<int64_t>(bytes);
}

}  // namespace coremesh::env
