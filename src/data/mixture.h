// A data mixture (`data.sources`): which source each training row reads, deterministically.
// Row r of micro-batch k is the global row n = k * batch + r; its source follows from (seed, n)
// alone, so any rank that draws the row draws the same window, and resuming at any step, on any
// rank or thread count, reads bitwise the rows an uninterrupted run reads. The window within the
// source comes from that source's own BatchSampler, at the same (k, r) as a one-source run.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "data/data.h"
#include "data/token_stream.h"

namespace nibble::train {

// Row -> source by a low-discrepancy (Kronecker / golden-ratio Weyl) sequence over the global row
// counter: u_n = offset + n * 2^64/phi (mod 2^64), and source s owns the arc [E_{s-1}, E_s) of the
// 2^64 circle, of length weight_s * 2^64. Why not independent random draws: after N rows a random
// source's count strays from N w_s by ~sqrt(N w_s (1 - w_s)) (hundreds of rows per million), while
// the golden-ratio sequence's strays by O(log N) for every N and every arc (its continued fraction
// has partial quotients 1: Niederreiter 1992, Random Number Generation and Quasi-Monte Carlo Methods,
// Theorem 3.3, N D*_N <= 3 + (1/ln phi + 1/ln 2) ln N; an arc of the circle, shifted by the offset,
// strays by at most twice that). Every batch's B consecutive rows are spread the same way, so even a
// single step holds each source close to its share. The offset comes from the seed only. 2^64/phi
// rounded (0x9E3779B97F4A7C15) has golden-ratio partial quotients up to ~2^31 rows, beyond any run
// measured here.
class SourceMix {
 public:
  // `weights`: positive, any scale (normalised here). One weight: every row is source 0.
  SourceMix(const std::vector<double>& weights, uint64_t seed);
  size_t sources() const { return ends_.size() + 1; }
  size_t source_of(uint64_t row) const;
  // Source s's share of the circle as stored (its normalised weight to 2^-64).
  double share(size_t s) const;
  static constexpr uint64_t kGoldenStep = 0x9E3779B97F4A7C15ull;  // 2^64 / phi

 private:
  std::vector<uint64_t> ends_;  // the arcs' ends but the last (2^64)
  uint64_t offset_;
};

// The training rows of a mixture: the source of each from SourceMix, its window from the source's
// BatchSampler (seeded alike). With one source it is that sampler, row for row.
class MixtureSampler {
 public:
  // `batch`: rows of a whole micro-batch (all ranks'), the stride of the global row counter.
  MixtureSampler(std::vector<TokenStream> sources, const std::vector<double>& weights, int64_t seq, uint64_t seed,
                 int64_t batch);
  void sample_rows(int64_t index, int64_t first_row, int64_t rows, std::vector<int32_t>& inputs,
                   std::vector<int32_t>& targets) const;
  const SourceMix& mix() const { return mix_; }
  // The global row counter of row `row` of micro-batch `index`.
  uint64_t global_row(int64_t index, int64_t row) const {
    return static_cast<uint64_t>(index) * static_cast<uint64_t>(batch_) + static_cast<uint64_t>(row);
  }

 private:
  std::vector<BatchSampler> samplers_;
  SourceMix mix_;
  int64_t seq_, batch_;
};

}  // namespace nibble::train
