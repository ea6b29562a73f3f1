// Memory per rank of a training job, from the config's shapes alone (no model allocated): what the
// start-up report of `nibble train` prints for the run, and `nibble plan CONFIG --ranks N` for any
// rank count and shard mode (a user sizing a job on a laptop).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "recipe/recipe.h"
#include "run/config.h"
#include "train/distributed.h"

namespace nibble::train {

// Bytes one rank holds, by kind. Every term follows from the shapes; `process` is what the program
// holds before training (its code and libraries, MPI's buffers, the token data it has touched),
// read from /proc/self/status where it runs.
struct RankMemory {
  int64_t weights = 0;       // the FP32 parameter arena: the whole, or (full) the slice and the largest phase gathered
  int64_t gradients = 0;     // the FP32 gradient arena (ZeRO-2: the pages its slice and the buckets in flight touch)
  int64_t accumulation = 0;  // GradientSum's tree levels when a rank runs several micro-batches
  int64_t optimizer = 0;     // AdamW's two FP32 moments and 1-byte decay flags: whole, or its slice
  int64_t activations = 0;   // one micro-batch's saved activations and the recipe's quantized weights
  int64_t buffers = 0;       // communication scratch (the exchange bucket; ZeRO-2: receive buffers in flight)
  int64_t process = 0;
  // Rank 0 only, while it writes a checkpoint (or reads one to resume): the whole state as host
  // copies and serialized files, on top of the rest.
  int64_t checkpoint = 0;
  // distributed.shard=full: the whole FP32 arena every rank holds while the model initialises it,
  // next to the gradients, before AdamW's state exists (train/weight_shards.h); 0 in other modes.
  int64_t startup_weights = 0;
  int64_t training() const {
    return weights + gradients + accumulation + optimizer + activations + buffers + process;
  }
  int64_t startup() const { return startup_weights > 0 ? startup_weights + gradients + process : 0; }
  int64_t resident() const {
    const int64_t t = training(), s = startup();
    return t > s ? t : s;
  }
  int64_t peak() const { return resident() + checkpoint; }

  // device=cuda: of the above, what lives in the GPU's memory (all but the program and the
  // checkpoint's host copies; under full, rank 0's whole weights gathered for a checkpoint are).
  bool on_gpu = false;
  int64_t checkpoint_on_gpu = 0;
  int64_t gpu_peak() const {
    const int64_t t = training() - process, s = startup() > 0 ? startup() - process : 0;
    return (t > s ? t : s) + checkpoint_on_gpu;
  }
};

// What MPI_Init adds to a rank's resident memory (Open MPI 4.1's shared-memory transport and its
// own tables, measured on 2 and 4 ranks of one host): `nibble plan`'s allowance for a job it does
// not run under MPI.
inline constexpr int64_t kMpiLibraryBytes = int64_t{14} << 20;

struct MemoryPlanInput {
  TrainConfig train;          // model (with its vocabulary), recipe, batch, seq, grad_accum, device
  int ranks = 1;
  ShardMode shard = ShardMode::none;
  int64_t process_bytes = 0;  // the process term (see RankMemory)
};

// The memory of `rank` (its slice decides ZeRO-1's share; rank 0 adds the checkpoint term).
// UsageError when the global batch cannot be divided between the ranks or the mode refuses the
// rank count (train/distributed.h), with the trainer's messages.
RankMemory plan_rank_memory(const MemoryPlanInput& in, int rank);

// This process's resident memory now (VmRSS), bytes; 0 where /proc is missing.
int64_t resident_bytes_now();
// Its peak resident memory so far (VmHWM), bytes; 0 where /proc is missing.
int64_t peak_resident_bytes();

// "weights 324 MiB, gradients ..., total ... (rank 0 writing a checkpoint: ...)": the start-up line.
std::string describe_rank_memory(const RankMemory& m);

// `nibble plan`: per mode (none, optimizer, gradients, full), the largest rank's memory, rank 0's peak and whether
// they fit in `device_memory` bytes (0: not asked), with the modes that fit named last. With
// device=cuda what must fit is each rank's GPU memory (RankMemory::gpu_peak), not its host's.
std::string memory_plan_report(const MemoryPlanInput& in, int64_t device_memory);

// "141GB", "80GiB", "512MB", "1.5T": bytes. UsageError naming the accepted forms.
int64_t parse_memory_size(const std::string& text);

}  // namespace nibble::train
