#include "recipe/linear.h"

#include <algorithm>
#include <chrono>
#include <span>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/quantize.h"

namespace nibble {

namespace {

bool same_options(const QuantOptions& a, const QuantOptions& b) {
  return a.format == b.format && a.tile_16x16 == b.tile_16x16 && a.rounding == b.rounding && a.seed == b.seed &&
         a.offset == b.offset && a.rht == b.rht && a.four_over_six == b.four_over_six &&
         a.four_over_six_error == b.four_over_six_error && a.four_over_six_e4m3_max == b.four_over_six_e4m3_max;
}

// [rows, cols] -> [cols, rows]; only for telemetry of the wgrad operands.
std::vector<float> transposed(const float* x, int64_t rows, int64_t cols) {
  std::vector<float> t(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[c * rows + r] = x[r * cols + c];
  return t;
}

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

Linear::Linear(std::string name, int64_t in_features, int64_t out_features)
    : name_(std::move(name)), in_(in_features), out_(out_features) {
  NIBBLE_CHECK(in_ > 0 && out_ > 0);
}

void Linear::record(std::string operand, std::span<const float> x, const QuantizedTensor& q) {
  stats_.push_back({std::move(operand), quant_stats(x, q)});
}

int64_t Linear::saved_activation_bytes() const {
  int64_t b = static_cast<int64_t>(saved_x_f32_.size() * sizeof(float) + saved_x_bf16_.size() * sizeof(bf16));
  if (saved_xt_valid_) b += static_cast<int64_t>(saved_xt_q_.codes.size() + saved_xt_q_.scales.size());
  return b;
}

void Linear::forward(const LinearStep& step, const float* x, int64_t tokens, const float* w, float* y) {
  NIBBLE_CHECK(tokens > 0);
  step_ = step;
  tokens_ = tokens;
  if (step.collect_stats) stats_.clear();
  const size_t nx = static_cast<size_t>(tokens * in_), nw = static_cast<size_t>(out_ * in_);
  const std::span<const float> xs(x, nx), ws(w, nw);

  // Fprop: Y = X W^T. When wgrad quantizes X^T too, both are made in one call (quantize_both_into
  // reads X once less).
  const GemmRecipe& f = step.recipe.fprop;
  const GemmRecipe& g = step.recipe.wgrad;
  saved_xt_valid_ = false;
  fprop_input_amax_ = -1.0f;
  switch (f.precision) {
    case GemmPrecision::fp32:
      {
        ScopedTimer timer(times_.gemm_s);
        cpu::gemm_f32(cpu::Trans::no, cpu::Trans::yes, tokens, out_, in_, 1.0f, x, in_, w, in_, 0.0f, y, out_);
      }
      break;
    case GemmPrecision::bf16:
      {
        ScopedTimer timer(times_.gemm_s);
        cpu::gemm_bf16(cpu::Trans::no, cpu::Trans::yes, tokens, out_, in_, 1.0f, x, in_, w, in_, 0.0f, y, out_);
      }
      break;
    case GemmPrecision::quantized: {
      QuantizedTensor& xq = x_q_;
      {
        ScopedTimer timer(times_.quantize_s);
        if (step.save_for_backward && g.precision == GemmPrecision::quantized) {
          cpu::quantize_both_into(xs, tokens, in_, seeded(f.a, step, GemmRole::fprop, 0), xq,
                                  seeded(g.b, step, GemmRole::wgrad, 1), saved_xt_q_);
          saved_xt_valid_ = true;
        } else {
          cpu::quantize_into(xs, tokens, in_, seeded(f.a, step, GemmRole::fprop, 0), xq);
        }
      }
      fprop_input_amax_ = xq.amax;
      QuantOptions wo = seeded(f.b, step, GemmRole::fprop, 1);
      if (!w_q_ || w_q_version_ != step.weight_version || step.weight_version < 0 || !same_options(wo, w_q_options_)) {
        {
          ScopedTimer timer(times_.quantize_s);
          w_q_ = cpu::quantize(ws, out_, in_, wo);
        }
        w_q_version_ = step.weight_version;
        w_q_options_ = wo;
      }
      {
        ScopedTimer timer(times_.gemm_s);
        cpu::gemm(xq, *w_q_, y, out_, 1.0f, false, f.summation);
      }
      if (step.collect_stats) {
        record("fprop.X", xs, xq);
        record("fprop.W", ws, *w_q_);
      }
      break;
    }
  }

  // What wgrad needs of X, in the form wgrad multiplies it.
  saved_x_f32_.clear();
  saved_x_bf16_.clear();
  if (!step.save_for_backward) {
    tokens_ = 0;  // backward without a training forward is an internal error
    return;
  }
  switch (g.precision) {
    case GemmPrecision::fp32: saved_x_f32_.assign(x, x + nx); break;
    case GemmPrecision::bf16:
      // gemm_bf16 rounds its operands to BF16 (RN), so keeping X in BF16 loses nothing.
      saved_x_bf16_.resize(nx);
#pragma omp parallel for simd schedule(static)
      for (size_t i = 0; i < nx; ++i) saved_x_bf16_[i] = bf16_from_float_rn(x[i]);
      break;
    case GemmPrecision::quantized: {
      {
        ScopedTimer timer(times_.quantize_s);
        if (!saved_xt_valid_)
          cpu::quantize_transposed_into(xs, tokens, in_, seeded(g.b, step, GemmRole::wgrad, 1), saved_xt_q_);
        saved_xt_valid_ = true;
      }
      if (step.collect_stats) record("wgrad.X^T", transposed(x, tokens, in_), saved_xt_q_);
      break;
    }
  }
}

void Linear::backward(const float* dy, const float* w, float* dx, float* dw) {
  NIBBLE_CHECK(tokens_ > 0);
  const int64_t tokens = tokens_;
  const LinearStep& step = step_;
  const std::span<const float> dys(dy, static_cast<size_t>(tokens * out_)), ws(w, static_cast<size_t>(out_ * in_));
  grad_t_valid_ = false;

  // Dgrad: dX = dY W.
  const GemmRecipe& d = step.recipe.dgrad;
  switch (d.precision) {
    case GemmPrecision::fp32:
      {
        ScopedTimer timer(times_.gemm_s);
        cpu::gemm_f32(cpu::Trans::no, cpu::Trans::no, tokens, in_, out_, 1.0f, dy, out_, w, in_, 0.0f, dx, in_);
      }
      break;
    case GemmPrecision::bf16:
      {
        ScopedTimer timer(times_.gemm_s);
        cpu::gemm_bf16(cpu::Trans::no, cpu::Trans::no, tokens, in_, out_, 1.0f, dy, out_, w, in_, 0.0f, dx, in_);
      }
      break;
    case GemmPrecision::quantized: {
      QuantizedTensor& dyq = grad_q_;
      {
        ScopedTimer timer(times_.quantize_s);
        if (step.recipe.wgrad.precision == GemmPrecision::quantized) {
          cpu::quantize_both_into(dys, tokens, out_, seeded(d.a, step, GemmRole::dgrad, 0), dyq,
                                  seeded(step.recipe.wgrad.a, step, GemmRole::wgrad, 0), grad_t_q_);
          grad_t_valid_ = true;
        } else {
          cpu::quantize_into(dys, tokens, out_, seeded(d.a, step, GemmRole::dgrad, 0), dyq);
        }
      }
      QuantOptions wo = seeded(d.b, step, GemmRole::dgrad, 1);
      if (!wt_q_ || wt_q_version_ != step.weight_version || step.weight_version < 0 || !same_options(wo, wt_q_options_)) {
        // With 16x16 tiles (weight_shared_by_fprop_and_dgrad) one amax and one scale per tile serve
        // both orientations: when fprop quantized this very weight with these options, dgrad takes
        // the exact transpose of its codes and scales instead of quantizing W again (tests compare it
        // with ref::transpose_tiles of fprop's weight bit for bit).
        const bool fprop_weight_current = w_q_ && w_q_version_ == step.weight_version && step.weight_version >= 0 &&
                                          same_options(wo, w_q_options_) && !wo.rht && w_q_->block == BlockShape::tile_16x16 &&
                                          out_ % 16 == 0;
        {
          ScopedTimer timer(times_.quantize_s);
          wt_q_ = fprop_weight_current ? cpu::transpose_tiles(*w_q_) : cpu::quantize_transposed(ws, out_, in_, wo);
        }
        wt_q_version_ = step.weight_version;
        wt_q_options_ = wo;
      }
      {
        ScopedTimer timer(times_.gemm_s);
        cpu::gemm(dyq, *wt_q_, dx, in_, 1.0f, false, d.summation);
      }
      if (step.collect_stats) {
        record("dgrad.dY", dys, dyq);
        record("dgrad.W^T", transposed(w, out_, in_), *wt_q_);
      }
      break;
    }
  }

  // Wgrad: dW += dY^T X.
  const GemmRecipe& g = step.recipe.wgrad;
  switch (g.precision) {
    case GemmPrecision::fp32:
      {
        ScopedTimer timer(times_.gemm_s);
        cpu::gemm_f32(cpu::Trans::yes, cpu::Trans::no, out_, in_, tokens, 1.0f, dy, out_, saved_x_f32_.data(), in_, 1.0f,
                      dw, in_);
      }
      break;
    case GemmPrecision::bf16: {
      std::vector<float>& x = bf16_x_f32_;
      x.resize(saved_x_bf16_.size());
#pragma omp parallel for simd schedule(static)
      for (size_t i = 0; i < x.size(); ++i) x[i] = bf16_to_float(saved_x_bf16_[i]);
      {
        ScopedTimer timer(times_.gemm_s);
        cpu::gemm_bf16(cpu::Trans::yes, cpu::Trans::no, out_, in_, tokens, 1.0f, dy, out_, x.data(), in_, 1.0f, dw, in_);
      }
      break;
    }
    case GemmPrecision::quantized: {
      NIBBLE_CHECK(saved_xt_valid_);
      QuantizedTensor& dyt = grad_t_q_;
      if (!grad_t_valid_) {
        ScopedTimer timer(times_.quantize_s);
        cpu::quantize_transposed_into(dys, tokens, out_, seeded(g.a, step, GemmRole::wgrad, 0), dyt);
      }
      {
        ScopedTimer timer(times_.gemm_s);
        cpu::gemm(dyt, saved_xt_q_, dw, in_, 1.0f, /*accumulate=*/true, g.summation);
      }
      if (step.collect_stats) record("wgrad.dY^T", transposed(dy, tokens, out_), dyt);
      break;
    }
  }
  grad_t_valid_ = false;
  // Capacity is kept for the next micro-step (no reallocation per step); the contents are dead.
  saved_x_f32_.clear();
  saved_x_bf16_.clear();
  saved_xt_valid_ = false;
  tokens_ = 0;
}

}  // namespace nibble
