#include "recipe/precision_map.h"

#include <charconv>

#include "common/error.h"
#include "recipe/recipe.h"

namespace nibble {

namespace {

// One [A-B] of a pattern: the numbers it admits and where the pattern goes on after it.
struct NumberRange {
  long long low = 0, high = 0;
  size_t next = 0;  // index in the pattern just past ']'
};

long long parse_bound(std::string_view pattern, std::string_view digits) {
  long long v = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
  if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size())
    throw UsageError("precision_map pattern '" + std::string(pattern) + "': [" + std::string(digits) +
                     "] is not a number range: write [A-B] with decimal numbers, e.g. block[0-1].*");
  return v;
}

// The range that starts at pattern[open] == '['.
NumberRange number_range(std::string_view pattern, size_t open) {
  const size_t close = pattern.find(']', open);
  if (close == std::string_view::npos)
    throw UsageError("precision_map pattern '" + std::string(pattern) + "' opens a [ it does not close: write [A-B]");
  const std::string_view inside = pattern.substr(open + 1, close - open - 1);
  const size_t dash = inside.find('-');
  NumberRange r;
  r.low = parse_bound(pattern, inside.substr(0, dash));
  r.high = dash == std::string_view::npos ? r.low : parse_bound(pattern, inside.substr(dash + 1));
  if (r.low > r.high)
    throw UsageError("precision_map pattern '" + std::string(pattern) + "': [" + std::string(inside) +
                     "] is empty (the first number is the larger): write [" + std::to_string(r.high) + "-" +
                     std::to_string(r.low) + "]");
  r.next = close + 1;
  return r;
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// Backtracking match of pattern[p..] against name[n..]; patterns are short and have few '*'.
bool matches_from(std::string_view pattern, size_t p, std::string_view name, size_t n) {
  while (p < pattern.size()) {
    const char c = pattern[p];
    if (c == '*') {
      for (size_t k = n; k <= name.size(); ++k)
        if (matches_from(pattern, p + 1, name, k)) return true;
      return false;
    }
    if (c == '[') {
      const NumberRange r = number_range(pattern, p);
      size_t end = n;
      while (end < name.size() && is_digit(name[end])) ++end;
      if (end == n) return false;
      long long v = 0;
      auto [ptr, ec] = std::from_chars(name.data() + n, name.data() + end, v);
      if (ec != std::errc() || v < r.low || v > r.high) return false;
      p = r.next;
      n = end;
      continue;
    }
    if (n >= name.size() || (c != '?' && c != name[n])) return false;
    ++p;
    ++n;
  }
  return n == name.size();
}

}  // namespace

void check_module_pattern(std::string_view pattern) {
  if (pattern.empty()) throw UsageError("precision_map has a rule with an empty pattern: write e.g. block*.qkv=bf16");
  for (size_t p = 0; p < pattern.size();) {
    if (pattern[p] == ']')
      throw UsageError("precision_map pattern '" + std::string(pattern) + "' closes a ] it did not open: write [A-B]");
    p = pattern[p] == '[' ? number_range(pattern, p).next : p + 1;
  }
}

bool module_pattern_matches(std::string_view pattern, std::string_view name) { return matches_from(pattern, 0, name, 0); }

void add_precision_rule(std::vector<PrecisionRule>& rules, std::string_view pattern, std::string_view quantization) {
  check_module_pattern(pattern);
  for (const PrecisionRule& r : rules)
    if (r.pattern == pattern)
      throw UsageError("precision_map gives the pattern '" + std::string(pattern) +
                       "' twice: keep one rule per pattern (the first match wins, so the second would never apply)");
  Quantization q{};
  try {
    q = parse_quantization(quantization);
  } catch (const UsageError& e) {
    throw UsageError("precision_map rule '" + std::string(pattern) + "=" + std::string(quantization) + "': " + e.what());
  }
  rules.push_back({std::string(pattern), q});
}

std::vector<PrecisionRule> parse_precision_map(std::string_view text) {
  std::vector<PrecisionRule> rules;
  auto separator = [](char c) { return c == ';' || c == ' ' || c == '\t' || c == '\n'; };
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && separator(text[i])) ++i;
    size_t j = i;
    while (j < text.size() && !separator(text[j])) ++j;
    if (j == i) break;
    const std::string_view rule = text.substr(i, j - i);
    const size_t eq = rule.rfind('=');
    if (eq == std::string_view::npos)
      throw UsageError("precision_map rule '" + std::string(rule) +
                       "' is not PATTERN=QUANTIZATION: write e.g. precision_map=\"block*.qkv=bf16; lm_head=bf16\"");
    add_precision_rule(rules, rule.substr(0, eq), rule.substr(eq + 1));
    i = j;
  }
  return rules;
}

std::string precision_map_text(const std::vector<PrecisionRule>& rules) {
  std::string s;
  for (const PrecisionRule& r : rules) s += (s.empty() ? "" : "; ") + r.pattern + "=" + std::string(to_string(r.quantization));
  return s;
}

}  // namespace nibble
