// The MPI Communicator (built only when CMake finds MPI).
//
// sum_gradients and reduce_scatter_gradients run after the last backward, in buckets that bound
// the scratch memory. ZeRO-2's reduce-scatter (start_reduce_scatter) is overlapped instead: the
// trainer starts a bucket when the backward pass has completed it (model::Transformer::backward's
// callback, once per block) and polls at every later block, because Open MPI without a progress
// thread advances non-blocking transfers only inside MPI calls; each poll moves every started
// bucket as far as its received messages allow (one recursive-halving level per exchange).
#include <mpi.h>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "common/rank_tree.h"
#include "train/distributed.h"

namespace nibble::train {

namespace {

// 4 MiB of FP32 per message: large enough to run at link bandwidth, small enough for the scratch.
constexpr size_t kBucketFloats = size_t{1} << 20;
// The largest count one MPI call takes (an int), in bytes for broadcasts.
constexpr size_t kMaxMessage = size_t{1} << 30;
// The tag of checkpoint gathers and scatters: the largest MPI guarantees (the gradient exchanges
// are tagged with their distance, a power of two below the rank count, ZeRO-2's below 32000).
constexpr int kShardTag = 32767;

void check(int code, const char* what) {
  // MPI_ERRORS_ARE_FATAL is set on the world communicator, so this only catches what the library
  // returns instead of aborting (it never should).
  if (code != MPI_SUCCESS) {
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(code, text, &length);
    throw std::runtime_error(fmt::format("{} failed: {}", what, std::string(text, static_cast<size_t>(length))));
  }
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      // Only the main thread calls MPI; OpenMP threads only compute.
      int provided = 0;
      check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
      owns_init_ = true;
    }
    // A failed peer (a rank that died, a broken link) ends the whole job instead of returning an
    // error some rank might not check: mpirun then names the rank and stops the others.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
    char name[MPI_MAX_PROCESSOR_NAME] = {};
    int length = 0;
    MPI_Get_processor_name(name, &length);
    host_.assign(name, static_cast<size_t>(length));
    if (std::string simulated = simulated_host_name(rank_, size_); !simulated.empty()) host_ = simulated;
    char version[MPI_MAX_LIBRARY_VERSION_STRING] = {};
    MPI_Get_library_version(version, &length);
    library_.assign(version, static_cast<size_t>(length));
    if (auto comma = library_.find(','); comma != std::string::npos) library_.resize(comma);
    while (!library_.empty() && (library_.back() == '\n' || library_.back() == ' ')) library_.pop_back();
    scratch_.resize(kBucketFloats);
    // The ranks sharing this host (shared memory), in rank order: which GPU this one takes.
    MPI_Comm host_comm = MPI_COMM_NULL;
    check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &host_comm),
          "MPI_Comm_split_type");
    MPI_Comm_rank(host_comm, &local_rank_);
    MPI_Comm_size(host_comm, &local_size_);
    MPI_Comm_free(&host_comm);
    const HostPlacement placement = group_ranks_by_host(all_host_names());
    host_placement_ = placement.text;
    hosts_ = placement.hosts;
  }

  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owns_init_ && !finalized) MPI_Finalize();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string host() const override { return host_; }
  std::string describe() const override {
    if (device_sum_) return fmt::format("MPI ({}) + {}, {} ranks", library_, device_sum_->describe(), size_);
    return fmt::format("MPI ({}), {} ranks", library_, size_);
  }
  int local_rank() const override { return local_rank_; }
  int local_size() const override { return local_size_; }

  void sum_in_memory_of(ops::Backend& backend) override {
    if (backend.device() == ops::Device::cpu) {
      device_sum_.reset();
      return;
    }
    // Rank 0 makes NCCL's id and MPI carries it; every rank joins (blocks until all have).
    ops::CollectiveId id{};
    if (rank_ == 0) id = ops::new_cuda_collective_id();
    broadcast(std::as_writable_bytes(std::span(id)), 0);
    device_sum_ = ops::connect_cuda_ranks(id, rank_, size_);
  }

  void sum_gradients(std::span<float> values) override {
    const auto start = std::chrono::steady_clock::now();
    if (device_sum_)
      device_sum_->sum(values.data(), static_cast<int64_t>(values.size()));  // NCCL, the same tree
    else
      sum_on_host(values);
    gradient_sum_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  void reduce_scatter_gradients(std::span<float> values, const ShardLayout& shards) override {
    NIBBLE_CHECK(shards.ranks() == size_ && shards.total() == static_cast<int64_t>(values.size()),
                 "reduce_scatter_gradients: one shard per rank covering the values");
    const auto start = std::chrono::steady_clock::now();
    if (device_sum_)
      device_sum_->reduce_scatter(values.data(), shards.bounds);  // NCCL, the same partners and order
    else if (is_power_of_two(size_))
      reduce_scatter_on_host(values, shards);
    else
      sum_on_host(values);  // MPI_Allreduce's order, as sum_gradients: the same bits in every slice
    gradient_sum_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  void start_reduce_scatter(std::span<float> values, int64_t begin, int64_t end, const ShardLayout& shards) override {
    NIBBLE_CHECK(shards.ranks() == size_ && shards.total() == static_cast<int64_t>(values.size()) && 0 <= begin &&
                     begin <= end && end <= shards.total(),
                 "start_reduce_scatter: one shard per rank covering the values, a bucket inside them");
    const auto start = std::chrono::steady_clock::now();
    if (device_sum_) {
      reduce_scatter_on_device(values, begin, end, shards);
      gradient_sum_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      return;
    }
    Bucket bucket;
    bucket.values = values;
    bucket.begin = begin;
    bucket.end = end;
    bucket.shards = &shards;
    bucket.serial = next_serial_++;
    in_flight_.push_back(std::move(bucket));
    if (is_power_of_two(size_)) {
      post_level(in_flight_.back());
    } else {
      // MPI_Allreduce's bits depend on the count and the place in the message, so the same
      // kBucketFloats-aligned messages as sum_on_host's, each once the buckets cover it.
      if (end == static_cast<int64_t>(values.size())) allreduced_from_ = end;  // a new reduction
      while (allreduced_from_ > 0) {
        const int64_t message = (allreduced_from_ - 1) / static_cast<int64_t>(kBucketFloats) *
                                static_cast<int64_t>(kBucketFloats);
        if (message < begin) break;
        sum_on_host(values.subspan(static_cast<size_t>(message), static_cast<size_t>(allreduced_from_ - message)));
        allreduced_from_ = message;
      }
      for (Bucket& b : in_flight_)
        if (allreduced_from_ <= b.begin) b.distance = size_;
    }
    gradient_sum_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  std::vector<std::pair<int64_t, int64_t>> poll_reduce_scatters(size_t keep_in_flight) override {
    if (device_sum_) return std::exchange(device_finished_, {});
    const auto start = std::chrono::steady_clock::now();
    for (Bucket& b : in_flight_) advance(b, false);
    // Reported in the order started: a later bucket finished first waits for the earlier ones.
    std::vector<std::pair<int64_t, int64_t>> finished;
    // (With a rank count not a power of two, a bucket waits for later ones to fill its messages.)
    const bool can_wait = is_power_of_two(size_);
    while (!in_flight_.empty() &&
           ((can_wait && in_flight_.size() > keep_in_flight) || in_flight_.front().distance >= size_)) {
      advance(in_flight_.front(), true);
      finished.emplace_back(in_flight_.front().begin, in_flight_.front().end);
      in_flight_.pop_front();
    }
    NIBBLE_CHECK(keep_in_flight > 0 || in_flight_.empty(), "poll_reduce_scatters(0) after the bucket at 0");
    gradient_sum_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return finished;
  }

  void all_gather_shards(std::span<std::byte> whole, const ShardLayout& shards) override {
    NIBBLE_CHECK(shards.ranks() == size_ && shards.total() == static_cast<int64_t>(whole.size()),
                 "all_gather_shards: one shard per rank covering the bytes");
    const auto start = std::chrono::steady_clock::now();
    for (int r = 0; r < size_; ++r)
      broadcast(whole.subspan(static_cast<size_t>(shards.begin(r)), static_cast<size_t>(shards.size(r))), r);
    gradient_sum_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  void all_gather_weights(std::span<float> values, const ShardLayout& shards) override {
    NIBBLE_CHECK(shards.ranks() == size_ && shards.total() == static_cast<int64_t>(values.size()),
                 "all_gather_weights: one shard per rank covering the values");
    if (!device_sum_) return all_gather_shards(std::as_writable_bytes(values), shards.scaled(sizeof(float)));
    const auto start = std::chrono::steady_clock::now();
    device_sum_->all_gather(values.data(), shards.bounds);
    gradient_sum_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  void gather_shards_to_root(std::span<const std::byte> mine, std::span<std::byte> whole,
                             const ShardLayout& shards) override {
    NIBBLE_CHECK(shards.ranks() == size_ && static_cast<int64_t>(mine.size()) == shards.size(rank_),
                 "gather_shards_to_root: this rank's shard");
    if (rank_ != 0) return send_bytes(mine, 0);
    NIBBLE_CHECK(static_cast<int64_t>(whole.size()) == shards.total(), "gather_shards_to_root: the whole on rank 0");
    if (mine.data() != whole.data() + shards.begin(0))  // already in place when the caller gathers into its own array
      std::copy(mine.begin(), mine.end(), whole.begin() + shards.begin(0));
    for (int r = 1; r < size_; ++r)
      receive_bytes(whole.subspan(static_cast<size_t>(shards.begin(r)), static_cast<size_t>(shards.size(r))), r);
  }

  void scatter_shards_from_root(std::span<const std::byte> whole, std::span<std::byte> mine,
                                const ShardLayout& shards) override {
    NIBBLE_CHECK(shards.ranks() == size_ && static_cast<int64_t>(mine.size()) == shards.size(rank_),
                 "scatter_shards_from_root: this rank's shard");
    if (rank_ != 0) return receive_bytes(mine, 0);
    NIBBLE_CHECK(static_cast<int64_t>(whole.size()) == shards.total(), "scatter_shards_from_root: the whole on rank 0");
    for (int r = 1; r < size_; ++r)
      send_bytes(whole.subspan(static_cast<size_t>(shards.begin(r)), static_cast<size_t>(shards.size(r))), r);
    const auto own = whole.subspan(static_cast<size_t>(shards.begin(0)), mine.size());
    if (own.data() != mine.data()) std::copy(own.begin(), own.end(), mine.begin());  // in place: already there
  }

  void sum(std::span<double> values) override {
    check(MPI_Allreduce(MPI_IN_PLACE, values.data(), static_cast<int>(values.size()), MPI_DOUBLE, MPI_SUM,
                        MPI_COMM_WORLD),
          "MPI_Allreduce of losses");
  }

  void broadcast(std::span<std::byte> bytes, int root) override {
    for (size_t first = 0; first < bytes.size(); first += kMaxMessage) {
      const size_t count = std::min(kMaxMessage, bytes.size() - first);
      check(MPI_Bcast(bytes.data() + first, static_cast<int>(count), MPI_BYTE, root, MPI_COMM_WORLD), "MPI_Bcast");
    }
  }

  std::vector<uint64_t> all_gather(uint64_t value) override {
    std::vector<uint64_t> all(static_cast<size_t>(size_));
    check(MPI_Allgather(&value, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD), "MPI_Allgather");
    return all;
  }

  void barrier() override { check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); }

  void abort(const std::string& message, int exit_code) override {
    std::fprintf(stderr, "nibble: error on rank %d of %d (%s): %s\n", rank_, size_, host_.c_str(), message.c_str());
    std::fflush(stderr);
    std::fflush(stdout);
    MPI_Abort(MPI_COMM_WORLD, exit_code);
    std::_Exit(exit_code);  // MPI_Abort does not return; this only satisfies [[noreturn]]
  }

 private:
  void sum_on_host(std::span<float> values) {
    const bool butterfly = is_power_of_two(size_);
    if (butterfly && hosts_ > 1) {
      // Across hosts recursive doubling would send every rank's whole host sum over the slow links;
      // the reduce-scatter (the same tree, element by element) sends each rank's share once, and
      // the all-gather only copies.
      ShardLayout even;
      for (int r = 0; r <= size_; ++r) even.bounds.push_back(static_cast<int64_t>(values.size()) * r / size_);
      reduce_scatter_on_host(values, even);
      const ShardLayout bytes = even.scaled(sizeof(float));
      const std::span<std::byte> whole = std::as_writable_bytes(values);
      for (int r = 0; r < size_; ++r)
        broadcast(whole.subspan(static_cast<size_t>(bytes.begin(r)), static_cast<size_t>(bytes.size(r))), r);
      return;
    }
    for (size_t first = 0; first < values.size(); first += kBucketFloats) {
      const size_t count = std::min(kBucketFloats, values.size() - first);
      float* bucket = values.data() + first;
      if (butterfly) {
        // Recursive doubling: after exchanging with rank ^ 1, ^ 2, ^ 4, ... every rank holds the
        // balanced-tree sum over ranks. Both partners add the same two operands (IEEE addition is
        // commutative), so the bits agree on every rank without trusting the library's order.
        for (int distance = 1; distance < size_; distance *= 2) {
          const int partner = rank_ ^ distance;
          check(MPI_Sendrecv(bucket, static_cast<int>(count), MPI_FLOAT, partner, distance, scratch_.data(),
                             static_cast<int>(count), MPI_FLOAT, partner, distance, MPI_COMM_WORLD, MPI_STATUS_IGNORE),
                "MPI_Sendrecv of a gradient bucket");
          for (size_t i = 0; i < count; ++i) bucket[i] = bucket[i] + scratch_[i];
        }
      } else {
        check(MPI_Allreduce(MPI_IN_PLACE, bucket, static_cast<int>(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD),
              "MPI_Allreduce of a gradient bucket");
      }
    }
  }

  // One bucket of ZeRO-2's reduce-scatter on the GPUs: NCCL's recursive halving over the bucket, each
  // rank's slice cut to it (element by element the whole arena's partners and order, so its part
  // of this rank's slice gets reduce_scatter_gradients' bits). Waited for: the GPU's one stream runs
  // the exchange between two blocks' backward kernels either way, and the trainer releases the bucket
  // next. check_shard_mode_runs_on keeps rank counts that are not a power of two off this path.
  void reduce_scatter_on_device(std::span<float> values, int64_t begin, int64_t end, const ShardLayout& shards) {
    NIBBLE_CHECK(is_power_of_two(size_), "ZeRO-2's buckets on GPUs: a power-of-two rank count");
    device_sum_->reduce_scatter(values.data() + begin, shards.within(begin, end).bounds);
    device_finished_.emplace_back(begin, end);
  }

  // Recursive halving with sum_on_host's partners in its order (common/rank_tree.h): each slice the
  // all-reduce's bits.
  void reduce_scatter_on_host(std::span<float> values, const ShardLayout& shards) {
    for (int distance = 1; distance < size_; distance *= 2) {
      const int partner = rank_ ^ distance;
      for_each_halving_pair(rank_, size_, distance, [&](int kept, int given) {
        exchange_and_add(values.subspan(static_cast<size_t>(shards.begin(kept)), static_cast<size_t>(shards.size(kept))),
                         values.subspan(static_cast<size_t>(shards.begin(given)), static_cast<size_t>(shards.size(given))),
                         partner, distance);
      });
    }
  }

  // Sends `given` to `partner` and adds what it sends back into `kept`, in buckets of kBucketFloats
  // (the two may differ in length by a chunk: a bucket past one's end is empty).
  void exchange_and_add(std::span<float> kept, std::span<const float> given, int partner, int tag) {
    const size_t longest = std::max(kept.size(), given.size());
    for (size_t first = 0; first < longest; first += kBucketFloats) {
      const size_t receive = first < kept.size() ? std::min(kBucketFloats, kept.size() - first) : 0;
      const size_t send = first < given.size() ? std::min(kBucketFloats, given.size() - first) : 0;
      check(MPI_Sendrecv(given.data() + (send ? first : 0), static_cast<int>(send), MPI_FLOAT, partner, tag,
                         scratch_.data(), static_cast<int>(receive), MPI_FLOAT, partner, tag, MPI_COMM_WORLD,
                         MPI_STATUS_IGNORE),
            "MPI_Sendrecv of a gradient shard");
      float* bucket = kept.data() + first;
      for (size_t i = 0; i < receive; ++i) bucket[i] = bucket[i] + scratch_[i];
    }
  }

  // One bucket of ZeRO-2's overlapped reduce-scatter: reduce_scatter_on_host's recursive halving on
  // values[begin, end) only (each rank's shard cut to the bucket), one level in flight at a time.
  struct Bucket {
    std::span<float> values;
    int64_t begin = 0, end = 0;
    const ShardLayout* shards = nullptr;
    int distance = 1;                    // the level in flight; size_ when finished
    int64_t serial = 0;                  // its place among the buckets started, for its tags
    std::vector<MPI_Request> requests;   // its sends and receives
    std::vector<float> received;         // what the partner sent, kept piece after kept piece
    std::vector<std::span<float>> kept;  // where each received piece is added
  };

  // Shard r of the bucket: its part of [begin, end).
  static std::span<float> piece_of(const Bucket& b, int r) {
    const int64_t first = std::max(b.begin, b.shards->begin(r)), last = std::min(b.end, b.shards->end(r));
    if (first >= last) return {};
    return b.values.subspan(static_cast<size_t>(first), static_cast<size_t>(last - first));
  }

  // Posts level b.distance: the pairs (kept, given) of reduce_scatter_on_host, in its order, so that
  // both partners post their messages in the same order (MPI matches them in order per pair and tag).
  void post_level(Bucket& b) {
    const int d = b.distance, partner = rank_ ^ d;
    // A later bucket's level may be posted before an earlier one's (its messages came first), so
    // each bucket and level has its own tag: serial mod 1000 (never that many in flight), level.
    int level = 0;
    while ((1 << level) < d) ++level;
    const int tag = static_cast<int>(b.serial % 1000) * 32 + level;
    b.kept.clear();
    std::vector<std::span<float>> given;
    size_t receive = 0;
    for_each_halving_pair(rank_, size_, d, [&](int kept, int given_to_partner) {
      b.kept.push_back(piece_of(b, kept));
      given.push_back(piece_of(b, given_to_partner));
      receive += b.kept.back().size();
    });
    b.received.resize(receive);
    b.requests.assign(2 * given.size(), MPI_REQUEST_NULL);
    size_t at = 0;
    for (size_t i = 0; i < given.size(); ++i) {
      NIBBLE_CHECK(b.kept[i].size() < kMaxMessage && given[i].size() < kMaxMessage, "a gradient bucket fits one message");
      check(MPI_Irecv(b.received.data() + at, static_cast<int>(b.kept[i].size()), MPI_FLOAT, partner, tag,
                      MPI_COMM_WORLD, &b.requests[2 * i]),
            "MPI_Irecv of a gradient bucket");
      check(MPI_Isend(given[i].data(), static_cast<int>(given[i].size()), MPI_FLOAT, partner, tag, MPI_COMM_WORLD,
                      &b.requests[2 * i + 1]),
            "MPI_Isend of a gradient bucket");
      at += b.kept[i].size();
    }
  }

  // Completes levels of `b` while their messages have arrived (all of them with `wait`): each adds
  // the partner's sums into the kept pieces (mine + partner's, as the blocking path) and posts the
  // next level.
  void advance(Bucket& b, bool wait) {
    if (!is_power_of_two(size_)) return;  // summed by start_reduce_scatter as its messages fill
    while (b.distance < size_) {
      int done = 1;
      if (wait)
        check(MPI_Waitall(static_cast<int>(b.requests.size()), b.requests.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
      else
        check(MPI_Testall(static_cast<int>(b.requests.size()), b.requests.data(), &done, MPI_STATUSES_IGNORE),
              "MPI_Testall");
      if (!done) return;
      const float* from = b.received.data();
      for (std::span<float> piece : b.kept) {
        for (size_t i = 0; i < piece.size(); ++i) piece[i] = piece[i] + from[i];
        from += piece.size();
      }
      b.distance *= 2;
      if (b.distance < size_) post_level(b);
    }
    b.received = {};  // its memory back: only the buckets in flight hold a receive buffer
    b.requests.clear();
  }

  // Every rank's host name, in rank order (names padded to MPI_MAX_PROCESSOR_NAME).
  std::vector<std::string> all_host_names() {
    std::vector<char> mine(MPI_MAX_PROCESSOR_NAME, '\0'), all(static_cast<size_t>(size_) * MPI_MAX_PROCESSOR_NAME);
    std::copy_n(host_.begin(), std::min(host_.size(), mine.size() - 1), mine.begin());
    check(MPI_Allgather(mine.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR,
                        MPI_COMM_WORLD),
          "MPI_Allgather of host names");
    std::vector<std::string> names;
    for (int r = 0; r < size_; ++r) names.emplace_back(all.data() + static_cast<size_t>(r) * MPI_MAX_PROCESSOR_NAME);
    return names;
  }

  // Point-to-point in messages of at most kMaxMessage bytes (one MPI count is an int).
  void send_bytes(std::span<const std::byte> bytes, int to) {
    for (size_t first = 0; first < bytes.size(); first += kMaxMessage) {
      const size_t count = std::min(kMaxMessage, bytes.size() - first);
      check(MPI_Send(bytes.data() + first, static_cast<int>(count), MPI_BYTE, to, kShardTag, MPI_COMM_WORLD),
            "MPI_Send of an optimizer shard");
    }
  }
  void receive_bytes(std::span<std::byte> bytes, int from) {
    for (size_t first = 0; first < bytes.size(); first += kMaxMessage) {
      const size_t count = std::min(kMaxMessage, bytes.size() - first);
      check(MPI_Recv(bytes.data() + first, static_cast<int>(count), MPI_BYTE, from, kShardTag, MPI_COMM_WORLD,
                     MPI_STATUS_IGNORE),
            "MPI_Recv of an optimizer shard");
    }
  }

  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  std::unique_ptr<ops::Collective> device_sum_;  // set by sum_in_memory_of(a GPU backend)
  std::vector<std::pair<int64_t, int64_t>> device_finished_;  // buckets reduced on the GPU, not yet polled
  bool owns_init_ = false;
  std::string host_, library_;
  std::vector<float> scratch_;
  std::deque<Bucket> in_flight_;  // ZeRO-2's started buckets, in start order
  int64_t allreduced_from_ = 0;
  int64_t next_serial_ = 0;
  int hosts_ = 1;  // distinct host names among the ranks   // without the butterfly: [this, end) of the values is summed
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator() { return std::make_unique<MpiCommunicator>(); }

}  // namespace nibble::train
