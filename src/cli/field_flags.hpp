// Command-line flags generated from a FieldTable (core/fields.hpp): one
// `--<flag>` per field (and per alias), with the field's type, help and
// default in its description; a bool flag alone means true. A flag overrides the config file only when it
// is given; its text is converted to the field's JSON type and set through
// the table, so a flag and a config key are checked the same way.
#pragma once

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "coremesh/core/error.hpp"
#include "coremesh/core/fields.hpp"

namespace coremesh::cli {

// "n_layers" -> "n-layers"
inline std::string flag_name(const std::string& field_name) {
  std::string s = field_name;
  std::replace(s.begin(), s.end(), '_', '-');
  return s;
}

// Converts a flag's text to the JSON value of a field of `type`.
inline nlohmann::json flag_value(const std::string& flag, const std::string& type, const std::vector<std::string>& text) {
  if (type == "list") return text;
  if (type == "bool" && (text.empty() || (text.size() == 1 && text[0].empty()))) return true;  // `--graph` alone
  CM_CHECK(text.size() == 1, fmt::format("give {} one value", flag), "{} got {} values", flag, text.size());
  const std::string& v = text[0];
  auto fail = [&](const char* want) -> nlohmann::json {
    CM_THROW(InvalidArgument, fmt::format("give {} {}", flag, want), "{} expects {}, got '{}'", flag, want, v);
  };
  if (type == "integer") {
    char* end = nullptr;
    errno = 0;
    const long long n = std::strtoll(v.c_str(), &end, 10);
    if (errno == ERANGE) return fail("an integer in [-2^63, 2^63)");  // strtoll saturated: 1e20 read as 2^63 - 1
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


// What --help shows for a flag's value.
inline std::string value_name(const std::string& type) {
  if (type == "integer") return "INT";
  if (type == "number") return "FLOAT";
  if (type == "bool") return "BOOL";
  return "TEXT";
}

template <class C>
class FieldFlags {
 public:
  FieldFlags(CLI::App& cmd, const FieldTable<C>& table, const std::string& group) {
    const C defaults{};
    for (const Field<C>& f : table.fields()) {
      std::vector<std::string> names{f.flag.empty() ? flag_name(f.name) : f.flag};
      for (const auto& a : f.aliases) names.push_back(flag_name(a));
      auto flag = std::make_unique<Flag>();
      flag->field = &f;
      std::string spec;
      for (const auto& n : names) spec += (spec.empty() ? "--" : ",--") + n;
      const std::string help = fmt::format("{} ({}, default {})", f.help, f.type, f.get(defaults).dump());
      flag->option = cmd.add_option(spec, flag->text, help)->group(group)->type_name(value_name(f.type));
      if (f.type == "list") flag->option->expected(1, -1);
      else if (f.type == "bool") flag->option->expected(0, 1);
      else flag->option->expected(1);
      flags_.push_back(std::move(flag));
    }
  }

  // Sets the given flags' values on `config`.
  void apply(C& config) const {
    for (const auto& f : flags_)
      if (f->option->count() > 0)
        f->field->set(config, flag_value(f->option->get_name(), f->field->type, f->text));
  }

  bool given(const std::string& field_name) const {
    for (const auto& f : flags_)
      if (f->field->name == field_name) return f->option->count() > 0;
    return false;
  }

 private:
  struct Flag {
    const Field<C>* field = nullptr;
    CLI::Option* option = nullptr;
    std::vector<std::string> text;
  };
  std::vector<std::unique_ptr<Flag>> flags_;
};

}  // namespace coremesh::cli
