#include "kernels/cuda/nccl_collective.h"

#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "kernels/cuda/cuda_error.h"
#include "kernels/cuda/layers.h"

namespace nibble::cuda {

namespace {

// 64 MiB of FP32 per exchange: near link bandwidth on NVLink and PCIe, and a bounded scratch.
constexpr size_t kBucketFloats = size_t{16} << 20;

void check(ncclResult_t status, const char* call) {
  if (status == ncclSuccess) return;
  std::string message = std::string(call) + " failed: " + ncclGetErrorString(status);
  if (const char* detail = ncclGetLastError(nullptr); detail && *detail) message += " (" + std::string(detail) + ")";
  if (status == ncclSystemError || status == ncclRemoteError)
    message += "; NCCL_DEBUG=INFO in the environment shows where the ranks failed to connect";
  throw CudaError(message);
}

bool is_power_of_two(int n) { return n > 0 && (n & (n - 1)) == 0; }

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

void Collective::sum(float* values, size_t count) {
  if (size_ == 1 || count == 0) return;
  const cudaStream_t stream = ctx_.stream();
  if (!is_power_of_two(size_)) {
    check(ncclAllReduce(values, values, count, ncclFloat32, ncclSum, comm_, stream), "ncclAllReduce");
    ctx_.synchronize();
    return;
  }
  if (partner_.size() < std::min(count, kBucketFloats))
    partner_ = DeviceBuffer<float>(std::min(count, kBucketFloats), stream);
  for (size_t first = 0; first < count; first += kBucketFloats) {
    const size_t n = std::min(kBucketFloats, count - first);
    float* bucket = values + first;
    for (int distance = 1; distance < size_; distance *= 2) {
      const int partner = rank_ ^ distance;
      check(ncclGroupStart(), "ncclGroupStart");
      check(ncclSend(bucket, n, ncclFloat32, partner, comm_, stream), "ncclSend");
      check(ncclRecv(partner_.data(), n, ncclFloat32, partner, comm_, stream), "ncclRecv");
      check(ncclGroupEnd(), "ncclGroupEnd");
      // Both partners add the same two operands (IEEE addition commutes): the same bits on both.
      add(bucket, partner_.data(), static_cast<int64_t>(n), ctx_);
    }
  }
  ctx_.synchronize();
}

std::string Collective::describe() const {
  int version = 0;
  ncclGetVersion(&version);
  return "NCCL " + std::to_string(version / 10000) + "." + std::to_string(version / 100 % 100) + "." +
         std::to_string(version % 100) + ", " + std::to_string(size_) + " GPUs";
}

}  // namespace nibble::cuda
