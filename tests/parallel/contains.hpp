// EXPECT_PRED2(contains, text, part): on failure gtest prints both strings.
#pragma once

#include <string>

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}
