// Typed access to COREMESH_* environment variables with clear errors.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace coremesh::env {

std::optional<std::string> get(const char* name);
// Integer value of `name`, or `fallback` when unset; throws InvalidArgument
// naming the variable when the value is not an integer.
int64_t get_int(const char* name, int64_t fallback);
double get_double(const char* name, double fallback);
// COREMESH_WAIT_TIMEOUT_S: seconds a blocking wait may take before the
// watchdog reports what it waits on (default 300). 0, inf or off: no
// watchdog (kNoWatchdogS, which every clock holds); larger values are capped
// there too. A negative value or NaN is refused.
constexpr double kNoWatchdogS = 1e9;  // about 31 years
double wait_timeout_s();
// Parses sizes such as "64M", "1G", "4096" (binary units).
int64_t parse_size(const std::string& text);

}  // namespace coremesh::env
