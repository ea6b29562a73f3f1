// Data parallelism across processes and hosts (`mpirun -np N nibble train ...`).
//
// Every rank holds the whole model. With distributed.shard=none it also holds the whole AdamW state;
// with distributed.shard=optimizer (ZeRO-1, ShardMode below) each rank keeps the AdamW moments of a
// contiguous slice of the parameter arena only: the gradients are reduce-scattered in the tree
// order of the sum below (each rank receives the summed gradients of its slice), each rank steps
// its slice, and the updated weights are all-gathered; with distributed.shard=gradients (ZeRO-2)
// the same, but the last micro-batch's gradients are reduce-scattered bucket by bucket while its
// backward pass runs, and each rank keeps of the summed gradient only its slice (the pages of the
// rest go back: pages on the CPU, chunks of releasable memory on a GPU). Per optimizer step the global batch, i.e.
// grad_accum micro-batches of `batch` sequences drawn from (seed, micro-batch index, row) exactly
// as on one process, is divided between the ranks without overlap (DataParallelPlan):
//   - split micro-batches, when grad_accum is a multiple of the rank count: rank r runs micro-batches
//     [r G/N, (r+1) G/N) whole. Each micro-batch then sees the same tokens, the same per-tensor
//     amax and the same stochastic-rounding seeds as on one process, so its gradient is bitwise
//     the one-process gradient;
//   - otherwise split rows, when batch is a multiple of the rank count: rank r runs rows
//     [r B/N, (r+1) B/N) of every micro-batch. Data-quantized tensors (activations, gradients)
//     then get per-rank amax and scales, as in Transformer Engine, and the wgrad sums over tokens
//     are split, so the result equals one process only up to FP32 rounding.
// Micro-batch gradients are combined along a fixed binary tree (GradientSum) and the ranks' sums
// along the continuation of that tree (Communicator::sum_gradients with a power-of-two rank count),
// so in the micro-batch split with grad_accum a power of two the weights after any number of
// steps are bitwise those of one process, in either shard mode. Weights are replicated, so their
// amax and quantized copies agree on every rank; replicas_identical() checks that with a checksum.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ops/backend.h"

namespace nibble::train {

// distributed.shard: what each rank keeps of the optimizer's state.
enum class ShardMode : uint8_t {
  none,       // every rank the whole AdamW state (replicated)
  optimizer,  // ZeRO-1: each rank the moments of its slice of the arena (optimizer_shards)
  full,       // ZeRO-3: the same slices of the moments, the gradient (as ZeRO-2) and the FP32 weights
              // (train/weight_shards.h)
  gradients,  // ZeRO-2: the same slices, and of the summed gradient only its slice (buckets reduce-
              // scattered during the backward pass, GradientBuckets below)
};
ShardMode parse_shard_mode(std::string_view s);  // UsageError naming the modes
// Whether the mode keeps only its slice of the summed gradient, reduce-scattering each bucket as the
// backward pass completes it (GradientBuckets): gradients (ZeRO-2) and full (ZeRO-3).
inline bool reduces_gradient_buckets(ShardMode m) { return m == ShardMode::gradients || m == ShardMode::full; }
std::string_view to_string(ShardMode m);
// UsageError naming the fixes when `m` does not run on `device` with `ranks` ranks: every mode runs on
// CPUs (MPI); on GPUs (NCCL) gradients and full need a power-of-two rank count. The trainer and the
// memory plan ask it.
void check_shard_mode_runs_on(ShardMode m, ops::Device device, int ranks);

// Contiguous ranges of a flat array, one per rank in rank order: rank r owns [begin(r), end(r)).
struct ShardLayout {
  std::vector<int64_t> bounds;  // ranks + 1 ascending offsets: 0, ..., the array's length
  int ranks() const { return static_cast<int>(bounds.size()) - 1; }
  int64_t begin(int r) const { return bounds[static_cast<size_t>(r)]; }
  int64_t end(int r) const { return bounds[static_cast<size_t>(r) + 1]; }
  int64_t size(int r) const { return end(r) - begin(r); }
  int64_t total() const { return bounds.back(); }
  // The same ranges in units `scale` times smaller or larger (elements -> bytes: scale = sizeof).
  ShardLayout scaled(int64_t scale) const;
  // Every rank's part of [begin, end), relative to begin (some empty): the layout of a stretch of the
  // array (a bucket of gradients, a phase's weights).
  ShardLayout within(int64_t begin, int64_t end) const;
  // f(b, e) for each non-empty part of [begin, end) outside rank r's slice: the part before the
  // slice, then the part after it (what a rank gives back of a range it held whole).
  template <class F>
  void for_each_unowned(int r, int64_t begin, int64_t end, F&& f) const {
    const int64_t before_end = std::min(end, this->begin(r)), after_begin = std::max(begin, this->end(r));
    if (before_end > begin) f(begin, before_end);
    if (end > after_begin) f(after_begin, end);
  }
};

// ZeRO-1's slices of an arena of n parameters over `ranks`: whole chunks of ops::kSumOfSquaresChunk
// elements (the gradient norm's summation unit, so that a rank's partial sums of squares are the
// one-process ones), as evenly as whole chunks allow, the last chunk cut at n. UsageError when there
// are fewer chunks than ranks (a rank would own nothing), naming both counts and the fixes.
// `mode` names the key in that message (optimizer and full slice alike).
ShardLayout optimizer_shards(int64_t n, int ranks, ShardMode mode = ShardMode::optimizer);

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string host() const = 0;  // this process's host name, for messages
  virtual std::string describe() const = 0;  // "single process" / "MPI: Open MPI v4.1.4, 2 ranks"
  // This process's position among the ranks on its host (for one GPU per rank).
  virtual int local_rank() const = 0;
  virtual int local_size() const = 0;
  // From now on sum_gradients(), reduce_scatter_gradients() and all_gather_weights() take arrays in
  // `backend`'s memory: on a GPU they run there (NCCL, in the same order as on the CPU), with no
  // copy through the host. Collective: every rank calls it. UsageError when this build cannot sum in
  // that memory.
  virtual void sum_in_memory_of(ops::Backend& backend) = 0;

  // In-place FP32 sum over all ranks, in buckets; every rank receives bitwise the same result.
  // With a power-of-two rank count the sum is the balanced binary tree over ranks (ranks 2i and
  // 2i+1 first, then pairs of pairs, ...), independent of the MPI library's algorithms; otherwise
  // the library's MPI_Allreduce order. Not overlapped with the backward pass (see the .cpp).
  virtual void sum_gradients(std::span<float> values) = 0;
  // ZeRO-1's gradient reduction: afterwards values[shards.begin(rank()), shards.end(rank())) holds
  // bitwise what sum_gradients would leave there (the same tree over ranks with a power-of-two rank
  // count: recursive halving with the partners of sum_gradients' recursive doubling, in the same
  // order; otherwise sum_gradients itself). The rest of `values` is left unspecified. In the memory
  // sum_gradients takes (sum_in_memory_of).
  virtual void reduce_scatter_gradients(std::span<float> values, const ShardLayout& shards) = 0;
  // ZeRO-1's weight update: every rank's values[shards.begin(r), shards.end(r)) (elements) reach every
  // rank (a copy: the owner's bits). In the memory sum_gradients takes.
  virtual void all_gather_weights(std::span<float> values, const ShardLayout& shards) = 0;
  // ZeRO-2's overlapped reduction, one bucket [begin, end) of `values` at a time (a stretch of the
  // arena whose gradients the backward pass has just completed), started here without waiting.
  // When a bucket is finished, its part inside this rank's shard holds bitwise what
  // reduce_scatter_gradients leaves there (the same partners in the same order, element by
  // element); the rest is unspecified. Every rank starts the same buckets in the same order;
  // `values` and `shards` stay alive until they are finished. In the memory sum_gradients takes (on
  // GPUs a power-of-two rank count: check_shard_mode_runs_on).
  virtual void start_reduce_scatter(std::span<float> values, int64_t begin, int64_t end, const ShardLayout& shards) = 0;
  // Advances every started bucket as far as the messages that arrived allow (MPI progresses them
  // only inside its calls), then waits for the oldest until at most `keep_in_flight` are unfinished
  // (0: all finished, once the bucket starting at 0 is started). Returns the buckets finished since
  // the last call ({begin, end}), in the order they were started. With a rank count that is not a
  // power of two, buckets are summed as sum_gradients' messages (MPI_Allreduce's order depends on
  // them), each once the started buckets cover it: a bucket may then wait for the next ones.
  virtual std::vector<std::pair<int64_t, int64_t>> poll_reduce_scatters(size_t keep_in_flight) = 0;
  // Every rank's bytes [shards.begin(r), shards.end(r)) of `whole` reach every rank (byte offsets;
  // a copy: no arithmetic, so the bits are the owner's). Host memory, on every device.
  virtual void all_gather_shards(std::span<std::byte> whole, const ShardLayout& shards) = 0;
  // Rank 0 receives every rank's `mine` (shards.size(r) bytes) into whole[shards.begin(r), ...);
  // `whole` is read only on rank 0 (empty elsewhere). For checkpoints: the state in one piece.
  virtual void gather_shards_to_root(std::span<const std::byte> mine, std::span<std::byte> whole,
                                     const ShardLayout& shards) = 0;
  // The reverse: rank r receives whole[shards.begin(r), shards.end(r)) of rank 0's `whole` into `mine`.
  virtual void scatter_shards_from_root(std::span<const std::byte> whole, std::span<std::byte> mine,
                                        const ShardLayout& shards) = 0;
  // In-place FP64 sum of a short vector (per-micro-batch losses), MPI_Allreduce order.
  virtual void sum(std::span<double> values) = 0;
  virtual void broadcast(std::span<std::byte> bytes, int root) = 0;
  // Every rank's value, in rank order.
  virtual std::vector<uint64_t> all_gather(uint64_t value) = 0;
  virtual void barrier() = 0;
  // Prints "nibble: error on rank R of N (HOST): message" to stderr and ends every rank of the
  // job with exit_code (MPI_Abort), so no rank is left waiting in a collective.
  [[noreturn]] virtual void abort(const std::string& message, int exit_code) = 0;

  // Where the ranks run (group_ranks_by_host below): "" on one host; otherwise a line for the
  // start-up report, a warning when the placement makes the gradient tree cross hosts early.
  const std::string& host_placement() const { return host_placement_; }

  // Wall time spent inside sum_gradients, reduce_scatter_gradients and all_gather_shards since
  // construction (communication plus waiting for the slowest rank): the step-time share that data
  // parallelism costs.
  double gradient_sum_seconds() const { return gradient_sum_seconds_; }

  template <typename T>
  void broadcast_values(std::span<T> values, int root) {
    broadcast(std::as_writable_bytes(values), root);
  }

 protected:
  double gradient_sum_seconds_ = 0;
  std::string host_placement_;
};

// One process, no MPI: the collectives are identities.
class SingleProcessCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string host() const override;
  std::string describe() const override { return "single process"; }
  int local_rank() const override { return 0; }
  int local_size() const override { return 1; }
  void sum_in_memory_of(ops::Backend&) override {}
  void sum_gradients(std::span<float>) override {}
  void reduce_scatter_gradients(std::span<float>, const ShardLayout&) override {}
  void all_gather_shards(std::span<std::byte>, const ShardLayout&) override {}
  void all_gather_weights(std::span<float>, const ShardLayout&) override {}
  void start_reduce_scatter(std::span<float>, int64_t begin, int64_t end, const ShardLayout&) override {
    finished_.emplace_back(begin, end);  // one rank: the bucket is its own sum
  }
  std::vector<std::pair<int64_t, int64_t>> poll_reduce_scatters(size_t) override { return std::exchange(finished_, {}); }
  void gather_shards_to_root(std::span<const std::byte> mine, std::span<std::byte> whole, const ShardLayout&) override;
  void scatter_shards_from_root(std::span<const std::byte> whole, std::span<std::byte> mine,
                                const ShardLayout&) override;
  void sum(std::span<double>) override {}
  void broadcast(std::span<std::byte>, int) override {}
  std::vector<uint64_t> all_gather(uint64_t value) override { return {value}; }
  void barrier() override {}
  [[noreturn]] void abort(const std::string& message, int exit_code) override;

 private:
  std::vector<std::pair<int64_t, int64_t>> finished_;
};

// ---- hosts ----------------------------------------------------------------------------------------
// The gradient tree over ranks is fixed by rank order (the bitwise promise): ranks 2i and 2i+1
// first, then pairs of pairs. When every host runs an aligned block of k consecutive ranks, k a
// power of two, its first log2(k) levels stay inside hosts and only host partial sums cross the
// slower links (the reduce-scatter sends each rank's share of its host's partial sum: one partial
// sum per host in all). Any other placement trains to the same bits but crosses hosts earlier.
struct HostPlacement {
  int hosts = 1;
  int ranks_per_host = 1;   // when host_first
  bool host_first = true;   // the tree sums within each host before across hosts
  std::string text;         // for the start-up report: the grouping, or the warning and its fix
};
// hosts: each rank's host name, in rank order.
HostPlacement group_ranks_by_host(const std::vector<std::string>& hosts);
// NIBBLE_SIMULATED_HOSTS=a,a,b,b (tests): rank r's host name is the r-th; UsageError when the
// list does not have one name per rank. Empty when unset.
std::string simulated_host_name(int rank, int ranks);

// True when this process was started by an MPI launcher (mpirun/mpiexec of Open MPI or MPICH,
// srun with PMI/PMIx), judged from the variables those launchers set.
bool launched_by_mpi();
// True when nibble was built with MPI support.
bool built_with_mpi();

// The communicator of this process: MPI over all ranks of the job when built with MPI and launched
// by an MPI launcher (MPI_Init here, MPI_Finalize when the object is destroyed), otherwise the
// single-process one. MPI can be initialised once per process: a second call throws UsageError.
// A job launched with several ranks by a nibble built without MPI is refused (each rank would
// otherwise train alone and all would write the same run directory).
std::unique_ptr<Communicator> connect_processes();

// ---- one process per GPU ------------------------------------------------------------------------
// The GPU (ordinal among those the process sees) of the local_rank-th of local_size ranks on a host
// with `gpus` visible GPUs: its own when there are enough, the only one when each rank sees one
// (CUDA_VISIBLE_DEVICES set per rank, as Slurm does). UsageError naming the host and the fix when
// the ranks outnumber the GPUs.
int gpu_of_rank(int local_rank, int local_size, int gpus, const std::string& host);
// "" when every rank has a GPU of its own, else a message naming two ranks that share one and the
// fix (fingerprints: ops::cuda_device_fingerprint() of every rank, in rank order).
std::string ranks_sharing_a_gpu(const std::vector<uint64_t>& fingerprints);
// device=cuda for this process: its GPU under mpirun (one per rank, gradients summed there by
// NCCL), the default GPU otherwise. UsageError naming the fix when no GPU, no NCCL or too few GPUs.
ops::Backend& connect_gpu(Communicator& comm);

// Who trains what in one optimizer step.
struct MicroBatchSlice {
  int64_t micro_batch = 0;  // global index within the step, 0..grad_accum-1
  int64_t first_row = 0, rows = 0;
  int64_t loss_slot = 0;    // where its loss goes in the step's loss vector (global order)
};

class DataParallelPlan {
 public:
  enum class Split : uint8_t { none, micro_batches, rows };
  // UsageError when neither grad_accum nor batch is a multiple of `ranks`, naming both fixes.
  DataParallelPlan(int64_t batch, int64_t grad_accum, int rank, int ranks);

  Split split() const { return split_; }
  int rank() const { return rank_; }
  int ranks() const { return ranks_; }
  // Rows of each micro-batch this rank runs (the recipe's tokens per micro-batch = rows * seq).
  int64_t rows_per_slice() const { return rows_; }
  // This rank's share of a step, in the order it runs them.
  const std::vector<MicroBatchSlice>& slices() const { return slices_; }
  // backward() scale that makes the sum over all ranks and slices the gradient of the mean loss
  // over the global batch: rows / (batch * grad_accum).
  float gradient_scale() const { return gradient_scale_; }
  // Length of the step's loss vector: one slot per (micro-batch, row slice) of the whole job.
  int64_t loss_slots() const { return loss_slots_; }
  // The weight of a slice's mean loss in the step loss: rows / batch (the step loss is the mean of
  // these weighted slots summed per micro-batch, over grad_accum).
  double loss_weight() const { return loss_weight_; }
  // Whether the result equals a single-process run bit for bit (see the top of this file).
  bool bitwise_equal_to_one_process() const;
  std::string describe(int64_t seq) const;  // one line for the startup report

 private:
  int64_t batch_, grad_accum_;
  int rank_, ranks_;
  Split split_ = Split::none;
  int64_t rows_ = 0, loss_slots_ = 0;
  float gradient_scale_ = 1;
  double loss_weight_ = 1;
  std::vector<MicroBatchSlice> slices_;
};

// Sums gradient vectors given one after another (leaves 0, 1, 2, ...) along a fixed binary tree:
// leaves 2i and 2i+1 first, then those pairs pairwise, and so on, like a binary counter; what is
// left when the count is not a power of two is added from the largest subtree down. For 2^k leaves
// this is the balanced tree, whose aligned subtrees are what the ranks of a micro-batch split
// compute, so one process and 2^j ranks add the same numbers in the same order. Memory: one buffer
// per tree level (log2 of the leaf count), in the memory of `ops` (the leaves and the output are
// that backend's memory too).
class GradientSum {
 public:
  explicit GradientSum(ops::TensorOps& ops) : ops_(&ops) {}
  void add(std::span<const float> leaf);
  // Writes the total into `out` and starts over. Precondition: at least one leaf.
  void finish(std::span<float> out);
  // ZeRO-2's piecewise finish: with `last` the final leaf, writes into last[begin, end) what
  // add(last) then finish(last) would leave there (the same additions element by element, so the
  // same bits), without changing the sum; start_over() once every piece is done. The last leaf is
  // thus never copied whole: each piece can be reduced across ranks as soon as the backward pass
  // completes it. Scratch: one array of the longest piece.
  void finish_piece_with_last(std::span<float> last, int64_t begin, int64_t end);
  void start_over();
  int64_t leaves() const { return leaves_; }

 private:
  ops::TensorOps* ops_;
  std::vector<ops::Array<float>> levels_;  // levels_[l]: the sum of 2^l leaves while full_[l]
  ops::Array<float> carry_, piece_carry_;
  std::vector<bool> full_;
  int64_t leaves_ = 0;
};

// A 64-bit checksum (FNV-1a over the bytes) of the weights, equal exactly when the bytes are.
uint64_t weights_checksum(std::span<const float> values);
// Gathers every rank's weights checksum; empty when all agree, else a message naming the ranks that
// differ from rank 0 (called at every logged step: a divergence would silently waste the run).
std::string check_replicas_identical(Communicator& comm, std::span<const float> values, int64_t step);

}  // namespace nibble::train
