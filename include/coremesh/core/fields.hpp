// FieldTable: the one description of a config struct's fields — name, type,
// default, help and checks — from which everything else is generated: JSON
// read and write (an unknown key is refused with the list of known ones),
// command-line flags (src/cli/field_flags.hpp), the differences between two
// configs, and the per-field checks of validate().
//
//   static const FieldTable<Cfg>& table() {
//     static const FieldTable<Cfg> t = FieldTable<Cfg>("train")
//         .add("steps", [](auto& c) -> auto& { return c.steps; }, "optimizer steps", positive<int64_t>())
//         .add_enum("gating", [](auto& c) -> auto& { return c.gating; },
//                   {{Gating::softmax, "softmax"}, {Gating::sigmoid, "sigmoid"}}, "router score function");
//     return t;
//   }
//
// Types: integers, floating point, bool, std::string, std::vector<std::string>
// (a list, or one string), and enums through add_enum. Integer fields refuse
// non-integer JSON numbers; floating fields refuse nan and inf; every error
// names the section and the field.
#pragma once

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "coremesh/core/error.hpp"

namespace coremesh {

template <class Config>
struct Field {
  std::string name;                  // JSON key
  std::string flag;                  // command-line flag without "--" (name with '-' for '_' unless set)
  std::vector<std::string> aliases;  // older names still read (JSON keys and flags)
  std::string type;                  // "integer", "number", "bool", "string", "list", "a|b|..."
  std::vector<std::string> choices;  // enums: the accepted names
  std::string help;
  std::function<nlohmann::json(const Config&)> get;
  std::function<void(Config&, const nlohmann::json&)> set;  // throws InvalidArgument naming the field
  std::function<std::string(const Config&)> check;          // a problem sentence, or ""
  std::function<void(Config&)> absent;                      // called when a JSON object lacks the key
};

// Per-field checks for add(): each returns a problem sentence or "".
template <class T>
std::function<std::string(const T&)> positive() {
  return [](const T& v) { return v > T(0) ? "" : fmt::format("{} must be positive", v); };
}
template <class T>
std::function<std::string(const T&)> non_negative() {
  return [](const T& v) { return v >= T(0) ? "" : fmt::format("{} must be >= 0", v); };
}
template <class T>
std::function<std::string(const T&)> in_range(T lo, T hi) {
  return [lo, hi](const T& v) {
    return v >= lo && v <= hi ? "" : fmt::format("{} must be in [{}, {}]", v, lo, hi);
  };
}

template <class Config>
class FieldTable {
 public:
  explicit FieldTable(std::string section) : section_(std::move(section)) {}

  const std::string& section() const { return section_; }
  const std::vector<Field<Config>>& fields() const { return fields_; }

  // `ref(config)` returns a reference to the member (any depth).
  template <class Ref, class T = std::remove_reference_t<std::invoke_result_t<Ref, Config&>>>
  FieldTable& add(std::string name, Ref ref, std::string help,
                  std::function<std::string(const T&)> check = {}) {
    Field<Config> f;
    f.name = std::move(name);
    f.type = type_name<T>();
    f.help = std::move(help);
    f.get = [ref](const Config& c) { return to_json_value(ref(const_cast<Config&>(c))); };
    const std::string where = section_ + "." + f.name;
    f.set = [ref, section = section_, name = f.name](Config& c, const nlohmann::json& j) {
      ref(c) = parse<T>(j, section, name);
    };
    // a floating field is a finite number before its own check runs (a flag
    // may say nan or inf, and comparisons with NaN pass every range)
    if constexpr (std::is_floating_point_v<T>)
      check = [own = std::move(check)](const T& v) {
        if (!std::isfinite(v)) return fmt::format("{} must be a finite number", v);
        return own ? own(v) : std::string();
      };
    if (check)
      f.check = [ref, check, where](const Config& c) {
        const std::string p = check(ref(const_cast<Config&>(c)));
        return p.empty() ? p : where + " = " + p;
      };
    fields_.push_back(std::move(f));
    return *this;
  }

  template <class Ref, class E = std::remove_reference_t<std::invoke_result_t<Ref, Config&>>>
  FieldTable& add_enum(std::string name, Ref ref, std::vector<std::pair<E, std::string>> names,
                       std::string help) {
    Field<Config> f;
    f.name = std::move(name);
    for (const auto& [value, text] : names) f.choices.push_back(text);
    f.type = fmt::format("{}", fmt::join(f.choices, "|"));
    f.help = std::move(help);
    f.get = [ref, names](const Config& c) {
      for (const auto& [value, text] : names)
        if (value == ref(const_cast<Config&>(c))) return nlohmann::json(text);
      return nlohmann::json("?");
    };
    f.set = [ref, names, section = section_, name = f.name, type = f.type](Config& c, const nlohmann::json& j) {
      const std::string s = parse<std::string>(j, section, name);
      for (const auto& [value, text] : names)
        if (text == s) {
          ref(c) = value;
          return;
        }
      CM_THROW(InvalidArgument, fmt::format("set {}.{} to one of {}", section, name, type), "unknown {} '{}'",
               name, s);
    };
    fields_.push_back(std::move(f));
    return *this;
  }

  // Modifiers of the field added last.
  FieldTable& flag(std::string flag) {
    fields_.back().flag = std::move(flag);
    return *this;
  }
  FieldTable& alias(std::string old_name) {
    fields_.back().aliases.push_back(std::move(old_name));
    return *this;
  }
  FieldTable& when_absent(std::function<void(Config&)> fill) {
    fields_.back().absent = std::move(fill);
    return *this;
  }

  const Field<Config>* find(const std::string& name) const {
    for (const auto& f : fields_) {
      if (f.name == name) return &f;
      for (const auto& a : f.aliases)
        if (a == name) return &f;
    }
    return nullptr;
  }

  std::vector<std::string> names() const {
    std::vector<std::string> n;
    for (const auto& f : fields_) n.push_back(f.name);
    return n;
  }

  // Reads the keys of `j` over `base`; `skip` lists keys owned by others
  // (sub-sections).
  Config from_json(const nlohmann::json& j, Config base = {}, const std::vector<std::string>& skip = {}) const {
    CM_CHECK(j.is_object(), fmt::format("write the {} section as a JSON object", section_),
             "the {} config is not a JSON object", section_);
    for (const auto& [key, value] : j.items()) {
      bool skipped = false;
      for (const auto& s : skip) skipped = skipped || s == key;
      if (skipped) continue;
      const Field<Config>* f = find(key);
      CM_CHECK(f, fmt::format("known {} fields: {}", section_, fmt::join(names(), ", ")),
               "unknown {} config field '{}'", section_, key);
      f->set(base, value);
    }
    for (const auto& f : fields_) {
      bool present = j.contains(f.name);
      for (const auto& a : f.aliases) present = present || j.contains(a);
      if (!present && f.absent) f.absent(base);
    }
    return base;
  }

  nlohmann::json to_json(const Config& c) const {
    nlohmann::json j = nlohmann::json::object();
    for (const auto& f : fields_) j[f.name] = f.get(c);
    return j;
  }

  // "section.name: a vs b" for every field that differs.
  std::vector<std::string> differences(const Config& a, const Config& b) const {
    std::vector<std::string> out;
    for (const auto& f : fields_) {
      const nlohmann::json x = f.get(a), y = f.get(b);
      if (x != y) out.push_back(fmt::format("{}: {} vs {}", f.name, x.dump(), y.dump()));
    }
    return out;
  }

  // The per-field checks' problems.
  std::vector<std::string> problems(const Config& c) const {
    std::vector<std::string> out;
    for (const auto& f : fields_)
      if (f.check)
        if (std::string p = f.check(c); !p.empty()) out.push_back(std::move(p));
    return out;
  }

  template <class T>
  static T parse(const nlohmann::json& j, const std::string& section, const std::string& name) {
    auto fail = [&](const std::string& want) {
      CM_THROW(InvalidArgument, fmt::format("give {}.{} {}", section, name, want),
               "{} config field '{}' has the wrong type: {}", section, name, j.dump());
    };
    if constexpr (std::is_same_v<T, bool>) {
      if (!j.is_boolean()) fail("true or false");
      return j.get<bool>();
    } else if constexpr (std::is_integral_v<T>) {
      if (!j.is_number_integer()) fail("an integer");
      // A value outside T is refused, not wrapped (4294967297 is no batch size of 1).
      const bool fits = j.is_number_unsigned() ? std::in_range<T>(j.get<uint64_t>())
                                               : std::in_range<T>(j.get<int64_t>());
      if (!fits)
        fail(fmt::format("an integer in [{}, {}]", std::numeric_limits<T>::min(), std::numeric_limits<T>::max()));
      return j.get<T>();
    } else if constexpr (std::is_floating_point_v<T>) {
      if (!j.is_number()) fail("a number");
      return j.get<T>();
    } else if constexpr (std::is_same_v<T, std::string>) {
      if (!j.is_string()) fail("a string");
      return j.get<std::string>();
    } else {
      static_assert(std::is_same_v<T, std::vector<std::string>>, "unsupported field type");
      if (j.is_string()) return T{j.get<std::string>()};
      if (!j.is_array()) fail("a list of strings");
      T out;
      for (const auto& e : j) {
        if (!e.is_string()) fail("a list of strings");
        out.push_back(e.get<std::string>());
      }
      return out;
    }
  }

 private:
  // A float is written as the shortest decimal that reads back as the same
  // float (0.001, not 0.0010000000474974513).
  template <class T>
  static nlohmann::json to_json_value(const T& v) {
    if constexpr (std::is_same_v<T, float>) return std::stod(fmt::format("{}", v));
    else return nlohmann::json(v);
  }

  template <class T>
  static std::string type_name() {
    if constexpr (std::is_same_v<T, bool>) return "bool";
    else if constexpr (std::is_integral_v<T>) return "integer";
    else if constexpr (std::is_floating_point_v<T>) return "number";
    else if constexpr (std::is_same_v<T, std::string>) return "string";
    else return "list";
  }

  std::string section_;
  std::vector<Field<Config>> fields_;
};

}  // namespace coremesh
