// Bad-input targets (issue 29): each feeds one input to a parser or loader of
// a file a user hands coremesh (a config, a schedule's text form, a
// safetensors checkpoint, a training text). The contract each checks:
//
//   accepted  the input passes the parser and the checks behind it, and what
//             was read survives the project's own write/read round trip;
//   refused   a coremesh::InvalidArgument with a message and a hint (what to
//             change).
//
// Anything else escapes to the caller as an exception: another exception type
// (a bad_alloc, a json::exception, an internal invariant), a round trip that
// changed the data; crashes, hangs and sanitizer reports happen in place.
// Two drivers run the same targets: libFuzzer (fuzz/fuzzer.cpp, a clang tree
// with -DCOREMESH_FUZZ=ON) and a bounded, seeded mutator in the normal test
// suite (tests/fuzz/test_bad_input.cpp).
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace coremesh::fuzz {

enum class Outcome { accepted, refused };

struct Target {
  const char* name;  // "config", "schedule", "safetensors", "data"
  Outcome (*run)(std::string_view input);
  std::vector<std::string> (*seeds)();     // valid inputs, made by the project's writers
  std::vector<std::string> (*dictionary)();  // tokens worth inserting
  // Optional framing: the part worth mutating (the safetensors header's JSON)
  // and how to put a mutated part back (its length prefix recomputed).
  // split returns false when the input has no such part.
  bool (*split)(std::string_view input, std::string& part, std::string& rest) = nullptr;
  std::string (*join)(std::string_view part, std::string_view rest) = nullptr;
};

const std::vector<Target>& targets();
const Target& target(std::string_view name);

}  // namespace coremesh::fuzz
