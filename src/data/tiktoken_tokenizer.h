// tiktoken BPE files (NAME.tiktoken: one "base64-token rank" line per token) with the pattern and
// special tokens of one of OpenAI's encodings: see the .cpp.
#pragma once
#include <memory>
#include <string>
#include <string_view>

#include "data/tokenizer.h"

namespace nibble::train {

// Whether `bytes` reads as a .tiktoken file (its first line is base64, a space and a number).
bool looks_like_tiktoken_file(std::string_view bytes);
// `encoding`: r50k_base, p50k_base, cl100k_base or o200k_base, whose pattern splits the text;
// `source` names the file in messages. UsageError naming the file and the fix.
std::unique_ptr<Tokenizer> load_tiktoken_tokenizer(std::string file, std::string encoding, const std::string& source);

}  // namespace nibble::train
