// Sums across the GPUs of a data-parallel job through NCCL: one process per GPU (mpirun), every
// process holding one Collective over the same id. Built only when CMake finds NCCL
// (NIBBLE_HAVE_NCCL); the launcher's own channel (MPI) carries the id from rank 0 to the others.
//
// The order of the sum is nibble's, not NCCL's: with a power-of-two rank count the ranks exchange
// whole buckets with rank ^ 1, ^ 2, ^ 4, ... and each adds its partner's bucket to its own (recursive
// doubling), so every GPU ends with the balanced binary tree over ranks, the same additions in the
// same order as the CPU's MPI path (train/distributed_mpi.cpp) and as one process's gradient-sum
// tree. With other rank counts it is ncclAllReduce's order (the CPU path's MPI_Allreduce likewise).
// ZeRO-1 (distributed.shard=optimizer) on GPUs reduce-scatters the gradients by recursive halving
// with the same partners (common/rank_tree.h, as the CPU's reduce-scatter) and all-gathers the
// updated weights. Runs in CI under the CUDA model with a model of NCCL (tests/emulated/cuda_model/).
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "kernels/cuda/context.h"

struct ncclComm;  // nccl.h's ncclComm_t is `struct ncclComm*`

namespace nibble::cuda {

using CollectiveId = std::array<std::byte, 128>;  // an ncclUniqueId's bytes

// A fresh id (rank 0 makes it and sends it to the others). Throws CudaError naming NCCL's reason.
CollectiveId new_collective_id();

class Collective {
 public:
  // Joins `size` ranks on the GPU of `ctx`; blocks until every rank has joined.
  Collective(Context& ctx, const CollectiveId& id, int rank, int size);
  ~Collective();
  Collective(const Collective&) = delete;
  Collective& operator=(const Collective&) = delete;

  // In place: every rank's `values` (device memory of ctx's GPU) becomes the sum over ranks, the
  // same bits on every rank. Ordered on ctx's stream; returns when the sum is complete.
  void sum(float* values, size_t count);
  // In place: afterwards values[bounds[rank], bounds[rank + 1]) holds bitwise what sum() leaves
  // there (recursive halving over the same tree with a power-of-two rank count; otherwise sum()
  // itself); the rest of `values` is unspecified. bounds: size + 1 ascending offsets from 0 to the
  // length of `values` (train::ShardLayout's). Returns when this rank's slice is complete.
  void reduce_scatter(float* values, std::span<const int64_t> bounds);
  // In place: every rank's values[bounds[r], bounds[r + 1]) reaches every rank (a copy, so the bits
  // are the owner's). Returns when complete.
  void all_gather(float* values, std::span<const int64_t> bounds);
  std::string describe() const;  // "NCCL 2.27.7, 4 GPUs"

 private:
  // Sends given[0, given_count) to `partner` and adds what it sends back into kept[0, kept_count),
  // in buckets of at most kBucketFloats (the two may differ in length: a bucket past one's end is
  // empty and not posted, on both sides alike).
  void exchange_and_add(float* kept, size_t kept_count, const float* given, size_t given_count, int partner);
  void check_bounds(std::span<const int64_t> bounds, const char* call) const;
  void reserve_partner_bucket(size_t count);

  Context& ctx_;
  ncclComm* comm_ = nullptr;
  int rank_ = 0, size_ = 1;
  DeviceBuffer<float> partner_;  // one bucket of the partner's values
};

}  // namespace nibble::cuda
