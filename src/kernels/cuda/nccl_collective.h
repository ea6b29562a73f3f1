// Sums across the GPUs of a data-parallel job through NCCL: one process per GPU (mpirun), every
// process holding one Collective over the same id. Built only when CMake finds NCCL
// (NIBBLE_HAVE_NCCL); the launcher's own channel (MPI) carries the id from rank 0 to the others.
//
// The order of the sum is nibble's, not NCCL's: with a power-of-two rank count the ranks exchange
// whole buckets with rank ^ 1, ^ 2, ^ 4, ... and each adds its partner's bucket to its own (recursive
// doubling), so every GPU ends with the balanced binary tree over ranks, the same additions in the
// same order as the CPU's MPI path (train/distributed_mpi.cpp) and as one process's gradient-sum
// tree. With other rank counts it is ncclAllReduce's order (the CPU path's MPI_Allreduce likewise).
#pragma once
#include <array>
#include <cstddef>
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
  std::string describe() const;  // "NCCL 2.27.7, 4 GPUs"

 private:
  Context& ctx_;
  ncclComm* comm_ = nullptr;
  int rank_ = 0, size_ = 1;
  DeviceBuffer<float> partner_;  // one bucket of the partner's values
};

}  // namespace nibble::cuda
