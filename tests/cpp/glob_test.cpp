// glob_test.cpp: globs against an obviously right (quadratic) oracle on many cases, '?' as one
// character, and the patterns that made the backtracking matcher take seconds.
#include "numalign/glob.hpp"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace numalign {
namespace {

TEST(GlobTest, StarsAndQuestionMarks) {
  EXPECT_TRUE(glob_match("decoder.*.grad", "decoder.layers.3.grad"));
  EXPECT_FALSE(glob_match("decoder.*.grad", "decoder.layers.3.out"));
  EXPECT_TRUE(glob_match("*", ""));
  EXPECT_TRUE(glob_match("a?c", "abc"));
  EXPECT_FALSE(glob_match("a?c", "ac"));
  EXPECT_TRUE(glob_match("*.*.*", "a.b.c"));
  EXPECT_TRUE(glob_match("**x", "yyx"));
  EXPECT_FALSE(glob_match("x", "xx"));
  // Found by fuzz_rules: a '*' in the name was matched as the pattern's literal '*'.
  EXPECT_TRUE(glob_match("*", "*)"));
  EXPECT_TRUE(glob_match("*:", "*:"));
  EXPECT_TRUE(glob_match("a*", "a*b"));
}

// The oracle: fnmatch restricted to '*' and '?', over characters (code points), by dynamic
// programming (quadratic, obviously right).
std::vector<char32_t> code_points(const std::string& s) {
  std::vector<char32_t> out;
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const std::size_t n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    char32_t cp = n == 1 ? c : c & (0x7F >> n);
    for (std::size_t k = 1; k < n; ++k)
      cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    out.push_back(cp);
    i += n;
  }
  return out;
}

bool oracle_match(const std::string& pattern, const std::string& name) {
  const auto p = code_points(pattern), n = code_points(name);
  std::vector<std::vector<bool>> m(p.size() + 1, std::vector<bool>(n.size() + 1, false));
  m[0][0] = true;
  for (std::size_t i = 1; i <= p.size(); ++i) {
    for (std::size_t j = 0; j <= n.size(); ++j) {
      if (p[i - 1] == U'*') {
        m[i][j] = m[i - 1][j] || (j > 0 && m[i][j - 1]);
      } else {
        m[i][j] = j > 0 && m[i - 1][j - 1] && (p[i - 1] == U'?' || p[i - 1] == n[j - 1]);
      }
    }
  }
  return m[p.size()][n.size()];
}

TEST(GlobTest, AgreesWithTheOracleOnManyCases) {
  const std::vector<std::string> alphabet = {"a", "b", ".", "层", "é"};
  const std::vector<std::string> pattern_alphabet = {"a", "b", ".", "层", "é", "*", "?", "*", "?"};
  std::mt19937 rng(7);
  std::size_t matched = 0;
  for (int trial = 0; trial < 40000; ++trial) {
    std::string pattern, name;
    const int pn = static_cast<int>(rng() % 8), nn = static_cast<int>(rng() % 10);
    for (int i = 0; i < pn; ++i) pattern += pattern_alphabet[rng() % pattern_alphabet.size()];
    for (int i = 0; i < nn; ++i) name += alphabet[rng() % (trial % 2 ? 2 : alphabet.size())];
    const bool want = oracle_match(pattern, name);
    matched += want;
    ASSERT_EQ(glob_match(pattern, name), want) << "'" << pattern << "' vs '" << name << "'";
  }
  EXPECT_GT(matched, 2000u) << "the cases exercise matches, not only mismatches";
  EXPECT_TRUE(glob_match("layer?.w", "layer层.w")) << "'?' is one character, not one byte";
  EXPECT_FALSE(glob_match("layer??.w", "layer层.w"));
}

TEST(GlobTest, PathologicalPatternsFinish) {
  // Each took seconds with the backtracking matcher (O(pattern x name)).
  const std::string a50k(50000, 'a'), a100k(100000, 'a');
  EXPECT_FALSE(glob_match("*" + a50k + "b", a100k));
  EXPECT_TRUE(glob_match("*" + a50k + "b", a100k + "b"));
  EXPECT_FALSE(glob_match("*" + a50k + "?b", a100k));
  std::string stars;
  for (int i = 0; i < 20000; ++i) stars += "*a";
  EXPECT_FALSE(glob_match(stars + "b", a100k));
  EXPECT_TRUE(glob_match(stars, a100k));
  std::string qs;
  for (int i = 0; i < 2000; ++i) qs += "a?";
  EXPECT_FALSE(glob_match("*" + qs + "b", a100k));
}

}  // namespace
}  // namespace numalign
