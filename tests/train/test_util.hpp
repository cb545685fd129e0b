// Helpers shared by the train tests.
#pragma once

#include <cstdlib>
#include <cstdint>
#include <filesystem>
#include <fstream>
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

// Writes a small Genesis-like text of `words` words (deterministic) to `path`.
inline void write_tiny_corpus(const std::string& path, int words) {
  std::ofstream out(path);
  const char* vocabulary[] = {"in the beginning ", "god created ", "the heaven ", "and the earth. ",
                              "and the earth was ", "without form, ", "and void; ", "and darkness "};
  uint64_t x = 7;
  for (int i = 0; i < words; ++i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    out << vocabulary[(x >> 33) % 8];
  }
}

// Source tree root (tests run from the build tree).
inline std::string source_root() {
  std::filesystem::path p = std::filesystem::path(__FILE__).parent_path().parent_path().parent_path();
  return p.string();
}
