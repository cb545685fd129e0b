#include "coremesh/runtime/op_desc.hpp"

#include <fmt/format.h>

namespace coremesh::runtime {

std::string OpKey::text() const {
  std::string s = op + "|";
  for (size_t i = 0; i < shapes.size(); ++i) s += (i ? "," : "") + shape_str(shapes[i]);
  s += "|";
  for (size_t i = 0; i < dtypes.size(); ++i) s += std::string(i ? "," : "") + std::string(dtype_name(dtypes[i]));
  s += fmt::format("|cube={}|vector={}", limits.cube, limits.vector);
  if (!attrs.empty()) s += "|" + attrs;
  return s;
}

std::optional<std::string> OpKey::attr(std::string_view name) const {
  std::string_view rest = attrs;
  while (!rest.empty()) {
    const size_t end = std::min(rest.find(';'), rest.size());
    const std::string_view item = rest.substr(0, end);
    const size_t eq = item.find('=');
    if (eq != std::string_view::npos && item.substr(0, eq) == name) return std::string(item.substr(eq + 1));
    rest.remove_prefix(std::min(end + 1, rest.size()));
  }
  return std::nullopt;
}

std::string OpDesc::describe(const std::function<std::string(const Tensor&)>& name_of) const {
  auto list = [&](const std::vector<Tensor>& ts) {
    std::string s;
    for (size_t i = 0; i < ts.size(); ++i)
      s += fmt::format("{}{}{}{}", i ? ", " : "", name_of(ts[i]), shape_str(ts[i].shape()),
                       dtype_name(ts[i].dtype()));
    return s;
  };
  std::string s = key.op + "(" + list(inputs) + ")";  // inputs named first
  s += " -> " + (outputs.empty() ? std::string("()") : list(outputs));
  if (!key.attrs.empty()) s += " {" + key.attrs + "}";
  return s;
}

}  // namespace coremesh::runtime
