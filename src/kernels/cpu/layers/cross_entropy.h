// Softmax cross-entropy over the vocabulary, in high precision.
#pragma once
#include <cstdint>

namespace nibble::cpu {

// logits: [N, vocab]; targets: [N]; loss[n] = logsumexp(logits[n]) - logits[n, target[n]].
// Returns the sum of loss[n] accumulated in double, in token order (deterministic).
template <typename T>
double cross_entropy_forward(const T* logits, const int32_t* targets, int64_t n, int64_t vocab, T* loss);
// dlogits[n] = scale * (softmax(logits[n]) - onehot(target[n])), overwritten. scale is 1/(tokens in
// the loss mean) times any loss scale.
template <typename T>
void cross_entropy_backward(const T* logits, const int32_t* targets, int64_t n, int64_t vocab, T scale, T* dlogits);
// As cross_entropy_forward<float>, also writing each row's max and 1 / (sum of exp) into row_stats
// [N, 2]; cross_entropy_backward<float>'s bits from them (the row's max and sum not found again).
double cross_entropy_forward_keeping(const float* logits, const int32_t* targets, int64_t n, int64_t vocab, float* loss,
                                     float* row_stats);
void cross_entropy_backward_kept(const float* logits, const int32_t* targets, int64_t n, int64_t vocab, float scale,
                                 const float* row_stats, float* dlogits);

}  // namespace nibble::cpu
