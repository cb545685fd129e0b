#include "coremesh/core/json.hpp"

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <vector>

#include "coremesh/core/error.hpp"

namespace coremesh {

nlohmann::json parse_user_json(std::string_view text, const std::string& source) {
  using Event = nlohmann::json::parse_event_t;
  std::vector<std::set<std::string>> objects;  // the keys seen in each open object
  std::string twice;
  const nlohmann::json::parser_callback_t note_keys = [&](int, Event event, nlohmann::json& parsed) {
    if (event == Event::object_start) objects.emplace_back();
    if (event == Event::object_end) objects.pop_back();
    if (event == Event::key && !objects.back().insert(parsed.get<std::string>()).second && twice.empty())
      twice = parsed.get<std::string>();
    return true;
  };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text, note_keys);
  } catch (const nlohmann::json::exception& e) {
    CM_THROW(InvalidArgument, "fix the JSON syntax", "cannot parse '{}': {}", source, e.what());
  }
  CM_CHECK(twice.empty(), fmt::format("keep one \"{}\" in that object", twice),
           "'{}' gives the key \"{}\" twice in one object", source, twice);
  return j;
}

nlohmann::json load_user_json(const std::string& path, const std::string& what, const std::string& hint) {
  std::error_code ec;  // an unreadable path is "cannot open" below
  CM_CHECK(!std::filesystem::is_directory(path, ec), hint, "{} '{}' is a directory", what, path);
  std::ifstream in(path);
  CM_CHECK(in.good(), hint, "cannot open {} '{}'", what, path);
  std::stringstream text;
  text << in.rdbuf();
  return parse_user_json(text.str(), path);
}

}  // namespace coremesh
