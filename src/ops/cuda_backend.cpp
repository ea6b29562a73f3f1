// The CUDA backend: every op of the seam on kernels/cuda, on one device (0, or $NIBBLE_CUDA_DEVICE)
// and its context's stream. Device memory; calls are asynchronous, copies to the host wait.
// Quantization gives the reference's bytes; GEMMs sum in FP32 in the tensor cores' order (native
// NVFP4 on sm_100/103, FP8 on sm_89+, exact BF16 emulation of the block-scaled formats elsewhere),
// which is Summation::fp32_products; block_exact is a CPU summation and is refused here.
#include <algorithm>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/cuda/context.h"
#ifdef NIBBLE_HAVE_NCCL
#include "kernels/cuda/nccl_collective.h"
#endif
#include "kernels/cuda/cuda_error.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/layer_math.h"
#include "kernels/cuda/layers.h"
#include "kernels/cuda/quantize.h"
#include "kernels/cuda/releasable_memory.h"
#include "ops/backend.h"

namespace nibble::ops {

static_assert(kSumOfSquaresChunk == cuda::lm::kSumOfSquaresChunk);
static_assert(kGainTileTokens == cuda::lm::kGainTileTokens);

namespace {

class DeviceQuantizedTensor final : public Quantized {
 public:
  Device device() const override { return Device::cuda; }
  const QuantizedLayout& layout() const override { return tensor.layout(); }
  float amax() const override { return tensor.globals.empty() ? 0.0f : tensor.globals.download()[0]; }
  int64_t stored_bytes() const override { return static_cast<int64_t>(tensor.codes.bytes() + tensor.scales.bytes()); }
  QuantizedTensor to_host() const override { return cuda::to_host(tensor); }

  cuda::DeviceQuantized tensor;
};

cuda::DeviceQuantized& dev(Quantized& q) {
  auto* d = dynamic_cast<DeviceQuantizedTensor*>(&q);
  NIBBLE_CHECK(d != nullptr, "a quantized tensor of another backend was handed to the CUDA backend");
  return d->tensor;
}
const cuda::DeviceQuantized& dev(const Quantized& q) {
  auto* d = dynamic_cast<const DeviceQuantizedTensor*>(&q);
  NIBBLE_CHECK(d != nullptr, "a quantized tensor of another backend was handed to the CUDA backend");
  return d->tensor;
}

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(cuda::Context& ctx) : ctx_(ctx) {}
  cuda::Context& context() { return ctx_; }

  Device device() const override { return Device::cuda; }
  std::string describe() const override {
    const auto& d = ctx_.device();
    return "cuda (" + d.name + ", sm_" + std::to_string(d.compute_capability()) + ")";
  }
  // An FP32 cuBLASLt GEMM of 2048^3, repeated for about `seconds`.
  double measure_peak_f32_flops(double seconds) override {
    constexpr int64_t n = 2048;
    cuda::DeviceBuffer<float> a(n * n, ctx_.stream()), c(n * n, ctx_.stream());
    a.fill_zero();
    cuda::gemm_f32(Trans::no, Trans::yes, n, n, n, 1.0f, a.data(), n, a.data(), n, 0.0f, c.data(), n, ctx_);
    ctx_.synchronize();
    int64_t runs = 0;
    const auto start = std::chrono::steady_clock::now();
    double elapsed = 0;
    do {
      cuda::gemm_f32(Trans::no, Trans::yes, n, n, n, 1.0f, a.data(), n, a.data(), n, 0.0f, c.data(), n, ctx_);
      ctx_.synchronize();
      ++runs;
      elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    } while (elapsed < seconds);
    return 2.0 * n * n * n * static_cast<double>(runs) / elapsed;
  }

  void* allocate(size_t bytes) override {
    if (bytes == 0) return nullptr;
    void* p = nullptr;
    const cudaError_t status = cudaMallocAsync(&p, (bytes + 63) / 64 * 64, ctx_.stream());
    if (status == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();  // not sticky: the context stays usable
      throw UsageError("out of GPU memory: " + std::to_string((bytes + (1 << 20) - 1) >> 20) + " MiB more did not fit on " +
                       describe() + ": lower batch, model.context, or the model's width or layers");
    }
    NIBBLE_CUDA_CHECK(status);
    return p;
  }
  void release(void* p) noexcept override {
    if (!p) return;
    if (auto it = releasable_.find(p); it != releasable_.end()) {
      // Unmapped at once, unlike a stream-ordered free: wait for the work that may still use it.
      cudaStreamSynchronize(ctx_.stream());
      releasable_.erase(it);
      return;
    }
    cudaFreeAsync(p, ctx_.stream());  // a failed free only leaks pool memory
  }
  // The parameter arena: address space with chunks mapped into it (kernels/cuda/releasable_memory.h),
  // where the driver offers that; plain device memory (which discard then keeps) where not.
  void* allocate_releasable(size_t bytes) override {
    if (bytes == 0) return nullptr;
    if (!cuda::ReleasableMemory::supported(ctx_.device().ordinal)) return allocate(bytes);
    auto memory = std::make_unique<cuda::ReleasableMemory>(ctx_.device().ordinal, bytes);
    void* p = memory->data();
    releasable_.emplace(p, std::move(memory));
    return p;
  }
  void discard(void* p, size_t bytes) override {
    cuda::ReleasableMemory* m = releasable_memory_of(p);
    if (!m || bytes == 0) return;
    ctx_.synchronize();  // no kernel or copy may still use a chunk about to be unmapped
    m->release(p, bytes);
  }
  // The partial chunks at the ends hold neighbouring data: those bytes are zeroed, the chunks kept;
  // the chunks inside are released, and commit() zeroes them when it maps them again.
  void discard_to_zero(void* p, size_t bytes) override {
    cuda::ReleasableMemory* m = releasable_memory_of(p);
    if (!m) return fill_zero(p, bytes);
    for (const auto& [at, n] : m->partial_chunk_parts(p, bytes)) fill_zero(at, n);
    discard(p, bytes);
  }
  void commit(void* p, size_t bytes) override {
    cuda::ReleasableMemory* m = releasable_memory_of(p);
    if (!m) return;
    for (const auto& [at, n] : m->commit(p, bytes)) fill_zero(at, n);
  }
  void copy(const void* src, void* dst, size_t bytes) override {
    if (bytes) NIBBLE_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, ctx_.stream()));
  }
  void copy_to_host(const void* src, void* host_dst, size_t bytes) override {
    if (bytes) NIBBLE_CUDA_CHECK(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, ctx_.stream()));
    ctx_.synchronize();
    cuda::throw_deferred_nonfinite(ctx_);
  }
  void copy_from_host(const void* host_src, void* dst, size_t bytes) override {
    if (bytes) NIBBLE_CUDA_CHECK(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, ctx_.stream()));
    ctx_.synchronize();  // the host memory may die after return
  }
  void fill_zero(void* p, size_t bytes) override {
    if (bytes) NIBBLE_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, ctx_.stream()));
  }
  // One memset over the ranges' hull: zeroing the gaps costs less than a launch per range.
  void fill_zero_ranges(float* base, std::span<const std::pair<int64_t, int64_t>> ranges) override {
    if (ranges.empty()) return;
    fill_zero(base + ranges.front().first, static_cast<size_t>(ranges.back().second - ranges.front().first) * sizeof(float));
  }
  void synchronize() override {
    ctx_.synchronize();
    cuda::throw_deferred_nonfinite(ctx_);
  }

  std::unique_ptr<Quantized> new_quantized() override { return std::make_unique<DeviceQuantizedTensor>(); }
  // Quantizations check their input for non-finite values without a host synchronisation each: the
  // results are read where this backend synchronises anyway (the loss, the gradient norm, copies to
  // the host, synchronize), and the first offending quantization throws there.
  // On GPUs without FP4 tensor cores (Hopper) every NVFP4 GEMM is the BF16 emulation: the quantize
  // kernel writes its BF16 operand too, so the GEMM runs no dequantize pass.
  cuda::KernelOptions quantize_options() const {
    cuda::KernelOptions k;
    k.defer_finite_check = true;
    k.write_bf16_operand = !cuda::has_native_nvfp4_gemm(ctx_.device().cc_major, ctx_.device().cc_minor);
    return k;
  }
  void quantize(const float* x, int64_t rows, int64_t cols, const QuantOptions& opt, Quantized& out) override {
    dev(out) = cuda::quantize(x, rows, cols, opt, ctx_, quantize_options());
  }
  void quantize_transposed(const float* x, int64_t rows, int64_t cols, const QuantOptions& opt,
                           Quantized& out) override {
    dev(out) = cuda::quantize_transposed(x, rows, cols, opt, ctx_, quantize_options());
  }
  void quantize_both(const float* x, int64_t rows, int64_t cols, const QuantOptions& row_opt, Quantized& row_out,
                     const QuantOptions& t_opt, Quantized& t_out) override {
    // One read of x where the fused kernel takes these options (the training recipe's 1x16 operands);
    // otherwise the two quantizations, which give the same bytes.
    if (row_opt.format == Format::nvfp4 && t_opt.format == Format::nvfp4 && !row_opt.tile_16x16 && !t_opt.tile_16x16 &&
        rows % 16 == 0 && cols % 16 == 0) {
      cuda::QuantizedPair pair = cuda::quantize_both(x, rows, cols, row_opt, t_opt, ctx_, quantize_options());
      dev(row_out) = std::move(pair.rowwise);
      dev(t_out) = std::move(pair.columnwise);
      return;
    }
    quantize(x, rows, cols, row_opt, row_out);
    quantize_transposed(x, rows, cols, t_opt, t_out);
  }
  void transpose_tiles(const Quantized& q, Quantized& out) override {
    const cuda::DeviceQuantized& s = dev(q);
    if (s.format != Format::nvfp4 || s.block != BlockShape::tile_16x16)
      throw UsageError("an exact transpose exists only for nvfp4 16x16 tiles; quantize the transposed tensor instead");
    if (s.rows % 16 != 0)
      throw UsageError("16x16 tiles need a multiple of 16 rows to transpose (got " + std::to_string(s.rows) + ")");
    cuda::DeviceQuantized t;
    t.layout() = s.layout();
    t.rows = s.cols;
    t.cols = s.rows;
    t.codes = cuda::DeviceBuffer<uint8_t>(static_cast<size_t>(t.code_bytes()), ctx_.stream());
    t.scales = cuda::DeviceBuffer<uint8_t>(static_cast<size_t>(t.scale_bytes()), ctx_.stream());
    t.globals = cuda::DeviceBuffer<float>(2, ctx_.stream());
    cuda::transpose_nvfp4_tiles(s.codes.data(), s.scales.data(), s.rows, s.cols, t.codes.data(), t.scales.data(), ctx_);
    cuda::transpose_bf16_operand(s, t, ctx_);  // Hopper: dgrad's weight needs no dequantize pass either
    copy(s.globals.data(), t.globals.data(), 2 * sizeof(float));
    dev(out) = std::move(t);
  }
  void dequantize(const Quantized& q, float* out) override { cuda::dequantize(dev(q), out, ctx_); }

  bool fp32_products_available(Format) const override { return true; }
  bool block_exact_available() const override { return false; }
  std::string describe_summation(Format format, Summation) const override {
    const auto& d = ctx_.device();
    const GemmShapeName path = format == Format::nvfp4 && cuda::has_native_nvfp4_gemm(d.cc_major, d.cc_minor)
                                   ? "native NVFP4 tensor cores"
                               : is_per_tensor_fp8(format) &&
                                       cuda::has_fp8_gemm(d.cc_major, d.cc_minor)
                                   ? "FP8 tensor cores"
                                   : "BF16 tensor cores on the exactly decoded operands";
    return std::string("GEMMs sum products in FP32 on the ") + path + " (cuBLASLt, gemm_summation=fp32_products)";
  }
  void gemm(const Quantized& a, const Quantized& b, float* c, int64_t ldc, float alpha, Output output,
            Summation summation) override {
    if (summation == Summation::block_exact)
      throw UsageError("gemm_summation=block_exact (exact 16-element block products) is a CPU summation; GPUs sum in "
                       "FP32 on their tensor cores: use gemm_summation=auto or fp32_products with device=cuda");
    cuda::gemm(dev(a), dev(b), c, ldc, alpha, output, ctx_);
  }
  void gemm_f32(const DenseGemmShape& s, float alpha, const float* a, const float* b, float beta, float* c) override {
    cuda::gemm_f32(s.ta, s.tb, s.m, s.n, s.k, alpha, a, s.lda, b, s.ldb, beta, c, s.ldc, ctx_);
  }
  // The operands rounded to BF16 (RN) into scratch, then cuBLASLt's BF16 GEMM with FP32 accumulation.
  void gemm_bf16(const DenseGemmShape& s, float alpha, const float* a, const float* b, float beta, float* c) override {
    // The stored extent of each operand: its rows apart by the leading dimension, the last row as long
    // as the operand is wide (a caller's allocation may end there).
    const int64_t a_elems = s.ta == Trans::no ? (s.m - 1) * s.lda + s.k : (s.k - 1) * s.lda + s.m;
    const int64_t b_elems = s.tb == Trans::no ? (s.k - 1) * s.ldb + s.n : (s.n - 1) * s.ldb + s.k;
    auto* a16 = reinterpret_cast<uint16_t*>(
        ctx_.scratch(cuda::Context::Scratch::operand_a, static_cast<size_t>(a_elems) * sizeof(uint16_t)));
    auto* b16 = reinterpret_cast<uint16_t*>(
        ctx_.scratch(cuda::Context::Scratch::operand_b, static_cast<size_t>(b_elems) * sizeof(uint16_t)));
    cuda::round_to_bf16(a, a16, a_elems, ctx_);
    cuda::round_to_bf16(b, b16, b_elems, ctx_);
    cuda::gemm_bf16(s.ta, s.tb, s.m, s.n, s.k, alpha, a16, s.lda, b16, s.ldb, beta, c, s.ldc, ctx_);
  }

  void add(float* y, const float* x, int64_t n) override { cuda::add(y, x, n, ctx_); }
  void round_to_bf16(const float* x, bf16* y, int64_t n) override {
    cuda::round_to_bf16(x, reinterpret_cast<uint16_t*>(y), n, ctx_);
  }
  void widen_bf16(const bf16* x, float* y, int64_t n) override {
    cuda::widen_bf16(reinterpret_cast<const uint16_t*>(x), y, n, ctx_);
  }

  void embedding_forward(const int32_t* tokens, int64_t n, const float* table, int64_t width, float* out) override {
    cuda::embedding_forward(tokens, n, table, width, out, ctx_);
  }
  void embedding_backward(const int32_t* tokens, int64_t n, const float* dout, int64_t width, float* dtable) override {
    cuda::embedding_backward(tokens, n, dout, width, dtable, ctx_);
  }
  void rmsnorm_forward(const RowsShape& s, const float* x, const float* gain, float eps, float* y,
                       float* rstd) override {
    cuda::rmsnorm_forward(x, gain, s.rows, s.cols, eps, y, rstd, ctx_);
  }
  void rmsnorm_backward(const RowsShape& s, const float* x, const float* gain, const float* rstd, const float* dy,
                        float* dx, float* dgain) override {
    cuda::rmsnorm_backward(x, gain, rstd, dy, s.rows, s.cols, dx, dgain, ctx_);
  }
  void rope_forward(float* x, const RopeShape& s, int64_t first_position) override {
    const RopeTable& t = rope_table(first_position + s.seq, s.head_dim, s.theta);
    cuda::rope(x, s.tokens, s.seq, s.stride, s.first_col, s.heads, s.head_dim, t.cos.data(), t.sin.data(),
               first_position, 1.0f, ctx_);
  }
  void rope_backward(float* dx, const RopeShape& s) override {
    const RopeTable& t = rope_table(s.seq, s.head_dim, s.theta);
    cuda::rope(dx, s.tokens, s.seq, s.stride, s.first_col, s.heads, s.head_dim, t.cos.data(), t.sin.data(), 0, -1.0f,
               ctx_);
  }
  void attention_forward(const AttentionShape& s, const float* qkv, float* out, float* softmax_stats) override {
    cuda::attention_forward(s, qkv, out, softmax_stats, ctx_);
  }
  void attention_backward(const AttentionShape& s, const float* qkv, const float* softmax_stats, const float* dout,
                          float* dqkv) override {
    cuda::attention_backward(s, qkv, softmax_stats, dout, dqkv, ctx_);
  }
  bool attention_backward_takes_output(const AttentionShape& s) const override {
    return cuda::attention_backward_takes_output(s, ctx_);
  }
  void attention_backward_with_output(const AttentionShape& s, const float* qkv, const float* softmax_stats,
                                      const float* out, const float* dout, float* dqkv) override {
    cuda::attention_backward(s, qkv, softmax_stats, dout, dqkv, ctx_, out);
  }
  void attention_decode(const AttentionShape& s, int64_t past, const float* qkv, float* k_cache, float* v_cache,
                        float* out) override {
    cuda::attention_decode(s, past, qkv, k_cache, v_cache, out, ctx_);
  }
  void swiglu_forward(const float* gate_up, int64_t n, int64_t hidden, float* a) override {
    cuda::swiglu_forward(gate_up, n, hidden, a, ctx_);
  }
  void swiglu_backward(const float* gate_up, const float* da, int64_t n, int64_t hidden, float* dgate_up) override {
    cuda::swiglu_backward(gate_up, da, n, hidden, dgate_up, ctx_);
  }
  double cross_entropy_forward(const float* logits, const int32_t* targets, int64_t n, int64_t vocab,
                               float* loss) override {
    const double total = cuda::cross_entropy_forward(logits, targets, n, vocab, loss, ctx_);
    cuda::throw_deferred_nonfinite(ctx_);  // the forward's quantizations, at the loss's read
    return total;
  }
  void cross_entropy_backward(const float* logits, const int32_t* targets, int64_t n, int64_t vocab, float scale,
                              float* dlogits) override {
    cuda::cross_entropy_backward(logits, targets, n, vocab, scale, dlogits, ctx_);
  }
  double cross_entropy_forward_keeping(const float* logits, const int32_t* targets, int64_t n, int64_t vocab,
                                       float* loss, float* row_stats) override {
    return cuda::cross_entropy_forward(logits, targets, n, vocab, loss, ctx_, row_stats);
  }
  void cross_entropy_backward_kept(const float* logits, const int32_t* targets, int64_t n, int64_t vocab, float scale,
                                   const float* row_stats, float* dlogits) override {
    cuda::cross_entropy_backward_kept(logits, targets, n, vocab, scale, row_stats, dlogits, ctx_);
  }
  // Read before the optimizer writes anything: the backward's quantizations are checked here, so a
  // step that met non-finite input throws before AdamW, as the CPU backend's (which throws at the
  // quantization itself), and the weights keep their values.
  double sum_of_squares(const float* g, int64_t n) override {
    const double total = cuda::sum_of_squares(g, n, ctx_);
    cuda::throw_deferred_nonfinite(ctx_);
    return total;
  }
  std::vector<double> sum_of_squares_by_chunk(const float* g, int64_t n) override {
    // The sharded optimizer's norm (train/optimizer.h): read before its AdamW, as sum_of_squares.
    std::vector<double> chunks = cuda::sum_of_squares_by_chunk(g, n, ctx_);
    cuda::throw_deferred_nonfinite(ctx_);
    return chunks;
  }
  void adamw_update(const AdamWStep& k, const float* g, float* m, float* v, float* w, const uint8_t* decay_mask,
                    int64_t n) override {
    cuda::adamw_update({k.clip, k.beta1, k.beta2, k.bias1, k.bias2, k.decay, k.lr, k.eps}, g, m, v, w, decay_mask, n,
                       ctx_);
  }

 private:
  using GemmShapeName = const char*;
  struct RopeTable {
    int64_t positions = 0;
    cuda::DeviceBuffer<float> cos, sin;  // [positions, head_dim/2]
  };
  // cos/sin per (head_dim, theta), computed on the host exactly as the CPU's table and grown to the
  // longest sequence asked for. A table replaced while kernels still read it is freed in stream order.
  const RopeTable& rope_table(int64_t positions, int64_t head_dim, double theta) {
    std::lock_guard<std::mutex> lock(rope_mutex_);
    RopeTable& t = rope_tables_[{head_dim, theta}];
    if (t.positions < positions) {
      const int64_t half = head_dim / 2;
      std::vector<float> c(static_cast<size_t>(positions * half)), s(c.size());
      for (int64_t p = 0; p < positions; ++p)
        for (int64_t i = 0; i < half; ++i) cuda::lm::rope_angle(p, i, head_dim, theta, &c[p * half + i], &s[p * half + i]);
      t.cos = cuda::DeviceBuffer<float>::from_host(c, ctx_.stream());
      t.sin = cuda::DeviceBuffer<float>::from_host(s, ctx_.stream());
      t.positions = positions;
    }
    return t;
  }

  cuda::ReleasableMemory* releasable_memory_of(const void* p) {
    if (releasable_.empty() || !p) return nullptr;
    auto it = releasable_.upper_bound(const_cast<void*>(p));
    if (it == releasable_.begin()) return nullptr;
    --it;
    return it->second->contains(p) ? it->second.get() : nullptr;
  }

  cuda::Context& ctx_;
  std::mutex rope_mutex_;
  std::map<std::pair<int64_t, double>, RopeTable> rope_tables_;
  std::map<void*, std::unique_ptr<cuda::ReleasableMemory>> releasable_;  // by start address
};

}  // namespace

bool cuda_built() { return true; }

Backend& cuda() {
  static std::once_flag once;
  static CudaBackend* backend = nullptr;
  std::call_once(once, [] {
    try {
      backend = new CudaBackend(cuda::process_context());  // lives as long as the process, as the context does
    } catch (const cuda::CudaError& e) {
      throw UsageError(std::string("device=cuda: ") + e.what() + "; use device=cpu on this machine");
    }
  });
  return *backend;
}

int cuda_device_count() {
  const cuda::DeviceAvailability a = cuda::probe_devices();
  return a.available ? a.device_count : 0;
}

void select_cuda_device(int ordinal) {
  try {
    cuda::select_default_device(ordinal);
  } catch (const cuda::CudaError& e) {
    throw UsageError(std::string("device=cuda: ") + e.what());
  }
}

uint64_t cuda_device_fingerprint() {
  cuda::Context& ctx = static_cast<CudaBackend&>(cuda()).context();
  uint64_t h = 0xCBF29CE484222325ull;  // FNV-1a
  for (unsigned char byte : ctx.device().uuid) h = (h ^ byte) * 0x100000001B3ull;
  return h;
}

#ifdef NIBBLE_HAVE_NCCL
namespace {
class NcclCollective final : public Collective {
 public:
  NcclCollective(cuda::Context& ctx, const CollectiveId& id, int rank, int size) : nccl_(ctx, id, rank, size) {}
  void sum(float* values, int64_t count) override { nccl_.sum(values, static_cast<size_t>(count)); }
  void reduce_scatter(float* values, std::span<const int64_t> bounds) override { nccl_.reduce_scatter(values, bounds); }
  void all_gather(float* values, std::span<const int64_t> bounds) override { nccl_.all_gather(values, bounds); }
  std::string describe() const override { return nccl_.describe(); }

 private:
  cuda::Collective nccl_;
};
}  // namespace

bool nccl_built() { return true; }

CollectiveId new_cuda_collective_id() {
  try {
    return cuda::new_collective_id();
  } catch (const cuda::CudaError& e) {
    throw UsageError(std::string("device=cuda with several ranks: ") + e.what());
  }
}

std::unique_ptr<Collective> connect_cuda_ranks(const CollectiveId& id, int rank, int size) {
  cuda::Context& ctx = static_cast<CudaBackend&>(cuda()).context();
  try {
    return std::make_unique<NcclCollective>(ctx, id, rank, size);
  } catch (const cuda::CudaError& e) {
    throw UsageError(std::string("device=cuda with several ranks: ") + e.what());
  }
}
#else
namespace {
[[noreturn]] void no_nccl() {
  throw UsageError("device=cuda with several ranks needs NCCL, which this nibble was built without (CMake found "
                   "no nccl.h/libnccl): install NCCL (NVIDIA's libnccl-dev, or the CUDA toolkit's) and rebuild, "
                   "run one process, or use device=cpu under mpirun");
}
}  // namespace
bool nccl_built() { return false; }
CollectiveId new_cuda_collective_id() { no_nccl(); }
std::unique_ptr<Collective> connect_cuda_ranks(const CollectiveId&, int, int) { no_nccl(); }
#endif

}  // namespace nibble::ops
