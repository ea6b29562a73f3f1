// The linear layer whose three GEMMs follow a precision recipe (spec section 5):
//   fprop  Y[T,out]   = X[T,in] W[out,in]^T
//   dgrad  dX[T,in]   = dY[T,out] W[out,in]
//   wgrad  dW[out,in]  = dY^T[out,T] X[T,in]
// T is the number of tokens of the micro-batch. The Linear does not own its weight (the model's
// arena does); it owns what backward needs, in the cheapest form the recipe allows: for a
// quantized wgrad that is the quantized X^T made in the forward pass (4 bits per value for NVFP4),
// not an FP32 copy of X. Every pointer handed to it, and everything it keeps, is in the memory of
// the backend it runs on (ops/backend.h).
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "format/codecs.h"
#include "format/quant_stats.h"
#include "format/quantized_tensor.h"
#include "ops/backend.h"
#include "recipe/recipe.h"

namespace nibble {

// What one step of one linear needs to know beyond its operands.
struct LinearStep {
  LinearRecipe recipe;          // this layer's operands at this point of training
  uint64_t run_seed = 0;        // SR seeds are derived from (run_seed, micro_step, layer, linear, role)
  int64_t micro_step = 0;
  int layer = 0, linear = 0;
  int64_t weight_version = -1;  // optimizer step of the weights: the quantized W is reused while it matches
  bool collect_stats = false;   // telemetry: quant_stats of every quantized operand (costs a dequantize)
  bool save_for_backward = true;  // false for evaluation: forward only, nothing kept
};

// Wall time spent inside this linear, split the way `nibble bench train` reports it.
struct LinearTimes {
  double gemm_s = 0, quantize_s = 0;
};

struct OperandStats {
  std::string operand;  // "fprop.X", "fprop.W", "dgrad.dY", "dgrad.W^T", "wgrad.dY^T", "wgrad.X^T"
  QuantStats stats;
};

// NVFP4 in 16x16 tiles with round-to-nearest and no RHT, Four Over Six or row scaling: a tensor whose
// bytes depend only on its values and its amax, so that it can be made from pieces
// (distributed.fp4_param_gather).
inline bool tiles_from_pieces(const QuantOptions& o) {
  return o.format == Format::nvfp4 && o.tile_16x16 && o.rounding == Rounding::nearest && !o.rht && !o.four_over_six &&
         !o.row_scaled;
}
// The options of the one such weight tensor that fprop and, when `training`, dgrad (its exact
// transpose: out_features a multiple of 16) share under `recipe`, which a weight provider can
// therefore make (Linear::providable_weight); else nullopt.
std::optional<QuantOptions> shared_tile_weight(const LinearRecipe& recipe, int64_t out_features, bool training);

class Linear {
 public:
  Linear(std::string name, int64_t in_features, int64_t out_features, ops::TensorOps& ops);

  const std::string& name() const { return name_; }
  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }

  // x: [tokens, in], w: [out, in] -> y: [tokens, out] (overwritten). x_amax: x's amaxes as its
  // producer gathered them (source_amax_request), or null.
  void forward(const LinearStep& step, const float* x, int64_t tokens, const float* w, float* y,
               const SourceAmax* x_amax = nullptr);
  // What forward(step, x of `tokens` rows) would take from x's producer: a SourceAmax to gather
  // (its rht set) when fprop's X and wgrad's X^T are made in one quantize_both pass that can use
  // it, else nullopt (the producer then runs its plain op).
  std::optional<SourceAmax> source_amax_request(const LinearStep& step, int64_t tokens) const;
  // dy: [tokens, out] -> dx: [tokens, in], dw: [out, in] (both overwritten: what dw held before is
  // never read, so the model's gradients need no zeroing first). w must be the weight forward saw.
  // Releases what forward saved.
  // dy_amax: dY's amaxes as its producer gathered them (gradient_amax_request), or null.
  void backward(const float* dy, const float* w, float* dx, float* dw, const SourceAmax* dy_amax = nullptr);
  // As source_amax_request, for the dY the next backward takes: when dgrad's dY and wgrad's dY^T are
  // made in one quantize_both pass that can use it (after a training forward).
  std::optional<SourceAmax> gradient_amax_request() const;

  // distributed.shard=full with NVFP4 weights: a weight provider may hand this linear its quantized
  // weight (gathered from the ranks' pieces) instead of the FP32 values. That is possible when `step`
  // quantizes fprop's W as 16x16 NVFP4 tiles with round-to-nearest, no RHT, Four Over Six or row
  // scaling, and dgrad (when the step trains) takes that very tensor transposed: then this returns
  // those options, else nullopt. Not with collect_stats (telemetry reads the FP32 W), nor without a
  // weight version (the weight would not be recognised as current).
  std::optional<QuantOptions> providable_weight(const LinearStep& step) const;
  // The tensor a provider fills, then weight_provided(step, options) with providable_weight's
  // options: fprop and dgrad use it as the weight of step.weight_version and never read `w`.
  ops::Quantized& weight_to_provide() { return slot(w_q_); }
  void weight_provided(const LinearStep& step, const QuantOptions& options);
  // Frees the quantized weights (the phase that used them is over; the next provides them again).
  void drop_quantized_weights();
  // The step of the last training forward (what backward will run), until backward.
  const LinearStep& current_step() const { return step_; }

  // Telemetry of the last forward/backward that ran with collect_stats.
  const std::vector<OperandStats>& stats() const { return stats_; }
  const LinearTimes& times() const { return times_; }
  void reset_times() { times_ = {}; }
  // Bytes held between forward and backward for the wgrad operand X (activation memory).
  int64_t saved_activation_bytes() const;
  // Host copies of the quantized weights of the last step (for tests and export: dgrad must see
  // fprop's codes); nullopt before the first quantized GEMM.
  std::optional<QuantizedTensor> fprop_weight() const;
  std::optional<QuantizedTensor> dgrad_weight() const;
  // The global amax of the last forward's input X when fprop quantized it (the activation
  // statistic `nibble export --calibrate` records); -1 when the last forward did not quantize X.
  float fprop_input_amax() const { return fprop_input_quantized_ ? x_q_->amax() : -1.0f; }

 private:
  void record(std::string operand, const float* x, int64_t rows, int64_t cols, bool transposed, const ops::Quantized& q);
  // The quantized tensor in `slot`, made on first use.
  ops::Quantized& slot(std::unique_ptr<ops::Quantized>& q);
  // Whether a quantized weight kept as (valid, version, kept) serves this step's `wanted` options.
  bool reusable(bool valid, int64_t version, const QuantOptions& kept, const QuantOptions& wanted) const;

  // A GEMM on FP32 operands, as ops::TensorOps::gemm_f32 takes it (alpha = 1):
  // C[m,n] = op(A) op(B) + beta C.
  struct DenseGemm {
    ops::DenseGemmShape shape;
    const float* a;
    const float* b;
    float beta;
    float* c;
  };
  // Runs one GEMM of the recipe: `dense` at fp32 or bf16 precision, `quantized()` when quantized.
  template <typename QuantizedGemm>
  void run_gemm(const GemmRecipe& recipe, const DenseGemm& dense, QuantizedGemm&& quantized);
  // The quantized GEMMs of fprop, dgrad and wgrad, with their operands' quantization and telemetry.
  void fprop_quantized(const float* x, const float* w, float* y, const SourceAmax* x_amax);
  void dgrad_quantized(const float* dy, const float* w, float* dx, const SourceAmax* dy_amax);
  void wgrad_quantized(const float* dy, float* dw);
  // Keeps what wgrad needs of X (forward, when training).
  void save_for_wgrad(const float* x);

  std::string name_;
  int64_t in_, out_;
  ops::TensorOps& ops_;
  // State of the current micro-step between forward and backward.
  LinearStep step_;
  int64_t tokens_ = 0;
  ops::Array<float> saved_x_f32_;             // fp32 wgrad
  ops::Array<bf16> saved_x_bf16_;             // bf16 wgrad
  std::unique_ptr<ops::Quantized> saved_xt_q_;  // quantized wgrad: X^T quantized along the tokens
  bool saved_xt_valid_ = false;               // saved_xt_q_ holds this micro-step's X^T
  // The quantized activation/gradient operand of the GEMM being run (X, dY or dY^T), and the FP32
  // copy of a BF16-saved X. Members so that their capacity is reused: a fresh tensor per GEMM cost
  // an allocation, a zero fill and page faults every step.
  std::unique_ptr<ops::Quantized> x_q_, grad_q_, grad_t_q_;  // fprop's X, dgrad's dY, wgrad's dY^T
  bool grad_t_valid_ = false;                 // grad_t_q_ was made with dgrad's dY (quantize_both)
  ops::Array<float> bf16_x_f32_;
  // Quantized weights, reused across the micro-steps of one optimizer step.
  std::unique_ptr<ops::Quantized> w_q_, wt_q_;
  bool w_q_valid_ = false, wt_q_valid_ = false;
  int64_t w_q_version_ = -1, wt_q_version_ = -1;
  QuantOptions w_q_options_{}, wt_q_options_{};
  std::vector<OperandStats> stats_;
  LinearTimes times_;
  // The last forward quantized X into x_q_ (its amax is read on demand: on a GPU, a read waits).
  bool fprop_input_quantized_ = false;
};

}  // namespace nibble
