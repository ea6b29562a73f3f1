// Quantized GEMM driver: validation, ISA dispatch, packing, cache blocking and threading.
//
// Blocking: both operands are packed once per call into panels over the whole K (gemm_kernels.h:
// 8 rows of A x 32 columns of B for the vector kernels, 16 x 16 for AMX-INT8, 32 x 32 for AMX-BF16,
// which also serves gemm_bf16 on FP32 operands); B up front, A up front too or, with many rows,
// a macro-tile row at a time by the thread that computes that row (run_plan). C is cut into macro
// tiles of kTileRows x kTileCols; each tile is owned by one thread (OpenMP dynamic schedule) and
// walks K in chunks so that a B chunk (10-20 KB) stays in L1 while the tile's A chunks stream from
// L2. The partial sums live in a per-thread FP32 scratch tile between chunks. Every output element
// is therefore summed by one thread, in K order, whatever the thread count: results are bitwise
// reproducible.
#include <omp.h>
#include <xmmintrin.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "format/gemm_rules.h"
#include "kernels/cpu/common/cpu_features.h"
#include "kernels/cpu/common/parallel.h"
#include "kernels/cpu/common/simd_clones.h"
#include "kernels/cpu/common/workspace.h"
#include "kernels/cpu/gemm/gemm.h"
#include "kernels/cpu/gemm/gemm_kernels.h"

namespace nibble::cpu {
namespace gemm_detail {
namespace {

constexpr int64_t kTileRows = 96;   // rows of A per macro tile (a multiple of every panel height)
constexpr int64_t kTileCols = 256;  // columns of B per macro tile
static_assert(kTileCols == kBf16AccStride);
constexpr int64_t kChunkK = 512;        // K per chunk (int8 family: 20-24 KB of packed B per panel)
constexpr int64_t kChunkKF32 = 128;     // K per chunk (f32 family: 16 KB of packed B per panel)
// K per chunk (AMX-BF16): up to 2048, every K of a model 512 wide (and all but GPT-2's 3072) in one
// micro-kernel call, so the four accumulator tiles stay in the tile unit instead of a store and a
// reload per 256 k; the panels then outgrow L1 (64 KB each at 2048), which costs the tile loads
// less than those round trips did.
constexpr int64_t kChunkKBf16 = 2048;
constexpr int64_t kChunkKPairs = 256;   // K per chunk (BF16 pairs: 16 KB of packed B per panel)
constexpr int64_t kParallelMinMacs = int64_t{1} << 19;  // below this a GEMM runs on the calling thread

bool is_nvfp4_block(BlockShape b) { return b == BlockShape::row_1x16 || b == BlockShape::tile_16x16; }

std::string describe(const QuantizedTensor& q) {
  return std::string(to_string(q.format)) + " " + std::string(to_string(q.block)) + " [" + std::to_string(q.rows) +
         ", " + std::to_string(q.cols) + "]";
}

void check_storage(const QuantizedTensor& q, const char* name) {
  if (q.rows < 0 || q.cols < 0) throw UsageError(std::string("gemm: operand ") + name + " has a negative shape");
  const int64_t block_len = q.block_len();
  if (block_len > 0 && q.cols % block_len != 0)
    throw UsageError(std::string("gemm: operand ") + name + " (" + describe(q) + "): K must be a multiple of the block length " +
                     std::to_string(block_len));
  if (q.is_4bit() && q.cols % 2 != 0)
    throw UsageError(std::string("gemm: operand ") + name + ": 4-bit operands need an even K");
  if (static_cast<int64_t>(q.codes.size()) != q.rows * q.row_bytes())
    throw UsageError(std::string("gemm: operand ") + name + " (" + describe(q) + ") holds " + std::to_string(q.codes.size()) +
                     " code bytes, expected " + std::to_string(q.rows * q.row_bytes()));
  if (q.row_scaled && (q.format != Format::nvfp4 || static_cast<int64_t>(q.row_decode_scale.size()) != q.rows))
    throw UsageError(std::string("gemm: operand ") + name + " (" + describe(q) + ") is row-scaled but holds " +
                     std::to_string(q.row_decode_scale.size()) + " row decode scales for " + std::to_string(q.rows) +
                     " rows (row scaling is an nvfp4 layout)");
  const int64_t want_scales = q.block == BlockShape::per_tensor || block_len == 0 ? 0 : q.rows * (q.cols / block_len);
  if (static_cast<int64_t>(q.scales.size()) != want_scales)
    throw UsageError(std::string("gemm: operand ") + name + " (" + describe(q) + ") holds " + std::to_string(q.scales.size()) +
                     " scales, expected " + std::to_string(want_scales));
}

}  // namespace

Family validate_operands(const QuantizedTensor& a, const QuantizedTensor& b, const void* c, int64_t ldc) {
  if (a.cols != b.cols)
    throw UsageError("gemm: A is " + describe(a) + " and B is " + describe(b) +
                     "; both must be K-contiguous with the same K (C = A . B^T)");
  Family family;
  if (a.format == Format::nvfp4 && b.format == Format::nvfp4) {
    if (!is_nvfp4_block(a.block) || !is_nvfp4_block(b.block))
      throw UsageError("gemm: NVFP4 operands need 1x16 or 16x16 blocks, got " + describe(a) + " x " + describe(b));
    family = Family::int8_blocks;
  } else if (a.format == Format::mxfp4 && b.format == Format::mxfp4) {
    family = Family::int8_blocks;
  } else if (a.format == Format::mxfp8 && b.format == Format::mxfp8) {
    family = Family::f32;
  } else if (is_per_tensor_fp8(a.format) && is_per_tensor_fp8(b.format)) {
    if (a.block != BlockShape::per_tensor || b.block != BlockShape::per_tensor)
      throw UsageError("gemm: FP8 operands must be per-tensor scaled, got " + describe(a) + " x " + describe(b));
    family = Family::f32;
  } else {
    throw UsageError("gemm: unsupported format pair " + describe(a) + " x " + describe(b) +
                     "; supported: nvfp4 x nvfp4, mxfp4 x mxfp4, mxfp8 x mxfp8, fp8 x fp8 (e4m3/e5m2)");
  }
  if (is_mx(a.format) &&
      (a.block != BlockShape::row_1x32 || b.block != BlockShape::row_1x32))
    throw UsageError("gemm: MX operands need 1x32 blocks, got " + describe(a) + " x " + describe(b));
  check_rht_pair(a.rht, b.rht);
  check_storage(a, "A");
  check_storage(b, "B");
  if (ldc < b.rows) throw UsageError("gemm: ldc " + std::to_string(ldc) + " is smaller than N " + std::to_string(b.rows));
  if (c == nullptr && a.rows > 0 && b.rows > 0) throw UsageError("gemm: C is null");
  return family;
}

namespace {

// The factor applied once at the end to output (m, n): (alpha * S_decA) * S_decB, times 1/4 for the
// doubled E2M1 codes of the int8 kernels (the BF16 panels hold the E2M1 values themselves). A
// row-scaled operand (QuantizedTensor::row_scaled) has one S_dec per row: A's per output row m,
// B's per output column n; per tensor the factor is the same FP32 product as ever.
struct OutputScale {
  float a = 1.0f, b = 1.0f;          // alpha * S_decA, S_decB (per tensor)
  const float* a_rows = nullptr;     // [M] alpha * S_decA[m], or null
  const float* b_rows = nullptr;     // [N] S_decB[n], or null
  bool quarter = false;
  static OutputScale uniform(float alpha) { return {alpha, 1.0f, nullptr, nullptr, false}; }
  float of_row(int64_t m) const { return a_rows ? a_rows[m] : a; }
  // The factor of a whole output row when B has one S_dec.
  float of_row_uniform(int64_t m) const {
    const float s = of_row(m) * b;
    return quarter ? s * 0.25f : s;
  }
};

// storage keeps the per-row factors that the returned OutputScale points into.
OutputScale output_scale(const QuantizedTensor& a, const QuantizedTensor& b, float alpha, bool doubled_codes,
                         std::vector<float>& storage) {
  OutputScale s{alpha * a.decode_scale, b.decode_scale, nullptr, nullptr, doubled_codes};
  storage.clear();
  if (a.row_scaled) {
    for (int64_t m = 0; m < a.rows; ++m) storage.push_back(alpha * a.decode_scale_of_row(m));
  }
  const size_t b_first = storage.size();
  if (b.row_scaled) storage.insert(storage.end(), b.row_decode_scale.begin(), b.row_decode_scale.end());
  if (a.row_scaled) s.a_rows = storage.data();
  if (b.row_scaled) s.b_rows = storage.data() + b_first;
  return s;
}

using PackQuantized = void (*)(const QuantizedTensor&, int64_t, uint8_t*);
using PackF32 = void (*)(const F32Operand&, int64_t, uint8_t*);

struct Plan {
  int64_t mr, nr;        // rows of A / columns of B per packed panel (= the micro-tile)
  int64_t unit_k;        // K elements per packing unit (block length, or 1 for f32)
  int64_t a_unit_bytes;  // packed bytes per unit per panel
  int64_t b_unit_bytes;
  int64_t chunk_units;
  PackQuantized pack_a, pack_b;  // null for FP32 operands (gemm_bf16_packed packs them itself)
  MicroKernel micro;
  // AMX: each thread configures its tile state first and releases it after.
  enum class Tiles { none, int8, bf16 } tiles;
};

// An E2M1 value (magnitudes 0.5..6) times an E8M0 scale 2^(e-127) is a normal BF16 number, hence
// exact and not flushed by the tile unit, when 2 <= e <= 252: then MXFP4 can take the BF16 tiles.
bool mx_scales_fit_bf16(const QuantizedTensor& q) {
  for (uint8_t e : q.scales)
    if (e < 2 || e > 252) return false;
  return true;
}

// A 16x16-tiled operand has one scale per 16 rows of every block, i.e. per AMX panel.
bool tile_uniform(const QuantizedTensor& q) { return q.block == BlockShape::tile_16x16; }

// The AMX-BF16 plan; pack_a/pack_b stay null for FP32 operands (gemm_bf16_packed packs them itself).
Plan bf16_plan(PackQuantized pack_a = nullptr, PackQuantized pack_b = nullptr) {
  return {kBf16Panel, kBf16Panel, kBf16UnitK, kBf16UnitBytes, kBf16UnitBytes, kChunkKBf16 / kBf16UnitK,
          pack_a, pack_b, bf16_micro_kernel_amx(), Plan::Tiles::bf16};
}

// The f32-family plan (one FMA per element product, k in order); pack_a/pack_b stay null for FP32
// operands of gemm_bf16 (gemm_bf16_packed packs them itself, rounded to BF16).
Plan f32_plan(Isa isa, PackQuantized pack_a = nullptr, PackQuantized pack_b = nullptr) {
  MicroKernel micro = isa >= Isa::avx512 ? f32_micro_kernel_avx512()
                      : isa == Isa::avx2 ? f32_micro_kernel_avx2()
                                         : f32_micro_kernel_scalar();
  return {kMr, kNr, 1, f32_a_k_bytes(), f32_b_k_bytes(), kChunkKF32, pack_a, pack_b, micro, Plan::Tiles::none};
}

// The BF16-pair plan (AVX512-BF16 vdpbf16ps); pack_a/pack_b stay null for FP32 operands.
Plan bf16_pair_plan(PackQuantized pack_a = nullptr, PackQuantized pack_b = nullptr) {
  return {kMr, kNr, kBf16PairUnitK, bf16_pair_a_unit_bytes(), bf16_pair_b_unit_bytes(), kChunkKPairs / kBf16PairUnitK,
          pack_a, pack_b, bf16_pair_micro_kernel_avx512bf16(), Plan::Tiles::none};
}

// The same pairs widened to FP32 for the FMA kernel of `isa` (gemm_kernels.h): vdpbf16ps's bits.
Plan widened_pair_plan(Isa isa, PackQuantized pack_a = nullptr, PackQuantized pack_b = nullptr) {
  MicroKernel micro = isa >= Isa::avx512 ? &widened_pairs<&f32_micro_kernel_avx512>
                      : isa == Isa::avx2 ? &widened_pairs<&f32_micro_kernel_avx2>
                                         : &widened_pairs<&f32_micro_kernel_scalar>;
  return {kMr, kNr, kBf16PairUnitK, 2 * f32_a_k_bytes(), 2 * f32_b_k_bytes(), kChunkKF32 / kBf16PairUnitK,
          pack_a, pack_b, micro, Plan::Tiles::none};
}

// Which kernel Summation::fp32_products gets for a format on this CPU (after NIBBLE_ISA).
enum class Fp32ProductsKernel { none, amx_tiles, bf16_pairs };
Fp32ProductsKernel fp32_products_kernel(Format f) {
  if (amx_bf16_active()) return Fp32ProductsKernel::amx_tiles;
  if (active_isa() >= Isa::avx512bf16 && is_per_tensor_fp8(f)) return Fp32ProductsKernel::bf16_pairs;
  return Fp32ProductsKernel::none;
}

Plan make_plan(Family family, const QuantizedTensor& a, const QuantizedTensor& b, Isa isa, bool bf16_tiles) {
  const int64_t block_len = a.block_len();
  if (bf16_tiles)
    return family == Family::f32 ? bf16_plan(&pack_bf16_fp8_a_panel, &pack_bf16_fp8_b_panel)
                                 : bf16_plan(&pack_bf16_a_panel, &pack_bf16_b_panel);
  if (family == Family::int8_blocks && isa == Isa::amx) {
    // (Not C^T = B . A^T when only B is 16x16-tiled, to put the uniform scale on the tile's rows:
    // on the recipe's forward shapes the transposed write-back costs more than the broadcast loads
    // it saves.)
    return {kAmxTile, kAmxTile, block_len, amx_block_bytes(block_len), amx_block_bytes(block_len), kChunkK / block_len,
            &pack_amx_a_panel, &pack_amx_b_panel, int8_micro_kernel_amx(block_len, tile_uniform(a), tile_uniform(b)),
            Plan::Tiles::int8};
  }
  if (family == Family::int8_blocks && isa == Isa::avx2)  // A biased, B signed (gemm_kernels.h)
    return {kMr, kNr, block_len, int8_biased_block_bytes(block_len, kMr), int8_signed_block_bytes(block_len, kNr),
            kChunkK / block_len, &pack_int8_biased_a_panel_simd, &pack_int8_signed_b_panel_simd,
            int8_micro_kernel_avx2(block_len, tile_uniform(b)), Plan::Tiles::none};
  if (family == Family::int8_blocks) {  // A signed, B biased: the AVX-512 kernel, else the scalar one
    const bool avx512 = isa >= Isa::avx512;
    // NVFP4's 16-blocks have AVX-512 packers of their own (four blocks a step).
    PackQuantized pack_a = &pack_int8_a_panel, pack_b = &pack_int8_b_panel;
    if (avx512 && block_len == 16) {
      pack_a = &pack_int8_a_panel_avx512;
      pack_b = &pack_int8_b_panel_avx512;
    } else if (avx512) {
      pack_a = &pack_int8_a_panel_simd;
      pack_b = &pack_int8_b_panel_simd;
    }
    return {kMr, kNr, block_len, int8_a_block_bytes(block_len), int8_b_block_bytes(block_len), kChunkK / block_len,
            pack_a, pack_b,
            avx512 ? int8_micro_kernel_avx512(block_len, tile_uniform(b)) : int8_micro_kernel_scalar(block_len),
            Plan::Tiles::none};
  }
  return f32_plan(isa, &pack_f32_a_panel, &pack_f32_b_panel);
}

// out = ((row * col[j]) [* 1/4]) * in (+ out): the epilogue of a row-scaled B (one factor per column).
NIBBLE_SIMD_CLONES void write_scaled_columns(const float* __restrict in, int64_t cols, float row, const float* __restrict col,
                                             bool quarter, bool accumulate, float* __restrict out) {
  const float q = quarter ? 0.25f : 1.0f;  // exact: a power of two (x * 1 leaves x unchanged)
  if (accumulate) {
#pragma omp simd
    for (int64_t j = 0; j < cols; ++j) out[j] = ((row * col[j]) * q) * in[j] + out[j];
  } else {
#pragma omp simd
    for (int64_t j = 0; j < cols; ++j) out[j] = ((row * col[j]) * q) * in[j];
  }
}

// out = scale * in (+ out) over a row of C whose values lie in pieces of `piece` floats, `stride`
// apart (one row of each micro-tile of a macro-tile row; one piece when they are contiguous). Cloned
// per ISA (chosen by the loader from cpuid) because it runs over every output of every GEMM, and the
// baseline x86-64 build runs it scalar; a whole macro-tile row per call, as a call per 32 floats
// through the clone dispatch weighed on every GEMM's write-back. `stream` (or null): overwrite with
// that kernel's non-temporal stores.
NIBBLE_SIMD_CLONES void write_scaled_pieces(const float* __restrict in, int64_t stride, int64_t piece, int64_t cols,
                                            float scale, bool accumulate, StreamScaled stream, float* __restrict out) {
  for (int64_t j0 = 0; j0 < cols; j0 += piece, in += stride, out += piece) {
    const int64_t n = std::min(piece, cols - j0);
    if (stream) {
      stream(in, n, scale, out);
    } else if (accumulate) {
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) out[j] = scale * in[j] + out[j];
    } else {
#pragma omp simd
      for (int64_t j = 0; j < n; ++j) out[j] = scale * in[j];
    }
  }
}

// One row of a macro tile into C: columns [n0, n0 + cols) of output row m.
// (stream: non-temporal stores where the scale is uniform; a row-scaled B's columns stay cached.)
void write_row(const float* in, int64_t m, int64_t n0, int64_t cols, const OutputScale& s, bool accumulate,
               StreamScaled stream, float* c_row) {
  if (s.b_rows) return write_scaled_columns(in, cols, s.of_row(m), s.b_rows + n0, s.quarter, accumulate, c_row);
  write_scaled_pieces(in, cols, cols, cols, s.of_row_uniform(m), accumulate, stream, c_row);
}

// Output row m, columns [n0, n0 + cols), from micro-tile rows of `piece` floats `stride` apart.
void write_row_pieces(const float* in, int64_t stride, int64_t piece, int64_t m, int64_t n0, int64_t cols,
                      const OutputScale& s, bool accumulate, StreamScaled stream, float* c_row) {
  if (!s.b_rows) return write_scaled_pieces(in, stride, piece, cols, s.of_row_uniform(m), accumulate, stream, c_row);
  for (int64_t j0 = 0; j0 < cols; j0 += piece, in += stride)
    write_row(in, m, n0 + j0, std::min(piece, cols - j0), s, accumulate, stream, c_row + j0);
}

// Non-temporal write-back by whole vectors of the ISA (c_stores() is cached below AVX2).
StreamScaled stream_scaled_kernel(Isa isa) { return isa >= Isa::avx512 ? &stream_scaled_avx512 : &stream_scaled_avx2; }

void write_zero_product(int64_t M, int64_t N, float* c, int64_t ldc, bool accumulate) {
  if (accumulate) return;  // alpha * 0 + C == C
  for (int64_t m = 0; m < M; ++m) std::fill(c + m * ldc, c + m * ldc + N, 0.0f);
}

}  // namespace
}  // namespace gemm_detail

bool fp32_products_available(Format format) {
  return gemm_detail::fp32_products_kernel(format) != gemm_detail::Fp32ProductsKernel::none;
}

namespace gemm_detail {
namespace {

// With at least this many macro-tile rows per thread, each thread packs the A panels of the tile
// row it takes itself, just before it computes that row's tiles (see run_plan).
constexpr int64_t kLocalATileRowsPerThread = 4;

// Packs both operands into panels, then computes C macro tile by macro tile (see the top of this
// file). pack_a(panel_row0, dst) / pack_b(panel_row0, dst) fill one panel of plan.mr / plan.nr rows.
// With many macro-tile rows (the activations' and gradients' M of a training step), a thread takes
// a whole tile row and packs its A panels into its own buffer first (kTileRows rows x K, which fits
// L2 at a model's K): packed up front, the whole of A went out to L3 or memory and came back for the
// tiles, and the packing waited on those stores. Each output is summed by one thread in K order
// either way: the same bits.
template <class PackA, class PackB>
void run_plan(const Plan& plan, int64_t M, int64_t N, int64_t units, PackA pack_a, PackB pack_b,
              const OutputScale& out_scale, bool accumulate, float* c, int64_t ldc) {
  const int64_t mr = plan.mr, nr = plan.nr;
  const int64_t a_panels = (M + mr - 1) / mr, b_panels = (N + nr - 1) / nr;
  const int64_t a_panel_bytes = units * plan.a_unit_bytes, b_panel_bytes = units * plan.b_unit_bytes;

  const int64_t tile_row_panels = kTileRows / mr, tile_col_panels = kTileCols / nr;
  const int64_t tile_rows = (a_panels + tile_row_panels - 1) / tile_row_panels;
  const int64_t tile_cols = (b_panels + tile_col_panels - 1) / tile_col_panels;
  const int64_t micro_tile_floats = mr * nr;
  // A team only pays off with two macro tiles or more and enough work to hide its start and
  // barriers (on a tiny model the waits of a 2-thread team would dominate the training step).
  // Either way each output is summed by one thread in the same order.
  const bool parallel = tile_rows * tile_cols > 1 && M * N * units * plan.unit_k >= kParallelMinMacs;
  const int64_t threads = parallel ? omp_get_max_threads() : 1;
  const bool local_a = tile_rows >= kLocalATileRowsPerThread * threads;
  const StreamScaled stream = !accumulate && M * N * static_cast<int64_t>(sizeof(float)) >= kStreamedOutputBytes &&
                                      c_stores() == CStores::streaming
                                  ? stream_scaled_kernel(active_isa())
                                  : nullptr;

  static thread_local Workspace packed_workspace;
  uint8_t* packed_b = packed_workspace.get(static_cast<size_t>((local_a ? 0 : a_panels * a_panel_bytes) + b_panels * b_panel_bytes));
  uint8_t* packed_a = local_a ? nullptr : packed_b + b_panels * b_panel_bytes;

  // Macro tile (tile row, tile col) into C; a_panels_of_row: the packed A panels of its tile row.
  auto compute_tile = [&](int64_t tile_row, int64_t tile_col, const uint8_t* a_panels_of_row, float* scratch) {
    const int64_t ia0 = tile_row * tile_row_panels, ib0 = tile_col * tile_col_panels;
    const int64_t ia_count = std::min(tile_row_panels, a_panels - ia0);
    const int64_t ib_count = std::min(tile_col_panels, b_panels - ib0);
    for (int64_t u0 = 0; u0 < units; u0 += plan.chunk_units) {
      const int64_t chunk = std::min(plan.chunk_units, units - u0);
      for (int64_t jb = 0; jb < ib_count; ++jb) {
        const uint8_t* pb = packed_b + (ib0 + jb) * b_panel_bytes + u0 * plan.b_unit_bytes;
        for (int64_t ia = 0; ia < ia_count; ++ia) {
          const uint8_t* pa = a_panels_of_row + ia * a_panel_bytes + u0 * plan.a_unit_bytes;
          float* acc = plan.tiles == Plan::Tiles::bf16 ? scratch + ia * mr * kTileCols + jb * nr
                                                       : scratch + (ia * tile_col_panels + jb) * micro_tile_floats;
          plan.micro(pa, pb, chunk, acc, u0 == 0);
        }
      }
    }
    // Scale once and write only the part of each micro-tile that lies inside C, whole rows of C at
    // a time: C rows are ldc apart (often a page), so writing micro-tile by micro-tile touched a
    // new page every 64 bytes.
    if (plan.tiles == Plan::Tiles::bf16) {  // macro-tile rows are contiguous in the scratch
      const int64_t m0 = ia0 * mr, n0 = ib0 * nr;
      const int64_t rows = std::min(ia_count * mr, M - m0), cols = std::min(ib_count * nr, N - n0);
      for (int64_t r = 0; r < rows; ++r)
        write_row(scratch + r * kTileCols, m0 + r, n0, cols, out_scale, accumulate, stream, c + (m0 + r) * ldc + n0);
      return;
    }
    const int64_t n0 = ib0 * nr, cols = std::min(ib_count * nr, N - n0);
    for (int64_t ia = 0; ia < ia_count; ++ia) {
      const int64_t m0 = (ia0 + ia) * mr, rows = std::min(mr, M - m0);
      const float* acc = scratch + ia * tile_col_panels * micro_tile_floats;
      for (int64_t r = 0; r < rows; ++r)
        write_row_pieces(acc + r * nr, micro_tile_floats, nr, m0 + r, n0, cols, out_scale, accumulate, stream,
                         c + (m0 + r) * ldc + n0);
    }
  };

#pragma omp parallel if (parallel)
  {
    if (!local_a) {
#pragma omp for schedule(dynamic, dynamic_chunk(a_panels)) nowait
      for (int64_t p = 0; p < a_panels; ++p) pack_a(p * mr, packed_a + p * a_panel_bytes);
    }
#pragma omp for schedule(dynamic, dynamic_chunk(b_panels))
    for (int64_t p = 0; p < b_panels; ++p) pack_b(p * nr, packed_b + p * b_panel_bytes);
    // (implicit barrier: the shared panels are packed before any tile starts)

    static thread_local Workspace scratch_workspace;
    float* scratch = reinterpret_cast<float*>(scratch_workspace.get(sizeof(float) * kTileRows * kTileCols));
    if (plan.tiles == Plan::Tiles::int8) amx_thread_begin(plan.unit_k);
    if (plan.tiles == Plan::Tiles::bf16) amx_bf16_thread_begin();
    // Dynamic: a tile (or tile row) is summed by whichever thread takes it, in the same order, so the
    // bits do not depend on the split, and a thread slowed by the machine (a shared VM) does not
    // hold the rest.
    if (local_a) {
      static thread_local Workspace row_workspace;
      uint8_t* row_a = row_workspace.get(static_cast<size_t>(tile_row_panels * a_panel_bytes));
#pragma omp for schedule(dynamic, 1)
      for (int64_t tile_row = 0; tile_row < tile_rows; ++tile_row) {
        const int64_t ia0 = tile_row * tile_row_panels, ia_count = std::min(tile_row_panels, a_panels - ia0);
        for (int64_t ia = 0; ia < ia_count; ++ia) pack_a((ia0 + ia) * mr, row_a + ia * a_panel_bytes);
        for (int64_t tile_col = 0; tile_col < tile_cols; ++tile_col) compute_tile(tile_row, tile_col, row_a, scratch);
      }
    } else {
#pragma omp for schedule(dynamic, 1)
      for (int64_t tile = 0; tile < tile_rows * tile_cols; ++tile) {
        const int64_t tile_row = tile / tile_cols;
        compute_tile(tile_row, tile % tile_cols, packed_a + tile_row * tile_row_panels * a_panel_bytes, scratch);
      }
    }
    if (stream) _mm_sfence();  // this thread's streamed lines reach memory before the region ends
    if (plan.tiles != Plan::Tiles::none) amx_thread_end();
  }
}

}  // namespace
}  // namespace gemm_detail

void gemm(const QuantizedTensor& a, const QuantizedTensor& b, float* c, int64_t ldc, float alpha, Output output,
          Summation summation) {
  const bool accumulate = output == Output::accumulate;
  using namespace gemm_detail;
  const Family family = validate_operands(a, b, c, ldc);
  if (a.rows == 0 || b.rows == 0) return;
  if (a.cols == 0) return write_zero_product(a.rows, b.rows, c, ldc, accumulate);

  // The ISA is read once per call.
  const Fp32ProductsKernel fp32_kernel =
      summation == Summation::fp32_products ? fp32_products_kernel(a.format) : Fp32ProductsKernel::none;
  const bool bf16_tiles = fp32_kernel == Fp32ProductsKernel::amx_tiles &&
                          (a.format == Format::nvfp4 || (is_per_tensor_fp8(a.format) && a.block == BlockShape::per_tensor) ||
                           (a.format == Format::mxfp4 && mx_scales_fit_bf16(a) && mx_scales_fit_bf16(b)));
  // Per-tensor FP8 values are exact BF16: vdpbf16ps sums them in pairs where AMX-BF16 is absent
  // (fp32_products_kernel gives bf16_pairs for FP8 only).
  const bool bf16_pairs = fp32_kernel == Fp32ProductsKernel::bf16_pairs;
  const Isa isa = active_isa();
  const Plan plan = !bf16_pairs ? make_plan(family, a, b, isa, bf16_tiles)
                    : bf16_pair_kernel() == Bf16PairKernel::dpbf16
                        ? bf16_pair_plan(&pack_bf16_pair_fp8_a_panel, &pack_bf16_pair_fp8_b_panel)
                        : widened_pair_plan(isa, &pack_bf16_pair_widened_fp8_a_panel, &pack_bf16_pair_widened_fp8_b_panel);
  std::vector<float> row_factors;
  const OutputScale out_scale = output_scale(a, b, alpha, family == Family::int8_blocks && !bf16_tiles, row_factors);
  const int64_t units = (a.cols + plan.unit_k - 1) / plan.unit_k;  // the BF16 unit (32) may pad one 16-block
  run_plan(
      plan, a.rows, b.rows, units, [&](int64_t row0, uint8_t* dst) { plan.pack_a(a, row0, dst); },
      [&](int64_t row0, uint8_t* dst) { plan.pack_b(b, row0, dst); }, out_scale, accumulate, c, ldc);
}

namespace gemm_detail {
void gemm_bf16_packed(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const float* a, int64_t lda,
                      const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  NIBBLE_CHECK(M > 0 && N > 0 && K > 0 && (beta == 0.0f || beta == 1.0f), "packed GEMM: positive M, N, K and beta 0 or 1");
  // op(A) is [M,K]: row m is K-contiguous when A is stored untransposed. op(B) is [K,N]; the kernel
  // wants its columns, which are K-contiguous when B is stored transposed ([N,K]).
  const F32Operand ao{a, lda, M, K, ta == Trans::no};
  const F32Operand bo{b, ldb, N, K, tb == Trans::yes};
  const Isa isa = active_isa();  // read once per call
  if (amx_bf16_active()) {
    return run_plan(
        bf16_plan(), M, N, bf16_units(K), [&](int64_t row0, uint8_t* dst) { pack_bf16_a_panel(ao, row0, dst); },
        [&](int64_t row0, uint8_t* dst) { pack_bf16_b_panel(bo, row0, dst); }, OutputScale::uniform(alpha), beta != 0.0f, c, ldc);
  }
  // Otherwise pair order, each output summed pair by pair in k order by the one thread that owns it:
  // vdpbf16ps on BF16-pair panels, or the f32 family's FMA kernel on the same pairs widened (the
  // same bits: a BF16 x BF16 product is exact in FP32, so FMA or mul + add round alike).
  const bool dpbf16 = bf16_pair_kernel() == Bf16PairKernel::dpbf16;  // (fma below AVX512-BF16)
  const bool simd = isa >= Isa::avx2;
  const PackF32 pack_a = dpbf16 ? &pack_bf16_pair_a_panel_avx2
                         : simd ? &pack_bf16_pair_widened_a_panel_avx2
                                : &pack_bf16_pair_widened_a_panel;
  const PackF32 pack_b = dpbf16 ? &pack_bf16_pair_b_panel_avx2
                         : simd ? &pack_bf16_pair_widened_b_panel_avx2
                                : &pack_bf16_pair_widened_b_panel;
  run_plan(
      dpbf16 ? bf16_pair_plan() : widened_pair_plan(isa), M, N, (K + 1) / 2,
      [&](int64_t row0, uint8_t* dst) { pack_a(ao, row0, dst); }, [&](int64_t row0, uint8_t* dst) { pack_b(bo, row0, dst); },
      OutputScale::uniform(alpha), beta != 0.0f, c, ldc);
}

void gemm_f32_packed(Trans ta, Trans tb, int64_t M, int64_t N, int64_t K, float alpha, const float* a, int64_t lda,
                     const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  NIBBLE_CHECK(M > 0 && N > 0 && K > 0 && (beta == 0.0f || beta == 1.0f), "packed GEMM: positive M, N, K and beta 0 or 1");
  const F32Operand ao{a, lda, M, K, ta == Trans::no};
  const F32Operand bo{b, ldb, N, K, tb == Trans::yes};
  const Isa isa = active_isa();  // read once per call
  const bool simd = isa >= Isa::avx2;
  const PackF32 pack_a = simd ? &pack_f32_a_panel_avx2 : static_cast<PackF32>(&pack_f32_a_panel);
  const PackF32 pack_b = simd ? &pack_f32_b_panel_avx2 : static_cast<PackF32>(&pack_f32_b_panel);
  run_plan(
      f32_plan(isa), M, N, K, [&](int64_t row0, uint8_t* dst) { pack_a(ao, row0, dst); },
      [&](int64_t row0, uint8_t* dst) { pack_b(bo, row0, dst); }, OutputScale::uniform(alpha), beta != 0.0f, c, ldc);
}
}  // namespace gemm_detail

}  // namespace nibble::cpu
