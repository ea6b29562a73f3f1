// The fixed tree over ranks that every gradient sum across processes follows, on every engine (MPI
// on CPUs, train/distributed_mpi.cpp; NCCL on GPUs, kernels/cuda/nccl_collective.cu): with 2^k ranks,
// ranks 2i and 2i+1 first, then pairs of pairs, the continuation of one process's micro-batch tree
// (train::GradientSum). Recursive doubling (every rank the whole sum) and recursive halving (each
// rank the sum of its slice) both walk it level by level with the partners rank ^ 1, ^ 2, ^ 4, ...
#pragma once

namespace nibble {

inline bool is_power_of_two(int n) { return n > 0 && (n & (n - 1)) == 0; }

// Recursive halving's exchanges with the partner rank ^ distance at one level (distance 1, 2, 4, ...
// below `ranks`, a power of two). The slices still summed here are those of the ranks that agree with
// `rank` on the bits below `distance`; of each pair (kept, kept ^ distance) this rank keeps the one
// whose bit `distance` is its own, sends the other to its partner and adds what the partner sends
// into the kept one (mine + partner's, which is commutative). Each kept slice thus receives, level by
// level, the sums of the same aligned subtrees of ranks that recursive doubling adds, in the same
// order: bitwise the all-reduce's result in that slice. f(kept, given) per pair in ascending order of
// `kept`; the partner visits the mirrored pairs (its kept is this rank's given) in the same order,
// so their messages match one for one.
template <class F>
void for_each_halving_pair(int rank, int ranks, int distance, F&& f) {
  const int below = 2 * distance - 1;
  for (int kept = 0; kept < ranks; ++kept)
    if ((kept & below) == (rank & below)) f(kept, kept ^ distance);
}

}  // namespace nibble
