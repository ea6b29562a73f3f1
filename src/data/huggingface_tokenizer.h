// Hugging Face `tokenizers` files (tokenizer.json) of the byte-level and the byte_fallback BPE kinds: see the .cpp.
#pragma once
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "data/tokenizer.h"

namespace nibble::train {

// Whether a parsed JSON file is a Hugging Face tokenizer.json (nibble's own tokenizer.json has a
// string "type" and no "model" object).
bool looks_like_huggingface_tokenizer(const nlohmann::json& j);
// `file`: the tokenizer.json's bytes, kept as they are (saved, exported, hashed into identity());
// `source` names it in messages. UsageError naming the source and the unsupported kind.
std::unique_ptr<Tokenizer> load_huggingface_tokenizer(std::string file, const std::string& source);

}  // namespace nibble::train
