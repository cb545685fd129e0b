#include "field_flags.hpp"

#include <cstdlib>

namespace coremesh::cli {

std::string flag_name(const std::string& field_name) {
  std::string s = field_name;
  std::replace(s.begin(), s.end(), '_', '-');
  return s;
}

nlohmann::json flag_value(const std::string& flag, const std::string& type, const std::vector<std::string>& text) {
  if (type == "list") return text;
  CM_CHECK(text.size() == 1, fmt::format("give {} one value", flag), "{} got {} values", flag, text.size());
  const std::string& v = text[0];
  auto fail = [&](const char* want) -> nlohmann::json {
    CM_THROW(InvalidArgument, fmt::format("give {} {}", flag, want), "{} expects {}, got '{}'", flag, want, v);
  };
  if (type == "integer") {
    char* end = nullptr;
    const long long n = std::strtoll(v.c_str(), &end, 10);
    return v.empty() || *end ? fail("an integer") : nlohmann::json(n);
  }
  if (type == "number") {
    char* end = nullptr;
    const double d = std::strtod(v.c_str(), &end);
    return v.empty() || *end ? fail("a number") : nlohmann::json(d);
  }
  if (type == "bool") {
    if (v == "true" || v == "1" || v == "yes" || v == "on") return true;
    if (v == "false" || v == "0" || v == "no" || v == "off") return false;
    return fail("true or false");
  }
  return v;  // strings and enum names (checked by the table)
}

}  // namespace coremesh::cli
