// gemm_f32_onednn / gemm_bf16_onednn: oneDNN's matmul primitive, the library a user would otherwise
// pick, for comparisons (its blocking, hence its rounding, follows the thread count). Built only
// where oneDNN is (NIBBLE_HAVE_ONEDNN); nibble's own gemm_f32 / gemm_bf16 are in gemm_dense.cpp.
// Transposes and leading dimensions become strides of the memory descriptors, so no operand is
// copied for FP32. Creating a primitive costs far more than a small GEMM, so primitives are cached
// by everything that shapes them (type, dims, strides, alpha, beta).
#include <dnnl.hpp>

#include <bit>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "format/codecs.h"
#include "kernels/cpu/common/cpu_features.h"
#include "kernels/cpu/gemm/gemm.h"
#include "kernels/cpu/gemm/gemm_kernels.h"

namespace nibble::cpu {
namespace {

using gemm_detail::check_dense_gemm_args;
using gemm_detail::scale_c_by_beta;

using dnnl::memory;

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// Strides of op(X) in the stored row-major matrix with leading dimension ld.
memory::dims op_strides(Trans t, int64_t ld) { return t == Trans::no ? memory::dims{ld, 1} : memory::dims{1, ld}; }

using PrimitiveKey = std::tuple<int, int, int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, uint32_t, uint32_t>;

dnnl::matmul& cached_matmul(memory::data_type input_type, Trans ta, Trans tb, int64_t M, int64_t N, int64_t K,
                            int64_t lda, int64_t ldb, int64_t ldc, float alpha, float beta) {
  static std::mutex mutex;
  static std::map<PrimitiveKey, dnnl::matmul> cache;
  PrimitiveKey key{static_cast<int>(input_type), static_cast<int>(ta), static_cast<int>(tb), M, N, K, lda, ldb, ldc,
                   std::bit_cast<uint32_t>(alpha), std::bit_cast<uint32_t>(beta)};
  std::lock_guard lock(mutex);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  memory::desc a_md({M, K}, input_type, op_strides(ta, lda));
  memory::desc b_md({K, N}, input_type, op_strides(tb, ldb));
  memory::desc c_md({M, N}, memory::data_type::f32, memory::dims{ldc, 1});
  dnnl::primitive_attr attr;
  if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
  if (beta != 0.0f) {
    dnnl::post_ops ops;
    ops.append_sum(beta);
    attr.set_post_ops(ops);
  }
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, b_md, c_md), attr, cpu_engine());
  return cache.emplace(key, dnnl::matmul(pd)).first->second;
}

void run_matmul(dnnl::matmul& mm, const memory::desc& a_md, const memory::desc& b_md, const memory::desc& c_md,
                const void* a, const void* b, float* c) {
  dnnl::stream stream(cpu_engine());
  memory a_mem(a_md, cpu_engine(), const_cast<void*>(a));
  memory b_mem(b_md, cpu_engine(), const_cast<void*>(b));
  memory c_mem(c_md, cpu_engine(), c);
  mm.execute(stream, {{DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, b_mem}, {DNNL_ARG_DST, c_mem}});
  stream.wait();
}

// Stored rows x cols matrix (leading dimension ld) rounded to BF16 (RN-even), densely packed.
void to_bf16(const float* x, int64_t rows, int64_t cols, int64_t ld, std::vector<bf16>& out) {
  out.resize(static_cast<size_t>(rows * cols));
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) out[r * cols + j] = bf16_from_float_rn(x[r * ld + j]);
}

}  // namespace

void gemm_f32_onednn(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const float* a, int64_t lda,
                     const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  check_dense_gemm_args("gemm_f32", ta, tb, M, N, K, lda, ldb, ldc);
  if (M == 0 || N == 0) return;
  if (K == 0) return scale_c_by_beta(M, N, beta, c, ldc);
  auto& mm = cached_matmul(memory::data_type::f32, ta, tb, M, N, K, lda, ldb, ldc, alpha, beta);
  run_matmul(mm, memory::desc({M, K}, memory::data_type::f32, op_strides(ta, lda)),
             memory::desc({K, N}, memory::data_type::f32, op_strides(tb, ldb)),
             memory::desc({M, N}, memory::data_type::f32, memory::dims{ldc, 1}), a, b, c);
}

void gemm_bf16_onednn(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const float* a, int64_t lda,
                      const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  check_dense_gemm_args("gemm_bf16", ta, tb, M, N, K, lda, ldb, ldc);
  if (M == 0 || N == 0) return;
  if (K == 0) return scale_c_by_beta(M, N, beta, c, ldc);
  // Round the stored matrices densely; their transposition is kept in the strides.
  static thread_local std::vector<bf16> a16, b16;
  const int64_t a_rows = ta == Trans::no ? M : K, a_cols = ta == Trans::no ? K : M;
  const int64_t b_rows = tb == Trans::no ? K : N, b_cols = tb == Trans::no ? N : K;
  to_bf16(a, a_rows, a_cols, lda, a16);
  to_bf16(b, b_rows, b_cols, ldb, b16);
  dnnl::matmul* mm_ptr = nullptr;
  try {
    mm_ptr = &cached_matmul(memory::data_type::bf16, ta, tb, M, N, K, a_cols, b_cols, ldc, alpha, beta);
  } catch (const dnnl::error&) {
    // oneDNN has no BF16 matmul below AVX-512 (e.g. an AVX2-only CPU). The same numbers come from
    // the FP32 matmul on the BF16-rounded operands: a BF16 x BF16 product (8+8 significant bits) is
    // exact in FP32, so only the FP32 accumulation rounds, as in the BF16 kernel.
    static thread_local std::vector<float> a32, b32;
    a32.resize(a16.size());
    b32.resize(b16.size());
    for (size_t i = 0; i < a16.size(); ++i) a32[i] = bf16_to_float(a16[i]);
    for (size_t i = 0; i < b16.size(); ++i) b32[i] = bf16_to_float(b16[i]);
    return gemm_f32_onednn(ta, tb, M, N, K, alpha, a32.data(), a_cols, b32.data(), b_cols, beta, c, ldc);
  }
  auto& mm = *mm_ptr;
  run_matmul(mm, memory::desc({M, K}, memory::data_type::bf16, op_strides(ta, a_cols)),
             memory::desc({K, N}, memory::data_type::bf16, op_strides(tb, b_cols)),
             memory::desc({M, N}, memory::data_type::f32, memory::dims{ldc, 1}), a16.data(), b16.data(), c);
}

}  // namespace nibble::cpu
