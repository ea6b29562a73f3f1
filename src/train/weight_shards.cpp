#include "train/weight_shards.h"

#include <algorithm>
#include <utility>

#include "common/error.h"

namespace nibble::train {

WeightShards::WeightShards(Communicator& comm, ShardLayout layout, model::ParamArena& params, ops::TensorOps& ops)
    : comm_(comm), layout_(std::move(layout)), params_(params), ops_(ops), rank_(comm.rank()) {
  NIBBLE_CHECK(layout_.ranks() == comm_.size() && layout_.total() == static_cast<int64_t>(params_.values().size()),
               "WeightShards: one slice per rank over the whole arena");
  drop_unowned();
}

void WeightShards::acquire(int64_t begin, int64_t end) {
  NIBBLE_CHECK(0 <= begin && begin <= end && end <= layout_.total(), "WeightShards::acquire: a range of the arena");
  // Each rank's part of the range, relative to its start, in bytes: some are empty.
  ShardLayout parts;
  for (int r = 0; r <= layout_.ranks(); ++r)
    parts.bounds.push_back(std::clamp(r == layout_.ranks() ? end : layout_.begin(r), begin, end) - begin);
  comm_.all_gather_shards(std::as_writable_bytes(params_.values().subspan(static_cast<size_t>(begin),
                                                                          static_cast<size_t>(end - begin))),
                          parts.scaled(sizeof(float)));
  gathered_bytes_ += (end - begin - parts.size(rank_)) * static_cast<int64_t>(sizeof(float));
}

void WeightShards::release(int64_t begin, int64_t end) {
  float* values = params_.values().data();
  layout_.for_each_unowned(rank_, begin, end, [&](int64_t b, int64_t e) {
    ops_.discard(values + b, static_cast<size_t>(e - b) * sizeof(float));
  });
}

namespace {
// This rank's slice of the arena, in bytes, and the whole arena on rank 0 (empty elsewhere).
struct SliceBytes {
  std::span<std::byte> whole, mine;
  ShardLayout layout;
};
SliceBytes slice_bytes(model::ParamArena& params, const ShardLayout& layout, int rank) {
  SliceBytes s;
  const auto all = std::as_writable_bytes(params.values());
  s.layout = layout.scaled(sizeof(float));
  s.mine = all.subspan(static_cast<size_t>(s.layout.begin(rank)), static_cast<size_t>(s.layout.size(rank)));
  if (rank == 0) s.whole = all;
  return s;
}
}  // namespace

void WeightShards::gather_to_root() {
  // Rank 0 receives in place (its own slice is already where it belongs); the others only send.
  const SliceBytes s = slice_bytes(params_, layout_, rank_);
  comm_.gather_shards_to_root(s.mine, s.whole, s.layout);
}

void WeightShards::scatter_from_root() {
  const SliceBytes s = slice_bytes(params_, layout_, rank_);
  comm_.scatter_shards_from_root(s.whole, s.mine, s.layout);
  drop_unowned();
}

}  // namespace nibble::train
