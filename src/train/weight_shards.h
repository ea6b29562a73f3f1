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
// The weights are gathered in FP32 for every recipe: an NVFP4 recipe's Linear quantizes the gathered
// FP32 weights as an unsharded run does (gathering the quantized weight instead is not written yet).
#pragma once
#include <cstdint>

#include "model/params.h"
#include "ops/backend.h"
#include "train/distributed.h"

namespace nibble::train {

class WeightShards final : public model::WeightProvider {
 public:
  // `layout`: one slice of `params`' arena per rank of `comm` (optimizer_shards). The model's
  // weights are set: this rank's slice is kept, the rest dropped at once (the Trainer makes this
  // before AdamW's state, so the start-up holds the whole weights only next to the gradients).
  WeightShards(Communicator& comm, ShardLayout layout, model::ParamArena& params, ops::TensorOps& ops);

  // Collective: every rank's part of [begin, end) to every rank, in place in the arena.
  void acquire(int64_t begin, int64_t end) override;
  // Local: the memory of [begin, end) outside this rank's slice back to the system.
  void release(int64_t begin, int64_t end) override;
  // Local: everything outside the slice (after something wrote the whole arena here).
  void drop_unowned() { release(0, layout_.total()); }
  // Collective: the whole weights on rank 0 (checkpoints), until it calls drop_unowned().
  void gather_to_root();
  // Collective: rank 0's whole arena (a resumed checkpoint) gives every rank its slice, in place;
  // then rank 0 drops the rest.
  void scatter_from_root();

  const ShardLayout& layout() const { return layout_; }
  int64_t owned_begin() const { return layout_.begin(rank_); }
  int64_t owned_end() const { return layout_.end(rank_); }
  // Bytes this rank received in acquires since construction (the all-gathers' traffic into it).
  int64_t gathered_bytes() const { return gathered_bytes_; }

 private:
  Communicator& comm_;
  ShardLayout layout_;
  model::ParamArena& params_;
  ops::TensorOps& ops_;
  int rank_;
  int64_t gathered_bytes_ = 0;
};

}  // namespace nibble::train
