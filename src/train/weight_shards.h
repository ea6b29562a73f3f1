// distributed.shard=full (ZeRO-3 / FSDP) over MPI on CPUs: each rank keeps the FP32 master weights of
// its slice of the parameter arena only (the slice of ZeRO-1's AdamW state, optimizer_shards: whole
// chunks of the gradient norm's unit), and the model acquires each phase's weights just before it
// (model::WeightProvider): the embedding, each block's forward, the head, the head and each block
// again in backward. An acquire all-gathers the range from its owners (a copy: the bits are the
// owner's, so every GEMM reads the weights an unsharded run reads, and the run stays bitwise); a
// release gives back the memory of what this rank does not own (TensorOps::discard: on the CPU the
// whole pages of the arena outside its slice leave the resident set). So a rank holds its slice plus
// the phase in use, and the arena's address range stays whole: offsets and every kernel unchanged.
// Gradients are whole on every rank and reduce-scattered as in ZeRO-1; AdamW steps the slice and
// does not all-gather it (the next acquires do).
//
// With an NVFP4 recipe whose linears' weights are 16x16 tiles (distributed.fp4_param_gather, the
// default), a linear's weight is gathered in its 4-bit form instead (Megatron's --fp4-param-gather):
// once per weight version every rank contributes the amax of its part (the global scale needs the
// whole weight's), quantizes the 16-row bands whose first row it owns with it (a band cut by a
// slice boundary comes whole to its owner first), and each phase all-gathers codes and scales,
// 0.5625 bytes a value instead of 4. The bytes are the whole weight's quantization (a tile's scale
// and codes depend on its 256 values and the global amax only), so the run stays bitwise.
#pragma once
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "model/params.h"
#include "ops/backend.h"
#include "train/distributed.h"

namespace nibble::train {

class WeightShards final : public model::WeightProvider {
 public:
  // `layout`: one slice of `params`' arena per rank of `comm` (optimizer_shards). The model's
  // weights are set: this rank's slice is kept, the rest dropped at once (the Trainer makes this
  // before AdamW's state, so the start-up holds the whole weights only next to the gradients).
  // quantized_gather: gather linears' NVFP4 weights quantized (provides_quantized) rather than FP32.
  WeightShards(Communicator& comm, ShardLayout layout, model::ParamArena& params, ops::TensorOps& ops,
               bool quantized_gather = true);

  // Collective: every rank's part of [begin, end) to every rank, in place in the arena.
  void acquire(int64_t begin, int64_t end) override;
  // Local: the memory of [begin, end) outside this rank's slice back to the system, with its
  // unowned neighbours up to the slice or a range still acquired (so that a page or a GPU chunk
  // straddling two phases goes back too).
  void release(int64_t begin, int64_t end) override;
  bool provides_quantized(const QuantOptions& o) const override;
  // Collective: w quantized with `o` (the options provides_quantized accepted) into `out`.
  void acquire_quantized(const model::ParamInfo& w, const QuantOptions& o, int64_t version, ops::Quantized& out) override;
  // Local: everything outside the slice (after something wrote the whole arena here).
  void drop_unowned() { release(0, layout_.total()); }
  // Collective: the whole weights on rank 0 (checkpoints), until it calls drop_unowned().
  void gather_to_root();
  // Collective: rank 0's whole arena (a resumed checkpoint) gives every rank its slice, in place;
  // then rank 0 drops the rest.
  void scatter_from_root();

  const ShardLayout& layout() const { return layout_; }
  // The ranges acquired and not yet released, in acquire order.
  const std::vector<std::pair<int64_t, int64_t>>& held() const { return held_; }
  int64_t owned_begin() const { return layout_.begin(rank_); }
  int64_t owned_end() const { return layout_.end(rank_); }
  // Bytes this rank received in acquires since construction (the all-gathers' traffic into it).
  int64_t gathered_bytes() const { return gathered_bytes_; }
  // Of those, the quantized weights' (codes, scales, amaxes and the FP32 bands cut by a slice boundary).
  int64_t gathered_quantized_bytes() const { return gathered_quantized_bytes_; }

 private:
  // This rank's piece of a weight gathered quantized, for one weight version and options: the
  // weight's 16-row bands whose first value it owns, quantized with the whole weight's amax.
  struct QuantizedPiece {
    int64_t version = -1;
    QuantOptions options;
    float amax = 0;
    ShardLayout bands;     // rank r quantizes bands [bands.begin(r), bands.end(r)) of the weight
    QuantizedTensor mine;  // those rows of this rank (none when it owns no band's first value)
  };
  // Which rank quantizes which of w's 16-row bands (the owner of its first value), as a layout over
  // band indices; and the arena ranges of the bands that a slice boundary cuts.
  ShardLayout band_owners(const model::ParamInfo& w) const;
  std::vector<std::pair<int64_t, int64_t>> bands_cut_by_slices(const model::ParamInfo& w) const;
  // Collective: makes `piece` for (w, o, version).
  void quantize_piece(const model::ParamInfo& w, const QuantOptions& o, int64_t version, QuantizedPiece& piece);
  // Collective: the max of every rank's max |x| over its part of w. NumericalError naming w when
  // a part holds an Inf or NaN (every rank throws it).
  float weight_amax(const model::ParamInfo& w);

  Communicator& comm_;
  ShardLayout layout_;
  model::ParamArena& params_;
  ops::TensorOps& ops_;
  int rank_;
  bool quantized_gather_;
  int64_t gathered_bytes_ = 0, gathered_quantized_bytes_ = 0;
  std::vector<std::pair<int64_t, int64_t>> held_;  // acquired, not yet released
  std::map<int64_t, QuantizedPiece> pieces_;  // by the weight's arena offset
};

}  // namespace nibble::train
