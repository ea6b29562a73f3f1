#include "model/kv_cache.h"

#include <cmath>
#include <string>

#include "format/quantized_tensor.h"

namespace nibble::model {

namespace {

// y[rows] = W[rows, cols] x[cols], each row's dot product accumulated in order. One token's work
// is small: threads only pay off for large matrices (a parallel region costs more than a
// 128 x 352 product, and far more when the cores are shared).
void matvec(const float* w, const float* x, int64_t rows, int64_t cols, float* y) {
#pragma omp parallel for schedule(static) if (rows * cols >= (1 << 21))
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = w + r * cols;
    float sum = 0;
    for (int64_t c = 0; c < cols; ++c) sum += row[c] * x[c];
    y[r] = sum;
  }
}

// The rotation of model/rope.cpp (pairs i and i + head_dim/2) at an explicit position.
void rotate_heads(float* x, int64_t heads, int64_t head_dim, const cpu::RopeTable<float>& table, int64_t position) {
  const int64_t half = head_dim / 2;
  const float* c = table.cos.data() + position * half;
  const float* s = table.sin.data() + position * half;
  for (int64_t h = 0; h < heads; ++h) {
    float* v = x + h * head_dim;
    for (int64_t i = 0; i < half; ++i) {
      const float a = v[i], b = v[i + half];
      v[i] = a * c[i] - b * s[i];
      v[i + half] = a * s[i] + b * c[i];
    }
  }
}

// RMSNorm and SwiGLU of model/rmsnorm.h and model/swiglu.h for a single row, inline: the
// library versions open a parallel region per call, which dominates one token's cost.
void rmsnorm_row(const float* x, const float* gain, int64_t width, float eps, float* y) {
  float sum = 0;
  for (int64_t i = 0; i < width; ++i) sum += x[i] * x[i];
  const float rstd = 1.0f / std::sqrt(sum / static_cast<float>(width) + eps);
  for (int64_t i = 0; i < width; ++i) y[i] = x[i] * rstd * gain[i];
}

void swiglu_row(const float* gate_up, int64_t hidden, float* a) {
  for (int64_t i = 0; i < hidden; ++i) {
    const float g = gate_up[i];
    a[i] = g / (1.0f + std::exp(-g)) * gate_up[hidden + i];
  }
}

}  // namespace

KvCacheDecoder::KvCacheDecoder(const Transformer& model)
    : model_(model), config_(model.config()), rope_(config_.context, config_.head_dim(), config_.rope_theta) {
  const ParamArena& p = model_.params();
  auto at = [&](const std::string& name) { return p.value(p.find(name).offset); };
  embedding_ = at("embedding");
  final_norm_ = at("final_norm");
  head_ = config_.tied_embeddings ? embedding_ : at("lm_head");
  for (int64_t l = 0; l < config_.layers; ++l) {
    const std::string b = "block" + std::to_string(l) + ".";
    blocks_.push_back({at(b + "norm1"), at(b + "qkv"), at(b + "attn_out"), at(b + "norm2"), at(b + "gate_up"), at(b + "down")});
  }
  const int64_t kv_width = config_.kv_head_count() * config_.head_dim();
  keys_.assign(static_cast<size_t>(config_.layers), std::vector<float>(static_cast<size_t>(config_.context * kv_width)));
  values_ = keys_;
  const int64_t d = config_.width, hd = config_.head_dim(), f = config_.hidden();
  x_.resize(d);
  normed_.resize(d);
  qkv_.resize(static_cast<size_t>((config_.heads + 2 * config_.kv_head_count()) * hd));
  attn_.resize(static_cast<size_t>(config_.heads * hd));
  proj_.resize(d);
  gate_up_.resize(static_cast<size_t>(2 * f));
  act_.resize(f);
  scores_.resize(static_cast<size_t>(config_.context));
  logits_.resize(static_cast<size_t>(config_.vocab));
}

void KvCacheDecoder::reset() { length_ = 0; }

int64_t KvCacheDecoder::capacity() const { return config_.context; }

std::span<const float> KvCacheDecoder::step(int32_t token) {
  if (token < 0 || token >= config_.vocab)
    throw UsageError("token " + std::to_string(token) + " is outside the vocabulary [0, " + std::to_string(config_.vocab) + ")");
  if (length_ >= config_.context)
    throw UsageError("the KV cache is full: the model's context is " + std::to_string(config_.context) + " tokens");
  const int64_t d = config_.width, hd = config_.head_dim(), H = config_.heads, Hkv = config_.kv_head_count();
  const int64_t f = config_.hidden(), kv_width = Hkv * hd, pos = length_;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  std::copy(embedding_ + token * d, embedding_ + (token + 1) * d, x_.begin());

  for (int64_t l = 0; l < config_.layers; ++l) {
    const BlockWeights& w = blocks_[l];
    rmsnorm_row(x_.data(), w.norm1, d, config_.norm_eps, normed_.data());
    matvec(w.qkv, normed_.data(), static_cast<int64_t>(qkv_.size()), d, qkv_.data());
    float* q = qkv_.data();
    float* k = q + H * hd;
    float* v = k + kv_width;
    rotate_heads(q, H, hd, rope_, pos);
    rotate_heads(k, Hkv, hd, rope_, pos);
    std::copy(k, k + kv_width, keys_[l].begin() + pos * kv_width);
    std::copy(v, v + kv_width, values_[l].begin() + pos * kv_width);
    // Causal attention of the new query over positions [0, pos].
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / (H / Hkv);
      const float* qh = q + h * hd;
      float max_score = -INFINITY;
      for (int64_t t = 0; t <= pos; ++t) {
        const float* kt = keys_[l].data() + t * kv_width + g * hd;
        float dot = 0;
        for (int64_t i = 0; i < hd; ++i) dot += qh[i] * kt[i];
        scores_[t] = dot * scale;
        max_score = std::max(max_score, scores_[t]);
      }
      float sum = 0;
      for (int64_t t = 0; t <= pos; ++t) sum += (scores_[t] = std::exp(scores_[t] - max_score));
      float* out = attn_.data() + h * hd;
      std::fill(out, out + hd, 0.0f);
      for (int64_t t = 0; t <= pos; ++t) {
        const float p = scores_[t] / sum;
        const float* vt = values_[l].data() + t * kv_width + g * hd;
        for (int64_t i = 0; i < hd; ++i) out[i] += p * vt[i];
      }
    }
    matvec(w.attn_out, attn_.data(), d, H * hd, proj_.data());
    for (int64_t i = 0; i < d; ++i) x_[i] += proj_[i];
    rmsnorm_row(x_.data(), w.norm2, d, config_.norm_eps, normed_.data());
    matvec(w.gate_up, normed_.data(), 2 * f, d, gate_up_.data());
    swiglu_row(gate_up_.data(), f, act_.data());
    matvec(w.down, act_.data(), d, f, proj_.data());
    for (int64_t i = 0; i < d; ++i) x_[i] += proj_[i];
  }
  rmsnorm_row(x_.data(), final_norm_, d, config_.norm_eps, normed_.data());
  matvec(head_, normed_.data(), config_.vocab, d, logits_.data());
  ++length_;
  return logits_;
}

}  // namespace nibble::model
