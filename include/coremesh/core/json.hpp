// The JSON files people write (configs, cluster files), parsed strictly.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

namespace coremesh {

// `text` parsed; a syntax error, or a key written twice in one object (a
// JSON parser silently keeps one of the two values), is an InvalidArgument
// that names `source` and says what to fix.
nlohmann::json parse_user_json(std::string_view text, const std::string& source);

// The file at `path`, read and parsed as above; `what` names it in errors
// ("cluster file"), `hint` says where to look when it cannot be opened.
nlohmann::json load_user_json(const std::string& path, const std::string& what, const std::string& hint);

}  // namespace coremesh
