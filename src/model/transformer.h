// A decoder-only, Llama-style language model with hand-written forward and backward:
//   x0 = embed(tokens)                                     [N, d]   (N = batch * seq tokens)
//   per block l:  h  = rmsnorm(x; g1)                      [N, d]
//                 qkv = Linear_qkv(h), RoPE on q and k      [N, (H + 2 Hkv) hd]
//                 o  = causal_attention(qkv)               [N, H hd]
//                 x' = x + Linear_o(o)                     [N, d]
//                 gu = Linear_gate_up(rmsnorm(x'; g2))     [N, 2 f]
//                 x  = x' + Linear_down(swiglu(gu))        [N, d]
//   logits = rmsnorm(x; gf) E^T (tied) or W_head^T          [N, vocab]
//   loss = mean cross-entropy(logits, targets)
// The four linears of every block follow the precision recipe; embeddings, norms, attention core,
// LM head and loss stay in FP32 (spec section 5). Parameters live in one FP32 arena. Every layer runs
// on the backend the model was made with (ops/backend.h), and its activations live in that
// backend's memory.
#pragma once
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "model/params.h"
#include "ops/backend.h"
#include "recipe/linear.h"
#include "recipe/recipe.h"

namespace nibble::model {

struct ModelConfig {
  int64_t vocab = 65;
  int64_t layers = 4;
  int64_t heads = 4;
  int64_t kv_heads = 0;      // 0: same as heads (no GQA)
  int64_t width = 128;
  int64_t mlp_hidden = 0;    // 0: 8/3 * width rounded up to a multiple of 32 (SwiGLU's usual size)
  int64_t context = 64;
  bool tied_embeddings = true;
  double rope_theta = 10000.0;
  float norm_eps = 1e-5f;
  float init_std = 0.02f;

  int64_t kv_head_count() const { return kv_heads > 0 ? kv_heads : heads; }
  int64_t head_dim() const { return width / heads; }
  int64_t hidden() const { return mlp_hidden > 0 ? mlp_hidden : (8 * width / 3 + 31) / 32 * 32; }
  void validate() const;  // UsageError naming the bad value
};

// Per micro-step inputs to the linears (see LinearStep).
struct ModelStep {
  const Recipe* recipe = nullptr;  // null: every GEMM in FP32
  double progress = 0;             // step / total steps, for precision_switch_at
  uint64_t run_seed = 0;
  int64_t micro_step = 0;
  int64_t weight_version = -1;
  bool collect_stats = false;
  bool training = true;  // false: forward only (evaluation), the linears keep nothing for backward
};

// Index of a linear within a block.
enum class BlockLinear : int { qkv = 0, attn_out = 1, gate_up = 2, down = 3 };
inline constexpr int kLinearsPerBlock = 4;

// The keys and values of the positions a sequence has seen, per block, for sampling one token at a
// time (Transformer::decode): [context, kv_heads * head_dim] each, in the model's backend memory.
struct KvCache {
  KvCache(const ModelConfig& config, ops::TensorOps& ops);
  int64_t capacity = 0;  // the model's context
  int64_t length = 0;    // positions filled
  std::vector<ops::Array<float>> keys, values;
};

struct LinearTelemetry {
  int layer = 0;
  std::string linear;
  OperandStats operand;
};

// The in and out features of a block's linears (qkv, attn_out, gate_up, down), from the config
// alone: what the recipe is built for, also where no model is allocated (nibble plan).
std::vector<LinearShape> block_linear_shapes(const ModelConfig& c);
// The length of the parameter arena a Transformer of `c` allocates (its tensors, each padded to 64
// bytes), without allocating it: the memory plan's unit.
int64_t arena_floats(const ModelConfig& c);

class Transformer {
 public:
  // The weights start as init_weights(init_seed).
  explicit Transformer(const ModelConfig& config, ops::Backend& backend, uint64_t init_seed = 0);
  Transformer(const Transformer&) = delete;
  Transformer& operator=(const Transformer&) = delete;

  const ModelConfig& config() const { return config_; }
  ParamArena& params() { return params_; }
  const ParamArena& params() const { return params_; }
  // Deterministic initialisation: N(0, init_std) for matrices, init_std / sqrt(2 layers) for the
  // projections into the residual stream (GPT-2), ones for norm gains.
  void init_weights(uint64_t seed);
  // The shapes of one block's linears, for Recipe validation.
  std::vector<LinearShape> block_linear_shapes() const { return model::block_linear_shapes(config_); }

  // tokens, targets: [batch, seq], seq <= context. Returns the mean loss over the batch*seq
  // tokens; keeps what backward needs.
  double forward(std::span<const int32_t> tokens, std::span<const int32_t> targets, int64_t batch, int64_t seq,
                 const ModelStep& step);
  // Writes d(scale * mean loss)/d(parameters) into params().grads(): the linears' and the head's
  // gradients are overwritten, the others (norm gains, an untied embedding) added into, so a
  // micro-batch's backward follows params().zero_grads(), which zeros just those. `on_complete(first)`,
  // when given, is called each time the gradients of arena [first, end) are complete, with `first`
  // decreasing: after the LM head and final norm, after each block (last to first), 0 after the
  // embedding. Data parallelism reduces a completed stretch while the backward pass goes on.
  void backward(float scale, const std::function<void(int64_t first)>& on_complete = {});
  // The `first` values backward passes to on_complete, in its order (from the config alone).
  static std::vector<int64_t> gradient_completion_points(const ModelConfig& c);

  // Sampling: the same blocks as forward (FP32 GEMMs from the master weights, FP32 attention) on
  // `tokens`, which continue the sequence in `cache` at position cache.length; extends the cache and
  // returns the next token's logits [vocab] on the host (valid until the next call). Replaces what a
  // training forward kept (backward needs a new forward). UsageError for a token outside the
  // vocabulary or a cache that would overflow the context.
  std::span<const float> decode(KvCache& cache, std::span<const int32_t> tokens);
  ops::Backend& backend() { return ops_; }
  const ops::Backend& backend() const { return ops_; }
  // distributed.shard=full: forward, backward and decode acquire each phase's weights from
  // `provider` just before it and release them after (model/params.h); null (the default): the arena
  // holds all of them. The provider outlives its use by this model.
  void set_weight_provider(WeightProvider* provider) { weights_ = provider; }
  // The arena ranges the phases acquire: [begin, end) of the values.
  struct ArenaRange {
    int64_t begin = 0, end = 0;
  };
  ArenaRange embedding_range() const { return {embedding_, block_ranges_.front().begin}; }
  ArenaRange block_range(int64_t layer) const { return block_ranges_[static_cast<size_t>(layer)]; }
  // The final norm and, untied, the LM head after it (tied, the head is embedding_range()).
  ArenaRange final_range() const { return {final_norm_, static_cast<int64_t>(params_.values().size())}; }

  // Quantization telemetry of the last step that ran with collect_stats.
  std::vector<LinearTelemetry> telemetry() const;
  // Time spent in the linears' GEMMs and quantizers, plus the LM head's GEMMs.
  LinearTimes linear_times() const;
  double head_gemm_seconds() const { return head_gemm_s_; }
  void reset_times();
  const Linear& linear(int layer, BlockLinear which) const { return *linears_[layer * kLinearsPerBlock + static_cast<int>(which)]; }
  // Activation bytes kept between forward and backward (for the memory comparison of recipes).
  int64_t saved_activation_bytes() const;

 private:
  struct BlockParams {
    int64_t norm1, qkv, attn_out, norm2, gate_up, down;
  };
  struct BlockActivations {
    explicit BlockActivations(ops::TensorOps& ops)
        : x_mid(ops), rstd1(ops), rstd2(ops), qkv(ops), softmax_stats(ops), attention_out(ops), gate_up(ops) {}
    ops::Array<float> x_mid;   // [N, d] residual after attention (input of norm2)
    ops::Array<float> rstd1, rstd2;  // [N]
    ops::Array<float> qkv;     // [N, (H + 2 Hkv) hd] after RoPE
    ops::Array<float> softmax_stats;  // [B, H, S, 2]: per query row, score max and 1 / sum of exp
    // [N, H hd] attention's output O, kept when the backend's attention backward takes it
    // (LayerOps::attention_backward_takes_output); empty otherwise (the layers share attn_).
    ops::Array<float> attention_out;
    ops::Array<float> gate_up; // [N, 2 f]
  };
  ops::AttentionShape attention_shape(int64_t batch, int64_t seq) const;
  // tokens_ [N] -> residual_[0]; sizes the residual stream and the per-block activations.
  void embed(int64_t N);
  void head_gemm(const ops::DenseGemmShape& shape, const float* a, const float* b, float beta, float* c);
  // RMSNorm backward (gain parameter `gain`) from d_normed_ into d_res_; returns the amax of the new
  // d_res_, gathered as it is written, where the linear (layer, which) whose dY it is asks for one
  // (layer < 0: the embedding's gradient, none).
  std::optional<SourceAmax> norm_backward(const ops::RowsShape& s, const float* x, int64_t gain, const float* rstd,
                                          int64_t layer, BlockLinear which);
  void block_forward(int64_t layer, int64_t batch, int64_t seq, const ModelStep& step, KvCache* cache);
  Linear& linear_(int layer, BlockLinear which) { return *linears_[layer * kLinearsPerBlock + static_cast<int>(which)]; }
  void acquire(ArenaRange r) {
    if (weights_) weights_->acquire(r.begin, r.end);
  }
  void release(ArenaRange r) {
    if (weights_) weights_->release(r.begin, r.end);
  }
  // The gradients of r are about to be written: memory a distributed mode released comes back.
  void commit_gradients(ArenaRange r) { params_.commit_grads(r.begin, r.end); }
  // The step of linear `which` of block l in a model step (its recipe, seeds and weight version).
  LinearStep linear_step(int64_t l, BlockLinear which, const ModelStep& step) const;
  using BlockSteps = std::array<LinearStep, kLinearsPerBlock>;
  BlockSteps block_steps(int64_t l, const ModelStep& step) const;
  // Block l's weights for a phase whose linears run `steps`: from a provider that gathers NVFP4
  // weights (WeightProvider::provides_quantized), each linear that can take its weight so
  // (Linear::providable_weight) gets it quantized and never reads the FP32 one; the rest of the block
  // comes in FP32. release_block gives both back.
  void acquire_block(int64_t l, const BlockSteps& steps);
  void release_block(int64_t l);
  // The LM head's weights: the final norm, and the head (the embedding when tied).
  void acquire_head();
  void release_head();

  ModelConfig config_;
  ops::Backend& ops_;
  ParamArena params_;
  int64_t embedding_ = 0, final_norm_ = 0, head_ = 0;
  std::vector<BlockParams> blocks_;
  std::vector<ArenaRange> block_ranges_;  // each block's parameters, contiguous in the arena
  WeightProvider* weights_ = nullptr;
  std::array<bool, kLinearsPerBlock> provided_{};  // the acquired block's linears that got quantized weights
  std::vector<std::unique_ptr<Linear>> linears_;

  // Forward state.
  bool head_bf16_ = false;       // the last forward ran the LM head with BF16 operands (precision_map lm_head=bf16)
  bool attention_bf16_ = false;  // the last forward ran attention with BF16 operands (the recipe's `attention`)
  int64_t batch_ = 0, seq_ = 0;
  bool backward_ready_ = false;
  ops::Array<int32_t> tokens_, targets_;
  std::vector<ops::Array<float>> residual_;  // residual_[l]: input of block l; [layers]: final
  std::vector<BlockActivations> acts_;
  ops::Array<float> final_rstd_, final_normed_, logits_, token_loss_;
  ops::Array<float> loss_row_stats_;  // [N, 2] per token: its logits' max and 1 / sum of exp (training)
  // Scratch reused across layers.
  ops::Array<float> normed_, attn_, mlp_act_, d_res_, d_normed_, d_qkv_, d_attn_, d_mlp_act_, d_gate_up_;
  std::vector<float> decoded_logits_;
  double head_gemm_s_ = 0;
};

}  // namespace nibble::model
