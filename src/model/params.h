// All parameters and their gradients live in two parallel FP32 arrays with one layout, so the
// optimizer, clipping and checkpoints visit them in lock step. The arrays are in the memory of the
// model's backend (ops/backend.h): on the CPU the spans below are host memory; on a GPU they are
// device memory, and host code reads and writes them through host_values() / set_values().
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ops/backend.h"

namespace nibble::model {

struct ParamInfo {
  std::string name;
  int64_t offset = 0;  // into values/grads, 64-byte aligned
  int64_t rows = 0, cols = 0;
  bool weight_decay = true;  // false for norms and embeddings (AdamW's usual exemption)
  // The backward pass writes this gradient whole before anything adds to it (a linear's wgrad GEMM,
  // the LM head's): zero_grads() leaves it as it is.
  bool grad_overwritten = false;
  int64_t size() const { return rows * cols; }
};

// Where the weights come from when a rank does not hold them all (distributed.shard=full, ZeRO-3:
// train/weight_shards.h). The model asks for the arena range [begin, end) of the values just before a
// phase reads it (a block's forward, its backward, the embedding, the head) and gives it back after:
// between acquire and release the range holds the whole weights; outside, only what this rank owns
// is guaranteed. Both are collective where the provider is (every rank calls them in the same order).
class WeightProvider {
 public:
  virtual ~WeightProvider() = default;
  virtual void acquire(int64_t begin, int64_t end) = 0;
  virtual void release(int64_t begin, int64_t end) = 0;
  // Instead of a linear's FP32 weight `w`, its NVFP4 quantization with options `o` (16x16 tiles, as
  // Linear::providable_weight gives them), made from the ranks' pieces and byte for byte the
  // quantization of the whole weight, into `out`: when provides_quantized says so (else the model
  // acquires the FP32 values). `version`: the weights' optimizer step (pieces made for it may be
  // kept until it changes). Collective as acquire; what it fills, the model frees after the phase.
  virtual bool provides_quantized(const QuantOptions& o) const {
    (void)o;
    return false;
  }
  virtual void acquire_quantized(const ParamInfo& w, const QuantOptions& o, int64_t version, ops::Quantized& out);
};

class ParamArena {
 public:
  explicit ParamArena(ops::TensorOps& ops) : values_(ops), grads_(ops) {}
  // Layout first, then allocate(): offsets stay valid because storage is made once.
  int64_t add(std::string name, int64_t rows, int64_t cols, bool weight_decay);
  void allocate();

  // Backend memory (see above).
  std::span<float> values() { return {values_.data(), values_.size()}; }
  std::span<const float> values() const { return {values_.data(), values_.size()}; }
  std::span<float> grads() { return {grads_.data(), grads_.size()}; }
  std::span<const float> grads() const { return {grads_.data(), grads_.size()}; }
  // Host copies, and the values written from the host (checkpoints, initialisation, broadcasts): of
  // the whole arena, so memory a distributed mode released is committed first.
  std::vector<float> host_values() const;
  std::vector<float> host_grads() const;
  void set_values(std::span<const float> host);
  float* value(int64_t offset) { return values_.data() + offset; }
  const float* value(int64_t offset) const { return values_.data() + offset; }
  float* grad(int64_t offset) { return grads_.data() + offset; }
  // [begin, end) of the values or the gradients is about to be used after the distributed modes
  // discarded it (ZeRO-3's weights, ZeRO-2's gradients): TensorOps::commit, which on a GPU maps the
  // released memory again. Both arrays are releasable memory (TensorOps::allocate_releasable).
  void commit_values(int64_t begin, int64_t end);
  void commit_grads(int64_t begin, int64_t end);
  // Before allocate(): the gradient of the tensor at `offset` is overwritten by the backward pass
  // (ParamInfo::grad_overwritten).
  void mark_grad_overwritten(int64_t offset);
  const std::vector<ParamInfo>& params() const { return params_; }
  const ParamInfo& find(const std::string& name) const;  // UsageError if absent
  int64_t parameter_count() const;
  // Zeros the gradients the backward pass adds into (norm gains, the embedding unless the tied
  // head's GEMM overwrites it, the alignment gaps) before a micro-batch's backward; the overwritten
  // ones are left: zeroing them would cost a write of most of the arena, and their GEMMs a read.
  void zero_grads();

 private:
  std::vector<ParamInfo> params_;
  std::vector<std::pair<int64_t, int64_t>> accumulated_ranges_;  // what zero_grads zeros, from allocate()
  int64_t size_ = 0;
  ops::Array<float> values_, grads_;
};

}  // namespace nibble::model
