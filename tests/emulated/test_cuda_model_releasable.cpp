// kernels/cuda/releasable_memory.cpp's own code under the CUDA model's virtual memory API
// (cuda_model/cuda.h: 64 KiB chunks, reserved ranges in host address space): the parameter arena's
// memory on GPUs, which ZeRO-2 and ZeRO-3 release chunk by chunk and commit again. What release
// gives back must be unreachable (a copy from it is refused: an illegal address on a GPU), what it
// keeps must keep its bytes, a commit must map exactly the missing chunks, and running out of
// memory must leave nothing mapped or allocated behind.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include <cuda.h>

#include "common/error.h"
#include "kernels/cuda/cuda_error.h"
#include "kernels/cuda/releasable_memory.h"

using namespace nibble;

namespace {

constexpr size_t kChunk = cuda_model::kVmmGranularity;

std::vector<uint8_t> pattern(size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 7 + 3);
  return v;
}

TEST(CudaModelReleasable, ReleaseGivesBackTheWholeChunksInsideAndKeepsTheEdges) {
  ASSERT_TRUE(cuda::ReleasableMemory::supported(0));
  {
    cuda::ReleasableMemory m(0, 5 * kChunk + 100);  // 6 chunks, the last one partly used
    ASSERT_EQ(m.chunk_bytes(), kChunk);
    EXPECT_EQ(m.reserved_bytes(), 6 * kChunk);
    EXPECT_EQ(m.mapped_bytes(), 6 * kChunk);
    EXPECT_EQ(cuda_model::vmm_mapped_bytes(), 6 * kChunk);
    auto* base = static_cast<uint8_t*>(m.data());
    const std::vector<uint8_t> written = pattern(6 * kChunk);
    ASSERT_EQ(cudaMemcpy(base, written.data(), written.size(), cudaMemcpyHostToDevice), cudaSuccess);  // spans chunks

    // [0.5, 4.5) chunks: chunks 1, 2 and 3 lie wholly inside; halves of 0 and 4 stay.
    const uint8_t* from = base + kChunk / 2;
    const size_t bytes = 4 * kChunk;
    const auto parts = m.partial_chunk_parts(from, bytes);
    ASSERT_EQ(parts.size(), 2u);
    EXPECT_EQ(parts[0].first, from);
    EXPECT_EQ(parts[0].second, kChunk / 2);
    EXPECT_EQ(parts[1].first, base + 4 * kChunk);
    EXPECT_EQ(parts[1].second, kChunk / 2);
    EXPECT_EQ(m.release(from, bytes), 3 * kChunk);
    EXPECT_EQ(m.mapped_bytes(), 3 * kChunk);
    EXPECT_EQ(cuda_model::vmm_mapped_bytes(), 3 * kChunk);
    EXPECT_EQ(cuda_model::vmm_created_bytes(), 3 * kChunk);  // the physical memory is freed, not only unmapped

    std::vector<uint8_t> back(kChunk);
    EXPECT_NE(cudaMemcpy(back.data(), base + 2 * kChunk, kChunk, cudaMemcpyDeviceToHost), cudaSuccess);
    (void)cudaGetLastError();
    EXPECT_NE(cudaMemcpy(back.data(), base + kChunk / 2, kChunk, cudaMemcpyDeviceToHost), cudaSuccess);  // runs into chunk 1
    (void)cudaGetLastError();
    for (size_t c : {size_t{0}, size_t{4}, size_t{5}}) {
      ASSERT_EQ(cudaMemcpy(back.data(), base + c * kChunk, kChunk, cudaMemcpyDeviceToHost), cudaSuccess) << c;
      EXPECT_EQ(0, std::memcmp(back.data(), written.data() + c * kChunk, kChunk)) << "chunk " << c;
    }
    EXPECT_EQ(m.release(from, bytes), 0u);  // released already

    // A commit of a range touching chunks 1 and 2 maps both, as one fresh range; then chunk 3.
    const auto fresh = m.commit(base + kChunk + 10, kChunk);
    ASSERT_EQ(fresh.size(), 1u);
    EXPECT_EQ(fresh[0].first, base + kChunk);
    EXPECT_EQ(fresh[0].second, 2 * kChunk);
    EXPECT_EQ(m.mapped_bytes(), 5 * kChunk);
    EXPECT_TRUE(m.commit(base + kChunk, 2 * kChunk).empty());  // mapped already
    const auto rest = m.commit(base, m.reserved_bytes());
    ASSERT_EQ(rest.size(), 1u);
    EXPECT_EQ(rest[0].first, base + 3 * kChunk);
    EXPECT_EQ(rest[0].second, kChunk);
    std::vector<uint8_t> all(6 * kChunk);
    ASSERT_EQ(cudaMemcpy(all.data(), base, all.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(0, std::memcmp(all.data(), written.data(), kChunk));  // kept chunks kept their bytes
    EXPECT_EQ(0, std::memcmp(all.data() + 4 * kChunk, written.data() + 4 * kChunk, 2 * kChunk));

    // A range without a whole chunk inside releases nothing and is all one part.
    EXPECT_EQ(m.release(base + 10, kChunk), 0u);
    const auto one = m.partial_chunk_parts(base + 10, kChunk);
    ASSERT_EQ(one.size(), 1u);
    EXPECT_EQ(one[0].second, kChunk);
    // A range of whole chunks has no partial part.
    EXPECT_TRUE(m.partial_chunk_parts(base + kChunk, 2 * kChunk).empty());
  }
  EXPECT_EQ(cuda_model::vmm_mapped_bytes(), 0u);  // the destructor unmapped, freed and unreserved all
  EXPECT_EQ(cuda_model::vmm_created_bytes(), 0u);
}

// Out of GPU memory, at construction or at a commit: a UsageError that names it and the fixes, and
// nothing left mapped or allocated by the failed call.
TEST(CudaModelReleasable, RunningOutOfMemoryIsAUsageErrorAndLeavesNothingBehind) {
  cuda_model::vmm_limit_bytes(3 * kChunk);
  try {
    cuda::ReleasableMemory too_big(0, 4 * kChunk);
    ADD_FAILURE() << "4 chunks fit under a 3-chunk limit";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("out of GPU memory"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("distributed.shard"), std::string::npos) << e.what();
  }
  EXPECT_EQ(cuda_model::vmm_created_bytes(), 0u);
  EXPECT_EQ(cuda_model::vmm_mapped_bytes(), 0u);
  {
    cuda::ReleasableMemory m(0, 3 * kChunk);
    auto* base = static_cast<uint8_t*>(m.data());
    EXPECT_EQ(m.release(base, 2 * kChunk), 2 * kChunk);
    cuda::ReleasableMemory other(0, 2 * kChunk);  // takes the released memory
    EXPECT_THROW(m.commit(base, 2 * kChunk), UsageError);
    EXPECT_EQ(m.mapped_bytes(), kChunk);
  }
  cuda_model::vmm_limit_bytes(0);
  EXPECT_EQ(cuda_model::vmm_created_bytes(), 0u);
}

}  // namespace
