// Writes every bad-input target's seed corpus (DIR/<target>/seed-N, made by
// the project's own writers) and its libFuzzer dictionary (DIR/<target>.dict).
// usage: fuzz_write_seeds DIR
#include <fmt/format.h>

#include <filesystem>
#include <fstream>

#include "bad_input.hpp"

int main(int argc, char** argv) {
  if (argc != 2) {
    fmt::print(stderr, "usage: {} DIR\n", argv[0]);
    return 2;
  }
  namespace fs = std::filesystem;
  for (const auto& t : coremesh::fuzz::targets()) {
    const fs::path dir = fs::path(argv[1]) / t.name;
    fs::create_directories(dir);
    const auto seeds = t.seeds();
    for (size_t i = 0; i < seeds.size(); ++i)
      std::ofstream(dir / fmt::format("seed-{}", i), std::ios::binary) << seeds[i];
    std::ofstream dict(fs::path(argv[1]) / (std::string(t.name) + ".dict"));
    for (const auto& token : t.dictionary()) {
      dict << '"';
      for (unsigned char c : token) dict << fmt::format("\\x{:02x}", c);
      dict << "\"\n";
    }
    fmt::print("{}: {} seeds\n", t.name, seeds.size());
  }
  return 0;
}
