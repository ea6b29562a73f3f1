#include "train/experiment.h"

#include <chrono>
#include <cmath>
#include <cstdio>

namespace nibble::train {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
// Whether Linear's quantize_both makes this operand's row-wise copy (of `row_gemm`) and its
// transposed one (of `t_gemm`) in one encode pass: both NVFP4 1x16 blocks, neither row-scaled, the
// row-wise copy without the RHT (its amax is then max |x|, which the transposed copy's amax pass
// yields). The CPU's quantize_both_into decides the same way (RowCompanion::fits).
bool fused_pair(const GemmRecipe& row_gemm, const QuantOptions& row, const GemmRecipe& t_gemm, const QuantOptions& t) {
  auto blocks_1x16 = [](const QuantOptions& o) { return o.format == Format::nvfp4 && !o.tile_16x16 && !o.row_scaled; };
  return row_gemm.precision == GemmPrecision::quantized && t_gemm.precision == GemmPrecision::quantized &&
         blocks_1x16(row) && blocks_1x16(t) && !row.rht;
}

}  // namespace

double training_flops_per_token(const model::ModelConfig& m, int64_t seq) {
  const double d = static_cast<double>(m.width), hd = static_cast<double>(m.head_dim());
  const double qkv = d * (static_cast<double>(m.heads + 2 * m.kv_head_count()) * hd);
  const double per_block = qkv + static_cast<double>(m.heads) * hd * d + 3.0 * d * static_cast<double>(m.hidden());
  const double matmul_params = static_cast<double>(m.layers) * per_block + static_cast<double>(m.vocab) * d;
  return 6.0 * matmul_params + 12.0 * static_cast<double>(m.layers) * d * static_cast<double>(seq);
}

StepWork step_work(const model::ModelConfig& m, const Recipe& recipe, int64_t batch, int64_t seq, int64_t grad_accum) {
  StepWork w;
  w.quantized_summation = recipe.summation(recipe.config().quantization);
  const double T = static_cast<double>(batch * seq * grad_accum), d = static_cast<double>(m.width);
  const double hd = static_cast<double>(m.head_dim()), f = static_cast<double>(m.hidden());
  const double H = static_cast<double>(m.heads), qkv = (H + 2.0 * static_cast<double>(m.kv_head_count())) * hd;
  const double V = static_cast<double>(m.vocab);
  const double shapes[4][2] = {{d, qkv}, {H * hd, d}, {d, 2 * f}, {f, d}};  // in, out of qkv, attn_out, gate_up, down
  for (int64_t l = 0; l < m.layers; ++l) {
    for (int linear = 0; linear < 4; ++linear) {
      const LinearRecipe lr = recipe.for_linear(static_cast<int>(l), linear, 0.0);
      const auto& [in, out] = shapes[linear];
      // fprop Y = X W^T, dgrad dX = dY W, wgrad dW = dY^T X: 2 T in out FLOPs each.
      const GemmRecipe* gemms[3] = {&lr.fprop, &lr.dgrad, &lr.wgrad};
      // Operands quantized per GEMM (elements): fprop X, W; dgrad dY, W (cached when shared); wgrad dY^T, X^T.
      const double operands[3][2] = {{T * in, in * out}, {T * out, lr.weight_shared_by_fprop_and_dgrad() ? 0 : in * out},
                                     {T * out, T * in}};
      for (int g = 0; g < 3; ++g) {
        w.gemm_flops[static_cast<int>(gemms[g]->precision)] += 2.0 * T * in * out;
        if (gemms[g]->precision == GemmPrecision::quantized)
          w.quantize_bytes += operands[g][0] * (4 + stored_bytes_per_element(gemms[g]->a.format)) +
                              operands[g][1] * (4 + stored_bytes_per_element(gemms[g]->b.format));
      }
      // X (fprop a, wgrad b) and dY (dgrad a, wgrad a): 8 bytes read (amax pass, encode pass) plus
      // both copies' codes and scales, as counted above. The X of qkv, gate_up and down has its amax
      // gathered by its producer (RMSNorm, SwiGLU) while that writes it: only the encode pass reads
      // it (the producer's write is in other_bytes). So quantize_bytes drops by those 4 bytes.
      // (attn_out's X comes from attention: its own pass; Linear::source_amax_request's shapes.)
      const bool x_amax_gathered = linear != 1 && static_cast<int64_t>(in) % 16 == 0 &&
                                   (!lr.wgrad.b.rht || (batch * seq) % 16 == 0);
      if (fused_pair(lr.fprop, lr.fprop.a, lr.wgrad, lr.wgrad.b)) {
        const double x_reads = x_amax_gathered ? 4 : 8;
        w.fused_quantize_bytes += T * in * (x_reads + 2 * stored_bytes_per_element(Format::nvfp4));
        w.quantize_bytes -= T * in * (8 - x_reads);
      }
      // Every dY's amax is gathered by the op that completes it: RoPE's backward (qkv), RMSNorm's
      // backward, which completes the residual stream's gradient (attn_out, down), SwiGLU's (gate_up).
      const bool dy_amax_gathered = static_cast<int64_t>(out) % 16 == 0 &&
                                    (!lr.wgrad.a.rht || (batch * seq) % 16 == 0);
      if (fused_pair(lr.dgrad, lr.dgrad.a, lr.wgrad, lr.wgrad.a)) {
        const double dy_reads = dy_amax_gathered ? 4 : 8;
        w.fused_quantize_bytes += T * out * (dy_reads + 2 * stored_bytes_per_element(Format::nvfp4));
        w.quantize_bytes -= T * out * (8 - dy_reads);
      }
    }
  }
  w.gemm_flops[static_cast<int>(recipe.lm_head_bf16() ? GemmPrecision::bf16 : GemmPrecision::fp32)] +=
      3 * 2.0 * T * d * V;  // LM head
  // Causal attention: each product is B H S^2/2 hd multiply-adds; 2 forward, 4 backward.
  w.attention_flops = static_cast<double>(m.layers) * 6 * 2.0 * (T / static_cast<double>(seq)) * H *
                      static_cast<double>(seq * seq) / 2 * hd;
  w.attention_bf16 = recipe.attention_bf16();
  // FP32 traffic per token and layer, forward + backward: RMSNorm x2 (read x, write y; backward
  // reads x, dy and adds into dx), RoPE on q and k (read, write; same backward), attention's qkv and
  // output (and dqkv, dout), two residual adds (read 2, write 1), SwiGLU (read 2f, write f; backward
  // reads 3f, writes 2f), the activations each linear's backward reads again.
  const double qk = (H + static_cast<double>(m.kv_head_count())) * hd;
  const double per_token_layer = 2 * (2 * d + 4 * d) + (2 * qk + 2 * qk) + (qkv + H * hd + 2 * qkv + H * hd) +
                                 2 * (3 * d + 3 * d) + (3 * f + 5 * f);
  const double params = static_cast<double>(m.layers) * (d * qkv + H * hd * d + 3 * d * f + 2 * d) + V * d + d +
                        (m.tied_embeddings ? 0 : V * d);
  w.other_bytes = 4 * (T * static_cast<double>(m.layers) * per_token_layer  // layers
                       + T * (2 * d + 2 * d)                              // embedding, final norm
                       + T * V * 3                                        // logits: softmax + backward
                       + params * (1 + 7 + 1));  // clipping reads g; AdamW reads p, g, m, v, writes p, m, v; grads zeroed
  return w;
}

SpeedResult measure_training_speed(const TrainConfig& config, const std::vector<int32_t>& corpus, int64_t warmup,
                                   int64_t steps) {
  Trainer trainer(config, corpus);
  for (int64_t i = 0; i < warmup; ++i) trainer.step();
  trainer.model().reset_times();
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < steps; ++i) trainer.step();
  const double total = seconds_since(t0);
  SpeedResult r;
  const double n = static_cast<double>(steps);
  const int64_t seq = config.seq > 0 ? config.seq : config.model.context;
  r.step_s = total / n;
  r.tokens_per_s = static_cast<double>(config.batch * seq * config.grad_accum) / r.step_s;
  const LinearTimes lt = trainer.model().linear_times();
  r.gemm_s = (lt.gemm_s + trainer.model().head_gemm_seconds()) / n;
  r.quantize_s = lt.quantize_s / n;
  r.rest_s = r.step_s - r.gemm_s - r.quantize_s;
  r.achieved_flops = training_flops_per_token(config.model, seq) * r.tokens_per_s;
  r.work = step_work(config.model, trainer.recipe(), config.batch, seq, config.grad_accum);
  return r;
}

QualityResult train_and_evaluate(const TrainConfig& config, const std::vector<int32_t>& corpus, int64_t eval_interval,
                                 const std::function<void(const std::string&)>& log) {
  Trainer trainer(config, corpus);
  QualityResult r;
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t total = config.schedule.total_steps;
  std::vector<double> recent;
  for (int64_t s = 0; s < total; ++s) {
    StepResult st = trainer.step();
    if (!std::isfinite(st.loss))
      throw UsageError("training diverged at step " + std::to_string(st.step) + " under " + describe(config.recipe) +
                       ": lower the learning rate or keep more layers in BF16");
    recent.push_back(st.loss);
    if (recent.size() > 20) recent.erase(recent.begin());
    if ((eval_interval > 0 && st.step % eval_interval == 0) || st.step == total) {
      const double val = trainer.evaluate();
      r.val_curve.emplace_back(st.step, val);
      char line[200];
      std::snprintf(line, sizeof line, "  [%s] step %5lld  train %.4f  val %.4f  lr %.2e  |g| %.3f  %.0fs",
                    std::string(to_string(config.recipe.quantization)).c_str(), static_cast<long long>(st.step),
                    st.loss, val, static_cast<double>(st.lr), st.grad_norm, seconds_since(t0));
      if (log) log(line);
    }
  }
  r.val_loss = r.val_curve.back().second;
  double sum = 0;
  for (double l : recent) sum += l;
  r.train_loss = sum / static_cast<double>(recent.size());
  r.seconds = seconds_since(t0);
  return r;
}

}  // namespace nibble::train
