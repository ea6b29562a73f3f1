// The backend seam: every operation that recipe/, model/ and train/ run on tensor data, behind one
// interface with one implementation per device. Nothing above this folder calls nibble::cpu:: or
// nibble::cuda:: directly; a backend is chosen once (the `device` of a run) and handed down.
//
//   TensorOps   memory, quantization (bit-identical to nibble::ref on every backend), quantized and
//               FP32/BF16 GEMMs: what a recipe's Linear needs.
//   LayerOps    the model's layers (embedding, RMSNorm, RoPE, attention, SwiGLU, cross-entropy),
//               forward and backward, plus the optimizer's fixed-order gradient norm and AdamW update.
//   Backend     both: what a whole model trains on.
//
// Pointers handed to a backend point into its own memory (host memory for the CPU, device memory for
// CUDA): allocate it with ops::Array. Calls are ordered as made; a backend may run them
// asynchronously, and copy_to_host waits for what came before it.
//
// Implementations: ops/cpu_backend.cpp (kernels/cpu) and ops/cuda_backend.cpp (kernels/cuda, built
// with NIBBLE_CUDA), each implementing every op.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/error.h"
#include "format/attention_shape.h"
#include "format/codecs.h"
#include "format/gemm_rules.h"
#include "format/quantized_tensor.h"
#include "format/source_amax.h"

namespace nibble::ops {

enum class Device : uint8_t { cpu, cuda };
std::string_view to_string(Device d);
// The chunk of LayerOps::sum_of_squares (elements), the same on every backend: what a ZeRO shard of
// the parameters aligns to so that its partial sums are the one-process ones.
inline constexpr int64_t kSumOfSquaresChunk = int64_t{1} << 14;
// RMSNorm's gain gradient sums each column's terms in token order within tiles of this many tokens
// (each tile from 0) and adds the tiles' sums in order, on every backend: a GPU sums the tiles side
// by side with the CPU's bits.
inline constexpr int64_t kGainTileTokens = 256;
Device parse_device(std::string_view s);  // "cpu" or "cuda"; UsageError naming both

// The GEMM contract of every backend (format/gemm_rules.h): how quantized products are summed,
// overwrite or accumulate, operand transposition.
using nibble::Output;
using nibble::Summation;
using nibble::Trans;

// A quantized tensor in a backend's memory: the layout every backend shares and storage only the
// backend that made it reads. Made empty by TensorOps::new_quantized and filled by its quantizers.
class Quantized {
 public:
  virtual ~Quantized() = default;
  virtual Device device() const = 0;
  virtual const QuantizedLayout& layout() const = 0;
  virtual float amax() const = 0;             // global amax (of the transformed values under RHT); may wait for the device
  virtual int64_t stored_bytes() const = 0;   // codes + block scales
  virtual QuantizedTensor to_host() const = 0;
};

// The causal attention core's shape, every backend's (format/attention_shape.h).
using nibble::AttentionShape;

// A dense GEMM's operands, row-major: C[m, n] = alpha op(A)[m, k] . op(B)[k, n] + beta C, where op
// transposes when ta/tb is Trans::yes; lda, ldb, ldc are the stored row lengths of A, B and C.
struct DenseGemmShape {
  Trans ta = Trans::no, tb = Trans::no;
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldc = 0;

  // The three products of a linear layer on contiguous operands: C = A B^T (forward, A [m, k] and
  // B [n, k]), C = A B (A [m, k], B [k, n]) and C = A^T B (A [k, m], B [k, n]).
  static DenseGemmShape a_bt(int64_t m, int64_t n, int64_t k) {
    return {.ta = Trans::no, .tb = Trans::yes, .m = m, .n = n, .k = k, .lda = k, .ldb = k, .ldc = n};
  }
  static DenseGemmShape a_b(int64_t m, int64_t n, int64_t k) {
    return {.ta = Trans::no, .tb = Trans::no, .m = m, .n = n, .k = k, .lda = k, .ldb = n, .ldc = n};
  }
  static DenseGemmShape at_b(int64_t m, int64_t n, int64_t k) {
    return {.ta = Trans::yes, .tb = Trans::no, .m = m, .n = n, .k = k, .lda = m, .ldb = n, .ldc = n};
  }
};

// `rows` rows of `cols` values each (one token per row), row-major and contiguous.
struct RowsShape {
  int64_t rows = 0, cols = 0;
};

// Half-split RoPE on `heads` heads of head_dim values each, from column first_col of [tokens, stride]
// rows; token t sits at position t % seq (plus the call's first position). theta: the frequency base
// (the model's rope_theta).
struct RopeShape {
  int64_t tokens = 0, seq = 0, stride = 0, first_col = 0, heads = 0, head_dim = 0;
  double theta = 0;
};

// AdamW's per-step scalars (train/optimizer.h derives them from the config and the step).
struct AdamWStep {
  float clip = 1, beta1 = 0.9f, beta2 = 0.99f, bias1 = 1, bias2 = 1, decay = 0, lr = 0, eps = 1e-8f;
};

class TensorOps {
 public:
  virtual ~TensorOps() = default;
  virtual Device device() const = 0;
  virtual std::string describe() const = 0;  // e.g. "cpu (avx2, 2 threads)"
  // The FP32 multiply-add rate of the whole device in FLOP/s, measured for about `seconds` (the
  // denominator of a run's MFU).
  virtual double measure_peak_f32_flops(double seconds) = 0;

  // ---- memory -----------------------------------------------------------------------------------
  virtual void* allocate(size_t bytes) = 0;  // aligned to 64 bytes; nullptr for 0
  virtual void release(void* p) noexcept = 0;
  virtual void copy(const void* src, void* dst, size_t bytes) = 0;  // within this backend's memory
  virtual void copy_to_host(const void* src, void* host_dst, size_t bytes) = 0;  // waits
  virtual void copy_from_host(const void* host_src, void* dst, size_t bytes) = 0;
  virtual void fill_zero(void* p, size_t bytes) = 0;
  // Zeros at least the ranges [begin, end) of base (in floats; sorted and disjoint); what lies between
  // them may be zeroed too (a GPU does it in one memset rather than a launch per range). The
  // parameter arena's gradients that the backward pass adds into (model/params.h).
  virtual void fill_zero_ranges(float* base, std::span<const std::pair<int64_t, int64_t>> ranges) {
    for (const auto& [begin, end] : ranges) fill_zero(base + begin, static_cast<size_t>(end - begin) * sizeof(float));
  }
  // Memory of which discard() can give pieces back while its addresses stay: the parameter arena's
  // values and gradients, which ZeRO-2 and ZeRO-3 hold only in part. The CPU's every allocation is
  // (madvise); a GPU's is address space reserved once with physical chunks mapped into it.
  virtual void* allocate_releasable(size_t bytes) { return allocate(bytes); }
  // The contents of [p, p + bytes) are no longer needed: the backend may give that memory back to the
  // system (the CPU the whole pages inside it, a GPU the whole chunks of releasable memory) while the
  // allocation stays valid. Before the range is read or written again, commit() it; the bytes are
  // unspecified until written. distributed.shard=full drops the weights a rank does not own so.
  virtual void discard(void* p, size_t bytes) {
    (void)p;
    (void)bytes;
  }
  // discard(), and the range reads as zeros once committed (ZeRO-2's gradients between steps, which
  // the backward pass accumulates into).
  virtual void discard_to_zero(void* p, size_t bytes) {
    fill_zero(p, bytes);
    discard(p, bytes);
  }
  // [p, p + bytes) is about to be used after a discard: memory given back is taken again (on a GPU,
  // mapped; what discard_to_zero released reads as zeros). The CPU needs nothing: a released page
  // comes back, zeroed, when touched.
  virtual void commit(void* p, size_t bytes) {
    (void)p;
    (void)bytes;
  }
  virtual void synchronize() = 0;  // waits for every call made so far

  // ---- quantization: x is [rows, cols] FP32 row-major; the same bytes as nibble::ref ---------------
  virtual std::unique_ptr<Quantized> new_quantized() = 0;
  // Row-wise blocks along cols (ref::quantize). UsageError for shapes/options the reference refuses,
  // NumericalError for non-finite input, naming it.
  virtual void quantize(const float* x, int64_t rows, int64_t cols, const QuantOptions& opt, Quantized& out) = 0;
  // The quantization of x^T, [cols, rows] (ref::quantize_transposed).
  virtual void quantize_transposed(const float* x, int64_t rows, int64_t cols, const QuantOptions& opt,
                                   Quantized& out) = 0;
  // Both: x row-wise with row_opt into row_out and x^T with t_opt into t_out, the same bytes as the
  // two calls above (a backend reads x once less).
  virtual void quantize_both(const float* x, int64_t rows, int64_t cols, const QuantOptions& row_opt,
                             Quantized& row_out, const QuantOptions& t_opt, Quantized& t_out) = 0;
  // As quantize_both, with x's amaxes as its producer gathered them (LayerOps' *_gathering ops): the
  // quantizer then skips its own amax pass. The same bytes whatever `known` holds (an invalid or
  // unusable one is ignored). A backend without gathering producers takes the plain call.
  virtual void quantize_both_gathered(const float* x, int64_t rows, int64_t cols, const QuantOptions& row_opt,
                                      Quantized& row_out, const QuantOptions& t_opt, Quantized& t_out,
                                      const SourceAmax& known) {
    (void)known;
    quantize_both(x, rows, cols, row_opt, row_out, t_opt, t_out);
  }
  // The exact transpose of a 16x16-tile NVFP4 tensor (ref::transpose_tiles): a weight's column-wise
  // copy without quantizing it again. UsageError for other blocks.
  virtual void transpose_tiles(const Quantized& q, Quantized& out) = 0;
  // ---- a tensor quantized in pieces (distributed.shard=full's NVFP4 weight gather) ----------------
  // max |x| over n values, as a float: +Inf or NaN when x holds one (the amax a rank contributes to
  // a tensor it holds part of).
  virtual float max_abs(const float* x, int64_t n);
  // Rows of a larger tensor whose amax (over all of it) is `tensor_amax`, quantized with its global
  // scale: when they start on a block boundary (for 16x16 tiles, a multiple of 16 rows into the
  // tensor), the bytes the whole tensor's quantization gives them. NVFP4 with round-to-nearest, no
  // RHT and no row scaling (whose bytes depend on nothing else); UsageError otherwise, NumericalError
  // for non-finite x, an internal error when x exceeds tensor_amax.
  virtual void quantize_rows_of(const float* x, int64_t rows, int64_t cols, const QuantOptions& opt,
                                float tensor_amax, Quantized& out);
  // A quantized tensor assembled on the host (codes and scales gathered from the ranks), moved into
  // this backend's memory.
  virtual void load_quantized(QuantizedTensor host, Quantized& out);
  // Values in the original domain (inverse RHT applied), [rows, cols] FP32.
  virtual void dequantize(const Quantized& q, float* out) = 0;

  // ---- GEMMs -------------------------------------------------------------------------------------
  // True when Summation::fp32_products has its own kernel for operands of `format` here (else a
  // gemm asked for it sums as block_exact).
  virtual bool fp32_products_available(Format format) const = 0;
  // False where the backend has no exact block-product summation (GPUs: their tensor cores sum in FP32).
  virtual bool block_exact_available() const = 0;
  // How a GEMM of `format` operands asked to sum with `summation` sums here, in words for a run's log.
  virtual std::string describe_summation(Format format, Summation summation) const = 0;
  // C[M,N] (+)= alpha * A[M,K] . B[N,K]^T, both K-contiguous quantized operands, FP32 C with leading
  // dimension ldc >= N. UsageError on mismatched shapes or formats.
  virtual void gemm(const Quantized& a, const Quantized& b, float* c, int64_t ldc, float alpha, Output output,
                    Summation summation) = 0;
  // BLAS-style, row-major: C[M,N] = alpha op(A) op(B) + beta C (DenseGemmShape). gemm_bf16 rounds the
  // operands to BF16 (RN) and accumulates in FP32. Bitwise the same for any thread count.
  virtual void gemm_f32(const DenseGemmShape& s, float alpha, const float* a, const float* b, float beta,
                        float* c) = 0;
  virtual void gemm_bf16(const DenseGemmShape& s, float alpha, const float* a, const float* b, float beta,
                         float* c) = 0;

  // ---- element-wise ------------------------------------------------------------------------------
  virtual void add(float* y, const float* x, int64_t n) = 0;  // y += x
  virtual void round_to_bf16(const float* x, bf16* y, int64_t n) = 0;  // RN
  virtual void widen_bf16(const bf16* x, float* y, int64_t n) = 0;
};

class LayerOps {
 public:
  virtual ~LayerOps() = default;
  // N tokens, width d. Each forward/backward pair is the CPU kernel file of the same name
  // (kernels/cpu/layers/<layer>.h), where the equations are written out.
  // out[N, d] = table[tokens[n]]; dtable[tokens[n]] += dout[n], in token order.
  virtual void embedding_forward(const int32_t* tokens, int64_t n, const float* table, int64_t width, float* out) = 0;
  virtual void embedding_backward(const int32_t* tokens, int64_t n, const float* dout, int64_t width,
                                  float* dtable) = 0;
  // y[N, d] = x * rstd * gain over s = {N, d}, rstd[N] saved; backward adds into dx and dgain.
  virtual void rmsnorm_forward(const RowsShape& s, const float* x, const float* gain, float eps, float* y,
                               float* rstd) = 0;
  // As rmsnorm_forward, and gathers y's SourceAmax for the quantize_both_gathered that reads y next
  // (amax.rht: with x^T's RHT amax; s.cols % 16 == 0, with the RHT s.rows % 16 == 0). A backend that
  // does not fuse it leaves amax.valid false.
  virtual void rmsnorm_forward_gathering(const RowsShape& s, const float* x, const float* gain, float eps, float* y,
                                         float* rstd, SourceAmax& amax) {
    rmsnorm_forward(s, x, gain, eps, y, rstd);
    amax.valid = false;
  }
  virtual void rmsnorm_backward(const RowsShape& s, const float* x, const float* gain, const float* rstd,
                                const float* dy, float* dx, float* dgain) = 0;
  // As rmsnorm_backward, and gathers the SourceAmax of the whole dx it adds into (the residual
  // stream's gradient: the dY of the linear before it) for that linear's backward.
  virtual void rmsnorm_backward_gathering(const RowsShape& s, const float* x, const float* gain, const float* rstd,
                                          const float* dy, float* dx, float* dgain, SourceAmax& amax) {
    rmsnorm_backward(s, x, gain, rstd, dy, dx, dgain);
    amax.valid = false;
  }
  // Half-split RoPE in place (RopeShape); token t at position first_position + t % s.seq. The backend
  // keeps the cos/sin tables per (head_dim, theta).
  virtual void rope_forward(float* x, const RopeShape& s, int64_t first_position) = 0;
  virtual void rope_backward(float* dx, const RopeShape& s) = 0;
  // rope_backward of the query heads and then of the key heads of the same rows (query and key differ
  // only in first_col and heads), gathering the SourceAmax of dx's whole rows (the qkv linear's dY;
  // rmsnorm_forward_gathering) as they are rotated.
  virtual void rope_backward_gathering(float* dx, const RopeShape& query, const RopeShape& key, SourceAmax& amax) {
    rope_backward(dx, query);
    rope_backward(dx, key);
    amax.valid = false;
  }
  // Causal GQA attention core: qkv [N, qkv_stride] -> out [N, heads*head_dim], softmax_stats saved.
  virtual void attention_forward(const AttentionShape& s, const float* qkv, float* out, float* softmax_stats) = 0;
  // Whether attention_backward_with_output gains from the forward's output O (a training forward
  // then keeps O per layer): the GPU's tiled kernels otherwise recompute O for the row sums of dO * O.
  virtual bool attention_backward_takes_output(const AttentionShape& s) const {
    (void)s;
    return false;
  }
  // attention_backward given O as attention_forward wrote it ([batch*seq, heads*head_dim]): the same bits.
  virtual void attention_backward_with_output(const AttentionShape& s, const float* qkv, const float* softmax_stats,
                                              const float* out, const float* dout, float* dqkv) {
    (void)out;
    attention_backward(s, qkv, softmax_stats, dout, dqkv);
  }
  virtual void attention_backward(const AttentionShape& s, const float* qkv, const float* softmax_stats,
                                  const float* dout, float* dqkv) = 0;
  // Sampling with a KV cache: s.seq new tokens of one sequence (s.batch == 1, FP32) at positions
  // [past, past + s.seq); appends their keys and values to the caches [capacity, kv_heads*head_dim],
  // then attends each new query to the cached keys up to its position. out: [s.seq, heads*head_dim].
  virtual void attention_decode(const AttentionShape& s, int64_t past, const float* qkv, float* k_cache,
                                float* v_cache, float* out) = 0;
  // a[N, f] = silu(gate) * up of gate_up [N, 2f]; backward overwrites dgate_up.
  virtual void swiglu_forward(const float* gate_up, int64_t n, int64_t hidden, float* a) = 0;
  // As swiglu_forward, and gathers a's SourceAmax (rmsnorm_forward_gathering).
  virtual void swiglu_forward_gathering(const float* gate_up, int64_t n, int64_t hidden, float* a, SourceAmax& amax) {
    swiglu_forward(gate_up, n, hidden, a);
    amax.valid = false;
  }
  virtual void swiglu_backward(const float* gate_up, const float* da, int64_t n, int64_t hidden,
                               float* dgate_up) = 0;
  // As swiglu_backward, and gathers dgate_up's SourceAmax (rmsnorm_forward_gathering).
  virtual void swiglu_backward_gathering(const float* gate_up, const float* da, int64_t n, int64_t hidden,
                                         float* dgate_up, SourceAmax& amax) {
    swiglu_backward(gate_up, da, n, hidden, dgate_up);
    amax.valid = false;
  }
  // Per-token loss [N]; returns their sum in double, token order. Backward overwrites dlogits
  // (may alias logits) with scale * (softmax - onehot).
  virtual double cross_entropy_forward(const float* logits, const int32_t* targets, int64_t n, int64_t vocab,
                                       float* loss) = 0;
  virtual void cross_entropy_backward(const float* logits, const int32_t* targets, int64_t n, int64_t vocab,
                                      float scale, float* dlogits) = 0;
  // Training's pair: the forward also keeps each row's max and 1 / (sum of exp) in row_stats [N, 2],
  // and the backward takes them instead of reading the row twice more to find them again: the same
  // bits as the two calls above.
  virtual double cross_entropy_forward_keeping(const float* logits, const int32_t* targets, int64_t n, int64_t vocab,
                                               float* loss, float* row_stats) = 0;
  virtual void cross_entropy_backward_kept(const float* logits, const int32_t* targets, int64_t n, int64_t vocab,
                                           float scale, const float* row_stats, float* dlogits) = 0;
  // sum g^2 in double, in fixed chunks of kSumOfSquaresChunk added in order (the same for any
  // thread count).
  virtual double sum_of_squares(const float* g, int64_t n) = 0;
  // Those chunks' sums, in order (sum_of_squares is 0.0 + [0] + [1] + ...): a ZeRO shard aligned to
  // the chunks computes its share of the one-process sum.
  virtual std::vector<double> sum_of_squares_by_chunk(const float* g, int64_t n) = 0;
  // AdamW on n parameters: m, v, w updated in place from g; decay_mask[i] is 1 where weight decay applies.
  virtual void adamw_update(const AdamWStep& k, const float* g, float* m, float* v, float* w,
                            const uint8_t* decay_mask, int64_t n) = 0;
};

class Backend : public TensorOps, public LayerOps {};

// The CPU backend (one per process; kernels chosen once from cpuid, capped by NIBBLE_ISA).
Backend& cpu();
// The CUDA backend on device 0 ($NIBBLE_CUDA_DEVICE), made at first use. UsageError naming the fix
// when this build has no CUDA backend or no usable GPU and driver is found.
Backend& cuda();
bool cuda_built();  // whether this build has the CUDA backend (a GPU may still be missing)
// The backend of a device: cpu() or cuda() (with cuda()'s UsageError when no GPU is usable).
Backend& backend(Device d);

// ---- one process per GPU (data parallelism under mpirun, train/distributed.h) ------------------
// GPUs this process sees: 0 without a GPU, a driver or a CUDA build. Never throws.
int cuda_device_count();
// Makes cuda() open GPU `ordinal` (call before its first use); UsageError naming the fix when the
// GPU does not exist or cuda() already runs on another one.
void select_cuda_device(int ordinal);
// A hash of the UUID of cuda()'s GPU: equal in two processes exactly when they share one GPU.
uint64_t cuda_device_fingerprint();

// In-place FP32 sums over the processes of a job, on arrays in one backend's memory; every process
// receives the same bits. With 2^k processes the order is the balanced binary tree over ranks
// (partners rank ^ 1, ^ 2, ^ 4, ...), the CPU path's order; otherwise the library's.
class Collective {
 public:
  virtual ~Collective() = default;
  virtual void sum(float* values, int64_t count) = 0;  // returns when the sum is complete
  // ZeRO-1: afterwards values[bounds[rank], bounds[rank + 1]) holds bitwise what sum() leaves there
  // (recursive halving with sum()'s partners, common/rank_tree.h), the rest unspecified; bounds are
  // the ranks' slices, size + 1 ascending offsets from 0 to the length of `values`.
  virtual void reduce_scatter(float* values, std::span<const int64_t> bounds) = 0;
  // Every rank's values[bounds[r], bounds[r + 1]) to every rank, in place (a copy: the owner's bits).
  virtual void all_gather(float* values, std::span<const int64_t> bounds) = 0;
  virtual std::string describe() const = 0;            // e.g. "NCCL 2.28.9, 4 GPUs"
};
using CollectiveId = std::array<std::byte, 128>;
bool nccl_built();  // whether this build links NCCL (several GPUs)
// Rank 0 makes the id and hands it to every rank (over MPI); each then connects with it. Both throw
// UsageError when this build has no NCCL, and NCCL's reason when the ranks cannot connect.
CollectiveId new_cuda_collective_id();
std::unique_ptr<Collective> connect_cuda_ranks(const CollectiveId& id, int rank, int size);

// A typed array in a backend's memory, owned: the storage behind every pointer handed to a backend.
// Growth keeps the contents (as std::vector); a default-constructed array is empty and belongs to
// no backend until bind().
template <typename T>
class Array {
 public:
  Array() = default;
  explicit Array(TensorOps& ops, size_t n = 0) : ops_(&ops) { resize(n); }
  ~Array() { reset(); }
  Array(Array&& o) noexcept
      : ops_(o.ops_), data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)),
        capacity_(std::exchange(o.capacity_, 0)), releasable_(o.releasable_) {}
  Array& operator=(Array&& o) noexcept {
    if (this != &o) {
      reset();
      ops_ = o.ops_;
      data_ = std::exchange(o.data_, nullptr);
      size_ = std::exchange(o.size_, 0);
      capacity_ = std::exchange(o.capacity_, 0);
      releasable_ = o.releasable_;
    }
    return *this;
  }
  Array(const Array&) = delete;
  Array& operator=(const Array&) = delete;

  void bind(TensorOps& ops) {
    NIBBLE_CHECK(ops_ == nullptr || ops_ == &ops || capacity_ == 0,
                 "Array::bind: an array holding memory of one backend cannot move to another");
    ops_ = &ops;
  }
  TensorOps* ops() const { return ops_; }
  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  size_t bytes() const { return size_ * sizeof(T); }

  // From the next allocation on, memory that TensorOps::discard can release piecewise.
  void make_releasable() { releasable_ = true; }

  // Contents up to min(old, new) size are kept; new elements are unspecified.
  void resize(size_t n) {
    if (n > capacity_) {
      NIBBLE_CHECK(ops_ != nullptr, "Array::resize on an array bound to no backend");
      T* grown = static_cast<T*>(releasable_ ? ops_->allocate_releasable(n * sizeof(T)) : ops_->allocate(n * sizeof(T)));
      if (size_ > 0) ops_->copy(data_, grown, size_ * sizeof(T));
      if (data_) ops_->release(data_);
      data_ = grown;
      capacity_ = n;
    }
    size_ = n;
  }
  void resize_zeroed(size_t n) {
    resize(n);
    if (n) ops_->fill_zero(data_, bytes());
  }
  void clear() { size_ = 0; }  // capacity kept
  void assign_from_host(const T* host, size_t n) {
    resize(n);
    if (n) ops_->copy_from_host(host, data_, bytes());
  }
  void assign_copy(const T* src, size_t n) {  // src in the same backend's memory
    resize(n);
    if (n) ops_->copy(src, data_, bytes());
  }
  void copy_to_host(T* host) const {
    if (size_) ops_->copy_to_host(data_, host, bytes());
  }
  std::vector<T> to_host() const {
    std::vector<T> host(size_);
    copy_to_host(host.data());
    return host;
  }
  void reset() noexcept {
    if (data_) ops_->release(data_);
    data_ = nullptr;
    size_ = capacity_ = 0;
  }

 private:
  TensorOps* ops_ = nullptr;
  T* data_ = nullptr;
  size_t size_ = 0, capacity_ = 0;
  bool releasable_ = false;
};

}  // namespace nibble::ops
