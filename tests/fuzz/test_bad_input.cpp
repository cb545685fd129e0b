// Bad input (issue 29): a bounded, seeded random mutator over the bad-input
// targets of fuzz/bad_input.hpp (config JSON, schedule text, safetensors,
// training data), the same targets the libFuzzer harnesses run. Every input
// must be accepted or refused with a coremesh::InvalidArgument that says what
// to change; another exception, a crash, a sanitizer report or an input that
// takes over 2 s is a finding. Then one regression case per finding fixed.
//
// The sequence of inputs is fixed by the seed; each target runs
// COREMESH_BAD_INPUT_ITERATIONS inputs (default 4000) or stops early at
// COREMESH_BAD_INPUT_SECONDS (default 40; the sanitizer trees are slower).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "bad_input.hpp"
#include "coremesh/core/error.hpp"
#include "coremesh/parallel/schedule.hpp"
#include "coremesh/train/safetensors.hpp"
#include "coremesh/train/train_config.hpp"

namespace {

using coremesh::fuzz::Outcome;
using coremesh::fuzz::Target;

long env_or(const char* name, long fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtol(v, nullptr, 10) : fallback;
}

// An input as C-escaped text, cut at 600 bytes, for failure messages.
std::string escaped(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < 600; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '\\' || c == '"') out += {'\\', char(c)};
    else if (c >= 32 && c < 127) out += char(c);
    else out += fmt::format("\\x{:02x}", c);
  }
  return s.size() > 600 ? out + "..." : out;
}

class Mutator {
 public:
  Mutator(uint64_t seed, std::vector<std::string> dictionary) : rng_(seed), dict_(std::move(dictionary)) {}

  size_t below(size_t n) { return n == 0 ? 0 : size_t(rng_() % n); }

  // 1 to 4 edits of `s`: bit flips, byte values, dictionary tokens, erased,
  // duplicated or spliced ranges (from `other`), numbers replaced.
  std::string mutate(std::string s, const std::string& other) {
    const int edits = 1 + int(below(4));
    for (int e = 0; e < edits; ++e) {
      const size_t pos = below(s.size() + 1);
      switch (below(8)) {
        case 0:
          if (!s.empty()) s[pos % s.size()] ^= char(1u << below(8));
          break;
        case 1: {
          static const char kBytes[] = {0, '\xff', '\x7f', '\x80', '0', '9', '-', '\n', ' ', '"'};
          if (!s.empty()) s[pos % s.size()] = kBytes[below(sizeof kBytes)];
          break;
        }
        case 2:
        case 3:
          if (!dict_.empty()) s.insert(pos, dict_[below(dict_.size())]);
          break;
        case 4:
          s.erase(pos, 1 + below(16));
          break;
        case 5: {
          const size_t len = std::min(s.size() - pos, 1 + below(64));
          s.insert(pos, s.substr(pos, len));
          break;
        }
        case 6:
          if (!other.empty()) s = s.substr(0, pos) + other.substr(below(other.size()));
          break;
        case 7: {
          // a run of digits becomes a dictionary token (numbers in, numbers out)
          size_t d = pos;
          while (d < s.size() && !std::isdigit(static_cast<unsigned char>(s[d]))) ++d;
          size_t end = d;
          while (end < s.size() && std::isdigit(static_cast<unsigned char>(s[end]))) ++end;
          if (d < s.size() && !dict_.empty()) s.replace(d, end - d, dict_[below(dict_.size())]);
          break;
        }
      }
    }
    if (s.size() > 65536) s.resize(65536);
    return s;
  }

 private:
  std::mt19937_64 rng_;
  std::vector<std::string> dict_;
};

struct Counts {
  long tried = 0, accepted = 0, refused = 0, findings = 0;
  double slowest_s = 0;
};

Counts fuzz(const Target& t, uint64_t seed) {
  const long iterations = env_or("COREMESH_BAD_INPUT_ITERATIONS", 4000);
  const double budget_s = double(env_or("COREMESH_BAD_INPUT_SECONDS", 40));
  std::vector<std::string> corpus = t.seeds();
  Mutator m(seed, t.dictionary());
  Counts c;
  const auto start = std::chrono::steady_clock::now();
  auto seconds_since = [](auto t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  // The seeds first: each must be accepted.
  for (const auto& s : corpus) EXPECT_EQ(t.run(s), Outcome::accepted) << t.name << " seed: " << escaped(s);
  for (long i = 0; i < iterations && seconds_since(start) < budget_s; ++i) {
    const std::string& base = corpus[m.below(corpus.size())];
    const std::string& other = corpus[m.below(corpus.size())];
    std::string input, part, rest;
    if (t.split && m.below(2) == 0 && t.split(base, part, rest))
      input = t.join(m.mutate(part, other), rest);
    else
      input = m.mutate(base, other);
    const auto t0 = std::chrono::steady_clock::now();
    ++c.tried;
    try {
      if (t.run(input) == Outcome::accepted) {
        ++c.accepted;
        if (corpus.size() < 1000) corpus.push_back(input);  // valid inputs breed further ones
      } else {
        ++c.refused;
      }
    } catch (const std::exception& e) {
      ++c.findings;
      ADD_FAILURE() << t.name << " input #" << i << " \"" << escaped(input) << "\": " << e.what();
    }
    const double took = seconds_since(t0);
    c.slowest_s = std::max(c.slowest_s, took);
    if (took > 2.0) {
      ++c.findings;
      ADD_FAILURE() << t.name << " input #" << i << " took " << took << " s: \"" << escaped(input) << "\"";
    }
    if (c.findings >= 5) break;
  }
  std::printf("bad input %s: %ld inputs, %ld accepted, %ld refused, %ld findings, slowest %.3f s\n", t.name,
              c.tried, c.accepted, c.refused, c.findings, c.slowest_s);
  return c;
}

class BadInputFuzz : public ::testing::TestWithParam<const char*> {};

TEST_P(BadInputFuzz, EveryInputIsAcceptedOrRefusedWithAHint) {
  const Target& t = coremesh::fuzz::target(GetParam());
  const Counts c = fuzz(t, 29);
  EXPECT_EQ(c.findings, 0);
  EXPECT_GT(c.tried, 100);
  EXPECT_GT(c.refused, 0);   // the mutator reaches the checks
  EXPECT_GT(c.accepted, 0);  // and also makes valid inputs
}

INSTANTIATE_TEST_SUITE_P(Targets, BadInputFuzz,
                         ::testing::Values("config", "schedule", "safetensors", "data"),
                         [](const auto& info) { return std::string(info.param); });

// ---- regression cases: inputs that once crashed, hung or were misread --------

// The target refuses `input` (an InvalidArgument with a hint), no finding.
void expect_target_refuses(const char* target, const std::string& input) {
  try {
    EXPECT_EQ(coremesh::fuzz::target(target).run(input), Outcome::refused) << target << " \"" << escaped(input) << "\"";
  } catch (const std::exception& e) {
    ADD_FAILURE() << target << " \"" << escaped(input) << "\": " << e.what();
  }
}

std::string refusal(const std::function<void()>& body) {
  try {
    body();
  } catch (const coremesh::InvalidArgument& e) {
    EXPECT_FALSE(e.hint().empty()) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "accepted";
  return "";
}

TEST(BadInputRegression, ConfigIntegerOutOfItsFieldsRangeIsRefused) {
  // 4294967297 once wrapped into batch_size = 1, -1 into seed = 2^64 - 1.
  for (const char* text : {R"({"data": "a.txt", "batch_size": 4294967297})", R"({"data": "a.txt", "seed": -1})",
                           R"({"data": "a.txt", "steps": 18446744073709551615})"}) {
    const std::string what = refusal([&] { coremesh::train::train_config_from_text(text, "c.json"); });
    EXPECT_NE(what.find("an integer in ["), std::string::npos) << what;
    expect_target_refuses("config", text);
  }
}

TEST(BadInputRegression, SafetensorsShapeWhoseSizeOverflowsIsRefused) {
  // [2^32, 2^32] F32 once wrapped to 0 bytes, matched the empty range [0, 0]
  // and made a tensor whose shape claims 2^64 elements over no storage.
  const std::string header =
      R"({"t":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})";
  std::string file;
  for (int i = 0; i < 8; ++i) file.push_back(char((uint64_t(header.size()) >> (8 * i)) & 0xff));
  file += header;
  const std::string what =
      refusal([&] { coremesh::train::safetensors_parse(file.data(), file.size(), "t.safetensors"); });
  EXPECT_NE(what.find("more elements than memory can address"), std::string::npos) << what;
  expect_target_refuses("safetensors", file);
}

TEST(BadInputRegression, ConfigSyntaxErrorIsAnInvalidArgument) {
  const std::string what = refusal([] { coremesh::train::train_config_from_text("{\"data\": ", "c.json"); });
  EXPECT_NE(what.find("cannot parse 'c.json'"), std::string::npos) << what;
  EXPECT_NE(what.find("fix the JSON syntax"), std::string::npos) << what;
}

}  // namespace
