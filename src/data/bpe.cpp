#include "data/bpe.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <fmt/format.h>
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <regex>
#include <atomic>
#include <thread>

#include "common/error.h"

namespace nibble::train::bpe {

namespace {

std::atomic<int> g_threads{0};
std::atomic<uint64_t> g_merger_serial{0};

// Unicode's White_Space characters: what `\s` matches in Oniguruma (tokenizers) and Rust's regex
// (tiktoken). PCRE2's UCP `\s` also matches U+180E (Mongolian vowel separator, White_Space until
// Unicode 6.3), so `\s` and `\S` are spelled out with this list instead.
constexpr const char* kWhiteSpace = "\\t\\n\\x{0B}\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";

// `\s` -> `[WHITE_SPACE]` (inside a class: the list alone), `\S` -> `[^WHITE_SPACE]` outside classes.
std::string exact_whitespace(std::string_view p) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char n = p[++i];
      if (n == 's')
        out += in_class ? std::string(kWhiteSpace) : "[" + std::string(kWhiteSpace) + "]";
      else if (n == 'S' && !in_class)
        out += "[^" + std::string(kWhiteSpace) + "]";
      else
        out += {c, n};
      continue;
    }
    out += c;
    if (c == '[' && !in_class) {
      in_class = true;
      // A ']' right after '[' or '[^' is a literal member, not the class's end.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
    } else if (c == ']' && in_class) {
      in_class = false;
    }
  }
  return out;
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof buffer);
  return reinterpret_cast<const char*>(buffer);
}

pcre2_code* code_of(const std::shared_ptr<void>& p) { return static_cast<pcre2_code*>(p.get()); }

}  // namespace

std::string byte_level_text(std::string_view bytes) {
  static const std::array<char32_t, 256> table = [] {
    std::array<char32_t, 256> t{};
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      t[b] = printable ? static_cast<char32_t>(b) : next++;
    }
    return t;
  }();
  std::string out;
  for (unsigned char b : bytes) {
    const char32_t c = table[b];  // below U+0800: one or two UTF-8 bytes
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back(static_cast<char>(0xC0 | (c >> 6)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    }
  }
  return out;
}

void set_threads(int threads) { g_threads = threads; }

int threads() {
  const int set = g_threads.load();
  return set > 0 ? set : std::max(1u, std::thread::hardware_concurrency());
}

Regex::Regex(std::string_view pattern, bool literal, std::string_view source, Dialect dialect) : source_(source) {
  // Oniguruma reads X{1,3}+ as (X{1,3})+, PCRE2 as a possessive X{1,3}: refused rather than split otherwise.
  if (!literal && dialect == Dialect::oniguruma &&
      std::regex_search(pattern.begin(), pattern.end(), std::regex(R"(\{[0-9]+(,[0-9]*)?\}\+)")))
    throw UsageError(fmt::format("{}: the pattern '{}' has an interval followed by + (X{{n,m}}+), which Oniguruma "
                                 "reads as (X{{n,m}})+ and nibble's PCRE2 as possessive: write (?:X{{n,m}})+ in the file",
                                 source, pattern));
  const std::string translated = literal ? std::string(pattern) : exact_whitespace(pattern);
  int error = 0;
  PCRE2_SIZE offset = 0;
  // PCRE2_LITERAL admits few other options (UTF among them).
  const uint32_t options = literal ? PCRE2_UTF | PCRE2_LITERAL
                                   : PCRE2_UTF | PCRE2_UCP |
                                         (dialect == Dialect::oniguruma ? PCRE2_MULTILINE : PCRE2_DOLLAR_ENDONLY);
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(), options, &error,
                                   &offset, nullptr);
  if (code == nullptr)
    throw UsageError(fmt::format("{}: the pattern '{}' does not compile ({} at offset {}): the tokenizer file is damaged "
                                 "or uses a regex feature PCRE2 lacks",
                                 source, pattern, pcre2_message(error), offset));
  code_ = std::shared_ptr<void>(code, [](void* c) { pcre2_code_free(static_cast<pcre2_code*>(c)); });
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // where JIT is unavailable, pcre2_match interprets
}

void Regex::find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& matches) const {
  pcre2_code* code = code_of(code_);
  std::unique_ptr<pcre2_match_data, void (*)(pcre2_match_data*)> data(pcre2_match_data_create_from_pattern(code, nullptr),
                                                                      pcre2_match_data_free);
  std::unique_ptr<pcre2_match_context, void (*)(pcre2_match_context*)> context(pcre2_match_context_create(nullptr),
                                                                               pcre2_match_context_free);
  // A run of a million spaces backtracks deeply in `\s+(?!\S)`: the JIT's stack may grow to 64 MiB.
  std::unique_ptr<pcre2_jit_stack, void (*)(pcre2_jit_stack*)> stack(pcre2_jit_stack_create(32 << 10, 64 << 20, nullptr),
                                                                     pcre2_jit_stack_free);
  pcre2_jit_stack_assign(context.get(), nullptr, stack.get());
  // The default limit (10 million backtracking steps) stops `\s+(?!\S)` on a run of 20 million
  // spaces, which is valid text: the steps grow linearly with a run, so no limit is needed.
  pcre2_set_match_limit(context.get(), UINT32_MAX);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t position = 0;
  while (position < text.size()) {
    const int rc = pcre2_match(code, subject, text.size(), position, PCRE2_NO_UTF_CHECK, data.get(), context.get());
    if (rc == PCRE2_ERROR_NOMATCH) return;
    if (rc < 0)
      throw UsageError(fmt::format("{}: pre-tokenizing failed at byte {} of a text of {} bytes ({})", source_, position,
                                   text.size(), pcre2_message(rc)));
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data.get());
    if (ovector[1] > ovector[0]) {
      matches.emplace_back(ovector[0], ovector[1]);
      position = ovector[1];
    } else {  // an empty match: searched again from the next character
      position = ovector[0] + 1;
      while (position < text.size() && (static_cast<unsigned char>(text[position]) & 0xC0) == 0x80) ++position;
    }
  }
}

void split(const Regex& regex, SplitBehavior behavior, std::string_view text, size_t begin, size_t end,
           std::vector<std::pair<size_t, size_t>>& pieces) {
  thread_local std::vector<std::pair<size_t, size_t>> matches;
  matches.clear();
  // The piece alone is the subject: lookarounds see no further, as each split is its own string there.
  regex.find_all(text.substr(begin, end - begin), matches);
  size_t previous = begin;
  for (const auto& [b, e] : matches) {
    if (begin + b > previous) pieces.emplace_back(previous, begin + b);
    if (behavior == SplitBehavior::isolated) pieces.emplace_back(begin + b, begin + e);
    previous = begin + e;
  }
  if (end > previous) pieces.emplace_back(previous, end);
}

void Merger::PairTable::grow() {
  std::vector<uint64_t> keys = std::move(keys_);
  std::vector<Pair> values = std::move(values_);
  const size_t capacity = keys.empty() ? 1024 : keys.size() * 2;
  shift_ = 64 - std::countr_zero(capacity);
  keys_.assign(capacity, kEmpty);
  values_.assign(capacity, Pair{});
  size_ = 0;
  for (size_t i = 0; i < keys.size(); ++i)
    if (keys[i] != kEmpty) insert(keys[i], values[i]);
}

void Merger::PairTable::insert(uint64_t key, Pair value) {
  if (2 * (size_ + 1) > keys_.size()) grow();  // at most half full: short probe runs
  for (size_t i = slot(key);; i = (i + 1) & (keys_.size() - 1)) {
    if (keys_[i] == key) {
      values_[i] = value;
      return;
    }
    if (keys_[i] == kEmpty) {
      keys_[i] = key, values_[i] = value, ++size_;
      return;
    }
  }
}

const Merger::Pair* Merger::PairTable::find(uint64_t key) const {
  if (keys_.empty()) return nullptr;
  for (size_t i = slot(key);; i = (i + 1) & (keys_.size() - 1)) {
    if (keys_[i] == key) return &values_[i];
    if (keys_[i] == kEmpty) return nullptr;
  }
}

Merger::Merger() : serial_(++g_merger_serial) { std::fill(std::begin(byte_id_), std::end(byte_id_), -1); }

void Merger::add_merge(int32_t left, int32_t right, uint32_t rank, int32_t merged) {
  const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  // Of a pair listed twice the later entry counts: HF collects the list into a map the same way.
  merges_.insert(key, Pair{rank, merged});
}

void Merger::add_token(std::string bytes, int32_t id) { tokens_.emplace(std::move(bytes), id); }

const int32_t* Merger::find_token(std::string_view bytes) const {
  const auto it = tokens_.find(bytes);
  return it == tokens_.end() ? nullptr : &it->second;
}

bool Merger::pair_rank(std::string_view piece, uint32_t a_begin, uint32_t b_end, int32_t left, int32_t right,
                       Pair& found) const {
  if (concatenation_) {
    const int32_t* id = find_token(piece.substr(a_begin, b_end - a_begin));
    if (id == nullptr) return false;
    found = {static_cast<uint32_t>(*id), *id};
    return true;
  }
  const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  const Pair* pair = merges_.find(key);
  if (pair == nullptr) return false;
  found = *pair;
  return true;
}

namespace {

struct Candidate {
  uint32_t rank, position;
  int32_t merged;
  // std::*_heap keep the largest on top: the lowest rank, then the leftmost, must compare largest.
  bool operator<(const Candidate& o) const { return rank != o.rank ? rank > o.rank : position > o.position; }
};

}  // namespace

void Merger::byte_symbols(std::string_view piece, std::vector<Symbol>& symbols) const {
  for (uint32_t i = 0; i < piece.size(); ++i) {
    int32_t id = byte_id_[static_cast<unsigned char>(piece[i])];
    if (id < 0 && unknown_ < 0) continue;  // HF drops a byte it has no token for when there is no unknown token
    if (id < 0 && fuse_unknown_ && !symbols.empty() && symbols.back().id == unknown_) {
      symbols.back().end = i + 1;
      continue;
    }
    if (id < 0) id = unknown_;
    const int32_t n = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, i, i + 1, n - 1, -1});
    if (n > 0) symbols[n - 1].next = n;
  }
}

// HF's merge_word: the piece is valid UTF-8 (encoders check the text first).
void Merger::character_symbols(std::string_view piece, std::vector<Symbol>& symbols) const {
  auto add = [&](int32_t id, uint32_t begin, uint32_t end) {
    const int32_t n = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, begin, end, n - 1, -1});
    if (n > 0) symbols[n - 1].next = n;
  };
  bool unknown_last = false;  // the last symbol is an unknown token another one may fuse into
  for (uint32_t i = 0; i < piece.size();) {
    const unsigned char lead = piece[i];
    const uint32_t n = std::min<uint32_t>(lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4,
                                          static_cast<uint32_t>(piece.size()) - i);
    const uint32_t end = i + n;
    if (const int32_t* id = find_token(piece.substr(i, n))) {
      add(*id, i, end), unknown_last = false;
    } else if (std::all_of(piece.begin() + i, piece.begin() + end,
                           [&](char b) { return byte_id_[static_cast<unsigned char>(b)] >= 0; })) {
      for (uint32_t k = i; k < end; ++k) add(byte_id_[static_cast<unsigned char>(piece[k])], k, k + 1);
      unknown_last = false;
    } else if (unknown_ >= 0 && fuse_unknown_ && unknown_last) {
      symbols.back().end = end;
    } else if (unknown_ >= 0) {
      add(unknown_, i, end), unknown_last = true;
    }  // no unknown token: the character is dropped, as HF does
    i = end;
  }
}

void Merger::encode(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (whole_piece_first_)
    if (const int32_t* id = find_token(piece)) return out.push_back(*id);
  thread_local std::vector<Symbol> symbols;
  thread_local std::vector<Candidate> heap;
  symbols.clear();
  heap.clear();
  if (characters_)
    character_symbols(piece, symbols);
  else
    byte_symbols(piece, symbols);
  auto consider = [&](int32_t left) {
    if (left < 0 || symbols[left].next < 0) return;
    const Symbol &a = symbols[left], &b = symbols[a.next];
    Pair p;
    if (!pair_rank(piece, a.begin, b.end, a.id, b.id, p)) return;
    heap.push_back({p.rank, static_cast<uint32_t>(left), p.merged});
    std::push_heap(heap.begin(), heap.end());
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(symbols.size()); ++i) consider(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end());
    const Candidate top = heap.back();
    heap.pop_back();
    Symbol& a = symbols[top.position];
    if (a.id < 0 || a.next < 0) continue;  // merged away, or nothing to its right any more
    Symbol& b = symbols[a.next];
    Pair now;
    // Stale when the pair there no longer forms the same token (HF's own test).
    if (!pair_rank(piece, a.begin, b.end, a.id, b.id, now) || now.merged != top.merged) continue;
    a.id = top.merged;
    a.end = b.end;
    a.next = b.next;
    if (b.next >= 0) symbols[b.next].prev = static_cast<int32_t>(top.position);
    b.id = -1;
    consider(a.prev);
    consider(static_cast<int32_t>(top.position));
  }
  for (int32_t i = symbols.empty() ? -1 : 0; i >= 0; i = symbols[i].next) out.push_back(symbols[i].id);
}

namespace {

// Repeated pre-tokens (" the", " of") are merged once: piece bytes -> ids, kept per thread across
// calls (documents), for one Merger at a time. Open addressing over 2^17 slots (3 MiB), the pieces'
// bytes in an arena; emptied when half full or the arena passes 64 MiB: bounded memory.
class PieceCache {
 public:
  // The ids of `piece`, merged by `merger` on first sight, appended to `out`.
  void encode(const Merger& merger, std::string_view piece, std::vector<int32_t>& out) {
    if (owner_ != merger.serial()) reset(merger.serial());
    // A long piece (a whole document where there is no pre-tokenizer, as Llama 2's tokenizer.json)
    // is rarely seen twice: kept, it would only push the short repeated ones out.
    if (piece.size() > kMaxPiece) return merger.encode(piece, out);
    const uint64_t hash = std::hash<std::string_view>{}(piece);
    size_t i = hash & (kSlots - 1);
    for (; slots_[i].length != 0; i = (i + 1) & (kSlots - 1)) {
      const Slot& s = slots_[i];
      if (s.hash == hash && s.length == piece.size() && std::memcmp(arena_.data() + s.offset, piece.data(), piece.size()) == 0) {
        out.insert(out.end(), ids_.begin() + s.first, ids_.begin() + s.last);
        return;
      }
    }
    const size_t first = ids_.size();
    merger.encode(piece, ids_);
    out.insert(out.end(), ids_.begin() + first, ids_.end());
    if (2 * ++used_ > kSlots || arena_.size() + piece.size() > kMaxArena) return reset(owner_);
    slots_[i] = {hash, static_cast<uint32_t>(arena_.size()), static_cast<uint32_t>(piece.size()),
                 static_cast<uint32_t>(first), static_cast<uint32_t>(ids_.size())};
    arena_.append(piece);
  }

 private:
  struct Slot {
    uint64_t hash = 0;
    uint32_t offset = 0, length = 0, first = 0, last = 0;  // length 0: empty (no piece is empty)
  };
  void reset(uint64_t owner) {
    slots_.assign(kSlots, Slot{});
    arena_.clear();
    ids_.clear();
    used_ = 0;
    owner_ = owner;
  }
  static constexpr size_t kSlots = 1 << 17, kMaxArena = 64 << 20, kMaxPiece = 4096;
  std::vector<Slot> slots_;
  std::string arena_;
  std::vector<int32_t> ids_;
  size_t used_ = 0;
  uint64_t owner_ = 0;  // Merger::serial() of the merger the entries are of; 0: none yet
};

// Pieces [first, last) into `out`; a piece with begin == npos stands for the id in its second.
void encode_run(const Merger& merger, std::string_view text, const std::vector<std::pair<size_t, size_t>>& pieces,
                size_t first, size_t last, std::vector<int32_t>& out) {
  thread_local PieceCache cache;
  for (size_t i = first; i < last; ++i) {
    const auto [b, e] = pieces[i];
    if (b == std::string::npos)
      out.push_back(static_cast<int32_t>(e));
    else
      cache.encode(merger, text.substr(b, e - b), out);
  }
}

}  // namespace

std::vector<int32_t> encode_pieces(const Merger& merger, std::string_view text,
                                   const std::vector<std::pair<size_t, size_t>>& pieces, int threads) {
  // Below this many pieces a thread costs more than it saves (a prompt, a short document).
  constexpr size_t kPiecesPerThread = 1 << 14;
  const size_t n = std::max<size_t>(1, std::min<size_t>(threads, pieces.size() / kPiecesPerThread));
  std::vector<std::vector<int32_t>> parts(n);
  std::vector<std::thread> workers;
  std::vector<std::exception_ptr> errors(n);
  for (size_t t = 0; t < n; ++t) {
    auto work = [&, t] {
      try {
        encode_run(merger, text, pieces, pieces.size() * t / n, pieces.size() * (t + 1) / n, parts[t]);
      } catch (...) {
        errors[t] = std::current_exception();
      }
    };
    if (t + 1 < n)
      workers.emplace_back(work);
    else
      work();
  }
  for (auto& w : workers) w.join();
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
  if (n == 1) return std::move(parts[0]);
  std::vector<int32_t> ids;
  size_t total = 0;
  for (const auto& p : parts) total += p.size();
  ids.reserve(total);
  for (const auto& p : parts) ids.insert(ids.end(), p.begin(), p.end());
  return ids;
}

}  // namespace nibble::train::bpe
