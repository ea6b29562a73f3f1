// Below this many scalar operations a loop runs on one thread: an OpenMP fork/join costs
// microseconds (milliseconds when the cores are oversubscribed), more than the work. Results do
// not depend on the choice, because every parallel loop here writes disjoint outputs.
#pragma once
#include <cstdint>

namespace nibble::cpu {
inline constexpr int64_t kMinParallelWork = int64_t{1} << 16;
}
