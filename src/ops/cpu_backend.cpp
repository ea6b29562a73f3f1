// The CPU backend: every op of the seam on kernels/cpu (SIMD variant chosen once from cpuid, capped
// by NIBBLE_ISA; OpenMP threads). Host memory; calls run synchronously.
#include <omp.h>
#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "common/pages.h"
#include "kernels/cpu/common/cpu_features.h"
#include "kernels/cpu/common/parallel.h"
#include "kernels/cpu/common/simd_clones.h"
#include "kernels/cpu/gemm/gemm.h"
#include "kernels/cpu/gemm/gemm_peaks.h"
#include "kernels/cpu/layers/adamw.h"
#include "kernels/cpu/layers/attention.h"
#include "kernels/cpu/layers/cross_entropy.h"
#include "kernels/cpu/layers/embedding.h"
#include "kernels/cpu/layers/rmsnorm.h"
#include "kernels/cpu/layers/rope.h"
#include "kernels/cpu/layers/swiglu.h"
#include "kernels/cpu/quantize/quantize.h"
#include "ops/backend.h"
#include "ops/host_quantized.h"

static_assert(nibble::ops::kSumOfSquaresChunk == nibble::cpu::kSumOfSquaresChunk);
static_assert(nibble::ops::kGainTileTokens == nibble::cpu::kGainTileTokens);

namespace nibble::ops {

namespace {

// y += x over one chunk (per-ISA copies: the baseline build ran it four floats at a time).
NIBBLE_SIMD_CLONES void add_range(float* __restrict y, const float* __restrict x, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

class CpuBackend final : public Backend {
 public:
  Device device() const override { return Device::cpu; }
  std::string describe() const override {
    return "cpu (" + std::string(cpu::to_string(cpu::active_isa())) + ", " + std::to_string(omp_get_max_threads()) +
           " threads)";
  }
  double measure_peak_f32_flops(double seconds) override {
    return cpu::measure_fma_f32_peak(seconds).giga_ops_per_s * 1e9 * omp_get_max_threads();
  }

  void* allocate(size_t bytes) override {
    if (bytes == 0) return nullptr;
    void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!p) throw std::bad_alloc();
    return p;
  }
  void release(void* p) noexcept override {
    if (auto it = strict_.find(p); it != strict_.end()) {
      ::munmap(p, it->second);
      strict_.erase(it);
      return;
    }
    std::free(p);
  }
  // $NIBBLE_STRICT_RELEASE=1 (a test aid): releasable memory behaves as a GPU's does, where a released
  // chunk is unmapped: its whole pages are unreadable (PROT_NONE, so a touch crashes at once) until
  // commit() takes them again, so the CPU's tests catch a path that would read or write memory it
  // released without committing it first. Otherwise (the default) released pages simply read as
  // zeros when touched again.
  void* allocate_releasable(size_t bytes) override {
    if (!strict_release() || bytes == 0) return allocate(bytes);
    const PageRange pages = pages_touching(nullptr, bytes);  // bytes rounded up to whole pages
    const size_t mapped = pages.end - pages.begin;
    void* p = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    strict_[p] = mapped;
    return p;
  }
  void copy(const void* src, void* dst, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void copy_to_host(const void* src, void* host_dst, size_t bytes) override { std::memcpy(host_dst, src, bytes); }
  void copy_from_host(const void* host_src, void* dst, size_t bytes) override { std::memcpy(dst, host_src, bytes); }
  void fill_zero(void* p, size_t bytes) override { std::memset(p, 0, bytes); }
  // MADV_DONTNEED on the whole pages inside: they leave the resident set and read as zeros when
  // touched again. The partial pages at the ends stay (they may hold bytes of other arrays).
  void discard(void* p, size_t bytes) override {
    release_whole_pages(p, bytes);  // refused: the bytes stay
    protect_released(p, bytes);
  }
  void discard_to_zero(void* p, size_t bytes) override {
    release_to_zero(p, bytes);
    protect_released(p, bytes);
  }
  void commit(void* p, size_t bytes) override {
    if (strict_.empty() || !strict_memory(p)) return;
    const PageRange touched = pages_touching(p, bytes);
    ::mprotect(reinterpret_cast<void*>(touched.begin), touched.end - touched.begin, PROT_READ | PROT_WRITE);
  }
  void synchronize() override {}

  std::unique_ptr<Quantized> new_quantized() override { return std::make_unique<HostQuantized>(); }
  void quantize(const float* x, int64_t rows, int64_t cols, const QuantOptions& opt, Quantized& out) override {
    cpu::quantize_into(span(x, rows, cols), rows, cols, opt, host(out));
  }
  void quantize_transposed(const float* x, int64_t rows, int64_t cols, const QuantOptions& opt,
                           Quantized& out) override {
    cpu::quantize_transposed_into(span(x, rows, cols), rows, cols, opt, host(out));
  }
  void quantize_both(const float* x, int64_t rows, int64_t cols, const QuantOptions& row_opt, Quantized& row_out,
                     const QuantOptions& t_opt, Quantized& t_out) override {
    cpu::quantize_both_into(span(x, rows, cols), rows, cols, row_opt, host(row_out), t_opt, host(t_out));
  }
  void quantize_both_gathered(const float* x, int64_t rows, int64_t cols, const QuantOptions& row_opt,
                              Quantized& row_out, const QuantOptions& t_opt, Quantized& t_out,
                              const SourceAmax& known) override {
    cpu::quantize_both_into(span(x, rows, cols), rows, cols, row_opt, host(row_out), t_opt, host(t_out), &known);
  }
  void transpose_tiles(const Quantized& q, Quantized& out) override { host(out) = cpu::transpose_tiles(host(q)); }
  float max_abs(const float* x, int64_t n) override { return cpu::max_abs(std::span<const float>(x, static_cast<size_t>(n))); }
  void quantize_rows_of(const float* x, int64_t rows, int64_t cols, const QuantOptions& opt, float tensor_amax,
                        Quantized& out) override {
    cpu::quantize_rows_of_into(span(x, rows, cols), rows, cols, opt, tensor_amax, host(out));
  }
  void load_quantized(QuantizedTensor t, Quantized& out) override { host(out) = std::move(t); }
  void dequantize(const Quantized& q, float* out) override {
    const QuantizedLayout& l = q.layout();
    cpu::dequantize(host(q), std::span<float>(out, static_cast<size_t>(l.rows * l.cols)));
  }

  bool fp32_products_available(Format format) const override { return cpu::fp32_products_available(format); }
  bool block_exact_available() const override { return true; }
  std::string describe_summation(Format format, Summation summation) const override {
    const bool fp8 = is_per_tensor_fp8(format);
    if (summation == Summation::block_exact)
      return fp8 ? "GEMMs sum exact FP8 products in k order with FMA (gemm_summation=block_exact)"
                 : "GEMMs sum exact 16-block products in FP32 (gemm_summation=block_exact)";
    if (!cpu::fp32_products_available(format))
      return fp8 ? "GEMMs sum exact FP8 products in k order with FMA (fp32_products asked for, but this CPU has "
                   "neither AMX-BF16 nor AVX512-BF16)"
                 : "GEMMs sum exact 16-block products in FP32 (fp32_products asked for, but this CPU has no AMX-BF16)";
    return cpu::amx_bf16_active()
               ? "GEMMs sum element products in FP32 on the AMX-BF16 tiles (gemm_summation=fp32_products)"
               : "GEMMs sum element products in FP32 with AVX512-BF16 vdpbf16ps (gemm_summation=fp32_products)";
  }
  void gemm(const Quantized& a, const Quantized& b, float* c, int64_t ldc, float alpha, Output output,
            Summation summation) override {
    cpu::gemm(host(a), host(b), c, ldc, alpha, output, summation);
  }
  void gemm_f32(const DenseGemmShape& s, float alpha, const float* a, const float* b, float beta, float* c) override {
    cpu::gemm_f32(s.ta, s.tb, s.m, s.n, s.k, alpha, a, s.lda, b, s.ldb, beta, c, s.ldc);
  }
  void gemm_bf16(const DenseGemmShape& s, float alpha, const float* a, const float* b, float beta, float* c) override {
    cpu::gemm_bf16(s.ta, s.tb, s.m, s.n, s.k, alpha, a, s.lda, b, s.ldb, beta, c, s.ldc);
  }

  void add(float* y, const float* x, int64_t n) override {
    const int64_t chunk = cpu::dynamic_chunk(n, 1024);
#pragma omp parallel for schedule(dynamic, 1) if (n >= cpu::kMinParallelWork)
    for (int64_t i0 = 0; i0 < n; i0 += chunk) add_range(y + i0, x + i0, std::min(chunk, n - i0));
  }
  void round_to_bf16(const float* x, bf16* y, int64_t n) override {
#pragma omp parallel for simd schedule(dynamic, cpu::dynamic_chunk(n, 1024)) if (n >= cpu::kMinParallelWork)
    for (int64_t i = 0; i < n; ++i) y[i] = bf16_from_float_rn(x[i]);
  }
  void widen_bf16(const bf16* x, float* y, int64_t n) override {
#pragma omp parallel for simd schedule(dynamic, cpu::dynamic_chunk(n, 1024)) if (n >= cpu::kMinParallelWork)
    for (int64_t i = 0; i < n; ++i) y[i] = bf16_to_float(x[i]);
  }

  void embedding_forward(const int32_t* tokens, int64_t n, const float* table, int64_t width, float* out) override {
    cpu::embedding_forward(tokens, n, table, width, out);
  }
  void embedding_backward(const int32_t* tokens, int64_t n, const float* dout, int64_t width, float* dtable) override {
    cpu::embedding_backward(tokens, n, dout, width, dtable);
  }
  void rmsnorm_forward(const RowsShape& s, const float* x, const float* gain, float eps, float* y,
                       float* rstd) override {
    cpu::rmsnorm_forward(x, gain, s.rows, s.cols, eps, y, rstd);
  }
  void rmsnorm_forward_gathering(const RowsShape& s, const float* x, const float* gain, float eps, float* y,
                                 float* rstd, SourceAmax& amax) override {
    cpu::rmsnorm_forward_gathering(x, gain, s.rows, s.cols, eps, y, rstd, amax);
  }
  void rmsnorm_backward(const RowsShape& s, const float* x, const float* gain, const float* rstd, const float* dy,
                        float* dx, float* dgain) override {
    cpu::rmsnorm_backward(x, gain, rstd, dy, s.rows, s.cols, dx, dgain);
  }
  void rmsnorm_backward_gathering(const RowsShape& s, const float* x, const float* gain, const float* rstd,
                                  const float* dy, float* dx, float* dgain, SourceAmax& amax) override {
    cpu::rmsnorm_backward_gathering(x, gain, rstd, dy, s.rows, s.cols, dx, dgain, amax);
  }
  void rope_forward(float* x, const RopeShape& s, int64_t first_position) override {
    cpu::rope_forward(x, s.tokens, s.seq, s.stride, s.first_col, s.heads,
                      *rope_table(first_position + s.seq, s.head_dim, s.theta), first_position);
  }
  void rope_backward(float* dx, const RopeShape& s) override {
    cpu::rope_backward(dx, s.tokens, s.seq, s.stride, s.first_col, s.heads, *rope_table(s.seq, s.head_dim, s.theta));
  }
  void rope_backward_gathering(float* dx, const RopeShape& query, const RopeShape& key, SourceAmax& amax) override {
    NIBBLE_CHECK(query.tokens == key.tokens && query.seq == key.seq && query.stride == key.stride &&
                     query.head_dim == key.head_dim && query.theta == key.theta,
                 "rope_backward_gathering: query and key heads of the same rows");
    cpu::rope_backward_gathering(dx, query.tokens, query.seq, query.stride, query.first_col, query.heads, key.first_col,
                                 key.heads, *rope_table(query.seq, query.head_dim, query.theta), amax);
  }
  void attention_forward(const AttentionShape& s, const float* qkv, float* out, float* softmax_stats) override {
    cpu::attention_forward(s, qkv, out, softmax_stats);
  }
  void attention_backward(const AttentionShape& s, const float* qkv, const float* softmax_stats, const float* dout,
                          float* dqkv) override {
    cpu::attention_backward(s, qkv, softmax_stats, dout, dqkv);
  }
  void attention_decode(const AttentionShape& s, int64_t past, const float* qkv, float* k_cache, float* v_cache,
                        float* out) override {
    cpu::attention_decode(s, past, qkv, k_cache, v_cache, out);
  }
  void swiglu_forward(const float* gate_up, int64_t n, int64_t hidden, float* a) override {
    cpu::swiglu_forward(gate_up, n, hidden, a);
  }
  void swiglu_forward_gathering(const float* gate_up, int64_t n, int64_t hidden, float* a, SourceAmax& amax) override {
    cpu::swiglu_forward_gathering(gate_up, n, hidden, a, amax);
  }
  void swiglu_backward(const float* gate_up, const float* da, int64_t n, int64_t hidden, float* dgate_up) override {
    cpu::swiglu_backward(gate_up, da, n, hidden, dgate_up);
  }
  void swiglu_backward_gathering(const float* gate_up, const float* da, int64_t n, int64_t hidden, float* dgate_up,
                                 SourceAmax& amax) override {
    cpu::swiglu_backward_gathering(gate_up, da, n, hidden, dgate_up, amax);
  }
  double cross_entropy_forward(const float* logits, const int32_t* targets, int64_t n, int64_t vocab,
                               float* loss) override {
    return cpu::cross_entropy_forward(logits, targets, n, vocab, loss);
  }
  void cross_entropy_backward(const float* logits, const int32_t* targets, int64_t n, int64_t vocab, float scale,
                              float* dlogits) override {
    cpu::cross_entropy_backward(logits, targets, n, vocab, scale, dlogits);
  }
  double cross_entropy_forward_keeping(const float* logits, const int32_t* targets, int64_t n, int64_t vocab,
                                       float* loss, float* row_stats) override {
    return cpu::cross_entropy_forward_keeping(logits, targets, n, vocab, loss, row_stats);
  }
  void cross_entropy_backward_kept(const float* logits, const int32_t* targets, int64_t n, int64_t vocab, float scale,
                                   const float* row_stats, float* dlogits) override {
    cpu::cross_entropy_backward_kept(logits, targets, n, vocab, scale, row_stats, dlogits);
  }
  double sum_of_squares(const float* g, int64_t n) override { return cpu::sum_of_squares(g, n); }
  std::vector<double> sum_of_squares_by_chunk(const float* g, int64_t n) override {
    std::vector<double> partial(static_cast<size_t>((n + kSumOfSquaresChunk - 1) / kSumOfSquaresChunk));
    cpu::sum_of_squares_by_chunk(g, n, partial.data());
    return partial;
  }
  void adamw_update(const AdamWStep& k, const float* g, float* m, float* v, float* w, const uint8_t* decay_mask,
                    int64_t n) override {
    cpu::adamw_update({k.clip, k.beta1, k.beta2, k.bias1, k.bias2, k.decay, k.lr, k.eps}, g, m, v, w, decay_mask, n);
  }

 private:
  static std::span<const float> span(const float* x, int64_t rows, int64_t cols) {
    return {x, static_cast<size_t>(rows * cols)};
  }
  static QuantizedTensor& host(Quantized& q) { return host_tensor(q, "the CPU backend"); }
  static const QuantizedTensor& host(const Quantized& q) { return host_tensor(q, "the CPU backend"); }

  // cos/sin tables per (head_dim, theta), grown to the longest sequence asked for: the values of a
  // position do not depend on the table's length, so one table serves every shorter sequence.
  // A caller keeps its table alive while another thread may grow the slot.
  std::shared_ptr<const cpu::RopeTable<float>> rope_table(int64_t positions, int64_t head_dim, double theta) {
    std::lock_guard<std::mutex> lock(rope_mutex_);
    auto& slot = rope_tables_[{head_dim, theta}];
    if (!slot || slot->context < positions) slot = std::make_shared<const cpu::RopeTable<float>>(positions, head_dim, theta);
    return slot;
  }
  std::mutex rope_mutex_;
  std::map<std::pair<int64_t, double>, std::shared_ptr<const cpu::RopeTable<float>>> rope_tables_;

  static bool strict_release() {
    static const bool on = [] {
      const char* v = std::getenv("NIBBLE_STRICT_RELEASE");
      return v != nullptr && std::string(v) == "1";
    }();
    return on;
  }
  bool strict_memory(const void* p) const {
    auto it = strict_.upper_bound(const_cast<void*>(p));
    if (it == strict_.begin()) return false;
    --it;
    return static_cast<const char*>(p) < static_cast<const char*>(it->first) + it->second;
  }
  // Under $NIBBLE_STRICT_RELEASE: the whole pages just released become unreadable until committed.
  void protect_released(void* p, size_t bytes) {
    if (strict_.empty() || !strict_memory(p)) return;
    const PageRange inner = whole_pages_inside(p, bytes);
    if (inner.begin < inner.end) ::mprotect(reinterpret_cast<void*>(inner.begin), inner.end - inner.begin, PROT_NONE);
  }
  std::map<void*, size_t> strict_;  // releasable allocations under $NIBBLE_STRICT_RELEASE: start -> mapped bytes
};

}  // namespace

Backend& cpu() {
  static CpuBackend backend;
  return backend;
}

}  // namespace nibble::ops
