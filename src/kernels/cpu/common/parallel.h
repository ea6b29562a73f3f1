// Below this many scalar operations a loop runs on one thread: an OpenMP fork/join costs
// microseconds (milliseconds when the cores are oversubscribed), more than the work. Results do
// not depend on the choice, because every parallel loop here writes disjoint outputs.
#pragma once
#include <omp.h>

#include <algorithm>
#include <cstdint>

namespace nibble::cpu {
inline constexpr int64_t kMinParallelWork = int64_t{1} << 16;

// The chunk of a `schedule(dynamic, chunk)` loop over `iterations` independent iterations: about
// kChunksPerThread chunks a thread, a whole number of `grain` iterations each (vector widths).
// First come first served rather than a static split: when another process takes a core for a
// few milliseconds, the thread that keeps its core takes the rest of the loop instead of waiting
// at the barrier for its partner's share (a static split ran a contended step 3-5x slower than a
// quiet one, where a fair share of the cores is 2x). Which thread runs an iteration never changes
// its bits: the iterations write disjoint outputs.
inline constexpr int64_t kChunksPerThread = 8;
inline int64_t dynamic_chunk(int64_t iterations, int64_t grain = 1) {
  const int64_t chunk = iterations / (kChunksPerThread * omp_get_max_threads());
  return std::max<int64_t>(grain, (chunk + grain - 1) / grain * grain);
}
}  // namespace nibble::cpu
