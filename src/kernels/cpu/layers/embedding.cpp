#include "kernels/cpu/common/parallel.h"
#include "kernels/cpu/layers/embedding.h"

#include <algorithm>

namespace nibble::cpu {

template <typename T>
void embedding_forward(const int32_t* tokens, int64_t n, const T* table, int64_t width, T* out) {
#pragma omp parallel for schedule(dynamic, dynamic_chunk(n)) if (n * width >= kMinParallelWork)
  for (int64_t i = 0; i < n; ++i)
    std::copy(table + static_cast<int64_t>(tokens[i]) * width, table + static_cast<int64_t>(tokens[i] + 1) * width,
              out + i * width);
}

template <typename T>
void embedding_backward(const int32_t* tokens, int64_t n, const T* dout, int64_t width, T* dtable) {
  // Parallel over columns, serial over tokens: each gradient element sums its contributions in
  // token order whatever the thread count.
#pragma omp parallel for schedule(dynamic, dynamic_chunk(width)) if (n * width >= kMinParallelWork)
  for (int64_t c = 0; c < width; ++c)
    for (int64_t i = 0; i < n; ++i) dtable[static_cast<int64_t>(tokens[i]) * width + c] += dout[i * width + c];
}

template void embedding_forward<float>(const int32_t*, int64_t, const float*, int64_t, float*);
template void embedding_forward<double>(const int32_t*, int64_t, const double*, int64_t, double*);
template void embedding_backward<float>(const int32_t*, int64_t, const float*, int64_t, float*);
template void embedding_backward<double>(const int32_t*, int64_t, const double*, int64_t, double*);

}  // namespace nibble::cpu
