// nibble_profile_cuda: the program behind gpu-check's profile step (profile_cuda.h), with the bench
// model's shape, or GPT-2 small's with --gpt2 (a NIBBLE_CUDA_ONLY build has no nibble command).
#include <cstdio>
#include <cstring>

#include "kernels/cuda/profile_cuda.h"

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "--gpt2") == 0)
    return nibble::cuda::run_cuda_profile(nibble::cuda::ProfileOptions::gpt2_small());
  if (argc > 1) {
    const bool help = std::strcmp(argv[1], "-h") == 0 || std::strcmp(argv[1], "--help") == 0;
    std::fprintf(help ? stdout : stderr,
                 "usage: nibble_profile_cuda: CUDA-event time per kernel kind at nibble bench train's bench shape "
                 "(6 blocks, width 384, 6 heads, context 256, batch 8, vocab 65) and attention at contexts "
                 "256, 1024, 2048; --gpt2: GPT-2 small's shape (12 blocks, width 768, 12 heads, hidden 2048, context "
                 "1024, batch 8, vocab 50304) and attention at 1024, 2048, 4096; no other arguments%s%s\n",
                 help ? "" : ", got ", help ? "" : argv[1]);
    return help ? 0 : 2;
  }
  return nibble::cuda::run_cuda_profile(nibble::cuda::ProfileOptions{});
}
