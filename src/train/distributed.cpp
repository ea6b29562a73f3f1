#include "train/distributed.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/error.h"
#include "common/rank_tree.h"

namespace nibble::train {

std::unique_ptr<Communicator> make_mpi_communicator();  // distributed_mpi.cpp, when built with MPI

namespace {

// The number of ranks an MPI launcher announced, 0 when none did.
int launcher_rank_count() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS"}) {
    if (const char* v = std::getenv(name); v && *v) {
      // SLURM_NTASKS alone (an salloc shell) is no launch; only count it next to PMI/PMIx.
      if (std::strcmp(name, "SLURM_NTASKS") == 0 && !std::getenv("PMI_RANK") && !std::getenv("PMIX_RANK")) continue;
      return std::max(1, std::atoi(v));
    }
  }
  if (std::getenv("PMIX_RANK") || std::getenv("PMI_RANK")) return 1;
  return 0;
}

bool is_power_of_two(int64_t n) { return n > 0 && (n & (n - 1)) == 0; }

}  // namespace

std::string SingleProcessCommunicator::host() const {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "localhost";
  return name;
}

void SingleProcessCommunicator::abort(const std::string& message, int exit_code) {
  std::fprintf(stderr, "nibble: error: %s\n", message.c_str());
  std::fflush(stderr);
  std::exit(exit_code);
}

void SingleProcessCommunicator::gather_shards_to_root(std::span<const std::byte> mine, std::span<std::byte> whole,
                                                      const ShardLayout& shards) {
  NIBBLE_CHECK(shards.ranks() == 1 && mine.size() == whole.size(), "one process: its shard is the whole");
  if (mine.data() != whole.data()) std::copy(mine.begin(), mine.end(), whole.begin());
}

void SingleProcessCommunicator::scatter_shards_from_root(std::span<const std::byte> whole, std::span<std::byte> mine,
                                                         const ShardLayout& shards) {
  NIBBLE_CHECK(shards.ranks() == 1 && mine.size() == whole.size(), "one process: its shard is the whole");
  if (mine.data() != whole.data()) std::copy(whole.begin(), whole.end(), mine.begin());
}

ShardMode parse_shard_mode(std::string_view s) {
  if (s == "none") return ShardMode::none;
  if (s == "optimizer") return ShardMode::optimizer;
  if (s == "gradients") return ShardMode::gradients;
  if (s == "full") return ShardMode::full;
  throw UsageError("distributed.shard '" + std::string(s) + "' is unknown: use none, optimizer, gradients or full");
}

std::string_view to_string(ShardMode m) {
  switch (m) {
    case ShardMode::none: return "none";
    case ShardMode::optimizer: return "optimizer";
    case ShardMode::gradients: return "gradients";
    case ShardMode::full: return "full";
  }
  return "none";
}

void check_shard_mode_runs_on(ShardMode m, ops::Device device, int ranks) {
  if (device == ops::Device::cpu || !reduces_gradient_buckets(m) || ranks <= 1 || is_power_of_two(ranks)) return;
  // ZeRO-2's buckets are reduce-scattered while the backward pass goes on, each bitwise its part of
  // the whole arena's reduction. With a power-of-two rank count that is nibble's own tree, element by
  // element; otherwise it is ncclAllReduce's order over the whole arena, which a bucket cannot repeat.
  throw UsageError("distributed.shard=" + std::string(to_string(m)) + " with device=" + std::string(ops::to_string(device)) +
                   " needs a power-of-two number of ranks (got " + std::to_string(ranks) +
                   "): use 2, 4, 8, ... GPUs, or distributed.shard=optimizer or none with " + std::to_string(ranks));
}

ShardLayout ShardLayout::scaled(int64_t scale) const {
  ShardLayout out;
  for (int64_t b : bounds) out.bounds.push_back(b * scale);
  return out;
}

ShardLayout ShardLayout::within(int64_t begin, int64_t end) const {
  ShardLayout out;
  for (int64_t b : bounds) out.bounds.push_back(std::clamp(b, begin, end) - begin);
  return out;
}

ShardLayout optimizer_shards(int64_t n, int ranks, ShardMode mode) {
  NIBBLE_CHECK(n > 0 && ranks > 0, "optimizer_shards: a non-empty arena and at least one rank");
  const int64_t chunk = ops::kSumOfSquaresChunk, chunks = (n + chunk - 1) / chunk;
  if (chunks < ranks)
    throw UsageError("distributed.shard=" + std::string(to_string(mode)) + ": the model's " + std::to_string(n) + " parameters make " +
                     std::to_string(chunks) + " slices of " + std::to_string(chunk) +
                     " (the unit of the gradient norm's fixed-order sum), fewer than the " + std::to_string(ranks) +
                     " ranks, so a rank would own nothing: run on at most " + std::to_string(chunks) +
                     " ranks, or use distributed.shard=none");
  ShardLayout layout;
  // Rank r owns chunks [r C / R, (r + 1) C / R): sizes differ by one chunk at most.
  for (int r = 0; r <= ranks; ++r) layout.bounds.push_back(std::min(n, chunks * r / ranks * chunk));
  return layout;
}

HostPlacement group_ranks_by_host(const std::vector<std::string>& hosts) {
  HostPlacement p;
  const int ranks = static_cast<int>(hosts.size());
  std::vector<std::string> order;  // hosts in order of first rank
  for (const std::string& h : hosts)
    if (std::find(order.begin(), order.end(), h) == order.end()) order.push_back(h);
  p.hosts = static_cast<int>(order.size());
  if (p.hosts <= 1) {
    p.ranks_per_host = ranks;
    return p;
  }
  // Host-first: equal blocks of consecutive ranks, a power of two each (aligned, as they are equal).
  const int k = ranks / p.hosts;
  p.host_first = ranks % p.hosts == 0 && is_power_of_two(k) && is_power_of_two(ranks);
  for (int r = 0; p.host_first && r < ranks; ++r)
    p.host_first = hosts[static_cast<size_t>(r)] == order[static_cast<size_t>(r / k)];
  if (p.host_first) {
    p.ranks_per_host = k;
    p.text = std::to_string(p.hosts) + " hosts x " + std::to_string(k) +
             " consecutive ranks: the gradient tree sums within each host first, then across hosts";
    return p;
  }
  p.ranks_per_host = 0;
  std::string where;
  for (int r = 0; r < ranks && r < 8; ++r) where += (r ? ", " : "") + std::to_string(r) + ":" + hosts[static_cast<size_t>(r)];
  if (ranks > 8) where += ", ...";
  p.text = "warning: the ranks are not placed in equal power-of-two blocks of consecutive ranks per host (" + where +
           "), so the gradient tree (fixed by rank order, the same bits either way) adds across hosts before within "
           "them and the slow links carry more than one partial sum per host: start the same power-of-two number "
           "of ranks on every host, host by host (mpirun --map-by ppr:K:node, Slurm's block distribution)";
  return p;
}

std::string simulated_host_name(int rank, int ranks) {
  const char* list = std::getenv("NIBBLE_SIMULATED_HOSTS");
  if (!list || !*list) return {};
  std::vector<std::string> names(1);
  for (const char* c = list; *c; ++c) {
    if (*c == ',') names.emplace_back();
    else names.back() += *c;
  }
  if (static_cast<int>(names.size()) != ranks)
    throw UsageError("NIBBLE_SIMULATED_HOSTS='" + std::string(list) + "' names " + std::to_string(names.size()) +
                     " hosts for " + std::to_string(ranks) + " ranks: give one host name per rank, comma-separated");
  return names[static_cast<size_t>(rank)];
}

bool launched_by_mpi() { return launcher_rank_count() > 0; }

bool built_with_mpi() {
#ifdef NIBBLE_HAVE_MPI
  return true;
#else
  return false;
#endif
}

std::unique_ptr<Communicator> connect_processes() {
  static bool connected = false;
  if (connected) throw UsageError("connect_processes() was called twice: MPI can be initialised once per process");
  connected = true;
  if (!launched_by_mpi()) return std::make_unique<SingleProcessCommunicator>();
#ifdef NIBBLE_HAVE_MPI
  return make_mpi_communicator();
#else
  if (launcher_rank_count() > 1)
    throw UsageError("this nibble was built without MPI but was launched as one of " +
                     std::to_string(launcher_rank_count()) +
                     " ranks: install libopenmpi-dev and rebuild (cmake finds it), or run without mpirun");
  return std::make_unique<SingleProcessCommunicator>();
#endif
}

int gpu_of_rank(int local_rank, int local_size, int gpus, const std::string& host) {
  if (gpus <= 0) throw UsageError("device=cuda: host " + host + " has no usable GPU; use device=cpu there");
  if (gpus >= local_size) return local_rank;
  if (gpus == 1) return 0;  // one visible GPU per rank; ranks_sharing_a_gpu tells when it is the same one
  throw UsageError(std::to_string(local_size) + " ranks run on host " + host + ", which has " + std::to_string(gpus) +
                   " GPUs: device=cuda trains with one rank per GPU; start at most " + std::to_string(gpus) +
                   " ranks per host (e.g. mpirun -np " + std::to_string(gpus) + ")");
}

std::string ranks_sharing_a_gpu(const std::vector<uint64_t>& fingerprints) {
  for (size_t a = 0; a < fingerprints.size(); ++a)
    for (size_t b = a + 1; b < fingerprints.size(); ++b)
      if (fingerprints[a] == fingerprints[b])
        return "ranks " + std::to_string(a) + " and " + std::to_string(b) +
               " would train on the same GPU: device=cuda trains with one rank per GPU; start as many ranks per host "
               "as it has GPUs, or give each rank its own with CUDA_VISIBLE_DEVICES";
  return {};
}

ops::Backend& connect_gpu(Communicator& comm) {
  const int gpus = ops::cuda_device_count();  // 0 also without a CUDA build
  if (comm.size() == 1 || gpus == 0) return ops::cuda();  // one GPU, or cuda()'s UsageError naming the fix
  ops::select_cuda_device(gpu_of_rank(comm.local_rank(), comm.local_size(), gpus, comm.host()));
  ops::Backend& gpu = ops::cuda();
  if (const std::string shared = ranks_sharing_a_gpu(comm.all_gather(ops::cuda_device_fingerprint()));
      !shared.empty())
    throw UsageError(shared);
  comm.sum_in_memory_of(gpu);
  return gpu;
}

DataParallelPlan::DataParallelPlan(int64_t batch, int64_t grad_accum, int rank, int ranks)
    : batch_(batch), grad_accum_(grad_accum), rank_(rank), ranks_(ranks) {
  if (ranks <= 0 || rank < 0 || rank >= ranks)
    throw UsageError("rank " + std::to_string(rank) + " of " + std::to_string(ranks) + " ranks is not a valid position");
  if (ranks == 1) {
    split_ = Split::none;
  } else if (grad_accum % ranks == 0) {
    split_ = Split::micro_batches;
  } else if (batch % ranks == 0) {
    split_ = Split::rows;
  } else {
    throw UsageError("the global batch of " + std::to_string(grad_accum) + " micro-batches x " + std::to_string(batch) +
                     " sequences cannot be divided between " + std::to_string(ranks) +
                     " ranks: make grad_accum (bitwise equal to one process) or batch a multiple of " +
                     std::to_string(ranks) + ", e.g. grad_accum=" + std::to_string(grad_accum * ranks) +
                     " batch=" + std::to_string(std::max<int64_t>(1, batch / ranks)) + " keeps about the same global batch");
  }
  if (split_ == Split::rows) {
    rows_ = batch / ranks;
    loss_slots_ = grad_accum * ranks;
    loss_weight_ = 1.0 / static_cast<double>(ranks);
    for (int64_t m = 0; m < grad_accum; ++m) slices_.push_back({m, rank * rows_, rows_, m * ranks + rank});
  } else {
    // One process is the micro-batch split with one rank.
    rows_ = batch;
    loss_slots_ = grad_accum;
    const int64_t per_rank = grad_accum / ranks;
    for (int64_t m = rank * per_rank; m < (rank + 1) * per_rank; ++m) slices_.push_back({m, 0, batch, m});
  }
  gradient_scale_ = static_cast<float>(static_cast<double>(rows_) / static_cast<double>(batch * grad_accum));
}

bool DataParallelPlan::bitwise_equal_to_one_process() const {
  if (split_ == Split::none) return true;
  return split_ == Split::micro_batches && is_power_of_two(grad_accum_) && is_power_of_two(ranks_);
}

std::string DataParallelPlan::describe(int64_t seq) const {
  if (split_ == Split::none) return "1 process";
  const std::string equality = bitwise_equal_to_one_process()
                                   ? "bitwise equal to 1 process"
                                   : "equal to 1 process up to FP32 rounding of the gradient sums";
  if (split_ == Split::micro_batches)
    return std::to_string(ranks_) + " ranks, each runs " + std::to_string(grad_accum_ / ranks_) + " of the " +
           std::to_string(grad_accum_) + " micro-batches (" + std::to_string(batch_) + " x " + std::to_string(seq) +
           " tokens) per step; " + equality;
  return std::to_string(ranks_) + " ranks, each runs rows [" + std::to_string(rows_) + " r, " + std::to_string(rows_) +
         " (r+1)) of every micro-batch (" + std::to_string(rows_) + " x " + std::to_string(seq) + " tokens per rank); " +
         equality;
}

void GradientSum::add(std::span<const float> leaf) {
  // The carry travels up the levels like a binary counter's: a full level absorbs it and moves up.
  carry_.bind(*ops_);
  carry_.assign_copy(leaf.data(), leaf.size());
  size_t level = 0;
  for (;; ++level) {
    if (level == levels_.size()) {
      levels_.emplace_back(*ops_);
      full_.push_back(false);
    }
    if (!full_[level]) break;
    // Older (lower-index) subtree plus newer: IEEE addition is commutative, so the order within the
    // pair does not change the bits; only the pairing does, and that is fixed by the leaf index.
    ops_->add(carry_.data(), levels_[level].data(), static_cast<int64_t>(carry_.size()));
    full_[level] = false;
  }
  std::swap(levels_[level], carry_);
  full_[level] = true;
  ++leaves_;
}

void GradientSum::finish(std::span<float> out) {
  if (leaves_ == 0) throw std::logic_error("GradientSum::finish without any leaf");
  bool first = true;
  for (size_t level = levels_.size(); level-- > 0;) {
    if (!full_[level]) continue;
    const ops::Array<float>& part = levels_[level];
    if (first) {
      ops_->copy(part.data(), out.data(), part.bytes());
      first = false;
    } else {
      ops_->add(out.data(), part.data(), static_cast<int64_t>(out.size()));
    }
    full_[level] = false;
  }
  leaves_ = 0;
}

void GradientSum::finish_piece_with_last(std::span<float> last, int64_t begin, int64_t end) {
  NIBBLE_CHECK(begin >= 0 && begin <= end && end <= static_cast<int64_t>(last.size()), "a piece of the last leaf");
  if (begin == end) return;
  const int64_t count = end - begin;
  // add(last): the carry absorbs the full levels below the first empty one (the binary counter's
  // trailing ones) and lands there.
  size_t landing = 0;
  piece_carry_.bind(*ops_);
  piece_carry_.assign_copy(last.data() + begin, static_cast<size_t>(count));
  for (; landing < levels_.size() && full_[landing]; ++landing)
    ops_->add(piece_carry_.data(), levels_[landing].data() + begin, count);
  // finish(): the full levels from the top down, the carry in its landing level's place.
  float* out = last.data() + begin;
  bool first = true;
  for (size_t level = std::max(levels_.size(), landing + 1); level-- > 0;) {
    const float* part = nullptr;
    if (level == landing) part = piece_carry_.data();
    else if (level > landing && level < levels_.size() && full_[level]) part = levels_[level].data() + begin;
    if (!part) continue;
    if (first) ops_->copy(part, out, static_cast<size_t>(count) * sizeof(float));
    else ops_->add(out, part, count);
    first = false;
  }
}

void GradientSum::start_over() {
  std::fill(full_.begin(), full_.end(), false);
  leaves_ = 0;
}

uint64_t weights_checksum(std::span<const float> values) {
  uint64_t h = 0xCBF29CE484222325ull;
  const auto* bytes = reinterpret_cast<const unsigned char*>(values.data());
  for (size_t i = 0; i < values.size_bytes(); ++i) {
    h ^= bytes[i];
    h *= 0x100000001B3ull;
  }
  return h;
}

std::string check_replicas_identical(Communicator& comm, std::span<const float> values, int64_t step) {
  if (comm.size() == 1) return {};
  const std::vector<uint64_t> sums = comm.all_gather(weights_checksum(values));
  std::string differing;
  uint64_t first_different = 0;
  for (size_t r = 1; r < sums.size(); ++r)
    if (sums[r] != sums[0]) {
      if (differing.empty()) first_different = sums[r];
      differing += (differing.empty() ? "" : ", ") + std::to_string(r);
    }
  if (differing.empty()) return {};
  char checksums[64];
  std::snprintf(checksums, sizeof(checksums), "%016llx vs %016llx", static_cast<unsigned long long>(first_different),
                static_cast<unsigned long long>(sums[0]));
  return "after step " + std::to_string(step) + " the weights of rank(s) " + differing +
         " differ from rank 0's (checksums " + checksums +
         "): the replicas diverged, which data parallelism must never let happen; please report it";
}

}  // namespace nibble::train
