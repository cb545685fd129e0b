// Helpers shared by the train tests.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "coremesh/core/tensor.hpp"

using NamedTensorList = std::vector<std::pair<std::string, coremesh::Tensor>>;

// A fresh directory under /tmp, removed with its contents at scope exit.
struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/coremesh_test_XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

// Source tree root (tests run from the build tree).
inline std::string source_root() {
  std::filesystem::path p = std::filesystem::path(__FILE__).parent_path().parent_path().parent_path();
  return p.string();
}
