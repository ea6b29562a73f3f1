#include "run/memory_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <string>

#include "common/error.h"
#include "run/metrics.h"
#include "run/report.h"

namespace nibble::train {

namespace {

// The gradient exchange's receive bucket (distributed_mpi.cpp's kBucketFloats FP32 values); on GPUs
// NCCL's partner bucket (nccl_collective.cu: up to 16 Mi floats, no more than the arena).
constexpr int64_t kExchangeBucketBytes = int64_t{4} << 20;
constexpr int64_t kNcclBucketFloats = int64_t{16} << 20;
// On GPUs the arena is released in whole chunks of CUDA's recommended granularity (2 MiB on Hopper
// and Blackwell; kernels/cuda/releasable_memory.h): a partial chunk at each end of a range held stays.
constexpr int64_t kGpuChunkBytes = int64_t{2} << 20;

// Stored bytes of one element of a GEMM's weight operand: 0 when the GEMM reads the FP32 weights.
double weight_copy_bytes(const GemmRecipe& g) {
  switch (g.precision) {
    case GemmPrecision::fp32: return 0;
    case GemmPrecision::bf16: return 2;
    case GemmPrecision::quantized: return stored_bytes_per_element(g.b.format);
  }
  return 0;
}

// The recipe's copies of the block linears' weights, kept between steps (recipe/linear.h reuses
// them while the weights are unchanged): one for fprop, one transposed for dgrad.
int64_t quantized_weight_bytes(const model::ModelConfig& m, const Recipe& recipe) {
  const std::vector<LinearShape> shapes = model::block_linear_shapes(m);
  double bytes = 0;
  for (int64_t l = 0; l < m.layers; ++l)
    for (size_t i = 0; i < shapes.size(); ++i) {
      const LinearRecipe r = recipe.for_linear(static_cast<int>(l), static_cast<int>(i), 0.0);
      bytes += (weight_copy_bytes(r.fprop) + weight_copy_bytes(r.dgrad)) *
               static_cast<double>(shapes[i].in_features * shapes[i].out_features);
    }
  return static_cast<int64_t>(bytes);
}

// GradientSum keeps floor(log2 L) + 2 arrays of the arena's size once L leaves were added to it (its
// levels and the carry, recycled from step to step, so resident from the second step on), none for
// none. Data parallelism adds every micro-batch slice of a rank when it has several (L = slices);
// ZeRO-2 and ZeRO-3 add all but the last, whose sum is finished piece by piece (L = slices - 1).
int64_t accumulation_arrays(int64_t leaves) {
  if (leaves <= 0) return 0;
  int64_t levels = 0;
  while ((int64_t{2} << levels) <= leaves) ++levels;
  return levels + 2;
}

// distributed.shard=full with distributed.fp4_param_gather: per block, the floats of the linears whose
// weights are gathered quantized (recipe/linear.h's shared_tile_weight) and the bytes of the fprop
// and dgrad copies the linears hold of them during the block's phase (freed after it).
// `bf16_copy_bytes`: with shard=full, the BF16 weight copies quantized_weight_bytes counts for the
// BF16 layers, which the measured peaks of `full` runs do not show (the CPU's BF16 GEMM packs its
// operand panel by panel per call; the other modes' plans keep the term, within 10 % of their peaks).
struct GatheredQuantized {
  std::vector<int64_t> floats;
  std::vector<double> copy_bytes;
  double bf16_copy_bytes = 0;
};
GatheredQuantized gathered_quantized(const TrainConfig& c, const Recipe& recipe, ShardMode shard) {
  GatheredQuantized g{std::vector<int64_t>(static_cast<size_t>(c.model.layers), 0),
                      std::vector<double>(static_cast<size_t>(c.model.layers), 0.0)};
  if (shard != ShardMode::full) return g;
  const std::vector<LinearShape> shapes = model::block_linear_shapes(c.model);
  for (int64_t l = 0; l < c.model.layers; ++l)
    for (size_t i = 0; i < shapes.size(); ++i) {
      const LinearRecipe r = recipe.for_linear(static_cast<int>(l), static_cast<int>(i), 0.0);
      const int64_t floats = shapes[i].in_features * shapes[i].out_features;
      if (r.fprop.precision == GemmPrecision::bf16) g.bf16_copy_bytes += weight_copy_bytes(r.fprop) * floats;
      if (r.dgrad.precision == GemmPrecision::bf16) g.bf16_copy_bytes += weight_copy_bytes(r.dgrad) * floats;
      if (!c.fp4_param_gather || !shared_tile_weight(r, shapes[i].out_features, true)) continue;
      g.floats[static_cast<size_t>(l)] += floats;
      g.copy_bytes[static_cast<size_t>(l)] += (weight_copy_bytes(r.fprop) + weight_copy_bytes(r.dgrad)) * floats;
    }
  return g;
}

// distributed.shard=full: the most arena floats one phase of the model acquires at once (the
// embedding, a block, or the final norm with the LM head: model::Transformer's ranges), read off the
// arena's layout as the backward pass completes it (the final norm's offset, each block's first
// offset from the last block down, then 0): the embedding ends where block 0 begins. A block's
// linears gathered quantized (`quantized` floats) are not acquired in FP32.
int64_t largest_gathered_floats(const model::ModelConfig& c, const std::vector<int64_t>& quantized) {
  const std::vector<int64_t> points = model::Transformer::gradient_completion_points(c);
  const int64_t table = points[points.size() - 2], block = points.size() > 2 ? points[0] - points[1] : 0;
  const int64_t final_norm = model::arena_floats(c) - points[0] - (c.tied_embeddings ? 0 : table);
  int64_t largest_block = 0;
  for (int64_t q : quantized) largest_block = std::max(largest_block, block - q);
  return std::max({table, largest_block, final_norm + table});
}

// ZeRO-2's gradient memory over the last backward pass (Trainer::backward_reducing_buckets), in
// floats: a bucket is whole from when the backward pass writes it until its reduce-scatter
// finishes, then only its part in this rank's slice; at most kGradientBucketsInFlight + 1 are
// unfinished at once, each with a receive buffer of its largest recursive-halving level (the first:
// the pieces of every rank whose low bit is this one's). A tied LM head writes the embedding's
// gradient first, and it stays whole until the end.
struct Zero2Peak {
  int64_t gradients = 0, receive = 0, largest_bucket = 0;
};
Zero2Peak zero2_peak(const model::ModelConfig& c, const ShardLayout& shards, int rank) {
  const std::vector<int64_t> points = model::Transformer::gradient_completion_points(c);
  const auto overlap = [](int64_t a0, int64_t a1, int64_t b0, int64_t b1) {
    return std::max<int64_t>(0, std::min(a1, b1) - std::max(a0, b0));
  };
  struct Bucket {
    int64_t size, owned, receive;
  };
  std::vector<Bucket> buckets;
  for (size_t i = 0; i < points.size(); ++i) {
    const int64_t begin = points[i], end = i == 0 ? shards.total() : points[i - 1];
    Bucket b{end - begin, overlap(begin, end, shards.begin(rank), shards.end(rank)), 0};
    for (int r = 0; r < shards.ranks(); ++r)
      if (shards.ranks() > 1 && (r & 1) == (rank & 1)) b.receive += overlap(begin, end, shards.begin(r), shards.end(r));
    buckets.push_back(b);
  }
  const int64_t tied_embedding = c.tied_embeddings ? buckets.back().size : 0;
  Zero2Peak peak;
  int64_t kept = 0;  // the owned parts of the finished buckets
  const size_t window = kGradientBucketsInFlight + 1;
  for (size_t j = 0; j < buckets.size(); ++j) {
    if (j >= window) kept += buckets[j - window].owned;
    int64_t whole = 0, receive = 0;
    for (size_t i = j + 1 > window ? j + 1 - window : 0; i <= j; ++i) {
      whole += buckets[i].size;
      receive += buckets[i].receive;
    }
    const bool embedding_in_window = j + window >= buckets.size();
    peak.gradients = std::max(peak.gradients, kept + whole + (embedding_in_window ? 0 : tied_embedding));
    peak.receive = std::max(peak.receive, receive);
    peak.largest_bucket = std::max(peak.largest_bucket, buckets[j].size);
  }
  return peak;
}

}  // namespace

namespace {
// A "Key: N kB" line of /proc/self/status, bytes; 0 where /proc is missing.
int64_t status_bytes(const std::string& wanted) {
  std::ifstream in("/proc/self/status");
  for (std::string key; in >> key;) {
    int64_t kib = 0;
    if (key == wanted && in >> kib) return kib * 1024;
    in.ignore(1 << 20, '\n');
  }
  return 0;
}
}  // namespace

int64_t resident_bytes_now() { return status_bytes("VmRSS:"); }

int64_t peak_resident_bytes() { return status_bytes("VmHWM:"); }

RankMemory plan_rank_memory(const MemoryPlanInput& in, int rank) {
  const TrainConfig& c = in.train;
  check_shard_mode_runs_on(in.shard, c.device, in.ranks);
  const DataParallelPlan plan(c.batch, c.grad_accum, rank, in.ranks);
  const int64_t n = model::arena_floats(c.model), seq = c.seq > 0 ? c.seq : c.model.context;
  RankMemory m;
  const int64_t slices = static_cast<int64_t>(plan.slices().size());
  const int64_t owned = in.shard == ShardMode::none ? n : optimizer_shards(n, in.ranks, in.shard).size(rank);
  const Recipe recipe(c.recipe, static_cast<int>(c.model.layers), model::block_linear_shapes(c.model),
                      plan.rows_per_slice() * seq, ops::cpu());
  const GatheredQuantized quantized = gathered_quantized(c, recipe, in.shard);
  // full: the slice, and the phase in use gathered whole (its own part counted twice: a bound).
  m.weights = in.shard == ShardMode::full ? 4 * std::min(n, owned + largest_gathered_floats(c.model, quantized.floats))
                                          : 4 * n;
  if (in.shard == ShardMode::full && c.device == ops::Device::cuda)
    m.weights = std::min(4 * n, m.weights + 4 * kGpuChunkBytes);  // the edge chunks of the slice and of the phase
  if (in.shard == ShardMode::full) m.startup_weights = 4 * n;
  m.gradients = 4 * n;
  m.accumulation = slices > 1 ? 4 * n * accumulation_arrays(slices) : 0;
  if (in.ranks > 1) m.buffers = c.device == ops::Device::cuda ? 4 * std::min(n, kNcclBucketFloats) : kExchangeBucketBytes;
  if (reduces_gradient_buckets(in.shard)) {
    // With several micro-batches a rank writes whole gradients before the last one (the tree sum
    // of its micro-batches needs them) and finishes the sum piecewise (one bucket of scratch).
    const Zero2Peak z = zero2_peak(c.model, optimizer_shards(n, in.ranks, in.shard), rank);
    if (slices == 1) m.gradients = 4 * z.gradients;
    else m.accumulation = 4 * n * accumulation_arrays(slices - 1) + 4 * z.largest_bucket;
    if (c.device == ops::Device::cuda) {
      // The slice's two edge chunks and two per bucket in flight; NCCL receives into its own bucket.
      const int64_t edges = 2 * (1 + static_cast<int64_t>(kGradientBucketsInFlight) + 1) * kGpuChunkBytes;
      if (slices == 1) m.gradients = std::min(4 * n, m.gradients + edges);
    } else {
      m.buffers += 4 * z.receive;
    }
  }
  m.optimizer = 9 * owned;  // m and v in FP32, one decay flag byte
  // Training saves the activations of rows_per_slice rows; evaluation runs whole batches of `batch`.
  // The linears' weight copies: every block's between steps, but those gathered quantized only for
  // the block in use, and this rank's bands of them (about its share) kept for the step.
  double gathered_all = 0, gathered_one_block = 0, gathered_floats = 0;
  for (size_t l = 0; l < quantized.floats.size(); ++l) {
    gathered_all += quantized.copy_bytes[l];
    gathered_one_block = std::max(gathered_one_block, quantized.copy_bytes[l]);
    gathered_floats += static_cast<double>(quantized.floats[l]);
  }
  const double own_bands = gathered_floats * stored_bytes_per_element(Format::nvfp4) / in.ranks;
  // On a GPU the tiled BF16 attention's backward reads the forward's output, which training keeps per
  // layer (LayerOps::attention_backward_takes_output: tiled_on_gpu, for GPUs of sm_80 and newer).
  const int64_t hd = c.model.head_dim();
  AttentionShape attention;
  attention.head_dim = hd;
  attention.bf16_matmuls = recipe.attention_bf16();
  const int64_t kept_attention_out =
      c.device == ops::Device::cuda && tiled_on_gpu(attention, 8)
          ? 4 * plan.rows_per_slice() * seq * c.model.heads * hd * c.model.layers
          : 0;
  m.activations = estimate_memory(c.model, &recipe, c.batch, seq).activations_recipe +
                  quantized_weight_bytes(c.model, recipe) -
                  static_cast<int64_t>(gathered_all - gathered_one_block - own_bands + quantized.bf16_copy_bytes) +
                  kept_attention_out;
  m.process = in.process_bytes;
  // Rank 0 writes the whole state (run/checkpoint.cpp): the weights' host copy and its file image
  // (8 bytes a parameter), then the gathered moments (8), their tensors (8) and file image (8).
  // full: rank 0 first gathers the whole weights into its arena.
  if (rank == 0) m.checkpoint = 24 * n + (in.shard == ShardMode::full ? 4 * n - m.weights : 0);
  m.on_gpu = c.device == ops::Device::cuda;
  if (m.on_gpu && rank == 0 && in.shard == ShardMode::full) m.checkpoint_on_gpu = 4 * n - m.weights;
  return m;
}

std::string describe_rank_memory(const RankMemory& m) {
  const auto b = [](int64_t bytes) { return bytes_text(static_cast<double>(bytes)); };
  std::string text = fmt::format("weights {}, gradients {}, micro-batch sums {}, AdamW {}, activations {}, "
                                 "buffers {}, program {}: {}",
                                 b(m.weights), b(m.gradients), b(m.accumulation), b(m.optimizer), b(m.activations),
                                 b(m.buffers), b(m.process), b(m.training()));
  if (m.startup_weights > 0)
    text += fmt::format("; at start-up the whole weights ({}) and the gradients: {}", b(m.startup_weights),
                        b(m.startup()));
  if (m.checkpoint > 0) text += fmt::format("; writing a checkpoint +{} = {}", b(m.checkpoint), b(m.peak()));
  if (m.on_gpu) text += fmt::format("; of it on the GPU at most {}", b(m.gpu_peak()));
  return text;
}

std::string memory_plan_report(const MemoryPlanInput& in, int64_t device_memory) {
  const auto b = [](int64_t bytes) { return bytes_text(static_cast<double>(bytes)); };
  std::string out = fmt::format("{} ranks, batch {} x grad_accum {}: memory per rank\n", in.ranks, in.train.batch,
                                in.train.grad_accum);
  std::vector<std::string> fitting;
  for (ShardMode mode : {ShardMode::none, ShardMode::optimizer, ShardMode::gradients, ShardMode::full}) {
    MemoryPlanInput each = in;
    each.shard = mode;
    std::string refused;
    RankMemory largest, root;
    int64_t gpu_need = 0;  // device=cuda: the largest rank's GPU memory
    try {
      for (int r = 0; r < in.ranks; ++r) {
        const RankMemory m = plan_rank_memory(each, r);
        if (r == 0) root = m;
        if (m.resident() > largest.resident()) largest = m;
        gpu_need = std::max(gpu_need, m.gpu_peak());
      }
    } catch (const UsageError& e) {
      refused = e.what();
    }
    out += fmt::format("shard={}\n", to_string(mode));
    if (!refused.empty()) {
      out += "  not possible: " + refused + "\n";
      continue;
    }
    out += "  largest rank: " + describe_rank_memory(largest) + "\n";
    if (device_memory > 0) {
      // On GPUs the device's memory holds the training state; the host keeps the program and the
      // checkpoint's copies.
      const bool gpu = root.on_gpu;
      const int64_t need = gpu ? gpu_need : std::max(largest.resident(), root.peak());
      const bool fits = need <= device_memory;
      out += fmt::format("  {} in {}: needs {} ({})\n", fits ? "fits" : "does not fit", b(device_memory), b(need),
                         gpu ? "the GPU memory of the largest rank; the program and checkpoint copies stay on the host"
                             : "rank 0 while checkpointing");
      if (fits) fitting.push_back(std::string(to_string(mode)));
    }
  }
  if (device_memory > 0) {
    std::string names;
    for (const auto& f : fitting) names += (names.empty() ? "" : ", ") + f;
    out += fmt::format("modes that fit in {}: {}\n", b(device_memory), names.empty() ? "no mode" : names);
  }
  return out;
}

int64_t parse_memory_size(const std::string& text) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit = text.substr(used);
  for (char& ch : unit) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  double scale = 0;
  if (unit.empty() || unit == "B") scale = 1;
  else if (unit == "K" || unit == "KB") scale = 1e3;
  else if (unit == "M" || unit == "MB") scale = 1e6;
  else if (unit == "G" || unit == "GB") scale = 1e9;
  else if (unit == "T" || unit == "TB") scale = 1e12;
  else if (unit == "KIB") scale = 1024.0;
  else if (unit == "MIB") scale = 1024.0 * 1024;
  else if (unit == "GIB") scale = 1024.0 * 1024 * 1024;
  else if (unit == "TIB") scale = 1024.0 * 1024 * 1024 * 1024;
  if (used == 0 || scale == 0 || !(value > 0) || !std::isfinite(value * scale) || value * scale > 9e18)
    throw UsageError("--device-memory '" + text +
                     "' is not a size: give a positive number with B, KB, MB, GB, TB (powers of 1000) or KiB, MiB, "
                     "GiB, TiB (powers of 1024), e.g. 141GB or 80GiB");
  return static_cast<int64_t>(value * scale);
}

}  // namespace nibble::train
