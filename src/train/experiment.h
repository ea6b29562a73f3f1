// Experiments over recipes that `nibble bench train` runs: the same model trained under each
// recipe for quality (validation loss) and timed for speed (tokens/s, where the time goes, MFU).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "train/trainer.h"

namespace nibble::train {

// Training FLOPs per token, PaLM's estimate: 6 * (non-embedding parameters + LM head) for the
// matrix multiplies of forward and backward, plus 12 * layers * width * seq for attention's
// QK^T and PV (forward and backward, counted without causal halving).
double training_flops_per_token(const model::ModelConfig& m, int64_t seq);

// What one optimizer step must compute and move, by kind: the numerators of the ideal step time that
// `nibble bench train` prints (each kind over the measured peak of the kernel that runs it). Bytes
// count every FP32 tensor an op reads or writes once: no reuse between ops through the caches, and
// none lost to them.
struct StepWork {
  double gemm_flops[3] = {};   // by GemmPrecision (fp32, bf16, quantized): every linear's three GEMMs + the LM head
  // How the quantized GEMMs sum (gemm_summation resolved for the backend): the peak their FLOPs are
  // judged against is that kernel's (on AMX-BF16 CPUs auto means fp32_products, another kernel).
  ops::Summation quantized_summation = ops::Summation::block_exact;
  double attention_flops = 0;  // causal: QK^T and PV forward, the four products of backward
  bool attention_bf16 = false;
  double quantize_bytes = 0;   // each quantized GEMM operand read in FP32, its codes and scales written
  // The part of quantize_bytes made by fused passes: an activation or gradient whose row-wise NVFP4
  // copy (fprop X, dgrad dY) and transposed one (wgrad X^T, dY^T) one quantize_both call makes, its
  // row-wise blocks encoded in the transposed copy's pass. That pair moves the FP32 tensor twice (the
  // amax pass the global scale needs first, then the one encode pass) and both codes and scales;
  // once where the producer gathered the amax as it wrote the tensor (RMSNorm and SwiGLU outputs,
  // SwiGLU backward's dgate_up).
  double fused_quantize_bytes = 0;
  double other_bytes = 0;      // norms, RoPE, SwiGLU, residual adds, attention's inputs and outputs,
                               // embedding, loss, gradient clipping, AdamW
};
StepWork step_work(const model::ModelConfig& m, const Recipe& recipe, int64_t batch, int64_t seq, int64_t grad_accum);

struct SpeedResult {
  double step_s = 0;          // mean wall time of one optimizer step
  double tokens_per_s = 0;
  double gemm_s = 0, quantize_s = 0, rest_s = 0;  // per step
  double achieved_flops = 0;  // training_flops_per_token * tokens_per_s
  StepWork work;              // of the measured configuration
};

// Runs `warmup` steps untimed, then `steps` timed ones, from a fresh model.
SpeedResult measure_training_speed(const TrainConfig& config, const std::vector<int32_t>& corpus, int64_t warmup,
                                   int64_t steps);

struct QualityResult {
  double val_loss = 0;    // at the end of training
  double train_loss = 0;  // mean of the last 20 steps
  std::vector<std::pair<int64_t, double>> val_curve;
  double seconds = 0;
};

// Trains for config.schedule.total_steps steps, evaluating every eval_interval steps and at the end;
// `log` gets one line per evaluation.
QualityResult train_and_evaluate(const TrainConfig& config, const std::vector<int32_t>& corpus, int64_t eval_interval,
                                 const std::function<void(const std::string&)>& log);

}  // namespace nibble::train
