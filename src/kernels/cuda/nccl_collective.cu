#include "kernels/cuda/nccl_collective.h"

#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "common/error.h"
#include "common/rank_tree.h"
#include "kernels/cuda/cuda_error.h"
#include "kernels/cuda/layers.h"

namespace nibble::cuda {

namespace {

// 64 MiB of FP32 per exchange: near link bandwidth on NVLink and PCIe, and a bounded scratch. The
// CUDA model's build makes it small, so that its small tests cross bucket edges.
#ifndef NIBBLE_NCCL_BUCKET_FLOATS
#define NIBBLE_NCCL_BUCKET_FLOATS (size_t{16} << 20)
#endif
constexpr size_t kBucketFloats = NIBBLE_NCCL_BUCKET_FLOATS;

void check(ncclResult_t status, const char* call) {
  if (status == ncclSuccess) return;
  std::string message = std::string(call) + " failed: " + ncclGetErrorString(status);
  if (const char* detail = ncclGetLastError(nullptr); detail && *detail) message += " (" + std::string(detail) + ")";
  if (status == ncclSystemError || status == ncclRemoteError)
    message += "; NCCL_DEBUG=INFO in the environment shows where the ranks failed to connect";
  throw CudaError(message);
}

}  // namespace

CollectiveId new_collective_id() {
  static_assert(sizeof(ncclUniqueId) == std::tuple_size_v<CollectiveId>);
  ncclUniqueId nccl_id;
  check(ncclGetUniqueId(&nccl_id), "ncclGetUniqueId");
  CollectiveId id;
  std::memcpy(id.data(), &nccl_id, id.size());
  return id;
}

Collective::Collective(Context& ctx, const CollectiveId& id, int rank, int size) : ctx_(ctx), rank_(rank), size_(size) {
  ncclUniqueId nccl_id;
  std::memcpy(&nccl_id, id.data(), id.size());
  NIBBLE_CUDA_CHECK(cudaSetDevice(ctx.device().ordinal));
  check(ncclCommInitRank(&comm_, size, nccl_id, rank), "ncclCommInitRank");
}

Collective::~Collective() {
  if (comm_) ncclCommDestroy(comm_);
}

void Collective::reserve_partner_bucket(size_t count) {
  if (partner_.size() < std::min(count, kBucketFloats))
    partner_ = DeviceBuffer<float>(std::min(count, kBucketFloats), ctx_.stream());
}

void Collective::sum(float* values, size_t count) {
  if (size_ == 1 || count == 0) return;
  const cudaStream_t stream = ctx_.stream();
  if (!is_power_of_two(size_)) {
    check(ncclAllReduce(values, values, count, ncclFloat32, ncclSum, comm_, stream), "ncclAllReduce");
    ctx_.synchronize();
    return;
  }
  reserve_partner_bucket(count);
  // Recursive doubling, bucket by bucket: each rank sends its whole bucket and adds the partner's;
  // both partners add the same two operands (IEEE addition commutes), so the bits agree.
  for (size_t first = 0; first < count; first += kBucketFloats) {
    const size_t n = std::min(kBucketFloats, count - first);
    for (int distance = 1; distance < size_; distance *= 2)
      exchange_and_add(values + first, n, values + first, n, rank_ ^ distance);
  }
  ctx_.synchronize();
}

void Collective::check_bounds(std::span<const int64_t> bounds, const char* call) const {
  NIBBLE_CHECK(static_cast<int>(bounds.size()) == size_ + 1 && bounds.front() == 0 &&
                   std::is_sorted(bounds.begin(), bounds.end()),
               "%s: one ascending slice per rank from offset 0", call);
}

void Collective::reduce_scatter(float* values, std::span<const int64_t> bounds) {
  check_bounds(bounds, "Collective::reduce_scatter");
  if (size_ == 1) return;
  // MPI_Allreduce's counterpart on the CPU does the same: every slice then has the all-reduce's bits.
  if (!is_power_of_two(size_)) return sum(values, static_cast<size_t>(bounds.back()));
  const auto slice = [&](int r) { return std::pair{values + bounds[r], static_cast<size_t>(bounds[r + 1] - bounds[r])}; };
  size_t longest = 0;
  for (int r = 0; r < size_; ++r) longest = std::max(longest, slice(r).second);
  reserve_partner_bucket(longest);
  for (int distance = 1; distance < size_; distance *= 2)
    for_each_halving_pair(rank_, size_, distance, [&](int kept, int given) {
      const auto [kept_values, kept_count] = slice(kept);
      const auto [given_values, given_count] = slice(given);
      exchange_and_add(kept_values, kept_count, given_values, given_count, rank_ ^ distance);
    });
  ctx_.synchronize();
}

void Collective::exchange_and_add(float* kept, size_t kept_count, const float* given, size_t given_count,
                                  int partner) {
  const cudaStream_t stream = ctx_.stream();
  for (size_t first = 0; first < std::max(kept_count, given_count); first += kBucketFloats) {
    const size_t receive = first < kept_count ? std::min(kBucketFloats, kept_count - first) : 0;
    const size_t send = first < given_count ? std::min(kBucketFloats, given_count - first) : 0;
    check(ncclGroupStart(), "ncclGroupStart");
    if (send) check(ncclSend(given + first, send, ncclFloat32, partner, comm_, stream), "ncclSend");
    if (receive) check(ncclRecv(partner_.data(), receive, ncclFloat32, partner, comm_, stream), "ncclRecv");
    check(ncclGroupEnd(), "ncclGroupEnd");
    // kept + partner's, the CPU path's operands; the stream orders the next receive after this add.
    if (receive) add(kept + first, partner_.data(), static_cast<int64_t>(receive), ctx_);
  }
}

void Collective::all_gather(float* values, std::span<const int64_t> bounds) {
  check_bounds(bounds, "Collective::all_gather");
  if (size_ == 1) return;
  // One broadcast per owner, grouped: the slices differ in length (whole chunks), which
  // ncclAllGather's equal counts cannot express.
  check(ncclGroupStart(), "ncclGroupStart");
  for (int r = 0; r < size_; ++r) {
    float* slice = values + bounds[r];
    const size_t count = static_cast<size_t>(bounds[r + 1] - bounds[r]);
    if (count) check(ncclBroadcast(slice, slice, count, ncclFloat32, r, comm_, ctx_.stream()), "ncclBroadcast");
  }
  check(ncclGroupEnd(), "ncclGroupEnd");
  ctx_.synchronize();
}

std::string Collective::describe() const {
  int version = 0;
  ncclGetVersion(&version);
  return "NCCL " + std::to_string(version / 10000) + "." + std::to_string(version / 100 % 100) + "." +
         std::to_string(version % 100) + ", " + std::to_string(size_) + " GPUs";
}

}  // namespace nibble::cuda
