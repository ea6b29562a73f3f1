// All parameters and their gradients live in two parallel FP32 arrays with one layout, so the
// optimizer, clipping and (later) checkpoints visit them in lock step.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace nibble::model {

struct ParamInfo {
  std::string name;
  int64_t offset = 0;  // into values/grads, 64-byte aligned
  int64_t rows = 0, cols = 0;
  bool weight_decay = true;  // false for norms and embeddings (AdamW's usual exemption)
  int64_t size() const { return rows * cols; }
};

class ParamArena {
 public:
  // Layout first, then allocate(): offsets stay valid because storage is made once.
  int64_t add(std::string name, int64_t rows, int64_t cols, bool weight_decay);
  void allocate();

  std::span<float> values() { return values_; }
  std::span<const float> values() const { return values_; }
  std::span<float> grads() { return grads_; }
  std::span<const float> grads() const { return grads_; }
  float* value(int64_t offset) { return values_.data() + offset; }
  const float* value(int64_t offset) const { return values_.data() + offset; }
  float* grad(int64_t offset) { return grads_.data() + offset; }
  const std::vector<ParamInfo>& params() const { return params_; }
  const ParamInfo& find(const std::string& name) const;  // UsageError if absent
  int64_t parameter_count() const;
  void zero_grads();

 private:
  std::vector<ParamInfo> params_;
  int64_t size_ = 0;
  std::vector<float> values_, grads_;
};

}  // namespace nibble::model
