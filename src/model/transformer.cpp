#include "model/transformer.h"

#include <chrono>
#include <cmath>
#include <sstream>

namespace nibble::model {

namespace {

const char* kLinearNames[kLinearsPerBlock] = {"qkv", "attn_out", "gate_up", "down"};

const SourceAmax* amax_or_null(const std::optional<SourceAmax>& amax) { return amax ? &*amax : nullptr; }

// RoPE on the query heads and on the key heads of the qkv rows of an attention of shape s (the value
// heads are not rotated).
struct QkvRope {
  ops::RopeShape query, key;
};
QkvRope qkv_rope(const ops::AttentionShape& s, double theta) {
  QkvRope r;
  r.query = {.tokens = s.batch * s.seq, .seq = s.seq, .stride = s.qkv_stride(), .first_col = 0, .heads = s.heads,
             .head_dim = s.head_dim, .theta = theta};
  r.key = r.query;
  r.key.first_col = s.heads * s.head_dim;
  r.key.heads = s.kv_heads;
  return r;
}

// Output k (k = 1, 2, ...) of the splitmix64 stream that starts at `seed`: its state after k steps
// is seed + k * golden, so any output can be computed on its own.
uint64_t splitmix64_output(uint64_t seed, uint64_t k) {
  uint64_t z = seed + k * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// N(0, std) by Box-Muller from a splitmix64 stream: the same values on every platform and
// thread count (std::normal_distribution is not specified bit for bit). Pair j takes the stream's
// outputs 2j + 1 and 2j + 2, so the pairs are independent and filled in parallel (the log and
// sin/cos in double made a GPT-2-small initialisation take seconds on one core).
void fill_normal(float* out, int64_t n, float std_dev, uint64_t seed) {
  const int64_t pairs = (n + 1) / 2;
#pragma omp parallel for schedule(static) if (pairs >= 4096)
  for (int64_t j = 0; j < pairs; ++j) {
    const uint64_t k = 2 * static_cast<uint64_t>(j);
    double u1 = (static_cast<double>(splitmix64_output(seed, k + 1) >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
    double u2 = static_cast<double>(splitmix64_output(seed, k + 2) >> 11) * 0x1.0p-53;
    double r = std::sqrt(-2.0 * std::log(u1)), a = 2.0 * M_PI * u2;
    out[2 * j] = static_cast<float>(r * std::cos(a) * std_dev);
    if (2 * j + 1 < n) out[2 * j + 1] = static_cast<float>(r * std::sin(a) * std_dev);
  }
}

using ops::Trans;

}  // namespace

namespace {
std::string number_text(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}
}  // namespace

void ModelConfig::validate() const {
  // Messages name the run config's keys (model.*); vocab is set by the data's tokenizer.
  auto bad = [](const std::string& what) { throw UsageError(what); };
  if (vocab <= 0) bad("the model's vocabulary (vocab=" + std::to_string(vocab) + ", from the tokenizer) must be positive");
  if (layers <= 0) bad("model.layers=" + std::to_string(layers) + " must be positive");
  if (heads <= 0 || width <= 0 || width % heads != 0)
    bad("model.width=" + std::to_string(width) + " must be a positive multiple of model.heads=" + std::to_string(heads));
  if (head_dim() % 2 != 0)
    bad("the head dimension model.width/model.heads=" + std::to_string(head_dim()) +
        " must be even for RoPE: change model.width or model.heads");
  if (kv_heads < 0 || heads % kv_head_count() != 0)
    bad("model.kv_heads=" + std::to_string(kv_heads) + " must divide model.heads=" + std::to_string(heads) +
        " (0 means no GQA)");
  if (mlp_hidden < 0) bad("model.mlp_hidden=" + std::to_string(mlp_hidden) + " must be >= 0 (0 picks 8/3 width)");
  if (context <= 0) bad("model.context=" + std::to_string(context) + " must be positive");
  if (!(norm_eps > 0)) bad("model.norm_eps=" + number_text(norm_eps) + " must be positive");
  // RoPE's frequencies are theta^(-2i/d): theta <= 0 gives NaN angles (reported later as divergence),
  // theta = 1 none at all. Typical values are 10000 (Llama 2) to 500000 (Llama 3).
  if (!(rope_theta > 1) || !std::isfinite(rope_theta))
    bad("model.rope_theta=" + number_text(rope_theta) + " must be a finite number > 1 (typically 10000)");
  // init_std = 0 makes every weight zero: the gradients of the matrices vanish and nothing trains.
  if (!(init_std > 0) || !std::isfinite(init_std))
    bad("model.init_std=" + number_text(init_std) + " must be a finite number > 0 (typically 0.02)");
}

Transformer::Transformer(const ModelConfig& config, ops::Backend& backend, uint64_t init_seed)
    : config_((config.validate(), config)), ops_(backend), params_(backend) {
  for (ops::Array<float>* a : {&final_rstd_, &final_normed_, &logits_, &token_loss_, &loss_row_stats_, &normed_,
                               &attn_, &mlp_act_, &d_res_, &d_normed_, &d_qkv_, &d_attn_, &d_mlp_act_, &d_gate_up_})
    a->bind(ops_);
  tokens_.bind(ops_);
  targets_.bind(ops_);
  const int64_t d = config_.width, hd = config_.head_dim(), f = config_.hidden();
  const int64_t qkv_out = (config_.heads + 2 * config_.kv_head_count()) * hd;
  embedding_ = params_.add("embedding", config_.vocab, d, /*weight_decay=*/false);
  for (int64_t l = 0; l < config_.layers; ++l) {
    const std::string p = "block" + std::to_string(l) + ".";
    BlockParams b;
    b.norm1 = params_.add(p + "norm1", 1, d, false);
    b.qkv = params_.add(p + "qkv", qkv_out, d, true);
    b.attn_out = params_.add(p + "attn_out", d, config_.heads * hd, true);
    b.norm2 = params_.add(p + "norm2", 1, d, false);
    b.gate_up = params_.add(p + "gate_up", 2 * f, d, true);
    b.down = params_.add(p + "down", d, f, true);
    blocks_.push_back(b);
    linears_.push_back(std::make_unique<Linear>(p + "qkv", d, qkv_out, ops_));
    linears_.push_back(std::make_unique<Linear>(p + "attn_out", config_.heads * hd, d, ops_));
    linears_.push_back(std::make_unique<Linear>(p + "gate_up", d, 2 * f, ops_));
    linears_.push_back(std::make_unique<Linear>(p + "down", f, d, ops_));
  }
  final_norm_ = params_.add("final_norm", 1, d, false);
  head_ = config_.tied_embeddings ? embedding_ : params_.add("lm_head", config_.vocab, d, true);
  // The linears' wgrad GEMMs and the head's write their gradients whole, the head's first in the
  // backward pass (before the tied embedding's rows are added to it): nothing to zero before them.
  for (const BlockParams& b : blocks_)
    for (const int64_t w : {b.qkv, b.attn_out, b.gate_up, b.down}) params_.mark_grad_overwritten(w);
  params_.mark_grad_overwritten(head_);
  params_.allocate();
  for (int64_t l = 0; l < config_.layers; ++l)  // a block's tensors were added one after another
    block_ranges_.push_back({blocks_[l].norm1, l + 1 < config_.layers ? blocks_[l + 1].norm1 : final_norm_});
  init_weights(init_seed);
}

LinearStep Transformer::linear_step(int64_t l, BlockLinear which, const ModelStep& step) const {
  LinearStep s;
  s.recipe = step.recipe ? step.recipe->for_linear(static_cast<int>(l), static_cast<int>(which), step.progress)
                         : Recipe::operands(Quantization::none, {});
  s.run_seed = step.run_seed;
  s.micro_step = step.micro_step;
  s.layer = static_cast<int>(l);
  s.linear = static_cast<int>(which);
  s.weight_version = step.weight_version;
  s.collect_stats = step.collect_stats;
  s.save_for_backward = step.training;
  return s;
}

Transformer::BlockSteps Transformer::block_steps(int64_t l, const ModelStep& step) const {
  BlockSteps steps;
  for (int i = 0; i < kLinearsPerBlock; ++i) steps[i] = linear_step(l, static_cast<BlockLinear>(i), step);
  return steps;
}

void Transformer::acquire_block(int64_t l, const BlockSteps& steps) {
  provided_.fill(false);
  if (!weights_) return;
  std::array<std::optional<QuantOptions>, kLinearsPerBlock> quantized;
  for (int i = 0; i < kLinearsPerBlock; ++i) {
    quantized[i] = linear_(static_cast<int>(l), static_cast<BlockLinear>(i)).providable_weight(steps[i]);
    provided_[i] = quantized[i] && weights_->provides_quantized(*quantized[i]);
  }
  // FP32: the block's range without the provided weights (the linears' tensors in arena order).
  const BlockParams& p = blocks_[l];
  const std::array<int64_t, kLinearsPerBlock> offsets{p.qkv, p.attn_out, p.gate_up, p.down};
  int64_t from = block_range(l).begin;
  for (int i = 0; i < kLinearsPerBlock; ++i) {
    if (!provided_[i]) continue;
    const Linear& linear = *linears_[l * kLinearsPerBlock + i];
    if (offsets[i] > from) weights_->acquire(from, offsets[i]);
    from = offsets[i] + linear.in_features() * linear.out_features();
  }
  if (block_range(l).end > from) weights_->acquire(from, block_range(l).end);
  for (int i = 0; i < kLinearsPerBlock; ++i) {
    if (!provided_[i]) continue;
    Linear& linear = linear_(static_cast<int>(l), static_cast<BlockLinear>(i));
    weights_->acquire_quantized(params_.find(linear.name()), *quantized[i], steps[i].weight_version,
                                linear.weight_to_provide());
    linear.weight_provided(steps[i], *quantized[i]);
  }
}

void Transformer::release_block(int64_t l) {
  release(block_range(l));
  for (int i = 0; i < kLinearsPerBlock; ++i)
    if (provided_[i]) linear_(static_cast<int>(l), static_cast<BlockLinear>(i)).drop_quantized_weights();
  provided_.fill(false);
}

void Transformer::acquire_head() {
  acquire(final_range());
  if (config_.tied_embeddings) acquire(embedding_range());
}

void Transformer::release_head() {
  if (config_.tied_embeddings) release(embedding_range());
  release(final_range());
}

void Transformer::init_weights(uint64_t seed) {
  const float residual_std = config_.init_std / std::sqrt(2.0f * static_cast<float>(config_.layers));
  // One tensor at a time on the host, then to the backend (a host copy of the whole arena would be a
  // start-up peak of memory above a sharded run's training); the padding stays allocate()'s zeros.
  std::vector<float> values;
  uint64_t index = 0;
  for (const auto& p : params_.params()) {
    values.resize(static_cast<size_t>(p.size()));
    float* v = values.data();
    const uint64_t tensor_seed = seed * 0x100000001B3ull + (++index) * 0x9E3779B97F4A7C15ull;
    if (p.rows == 1) {  // norm gains
      std::fill(v, v + p.size(), 1.0f);
    } else {
      bool residual = p.name.ends_with(".attn_out") || p.name.ends_with(".down");
      fill_normal(v, p.size(), residual ? residual_std : config_.init_std, tensor_seed);
    }
    ops_.copy_from_host(v, params_.value(p.offset), values.size() * sizeof(float));
  }
}

ops::AttentionShape Transformer::attention_shape(int64_t batch, int64_t seq) const {
  return {batch, seq, config_.heads, config_.kv_head_count(), config_.head_dim(), attention_bf16_};
}

int64_t arena_floats(const ModelConfig& c) {
  const auto padded = [](int64_t n) { return (n + 15) / 16 * 16; };  // ParamArena::add's alignment
  const int64_t d = c.width;
  int64_t n = padded(c.vocab * d) + padded(d) + (c.tied_embeddings ? 0 : padded(c.vocab * d));
  for (const LinearShape& l : block_linear_shapes(c)) n += c.layers * padded(l.in_features * l.out_features);
  return n + c.layers * 2 * padded(d);  // the two norms of each block
}

std::vector<LinearShape> block_linear_shapes(const ModelConfig& c) {
  const int64_t d = c.width, hd = c.head_dim(), f = c.hidden();
  // In the order of kLinearNames, as the constructor makes them.
  return {{kLinearNames[0], d, (c.heads + 2 * c.kv_head_count()) * hd},
          {kLinearNames[1], c.heads * hd, d},
          {kLinearNames[2], d, 2 * f},
          {kLinearNames[3], f, d}};
}

double Transformer::forward(std::span<const int32_t> tokens, std::span<const int32_t> targets, int64_t batch,
                            int64_t seq, const ModelStep& step) {
  const int64_t N = batch * seq, d = config_.width, V = config_.vocab;
  const size_t nd = static_cast<size_t>(N * d);
  if (seq <= 0 || seq > config_.context)
    throw UsageError("sequence length " + std::to_string(seq) + " is outside [1, context=" +
                     std::to_string(config_.context) + "]");
  if (static_cast<int64_t>(tokens.size()) != N || static_cast<int64_t>(targets.size()) != N)
    throw UsageError("forward needs batch*seq=" + std::to_string(N) + " tokens and targets, got " +
                     std::to_string(tokens.size()) + " and " + std::to_string(targets.size()));
  for (int64_t i = 0; i < N; ++i)
    if (tokens[i] < 0 || tokens[i] >= V || targets[i] < 0 || targets[i] >= V)
      throw UsageError("token id at position " + std::to_string(i) + " is outside the vocabulary [0, " +
                       std::to_string(V) + ")");
  batch_ = batch;
  backward_ready_ = step.training;
  seq_ = seq;
  tokens_.assign_from_host(tokens.data(), tokens.size());
  targets_.assign_from_host(targets.data(), targets.size());
  attention_bf16_ = step.recipe != nullptr && step.recipe->attention_bf16();
  head_bf16_ = step.recipe != nullptr && step.recipe->lm_head_bf16();
  acquire(embedding_range());
  embed(N);
  release(embedding_range());
  for (int64_t l = 0; l < config_.layers; ++l) {
    acquire_block(l, block_steps(l, step));
    block_forward(l, batch, seq, step, nullptr);
    release_block(l);
  }

  acquire_head();
  final_rstd_.resize(N);
  final_normed_.resize(nd);
  logits_.resize(static_cast<size_t>(N * V));
  token_loss_.resize(N);
  ops_.rmsnorm_forward({N, d}, residual_[config_.layers].data(), params_.value(final_norm_), config_.norm_eps,
                       final_normed_.data(), final_rstd_.data());
  {
    auto t0 = std::chrono::steady_clock::now();
    head_gemm(ops::DenseGemmShape::a_bt(N, V, d), final_normed_.data(), params_.value(head_), 0.0f, logits_.data());
    head_gemm_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  release_head();
  // Training keeps each row's max and 1 / sum for the backward (one pass over the logits there, not three).
  double total;
  if (step.training) {
    loss_row_stats_.resize(static_cast<size_t>(2 * N));
    total = ops_.cross_entropy_forward_keeping(logits_.data(), targets_.data(), N, V, token_loss_.data(),
                                               loss_row_stats_.data());
  } else {
    total = ops_.cross_entropy_forward(logits_.data(), targets_.data(), N, V, token_loss_.data());
  }
  return total / static_cast<double>(N);
}

// The LM head's GEMMs in the precision the recipe gave the module lm_head (FP32 unless a
// precision_map rule said bf16); the backward uses what the forward used.
void Transformer::head_gemm(const ops::DenseGemmShape& shape, const float* a, const float* b, float beta, float* c) {
  if (head_bf16_)
    ops_.gemm_bf16(shape, 1.0f, a, b, beta, c);
  else
    ops_.gemm_f32(shape, 1.0f, a, b, beta, c);
}

std::optional<SourceAmax> Transformer::norm_backward(const ops::RowsShape& s, const float* x, int64_t gain,
                                                     const float* rstd, int64_t layer, BlockLinear which) {
  std::optional<SourceAmax> amax;
  if (layer >= 0) amax = linear_(static_cast<int>(layer), which).gradient_amax_request();
  if (amax)
    ops_.rmsnorm_backward_gathering(s, x, params_.value(gain), rstd, d_normed_.data(), d_res_.data(),
                                    params_.grad(gain), *amax);
  else
    ops_.rmsnorm_backward(s, x, params_.value(gain), rstd, d_normed_.data(), d_res_.data(), params_.grad(gain));
  return amax;
}

void Transformer::embed(int64_t N) {
  const int64_t d = config_.width;
  while (residual_.size() < static_cast<size_t>(config_.layers + 1)) residual_.emplace_back(ops_);
  while (acts_.size() < static_cast<size_t>(config_.layers)) acts_.emplace_back(ops_);
  for (auto& r : residual_) r.resize(static_cast<size_t>(N * d));
  ops_.embedding_forward(tokens_.data(), N, params_.value(embedding_), d, residual_[0].data());
}

// residual_[l] [N, d] -> residual_[l + 1]. With a cache, the N = seq tokens of one sequence continue
// it at positions [cache->length, +seq): RoPE starts there and attention reads (and extends) the
// cached keys and values instead of the causal block attention of a whole sequence.
void Transformer::block_forward(int64_t l, int64_t batch, int64_t seq, const ModelStep& step, KvCache* cache) {
  const int64_t N = batch * seq, d = config_.width, f = config_.hidden();
  const ops::AttentionShape shape = attention_shape(batch, seq);
  const int64_t first_position = cache ? cache->length : 0;
  const size_t nd = static_cast<size_t>(N * d);
  normed_.resize(nd);
  attn_.resize(static_cast<size_t>(N * shape.out_width()));
  mlp_act_.resize(static_cast<size_t>(N * f));
  const BlockParams& p = blocks_[l];
  BlockActivations& a = acts_[l];
  a.x_mid.resize(nd);
  a.rstd1.resize(N);
  a.rstd2.resize(N);
  a.qkv.resize(static_cast<size_t>(N * shape.qkv_stride()));
  a.softmax_stats.resize(static_cast<size_t>(shape.softmax_stats_size()));
  a.gate_up.resize(static_cast<size_t>(N * 2 * f));
  const float* x = residual_[l].data();
  // The producers of the qkv, gate_up and down inputs (the RMSNorms, SwiGLU) gather the amaxes of
  // what they write when the linear reading it asks (Linear::source_amax_request): its
  // quantization then skips its own amax pass. The same bits either way.
  auto gathered = [](std::optional<SourceAmax>& amax) { return amax ? &*amax : nullptr; };

  const LinearStep qkv_step = linear_step(l, BlockLinear::qkv, step);
  std::optional<SourceAmax> amax = linear_(l, BlockLinear::qkv).source_amax_request(qkv_step, N);
  if (amax)
    ops_.rmsnorm_forward_gathering({N, d}, x, params_.value(p.norm1), config_.norm_eps, normed_.data(), a.rstd1.data(),
                                   *amax);
  else
    ops_.rmsnorm_forward({N, d}, x, params_.value(p.norm1), config_.norm_eps, normed_.data(), a.rstd1.data());
  linear_(l, BlockLinear::qkv).forward(qkv_step, normed_.data(), N, params_.value(p.qkv), a.qkv.data(), gathered(amax));
  const QkvRope rope = qkv_rope(shape, config_.rope_theta);
  ops_.rope_forward(a.qkv.data(), rope.query, first_position);
  ops_.rope_forward(a.qkv.data(), rope.key, first_position);
  // O: kept for the backward where it takes it, else in the scratch the layers share.
  const bool keep_out = step.training && !cache && ops_.attention_backward_takes_output(shape);
  if (keep_out)
    a.attention_out.resize(static_cast<size_t>(N * shape.out_width()));
  else
    a.attention_out.clear();
  float* o = keep_out ? a.attention_out.data() : attn_.data();
  if (cache)
    ops_.attention_decode(shape, first_position, a.qkv.data(), cache->keys[l].data(), cache->values[l].data(), o);
  else
    ops_.attention_forward(shape, a.qkv.data(), o, a.softmax_stats.data());
  linear_(l, BlockLinear::attn_out)
      .forward(linear_step(l, BlockLinear::attn_out, step), o, N, params_.value(p.attn_out), a.x_mid.data());
  ops_.add(a.x_mid.data(), x, N * d);

  const LinearStep gate_up_step = linear_step(l, BlockLinear::gate_up, step);
  amax = linear_(l, BlockLinear::gate_up).source_amax_request(gate_up_step, N);
  if (amax)
    ops_.rmsnorm_forward_gathering({N, d}, a.x_mid.data(), params_.value(p.norm2), config_.norm_eps, normed_.data(),
                                   a.rstd2.data(), *amax);
  else
    ops_.rmsnorm_forward({N, d}, a.x_mid.data(), params_.value(p.norm2), config_.norm_eps, normed_.data(), a.rstd2.data());
  linear_(l, BlockLinear::gate_up)
      .forward(gate_up_step, normed_.data(), N, params_.value(p.gate_up), a.gate_up.data(), gathered(amax));
  const LinearStep down_step = linear_step(l, BlockLinear::down, step);
  amax = linear_(l, BlockLinear::down).source_amax_request(down_step, N);
  if (amax)
    ops_.swiglu_forward_gathering(a.gate_up.data(), N, f, mlp_act_.data(), *amax);
  else
    ops_.swiglu_forward(a.gate_up.data(), N, f, mlp_act_.data());
  float* out = residual_[l + 1].data();
  linear_(l, BlockLinear::down).forward(down_step, mlp_act_.data(), N, params_.value(p.down), out, gathered(amax));
  ops_.add(out, a.x_mid.data(), N * d);
}

KvCache::KvCache(const ModelConfig& config, ops::TensorOps& ops) : capacity(config.context) {
  const size_t size = static_cast<size_t>(config.context * config.kv_head_count() * config.head_dim());
  for (int64_t l = 0; l < config.layers; ++l) {
    keys.emplace_back(ops, size);
    values.emplace_back(ops, size);
  }
}

std::span<const float> Transformer::decode(KvCache& cache, std::span<const int32_t> tokens) {
  const int64_t n = static_cast<int64_t>(tokens.size()), d = config_.width, V = config_.vocab;
  if (n == 0) throw UsageError("decode needs at least one token");
  if (static_cast<int64_t>(cache.keys.size()) != config_.layers || cache.capacity != config_.context)
    throw UsageError("the KV cache was made for another model shape: make it with this model's config");
  for (int64_t i = 0; i < n; ++i)
    if (tokens[i] < 0 || tokens[i] >= V)
      throw UsageError("token " + std::to_string(tokens[i]) + " is outside the vocabulary [0, " + std::to_string(V) + ")");
  if (cache.length + n > config_.context)
    throw UsageError("the KV cache is full: the model's context is " + std::to_string(config_.context) + " tokens");
  backward_ready_ = false;
  attention_bf16_ = false;  // sampling computes in FP32 from the master weights
  tokens_.assign_from_host(tokens.data(), tokens.size());
  acquire(embedding_range());
  embed(n);
  release(embedding_range());
  ModelStep step;  // no recipe: FP32 GEMMs; nothing kept for backward
  step.training = false;
  for (int64_t l = 0; l < config_.layers; ++l) {
    acquire_block(l, block_steps(l, step));
    block_forward(l, 1, n, step, &cache);
    release_block(l);
  }
  cache.length += n;
  acquire_head();

  // The logits of the last token only.
  final_rstd_.resize(1);
  final_normed_.resize(static_cast<size_t>(d));
  logits_.resize(static_cast<size_t>(V));
  ops_.rmsnorm_forward({1, d}, residual_[config_.layers].data() + (n - 1) * d, params_.value(final_norm_),
                       config_.norm_eps, final_normed_.data(), final_rstd_.data());
  ops_.gemm_f32(ops::DenseGemmShape::a_bt(1, V, d), 1.0f, final_normed_.data(), params_.value(head_), 0.0f,
                logits_.data());
  release_head();
  decoded_logits_.resize(static_cast<size_t>(V));
  logits_.copy_to_host(decoded_logits_.data());
  return decoded_logits_;
}

// The arena is laid out embedding, block 0 .. block L-1, final norm, untied head (the constructor),
// and backward runs from the end: a suffix of the arena is complete after each stage. A tied head's
// gradient lands in the embedding, which the last stage completes.
std::vector<int64_t> Transformer::gradient_completion_points(const ModelConfig& c) {
  const auto padded = [](int64_t n) { return (n + 15) / 16 * 16; };  // ParamArena::add's alignment
  int64_t block = 2 * padded(c.width);
  for (const LinearShape& l : model::block_linear_shapes(c)) block += padded(l.in_features * l.out_features);
  const int64_t blocks_begin = padded(c.vocab * c.width);
  std::vector<int64_t> points{blocks_begin + c.layers * block};  // the final norm's offset
  for (int64_t l = c.layers - 1; l >= 0; --l) points.push_back(blocks_begin + l * block);
  points.push_back(0);
  return points;
}

void Transformer::backward(float scale, const std::function<void(int64_t first)>& on_complete) {
  const auto complete = [&](int64_t first) {
    if (on_complete) on_complete(first);
  };
  NIBBLE_CHECK(batch_ > 0 && backward_ready_, "Transformer::backward without a training forward before it");
  backward_ready_ = false;
  const int64_t N = batch_ * seq_, d = config_.width, V = config_.vocab, f = config_.hidden();
  const ops::AttentionShape shape = attention_shape(batch_, seq_);
  const QkvRope rope = qkv_rope(shape, config_.rope_theta);
  const size_t nd = static_cast<size_t>(N * d);
  d_res_.resize_zeroed(nd);
  d_normed_.resize(nd);
  d_attn_.resize(static_cast<size_t>(N * shape.out_width()));
  d_qkv_.resize(static_cast<size_t>(N * shape.qkv_stride()));
  d_mlp_act_.resize(static_cast<size_t>(N * f));
  d_gate_up_.resize(static_cast<size_t>(N * 2 * f));

  // Loss and head. logits_ becomes dlogits in place (each row is read before it is written).
  float* dlogits = logits_.data();
  commit_gradients(final_range());
  if (config_.tied_embeddings) commit_gradients(embedding_range());
  acquire_head();
  ops_.cross_entropy_backward_kept(logits_.data(), targets_.data(), N, V, scale / static_cast<float>(N),
                                   loss_row_stats_.data(), dlogits);
  {
    auto t0 = std::chrono::steady_clock::now();
    head_gemm(ops::DenseGemmShape::a_b(N, d, V), dlogits, params_.value(head_), 0.0f, d_normed_.data());
    head_gemm(ops::DenseGemmShape::at_b(V, d, N), dlogits, final_normed_.data(), 0.0f, params_.grad(head_));
    head_gemm_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  // Each RMSNorm backward adds into d_res_, which then is the dY of the linear before it (the last
  // block's down here, attn_out and the previous block's down below): it gathers that dY's amax.
  std::optional<SourceAmax> res_amax =
      norm_backward({N, d}, residual_[config_.layers].data(), final_norm_, final_rstd_.data(), config_.layers - 1,
                    BlockLinear::down);
  release_head();
  complete(final_norm_);

  // d_res_ holds dL/d(output of block l) on entry to each iteration, dL/d(input of block l) on exit.
  for (int64_t l = config_.layers - 1; l >= 0; --l) {
    const BlockParams& p = blocks_[l];
    BlockActivations& a = acts_[l];
    commit_gradients(block_range(l));
    acquire_block(l, {linear_(l, BlockLinear::qkv).current_step(), linear_(l, BlockLinear::attn_out).current_step(),
                      linear_(l, BlockLinear::gate_up).current_step(), linear_(l, BlockLinear::down).current_step()});
    linear_(l, BlockLinear::down)
        .backward(d_res_.data(), params_.value(p.down), d_mlp_act_.data(), params_.grad(p.down), amax_or_null(res_amax));
    // SwiGLU backward gathers the amax of d_gate_up for the gate_up linear's dY quantization.
    std::optional<SourceAmax> dy_amax = linear_(l, BlockLinear::gate_up).gradient_amax_request();
    if (dy_amax)
      ops_.swiglu_backward_gathering(a.gate_up.data(), d_mlp_act_.data(), N, f, d_gate_up_.data(), *dy_amax);
    else
      ops_.swiglu_backward(a.gate_up.data(), d_mlp_act_.data(), N, f, d_gate_up_.data());
    linear_(l, BlockLinear::gate_up)
        .backward(d_gate_up_.data(), params_.value(p.gate_up), d_normed_.data(), params_.grad(p.gate_up),
                  amax_or_null(dy_amax));
    res_amax = norm_backward({N, d}, a.x_mid.data(), p.norm2, a.rstd2.data(), l, BlockLinear::attn_out);

    linear_(l, BlockLinear::attn_out)
        .backward(d_res_.data(), params_.value(p.attn_out), d_attn_.data(), params_.grad(p.attn_out),
                  amax_or_null(res_amax));
    if (a.attention_out.size() > 0)
      ops_.attention_backward_with_output(shape, a.qkv.data(), a.softmax_stats.data(), a.attention_out.data(),
                                          d_attn_.data(), d_qkv_.data());
    else
      ops_.attention_backward(shape, a.qkv.data(), a.softmax_stats.data(), d_attn_.data(), d_qkv_.data());
    // RoPE's backward completes the qkv linear's dY (attention's backward wrote its value columns):
    // it gathers that dY's amax.
    std::optional<SourceAmax> qkv_dy_amax = linear_(l, BlockLinear::qkv).gradient_amax_request();
    if (qkv_dy_amax) {
      ops_.rope_backward_gathering(d_qkv_.data(), rope.query, rope.key, *qkv_dy_amax);
    } else {
      ops_.rope_backward(d_qkv_.data(), rope.query);
      ops_.rope_backward(d_qkv_.data(), rope.key);
    }
    linear_(l, BlockLinear::qkv)
        .backward(d_qkv_.data(), params_.value(p.qkv), d_normed_.data(), params_.grad(p.qkv), amax_or_null(qkv_dy_amax));
    res_amax = norm_backward({N, d}, residual_[l].data(), p.norm1, a.rstd1.data(), l - 1, BlockLinear::down);
    release_block(l);
    complete(p.norm1);  // the block's first parameter
  }
  // The embedding's gradient reads no weights: nothing to acquire.
  if (!config_.tied_embeddings) commit_gradients(embedding_range());
  ops_.embedding_backward(tokens_.data(), N, d_res_.data(), d, params_.grad(embedding_));
  complete(0);
}

std::vector<LinearTelemetry> Transformer::telemetry() const {
  std::vector<LinearTelemetry> out;
  for (size_t i = 0; i < linears_.size(); ++i)
    for (const auto& s : linears_[i]->stats())
      out.push_back({static_cast<int>(i / kLinearsPerBlock), kLinearNames[i % kLinearsPerBlock], s});
  return out;
}

LinearTimes Transformer::linear_times() const {
  LinearTimes t;
  for (const auto& l : linears_) {
    t.gemm_s += l->times().gemm_s;
    t.quantize_s += l->times().quantize_s;
  }
  return t;
}

void Transformer::reset_times() {
  for (auto& l : linears_) l->reset_times();
  head_gemm_s_ = 0;
}

int64_t Transformer::saved_activation_bytes() const {
  int64_t b = 0;
  for (const auto& l : linears_) b += l->saved_activation_bytes();
  for (const auto& a : acts_)
    b += static_cast<int64_t>((a.x_mid.size() + a.rstd1.size() + a.rstd2.size() + a.qkv.size() + a.softmax_stats.size() +
                               a.gate_up.size()) * sizeof(float));
  for (const auto& r : residual_) b += static_cast<int64_t>(r.size() * sizeof(float));
  return b;
}

}  // namespace nibble::model
