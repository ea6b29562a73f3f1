#include "model/params.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "common/error.h"

namespace nibble::model {

void WeightProvider::acquire_quantized(const ParamInfo& w, const QuantOptions&, int64_t, ops::Quantized&) {
  NIBBLE_CHECK(false, "WeightProvider: %s was asked for quantized although provides_quantized said no", w.name.c_str());
}

int64_t ParamArena::add(std::string name, int64_t rows, int64_t cols, bool weight_decay) {
  NIBBLE_CHECK(values_.empty() && rows > 0 && cols > 0,
               "ParamArena::add(%s, %lld x %lld): parameters are added before allocate(), with a non-empty shape",
               name.c_str(), static_cast<long long>(rows), static_cast<long long>(cols));
  const int64_t offset = size_;
  params_.push_back({std::move(name), offset, rows, cols, weight_decay});
  size_ += (rows * cols + 15) / 16 * 16;  // 64-byte alignment of every tensor
  return offset;
}

void ParamArena::mark_grad_overwritten(int64_t offset) {
  NIBBLE_CHECK(values_.empty(), "ParamArena::mark_grad_overwritten: before allocate()");
  for (ParamInfo& p : params_)
    if (p.offset == offset) {
      p.grad_overwritten = true;
      return;
    }
  NIBBLE_CHECK(false, "ParamArena::mark_grad_overwritten: no tensor at offset %lld", static_cast<long long>(offset));
}

void ParamArena::allocate() {
  values_.make_releasable();
  grads_.make_releasable();
  values_.resize_zeroed(static_cast<size_t>(size_));
  grads_.resize_zeroed(static_cast<size_t>(size_));
  // The complement of the overwritten tensors, adjacent pieces merged (tensors are in offset order).
  accumulated_ranges_.clear();
  int64_t begin = 0;
  for (const ParamInfo& p : params_) {
    if (!p.grad_overwritten) continue;
    if (p.offset > begin) accumulated_ranges_.emplace_back(begin, p.offset);
    begin = p.offset + p.size();
  }
  if (size_ > begin) accumulated_ranges_.emplace_back(begin, size_);
}

namespace {
// TensorOps::commit of elements [begin, end) of `a`: memory a distributed mode released is taken
// again (on a GPU a touch of an unmapped chunk would be an illegal address; on the CPU released
// pages come back as zeros either way).
void commit(const ops::Array<float>& a, int64_t begin, int64_t end) {
  if (end > begin)
    a.ops()->commit(const_cast<float*>(a.data()) + begin, static_cast<size_t>(end - begin) * sizeof(float));
}
}  // namespace

void ParamArena::commit_values(int64_t begin, int64_t end) {
  NIBBLE_CHECK(0 <= begin && begin <= end && end <= size_, "ParamArena::commit_values: a range of the arena");
  commit(values_, begin, end);
}

void ParamArena::commit_grads(int64_t begin, int64_t end) {
  NIBBLE_CHECK(0 <= begin && begin <= end && end <= size_, "ParamArena::commit_grads: a range of the arena");
  commit(grads_, begin, end);
}

// Whole-arena copies commit first.
std::vector<float> ParamArena::host_values() const {
  commit(values_, 0, static_cast<int64_t>(values_.size()));
  return values_.to_host();
}

std::vector<float> ParamArena::host_grads() const {
  commit(grads_, 0, static_cast<int64_t>(grads_.size()));
  return grads_.to_host();
}

void ParamArena::set_values(std::span<const float> host) {
  if (host.size() != values_.size())
    throw UsageError("parameter values: " + std::to_string(host.size()) + " given for an arena of " +
                     std::to_string(values_.size()));
  commit(values_, 0, static_cast<int64_t>(values_.size()));
  values_.assign_from_host(host.data(), host.size());
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

void ParamArena::zero_grads() { grads_.ops()->fill_zero_ranges(grads_.data(), accumulated_ranges_); }

}  // namespace nibble::model
