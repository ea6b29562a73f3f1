// The MPI Communicator (built only when CMake finds MPI).
//
// Gradient sums are not overlapped with the backward pass: the model's backward is one call over
// all layers (model/transformer.h) with no per-layer hook, and Open MPI without a progress thread
// advances non-blocking transfers only inside MPI calls, so overlap would need both a hook in the
// model and polling from it. On the CPU the reduction of a small model is a few percent of a step
// (the startup/step lines report the share as "comm"), so the sum runs after the last backward,
// in buckets that bound the scratch memory.
#include <mpi.h>

#include <fmt/format.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "common/error.h"
#include "train/distributed.h"

namespace nibble::train {

namespace {

// 4 MiB of FP32 per message: large enough to run at link bandwidth, small enough for the scratch.
constexpr size_t kBucketFloats = size_t{1} << 20;
// The largest count one MPI call takes (an int), in bytes for broadcasts.
constexpr size_t kMaxMessage = size_t{1} << 30;

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
    const bool butterfly = (size_ & (size_ - 1)) == 0;
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

  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  std::unique_ptr<ops::Collective> device_sum_;  // set by sum_in_memory_of(a GPU backend)
  bool owns_init_ = false;
  std::string host_, library_;
  std::vector<float> scratch_;
};

}  // namespace

std::unique_ptr<Communicator> make_mpi_communicator() { return std::make_unique<MpiCommunicator>(); }

}  // namespace nibble::train
