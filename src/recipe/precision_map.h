// The precision map: ordered rules that give a module (one linear of a block, or the LM head) a
// quantization of its own, as Megatron's --te-precision-config-file does by module name. Module
// names are the model's parameter names: block0.qkv, block0.attn_out, block0.gate_up, block0.down,
// ..., lm_head. A pattern matches a whole name:
//   *        any run of characters (dots included): block*.qkv, *.down, *
//   ?        one character
//   [A-B]    a decimal number from A to B (block[0-1].*, block[10-11].*); [A] is [A-A]
// Rules are tried in order and the first that matches decides (spec section 5.4).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace nibble {

enum class Quantization : uint8_t;

struct PrecisionRule {
  std::string pattern;
  Quantization quantization;
  bool operator==(const PrecisionRule&) const = default;
};

// UsageError naming the pattern and what is wrong with it (an unclosed or empty [..], A > B).
void check_module_pattern(std::string_view pattern);
bool module_pattern_matches(std::string_view pattern, std::string_view name);

// "block*.qkv=bf16; lm_head=bf16": rules separated by ';' or whitespace (the command-line and
// config.yaml form). UsageError for a rule without '=', an unknown quantization, a bad pattern,
// or a pattern given twice.
std::vector<PrecisionRule> parse_precision_map(std::string_view text);
// Adds one rule (the YAML list form builds the map one rule at a time), with the same checks.
void add_precision_rule(std::vector<PrecisionRule>& rules, std::string_view pattern, std::string_view quantization);
// The text form parse_precision_map reads back: "block*.qkv=bf16; lm_head=bf16".
std::string precision_map_text(const std::vector<PrecisionRule>& rules);

}  // namespace nibble
