// Token embedding: out[n, :] = table[token[n], :]. Kept in high precision (spec section 5).
#pragma once
#include <cstdint>

namespace nibble::cpu {

// tokens: [N] in [0, vocab); table: [vocab, width]; out: [N, width] (overwritten).
template <typename T>
void embedding_forward(const int32_t* tokens, int64_t n, const T* table, int64_t width, T* out);
// dtable[token[n], :] += dout[n, :], rows visited in token order (deterministic).
template <typename T>
void embedding_backward(const int32_t* tokens, int64_t n, const T* dout, int64_t width, T* dtable);

}  // namespace nibble::cpu
