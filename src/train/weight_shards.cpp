#include "train/weight_shards.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>
#include <utility>

#include "common/error.h"
#include "format/quantize.h"
#include "recipe/linear.h"

namespace nibble::train {

WeightShards::WeightShards(Communicator& comm, ShardLayout layout, model::ParamArena& params, ops::TensorOps& ops,
                           bool quantized_gather)
    : comm_(comm),
      layout_(std::move(layout)),
      params_(params),
      ops_(ops),
      rank_(comm.rank()),
      quantized_gather_(quantized_gather) {
  NIBBLE_CHECK(layout_.ranks() == comm_.size() && layout_.total() == static_cast<int64_t>(params_.values().size()),
               "WeightShards: one slice per rank over the whole arena");
  drop_unowned();
}

void WeightShards::acquire(int64_t begin, int64_t end) {
  NIBBLE_CHECK(0 <= begin && begin <= end && end <= layout_.total(), "WeightShards::acquire: a range of the arena");
  const ShardLayout parts = layout_.within(begin, end);  // each rank's part of the range, some empty
  // In the backend's memory (NCCL on GPUs), into memory released by an earlier phase.
  params_.commit_values(begin, end);
  comm_.all_gather_weights(params_.values().subspan(static_cast<size_t>(begin), static_cast<size_t>(end - begin)), parts);
  gathered_bytes_ += (end - begin - parts.size(rank_)) * static_cast<int64_t>(sizeof(float));
  if (end > begin) held_.emplace_back(begin, end);
}

void WeightShards::release(int64_t begin, int64_t end) {
  if (auto it = std::find(held_.begin(), held_.end(), std::pair{begin, end}); it != held_.end()) held_.erase(it);
  float* values = params_.values().data();
  layout_.for_each_unowned(rank_, begin, end, [&](int64_t b, int64_t e) {
    // Out to this rank's slice, a range still held or the arena's ends: nothing there is in use, and
    // a page or chunk straddling b or e then lies inside and goes back too.
    int64_t lo = owned_end() <= b ? owned_end() : 0, hi = owned_begin() >= e ? owned_begin() : layout_.total();
    for (const auto& [hb, he] : held_) {
      if (he <= b) lo = std::max(lo, he);
      else if (hb >= e) hi = std::min(hi, hb);
      else lo = b, hi = e;  // overlaps a held range: no wider than asked
    }
    lo = std::min(lo, b);
    hi = std::max(hi, e);
    ops_.discard(values + lo, static_cast<size_t>(hi - lo) * sizeof(float));
  });
}

bool WeightShards::provides_quantized(const QuantOptions& o) const { return quantized_gather_ && tiles_from_pieces(o); }

float WeightShards::weight_amax(const model::ParamInfo& w) {
  const int64_t begin = std::max(w.offset, owned_begin()), end = std::min(w.offset + w.size(), owned_end());
  std::vector<float> parts(static_cast<size_t>(layout_.ranks()), 0.0f);
  if (end > begin) parts[static_cast<size_t>(rank_)] = ops_.max_abs(params_.value(begin), end - begin);
  ShardLayout one_each;
  for (int r = 0; r <= layout_.ranks(); ++r) one_each.bounds.push_back(r * static_cast<int64_t>(sizeof(float)));
  comm_.all_gather_shards(std::as_writable_bytes(std::span<float>(parts)), one_each);
  gathered_bytes_ += (layout_.ranks() - 1) * static_cast<int64_t>(sizeof(float));
  gathered_quantized_bytes_ += (layout_.ranks() - 1) * static_cast<int64_t>(sizeof(float));
  float amax = 0.0f;
  for (int r = 0; r < layout_.ranks(); ++r) {
    const float a = parts[static_cast<size_t>(r)];
    if (!std::isfinite(a))
      throw NumericalError("weight " + w.name + " holds a non-finite value in rank " + std::to_string(r) +
                           "'s slice (its max |x| is " + std::to_string(a) +
                           "): the training diverged; resume from an earlier checkpoint with a lower learning rate");
    amax = std::max(amax, a);
  }
  return amax;
}

ShardLayout WeightShards::band_owners(const model::ParamInfo& w) const {
  const int64_t band = 16 * w.cols, bands = (w.rows + 15) / 16;
  // Band k goes to the rank that owns its first value: rank r starts at the first band whose first
  // value is at or after begin(r).
  ShardLayout owners;
  for (int r = 0; r < layout_.ranks(); ++r)
    owners.bounds.push_back(std::clamp((layout_.begin(r) - w.offset + band - 1) / band, int64_t{0}, bands));
  owners.bounds.push_back(bands);
  return owners;
}

std::vector<std::pair<int64_t, int64_t>> WeightShards::bands_cut_by_slices(const model::ParamInfo& w) const {
  const int64_t band = 16 * w.cols, w_end = w.offset + w.size();
  std::vector<std::pair<int64_t, int64_t>> cut;
  for (int r = 1; r < layout_.ranks(); ++r) {
    const int64_t boundary = layout_.begin(r);
    if (boundary <= w.offset || boundary >= w_end || (boundary - w.offset) % band == 0) continue;
    const int64_t first = w.offset + (boundary - w.offset) / band * band;
    if (cut.empty() || cut.back().first != first) cut.emplace_back(first, std::min(first + band, w_end));
  }
  return cut;
}

void WeightShards::quantize_piece(const model::ParamInfo& w, const QuantOptions& o, int64_t version,
                                  QuantizedPiece& piece) {
  piece.version = -1;  // until it is made (a throw below leaves no stale piece for this version)
  piece.amax = weight_amax(w);
  piece.bands = band_owners(w);
  // A band cut by a slice boundary comes whole to every rank (the FP32 all-gather; its owner needs it).
  const std::vector<std::pair<int64_t, int64_t>> cut = bands_cut_by_slices(w);
  const int64_t before = gathered_bytes_;
  for (const auto& [b, e] : cut) acquire(b, e);
  gathered_quantized_bytes_ += gathered_bytes_ - before;
  const int64_t kb = piece.bands.begin(rank_), ke = piece.bands.end(rank_);
  piece.mine = QuantizedTensor{};
  if (ke > kb) {
    std::unique_ptr<ops::Quantized> q = ops_.new_quantized();
    ops_.quantize_rows_of(params_.value(w.offset + kb * 16 * w.cols), std::min(w.rows, ke * 16) - kb * 16, w.cols, o,
                          piece.amax, *q);
    piece.mine = q->to_host();
  }
  for (const auto& [b, e] : cut) release(b, e);
  piece.version = version;
  piece.options = o;
}

void WeightShards::acquire_quantized(const model::ParamInfo& w, const QuantOptions& o, int64_t version,
                                     ops::Quantized& out) {
  NIBBLE_CHECK(provides_quantized(o) && w.rows % 16 == 0,
               "WeightShards::acquire_quantized: %s [%lld, %lld] is not a weight of whole 16x16 tiles", w.name.c_str(),
               static_cast<long long>(w.rows), static_cast<long long>(w.cols));
  QuantizedPiece& piece = pieces_[w.offset];
  if (version < 0 || piece.version != version || !(piece.options == o)) quantize_piece(w, o, version, piece);
  QuantizedTensor whole;
  whole.layout() = layout_of(o, w.rows, w.cols);
  whole.codes.resize(static_cast<size_t>(whole.code_bytes()));
  whole.scales.resize(static_cast<size_t>(whole.scale_bytes()));
  // Every rank's bands in place: a band is 16 rows of codes (cols / 2 bytes each) and of scales
  // (cols / 16 bytes each: a tile's scale is repeated on its 16 rows).
  const ShardLayout code_bytes = piece.bands.scaled(8 * w.cols), scale_bytes = piece.bands.scaled(w.cols);
  std::copy(piece.mine.codes.begin(), piece.mine.codes.end(), whole.codes.begin() + code_bytes.begin(rank_));
  std::copy(piece.mine.scales.begin(), piece.mine.scales.end(), whole.scales.begin() + scale_bytes.begin(rank_));
  comm_.all_gather_shards(std::as_writable_bytes(std::span<uint8_t>(whole.codes)), code_bytes);
  comm_.all_gather_shards(std::as_writable_bytes(std::span<uint8_t>(whole.scales)), scale_bytes);
  const int64_t received = whole.code_bytes() + whole.scale_bytes() - code_bytes.size(rank_) - scale_bytes.size(rank_);
  gathered_bytes_ += received;
  gathered_quantized_bytes_ += received;
  whole.amax = piece.amax;
  whole.decode_scale = ref::nvfp4_global_scale(piece.amax, nvfp4_global_numerator(o)).decode;
  ops_.load_quantized(std::move(whole), out);
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

// Checkpoints move the state through host memory: on the CPU in place in the arena; on a GPU through
// host copies of this rank's slice and (rank 0) of the whole arena.
void WeightShards::gather_to_root() {
  const SliceBytes s = slice_bytes(params_, layout_, rank_);
  if (rank_ == 0) params_.commit_values(0, layout_.total());  // it receives the whole arena
  if (ops_.device() == ops::Device::cpu) {
    // Rank 0 receives in place (its own slice is already where it belongs); the others only send.
    comm_.gather_shards_to_root(s.mine, s.whole, s.layout);
    return;
  }
  std::vector<std::byte> mine_host(s.mine.size()), whole_host(s.whole.size());
  ops_.copy_to_host(s.mine.data(), mine_host.data(), s.mine.size());
  comm_.gather_shards_to_root(mine_host, whole_host, s.layout);
  if (rank_ == 0) ops_.copy_from_host(whole_host.data(), s.whole.data(), s.whole.size());
}

void WeightShards::scatter_from_root() {
  const SliceBytes s = slice_bytes(params_, layout_, rank_);
  if (ops_.device() == ops::Device::cpu) {
    comm_.scatter_shards_from_root(s.whole, s.mine, s.layout);
  } else {
    std::vector<std::byte> mine_host(s.mine.size()), whole_host(s.whole.size());
    if (rank_ == 0) ops_.copy_to_host(s.whole.data(), whole_host.data(), s.whole.size());
    comm_.scatter_shards_from_root(whole_host, mine_host, s.layout);
    ops_.copy_from_host(mine_host.data(), s.mine.data(), s.mine.size());
  }
  drop_unowned();
}

}  // namespace nibble::train
