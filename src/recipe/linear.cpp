#include "recipe/linear.h"

#include <algorithm>
#include <chrono>
#include <span>


namespace nibble {

namespace {

// [rows, cols] -> [cols, rows]; only for telemetry of the wgrad operands.
std::vector<float> transposed(const std::vector<float>& x, int64_t rows, int64_t cols) {
  std::vector<float> t(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[c * rows + r] = x[r * cols + c];
  return t;
}

using ops::Output;
using ops::Trans;

QuantOptions seeded(QuantOptions o, const LinearStep& s, GemmRole role, int operand) {
  if (o.rounding == Rounding::stochastic) o.seed = sr_seed(s.run_seed, s.micro_step, s.layer, s.linear, role, operand);
  return o;
}

// Adds the wall time of its scope to a counter.
class ScopedTimer {
 public:
  explicit ScopedTimer(double& total) : total_(total), start_(std::chrono::steady_clock::now()) {}
  ~ScopedTimer() { total_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }

 private:
  double& total_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace

Linear::Linear(std::string name, int64_t in_features, int64_t out_features, ops::TensorOps& ops)
    : name_(std::move(name)), in_(in_features), out_(out_features), ops_(ops) {
  NIBBLE_CHECK(in_ > 0 && out_ > 0, "Linear %s: positive in and out features", name_.c_str());
  saved_x_f32_.bind(ops_);
  saved_x_bf16_.bind(ops_);
  bf16_x_f32_.bind(ops_);
}

ops::Quantized& Linear::slot(std::unique_ptr<ops::Quantized>& q) {
  if (!q) q = ops_.new_quantized();
  return *q;
}

// Telemetry reads the operand and its quantization on the host (a copy on the CPU backend too; the
// statistics cost a dequantize anyway).
void Linear::record(std::string operand, const float* x, int64_t rows, int64_t cols, bool transpose,
                    const ops::Quantized& q) {
  std::vector<float> host(static_cast<size_t>(rows * cols));
  ops_.copy_to_host(x, host.data(), host.size() * sizeof(float));
  if (transpose) host = transposed(host, rows, cols);
  stats_.push_back({std::move(operand), quant_stats(host, q.to_host())});
}

std::optional<QuantizedTensor> Linear::fprop_weight() const {
  if (!w_q_valid_) return std::nullopt;
  return w_q_->to_host();
}

std::optional<QuantizedTensor> Linear::dgrad_weight() const {
  if (!wt_q_valid_) return std::nullopt;
  return wt_q_->to_host();
}

int64_t Linear::saved_activation_bytes() const {
  int64_t b = static_cast<int64_t>(saved_x_f32_.bytes() + saved_x_bf16_.bytes());
  if (saved_xt_valid_) b += saved_xt_q_->stored_bytes();
  return b;
}

bool Linear::reusable(bool valid, int64_t version, const QuantOptions& kept, const QuantOptions& wanted) const {
  return valid && version == step_.weight_version && step_.weight_version >= 0 && wanted == kept;
}

std::optional<QuantOptions> shared_tile_weight(const LinearRecipe& recipe, int64_t out_features, bool training) {
  const QuantOptions& o = recipe.fprop.b;
  const bool tiles = recipe.fprop.precision == GemmPrecision::quantized && tiles_from_pieces(o);
  const bool dgrad_shares = !training || (recipe.dgrad.precision == GemmPrecision::quantized &&
                                          recipe.dgrad.b == o && out_features % 16 == 0);
  if (!tiles || !dgrad_shares) return std::nullopt;
  return o;
}

std::optional<QuantOptions> Linear::providable_weight(const LinearStep& step) const {
  if (step.collect_stats || step.weight_version < 0) return std::nullopt;
  return shared_tile_weight(step.recipe, out_, step.save_for_backward);
}

void Linear::weight_provided(const LinearStep& step, const QuantOptions& options) {
  NIBBLE_CHECK(w_q_ && w_q_->layout().rows == out_ && w_q_->layout().cols == in_ &&
                   w_q_->layout().block == BlockShape::tile_16x16,
               "Linear %s: the provided weight is not its [%lld, %lld] 16x16-tile tensor", name_.c_str(),
               static_cast<long long>(out_), static_cast<long long>(in_));
  w_q_valid_ = true;
  w_q_version_ = step.weight_version;
  w_q_options_ = options;
  wt_q_valid_ = false;  // dgrad transposes the provided tensor
}

void Linear::drop_quantized_weights() {
  w_q_.reset();
  wt_q_.reset();
  w_q_valid_ = wt_q_valid_ = false;
}

// The one switch over a GEMM's precision: fp32 and bf16 run `dense` through the backend's GEMMs on
// FP32 operands (gemm_bf16 rounds them to BF16), quantized runs `quantized`.
template <typename QuantizedGemm>
void Linear::run_gemm(const GemmRecipe& recipe, const DenseGemm& g, QuantizedGemm&& quantized) {
  switch (recipe.precision) {
    case GemmPrecision::fp32: {
      ScopedTimer timer(times_.gemm_s);
      ops_.gemm_f32(g.shape, 1.0f, g.a, g.b, g.beta, g.c);
      break;
    }
    case GemmPrecision::bf16: {
      ScopedTimer timer(times_.gemm_s);
      ops_.gemm_bf16(g.shape, 1.0f, g.a, g.b, g.beta, g.c);
      break;
    }
    case GemmPrecision::quantized: quantized(); break;
  }
}

namespace {
// The request for an operand whose row-wise copy (`row`, of `row_gemm`) and transposed one (`t`, of
// wgrad) quantize_both makes in one pass; cols of the operand, tokens its rows. Gathering needs
// whole 16-column blocks and, with the RHT, whole 16-token blocks.
std::optional<SourceAmax> pair_request(const GemmRecipe& row_gemm, const QuantOptions& row, const GemmRecipe& wgrad,
                                       const QuantOptions& t, int64_t cols, int64_t tokens) {
  auto blocks_1x16 = [](const QuantOptions& o) { return o.format == Format::nvfp4 && !o.tile_16x16 && !o.row_scaled; };
  const bool shapes = cols % 16 == 0 && (!t.rht || tokens % 16 == 0);
  if (row_gemm.precision != GemmPrecision::quantized || wgrad.precision != GemmPrecision::quantized ||
      !blocks_1x16(row) || row.rht || !blocks_1x16(t) || !shapes)
    return std::nullopt;
  SourceAmax request;
  request.rht = t.rht;
  return request;
}
}  // namespace

std::optional<SourceAmax> Linear::source_amax_request(const LinearStep& step, int64_t tokens) const {
  if (!step.save_for_backward) return std::nullopt;
  return pair_request(step.recipe.fprop, step.recipe.fprop.a, step.recipe.wgrad, step.recipe.wgrad.b, in_, tokens);
}

std::optional<SourceAmax> Linear::gradient_amax_request() const {
  if (tokens_ <= 0) return std::nullopt;
  return pair_request(step_.recipe.dgrad, step_.recipe.dgrad.a, step_.recipe.wgrad, step_.recipe.wgrad.a, out_, tokens_);
}

void Linear::forward(const LinearStep& step, const float* x, int64_t tokens, const float* w, float* y,
                     const SourceAmax* x_amax) {
  NIBBLE_CHECK(tokens > 0, "Linear::forward of %s with no tokens", name_.c_str());
  step_ = step;
  tokens_ = tokens;
  if (step.collect_stats) stats_.clear();
  saved_xt_valid_ = false;
  fprop_input_quantized_ = false;
  // Fprop: Y = X W^T.
  run_gemm(step.recipe.fprop, {ops::DenseGemmShape::a_bt(tokens, out_, in_), x, w, 0.0f, y},
           [&] { fprop_quantized(x, w, y, x_amax); });
  saved_x_f32_.clear();
  saved_x_bf16_.clear();
  if (!step.save_for_backward) {
    tokens_ = 0;  // backward without a training forward is an internal error
    return;
  }
  save_for_wgrad(x);
}

void Linear::fprop_quantized(const float* x, const float* w, float* y, const SourceAmax* x_amax) {
  const LinearStep& step = step_;
  const GemmRecipe& f = step.recipe.fprop;
  const GemmRecipe& g = step.recipe.wgrad;
  ops::Quantized& xq = slot(x_q_);
  {
    // When wgrad quantizes X^T too, both are made in one call (quantize_both reads X once less).
    ScopedTimer timer(times_.quantize_s);
    if (step.save_for_backward && g.precision == GemmPrecision::quantized) {
      if (x_amax && x_amax->valid)
        ops_.quantize_both_gathered(x, tokens_, in_, seeded(f.a, step, GemmRole::fprop, 0), xq,
                                    seeded(g.b, step, GemmRole::wgrad, 1), slot(saved_xt_q_), *x_amax);
      else
        ops_.quantize_both(x, tokens_, in_, seeded(f.a, step, GemmRole::fprop, 0), xq,
                           seeded(g.b, step, GemmRole::wgrad, 1), slot(saved_xt_q_));
      saved_xt_valid_ = true;
    } else {
      ops_.quantize(x, tokens_, in_, seeded(f.a, step, GemmRole::fprop, 0), xq);
    }
  }
  fprop_input_quantized_ = true;
  const QuantOptions wo = seeded(f.b, step, GemmRole::fprop, 1);
  if (!reusable(w_q_valid_, w_q_version_, w_q_options_, wo)) {
    {
      ScopedTimer timer(times_.quantize_s);
      w_q_valid_ = false;  // stays false if quantize throws
      ops_.quantize(w, out_, in_, wo, slot(w_q_));
      w_q_valid_ = true;
    }
    w_q_version_ = step.weight_version;
    w_q_options_ = wo;
  }
  {
    ScopedTimer timer(times_.gemm_s);
    ops_.gemm(xq, *w_q_, y, out_, 1.0f, Output::overwrite, f.summation);
  }
  if (step.collect_stats) {
    record("fprop.X", x, tokens_, in_, false, xq);
    record("fprop.W", w, out_, in_, false, *w_q_);
  }
}

// What wgrad needs of X, in the form wgrad multiplies it.
void Linear::save_for_wgrad(const float* x) {
  const GemmRecipe& g = step_.recipe.wgrad;
  const size_t nx = static_cast<size_t>(tokens_ * in_);
  switch (g.precision) {
    case GemmPrecision::fp32: saved_x_f32_.assign_copy(x, nx); break;
    case GemmPrecision::bf16:
      // gemm_bf16 rounds its operands to BF16 (RN), so keeping X in BF16 loses nothing.
      saved_x_bf16_.resize(nx);
      ops_.round_to_bf16(x, saved_x_bf16_.data(), static_cast<int64_t>(nx));
      break;
    case GemmPrecision::quantized: {
      {
        ScopedTimer timer(times_.quantize_s);
        if (!saved_xt_valid_)
          ops_.quantize_transposed(x, tokens_, in_, seeded(g.b, step_, GemmRole::wgrad, 1), slot(saved_xt_q_));
        saved_xt_valid_ = true;
      }
      if (step_.collect_stats) record("wgrad.X^T", x, tokens_, in_, true, *saved_xt_q_);
      break;
    }
  }
}

void Linear::backward(const float* dy, const float* w, float* dx, float* dw, const SourceAmax* dy_amax) {
  NIBBLE_CHECK(tokens_ > 0, "Linear::backward of %s without a forward before it", name_.c_str());
  const int64_t tokens = tokens_;
  const LinearRecipe& r = step_.recipe;
  grad_t_valid_ = false;
  // Dgrad: dX = dY W.
  run_gemm(r.dgrad, {ops::DenseGemmShape::a_b(tokens, in_, out_), dy, w, 0.0f, dx},
           [&] { dgrad_quantized(dy, w, dx, dy_amax); });
  // Wgrad: dW = dY^T X, with X as forward saved it (BF16 widened back to FP32 for gemm_bf16).
  const float* x = saved_x_f32_.data();
  if (r.wgrad.precision == GemmPrecision::bf16) {
    bf16_x_f32_.resize(saved_x_bf16_.size());
    ops_.widen_bf16(saved_x_bf16_.data(), bf16_x_f32_.data(), static_cast<int64_t>(bf16_x_f32_.size()));
    x = bf16_x_f32_.data();
  }
  run_gemm(r.wgrad, {ops::DenseGemmShape::at_b(out_, in_, tokens), dy, x, 0.0f, dw},
           [&] { wgrad_quantized(dy, dw); });
  grad_t_valid_ = false;
  // Capacity is kept for the next micro-step (no reallocation per step); the contents are dead.
  saved_x_f32_.clear();
  saved_x_bf16_.clear();
  saved_xt_valid_ = false;
  tokens_ = 0;
}

void Linear::dgrad_quantized(const float* dy, const float* w, float* dx, const SourceAmax* dy_amax) {
  const LinearStep& step = step_;
  const GemmRecipe& d = step.recipe.dgrad;
  ops::Quantized& dyq = slot(grad_q_);
  {
    ScopedTimer timer(times_.quantize_s);
    if (step.recipe.wgrad.precision == GemmPrecision::quantized) {
      if (dy_amax && dy_amax->valid)
        ops_.quantize_both_gathered(dy, tokens_, out_, seeded(d.a, step, GemmRole::dgrad, 0), dyq,
                                    seeded(step.recipe.wgrad.a, step, GemmRole::wgrad, 0), slot(grad_t_q_), *dy_amax);
      else
        ops_.quantize_both(dy, tokens_, out_, seeded(d.a, step, GemmRole::dgrad, 0), dyq,
                           seeded(step.recipe.wgrad.a, step, GemmRole::wgrad, 0), slot(grad_t_q_));
      grad_t_valid_ = true;
    } else {
      ops_.quantize(dy, tokens_, out_, seeded(d.a, step, GemmRole::dgrad, 0), dyq);
    }
  }
  const QuantOptions wo = seeded(d.b, step, GemmRole::dgrad, 1);
  if (!reusable(wt_q_valid_, wt_q_version_, wt_q_options_, wo)) {
    // With 16x16 tiles (weight_shared_by_fprop_and_dgrad) one amax and one scale per tile serve
    // both orientations: when fprop quantized this very weight with these options, dgrad takes
    // the exact transpose of its codes and scales instead of quantizing W again (tests compare it
    // with ref::transpose_tiles of fprop's weight bit for bit).
    const bool fprop_weight_current = reusable(w_q_valid_, w_q_version_, w_q_options_, wo) && !wo.rht &&
                                      w_q_->layout().block == BlockShape::tile_16x16 && out_ % 16 == 0;
    {
      ScopedTimer timer(times_.quantize_s);
      wt_q_valid_ = false;
      if (fprop_weight_current)
        ops_.transpose_tiles(*w_q_, slot(wt_q_));
      else
        ops_.quantize_transposed(w, out_, in_, wo, slot(wt_q_));
      wt_q_valid_ = true;
    }
    wt_q_version_ = step.weight_version;
    wt_q_options_ = wo;
  }
  {
    ScopedTimer timer(times_.gemm_s);
    ops_.gemm(dyq, *wt_q_, dx, in_, 1.0f, Output::overwrite, d.summation);
  }
  if (step.collect_stats) {
    record("dgrad.dY", dy, tokens_, out_, false, dyq);
    record("dgrad.W^T", w, out_, in_, true, *wt_q_);
  }
}

void Linear::wgrad_quantized(const float* dy, float* dw) {
  NIBBLE_CHECK(saved_xt_valid_, "Linear %s: the wgrad GEMM needs the X^T its forward saved", name_.c_str());
  const GemmRecipe& g = step_.recipe.wgrad;
  ops::Quantized& dyt = slot(grad_t_q_);
  if (!grad_t_valid_) {
    ScopedTimer timer(times_.quantize_s);
    ops_.quantize_transposed(dy, tokens_, out_, seeded(g.a, step_, GemmRole::wgrad, 0), dyt);
  }
  {
    ScopedTimer timer(times_.gemm_s);
    ops_.gemm(dyt, *saved_xt_q_, dw, in_, 1.0f, Output::overwrite, g.summation);
  }
  if (step_.collect_stats) record("wgrad.dY^T", dy, tokens_, out_, true, dyt);
}

}  // namespace nibble
