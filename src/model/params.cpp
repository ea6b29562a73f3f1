#include "model/params.h"

#include <algorithm>

#include "format/quantized_tensor.h"

namespace nibble::model {

int64_t ParamArena::add(std::string name, int64_t rows, int64_t cols, bool weight_decay) {
  NIBBLE_CHECK(values_.empty() && rows > 0 && cols > 0);
  const int64_t offset = size_;
  params_.push_back({std::move(name), offset, rows, cols, weight_decay});
  size_ += (rows * cols + 15) / 16 * 16;  // 64-byte alignment of every tensor
  return offset;
}

void ParamArena::allocate() {
  values_.assign(static_cast<size_t>(size_), 0.0f);
  grads_.assign(static_cast<size_t>(size_), 0.0f);
}

const ParamInfo& ParamArena::find(const std::string& name) const {
  for (const auto& p : params_)
    if (p.name == name) return p;
  throw UsageError("no parameter named '" + name + "'");
}

int64_t ParamArena::parameter_count() const {
  int64_t n = 0;
  for (const auto& p : params_) n += p.size();
  return n;
}

void ParamArena::zero_grads() { std::fill(grads_.begin(), grads_.end(), 0.0f); }

}  // namespace nibble::model
