// nibble_profile_cuda (scripts/gpu-check.sh's profile step): the CUDA-event time of each kernel kind
// of a training step at one model shape (by default nibble bench train's bench model), each kind
// run alone on the context's stream, and attention forward/backward at several context lengths
// with the tokens per call held fixed. The table is what the first GPU run compares, kind by kind,
// with `nibble bench train --predict`.
#pragma once
#include <cstdint>
#include <vector>

namespace nibble::cuda {

struct ProfileOptions {
  int64_t layers = 6, width = 384, heads = 6, hidden = 1024, context = 256, batch = 8, vocab = 65;
  int64_t params = 0;  // the gradient norm's and AdamW's length; 0: a model of these sizes
  std::vector<int64_t> attention_contexts{256, 1024, 2048};
  // GPT-2 small's shape as nibble builds it (12 x 768, 12 heads, SwiGLU hidden 2048, context 1024,
  // batch 8, GPT-2's vocabulary padded to 50304), attention at 1024, 2048, 4096.
  static ProfileOptions gpt2_small() {
    ProfileOptions o;
    o.layers = 12, o.width = 768, o.heads = 12, o.hidden = 2048, o.context = 1024, o.batch = 8, o.vocab = 50304;
    o.attention_contexts = {1024, 2048, 4096};
    return o;
  }
  double seconds_per_kind = 0.2;  // timed repetitions per kind: about this long, from 1 to 20
  int device = 0;
};

// Prints the table on stdout. 0 when it ran; 2 with a message on stderr without a usable GPU or for
// invalid options; 1 for a CUDA error.
int run_cuda_profile(const ProfileOptions& options);

}  // namespace nibble::cuda
