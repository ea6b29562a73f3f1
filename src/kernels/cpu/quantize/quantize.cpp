// Dispatch for the CPU quantizers: validation, the per-tensor constants and lookup tables (built
// with the scalar codecs, so they are the reference's own numbers), the split over OpenMP threads,
// and the choice of kernel variant from active_isa(). The kernels live in quantize_<isa>.cpp.
//
// Every result is bit-identical to nibble::ref: each block is computed from its own inputs with
// the reference's FP32 operations in the reference's order, the global amax is a maximum (which
// does not depend on the order of reduction), and stochastic rounding draws the 8 random bits of
// each element from its flat index (format/philox.h). So neither the ISA nor the thread count changes a bit.
#include "kernels/cpu/quantize/quantize.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cfloat>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/common/cpu_features.h"
#include "kernels/cpu/common/workspace.h"
#include "kernels/cpu/quantize/quantize_kernels.h"

namespace nibble::cpu {
namespace {

using kernels::Kernels;

std::atomic<const Kernels*> kernels_override{nullptr};

const Kernels& active_kernels() {
  if (const Kernels* k = kernels_override.load(std::memory_order_relaxed)) return *k;
  switch (active_isa()) {
    case Isa::amx:         // no AMX quantizer: the tile unit only multiplies
    case Isa::avx512bf16:  // nor a BF16 one: vdpbf16ps only multiplies
    case Isa::avx512: return kernels::avx512_kernels();
    case Isa::avx2: return kernels::avx2_kernels();
    case Isa::scalar: break;
  }
  return kernels::scalar_kernels();
}

// Below this much work one thread does everything: waking the team costs more than it saves.
constexpr int64_t kParallelMinElements = int64_t{1} << 16;

// Work is handed out in chunks of about this many elements, first come first served: on a
// machine whose cores are shared, a thread that loses its core for a while no longer holds up
// the whole call (a static split waits for the slowest share). Chunks are large enough to keep
// the streaming loops and the hardware prefetcher in their stride.
constexpr int64_t kChunkElements = int64_t{1} << 16;

// Calls body(begin, end) over [0, n) in chunks of whole `grain` units, spread over the OpenMP
// threads; `elements` is the work behind all n units. Kernels never throw, so nothing escapes.
template <class Body>
void parallel_ranges(int64_t n, int64_t grain, int64_t elements, Body&& body) {
  if (n <= 0) return;
  if (elements < kParallelMinElements || omp_get_max_threads() == 1) {
    body(int64_t{0}, n);
    return;
  }
  const int64_t elements_per_unit = std::max<int64_t>(1, elements / n);
  const int64_t chunk = std::max<int64_t>(grain, kChunkElements / elements_per_unit / grain * grain);
  const int64_t chunks = (n + chunk - 1) / chunk;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t c = 0; c < chunks; ++c) body(c * chunk, std::min(n, (c + 1) * chunk));
}

void atomic_max(std::atomic<uint32_t>& slot, uint32_t v) {
  uint32_t cur = slot.load(std::memory_order_relaxed);
  while (v > cur && !slot.compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
  }
}

int64_t block_of_format(Format f) {
  return f == Format::nvfp4 ? 16 : (f == Format::mxfp4 || f == Format::mxfp8) ? 32 : 1;
}

// Everything ref::validate checks except the values. When this says no, ref::validate is called
// to throw its own message, so both implementations report the same errors.
bool shape_and_options_ok(size_t size, int64_t rows, int64_t cols, const QuantOptions& o) {
  if (rows <= 0 || cols <= 0 || static_cast<int64_t>(size) != rows * cols) return false;
  if (o.format != Format::nvfp4 && (o.rht || o.four_over_six || o.tile_16x16)) return false;
  if (o.four_over_six_e4m3_max != 448 && o.four_over_six_e4m3_max != 256) return false;
  if (o.four_over_six_error != FourOverSixError::mae && o.four_over_six_error != FourOverSixError::mse) return false;
  if (o.rounding == Rounding::stochastic && !is_4bit(o.format)) return false;
  if (cols % block_of_format(o.format) != 0) return false;
  if (is_4bit(o.format) && cols % 2 != 0) return false;
  if (o.row_scaled && (o.format != Format::nvfp4 || o.tile_16x16 || o.rht || o.rounding == Rounding::stochastic ||
                       o.four_over_six))
    return false;
  return true;
}

// A non-finite value is present (the amax scan saw an Inf/NaN bit pattern): let the reference find
// the first one and throw its NumericalError.
[[noreturn]] void throw_non_finite(std::span<const float> x, int64_t rows, int64_t cols, const QuantOptions& o) {
  ref::validate(x, rows, cols, o);
  NIBBLE_CHECK(false, "the amax scan saw a non-finite value that validate() did not");
  __builtin_unreachable();
}

constexpr uint32_t kFloatExponentAllOnes = 0x7F800000u;

// Sets every field for the new tensor; the kernels overwrite every code and scale byte, so buffers
// that already have the right size are kept as they are (resize() only zero-fills growth).
void make_header(int64_t rows, int64_t cols, const QuantOptions& o, QuantizedTensor& q) {
  q.layout() = layout_of(o, rows, cols);
  q.codes.resize(static_cast<size_t>(q.code_bytes()));
  q.scales.resize(static_cast<size_t>(q.scale_bytes()));
  q.amax = 0.0f;
  q.decode_scale = 1.0f;
  q.row_amax.resize(o.row_scaled ? static_cast<size_t>(rows) : 0);
  q.row_decode_scale.resize(o.row_scaled ? static_cast<size_t>(rows) : 0);
}

uint32_t parallel_max_abs_bits(const Kernels& k, const float* x, int64_t n) {
  std::atomic<uint32_t> result{0};
  parallel_ranges(n, 1024, n, [&](int64_t b, int64_t e) { atomic_max(result, k.max_abs_bits(x + b, e - b)); });
  return result.load();
}

// max |x| below 2^122 (bit pattern of 2^122): the RHT's partial sums stay below 2^126, so no
// transformed value is Inf or NaN.
constexpr uint32_t kRhtFiniteInputBits = 0x7C800000u;

// What the NVFP4 encode pass needs besides the input: the global scale from the amax and the
// per-scale-code tables (computed with the scalar codecs, so they are the reference's numbers).
struct Nvfp4Encoding {
  float enc_of_scale[256];
  kernels::Nvfp4Job job;
};

// e4m3_decode of every byte, computed once: with std::ldexp per entry, building this table for every
// row of a row-scaled tensor cost many times the row's quantization (docs/benchmarks.md).
const float* e4m3_values() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int s = 0; s < 256; ++s) t[static_cast<size_t>(s)] = e4m3_decode(static_cast<uint8_t>(s));
    return t;
  }();
  return table.data();
}

// The job and tables of a global scale from `amax`; *amax_out and *decode_out get the tensor's (or,
// row-scaled, the row's) amax and S_dec.
void prepare_nvfp4_tables(float amax, bool rht_finite, const QuantOptions& o, QuantizedTensor& q, Nvfp4Encoding& e,
                          float* amax_out, float* decode_out) {
  const ref::Nvfp4GlobalScale g = ref::nvfp4_global_scale(amax, nvfp4_global_numerator(o));
  *amax_out = amax;
  *decode_out = g.decode;
  const float* values = e4m3_values();
  for (int s = 0; s < 256; ++s) e.enc_of_scale[s] = std::min(1.0f / (values[s] * g.decode), FLT_MAX);
  kernels::Nvfp4Job& job = e.job;
  job.rows = q.rows;
  job.cols = q.cols;
  job.rht = o.rht;
  job.rht_finite = rht_finite;
  job.four_over_six = o.four_over_six;
  job.four_over_six_mse = o.four_over_six_error == FourOverSixError::mse;
  job.stochastic = o.rounding == Rounding::stochastic;
  job.seed = o.seed;
  job.offset = o.offset;
  job.encode_times_rcp6 = g.encode * (1.0f / 6.0f);
  job.global_encode = g.encode;
  job.global_amax = g.amax;
  job.global_numerator = g.numerator;
  job.enc_of_scale = e.enc_of_scale;
  job.value_of_scale = values;
  job.codes = q.codes.data();
  job.scales = q.scales.data();
}

void prepare_nvfp4(float amax, bool rht_finite, const QuantOptions& o, QuantizedTensor& q, Nvfp4Encoding& e) {
  prepare_nvfp4_tables(amax, rht_finite, o, q, e, &q.amax, &q.decode_scale);
}

// The two maxima of an RHT amax pass (max |x| bits, amax of the transformed values), combined over
// the threads' ranges.
struct RhtAmax {
  std::atomic<uint32_t> input_bits{0}, transformed_amax_bits{0};
  void add(uint32_t bits, float t_amax) {
    atomic_max(input_bits, bits);
    atomic_max(transformed_amax_bits, std::bit_cast<uint32_t>(t_amax));  // non-negative floats order like their bits
  }
  float transformed_amax() const { return std::bit_cast<float>(transformed_amax_bits.load()); }
};

// Amax of the RHT-transformed blocks in [x, x + n) and max |x| bits, into `into`.
void rht_amax_into(const Kernels& k, const float* x, int64_t n, RhtAmax& into) {
  uint32_t bits;
  float t_amax;
  k.rht_amax(x, n, &bits, &t_amax);
  into.add(bits, t_amax);
}

// Row-scaled NVFP4 (ref: quantize_nvfp4_row_scaled): every row is a tensor of its own, its amax, its
// global scale and its scale tables, then the ISA's 1x16 block kernel on that row's blocks. Rows are
// independent, so the split over threads changes nothing.
void quantize_nvfp4_row_scaled(const Kernels& k, std::span<const float> x, const QuantOptions& o, QuantizedTensor& q) {
  const int64_t rows = q.rows, cols = q.cols, blocks_per_row = cols / 16;
  std::atomic<uint32_t> max_bits{0};
  parallel_ranges(rows, 1, rows * cols, [&](int64_t r0, int64_t r1) {
    uint32_t local = 0;
    for (int64_t r = r0; r < r1; ++r) {
      const uint32_t bits = k.max_abs_bits(x.data() + r * cols, cols);
      q.row_amax[static_cast<size_t>(r)] = std::bit_cast<float>(bits);  // meaningful only when finite
      local = std::max(local, bits);
    }
    atomic_max(max_bits, local);
  });
  if (max_bits.load() >= kFloatExponentAllOnes) throw_non_finite(x, rows, cols, o);
  q.amax = std::bit_cast<float>(max_bits.load());
  q.decode_scale = 1.0f;
  parallel_ranges(rows, 1, rows * cols, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      Nvfp4Encoding e;  // the row's own S_enc table (256 divisions)
      float row_amax = q.row_amax[static_cast<size_t>(r)];
      prepare_nvfp4_tables(row_amax, false, o, q, e, &row_amax, &q.row_decode_scale[static_cast<size_t>(r)]);
      e.job.x = x.data();
      k.nvfp4_blocks(e.job, r * blocks_per_row, (r + 1) * blocks_per_row);
    }
  });
}

// known_max_abs_bits: max |x| (as bits, finite) when the caller already has it; skips that pass.
void quantize_nvfp4(const Kernels& k, std::span<const float> x, const QuantOptions& o, QuantizedTensor& q,
                    const uint32_t* known_max_abs_bits = nullptr) {
  if (o.row_scaled) return quantize_nvfp4_row_scaled(k, x, o, q);
  const int64_t n = q.rows * q.cols;
  float amax;
  bool rht_finite = false;
  if (o.rht) {
    // Validate the input and take the amax of its transform in one read; the quantize pass
    // transforms each block again rather than storing and re-reading a transformed copy.
    RhtAmax m;
    parallel_ranges(n / 16, 256, n, [&](int64_t b, int64_t e) { rht_amax_into(k, x.data() + b * 16, (e - b) * 16, m); });
    if (m.input_bits.load() >= kFloatExponentAllOnes) throw_non_finite(x, q.rows, q.cols, o);
    amax = m.transformed_amax();
    rht_finite = m.input_bits.load() < kRhtFiniteInputBits;
  } else {
    uint32_t bits = known_max_abs_bits ? *known_max_abs_bits : parallel_max_abs_bits(k, x.data(), n);
    if (bits >= kFloatExponentAllOnes) throw_non_finite(x, q.rows, q.cols, o);
    amax = std::bit_cast<float>(bits);
  }
  Nvfp4Encoding e;
  prepare_nvfp4(amax, rht_finite, o, q, e);
  e.job.x = x.data();
  if (o.tile_16x16) {
    const int64_t tiles = (q.rows + 15) / 16 * (q.cols / 16);
    parallel_ranges(tiles, 1, n, [&](int64_t b, int64_t end) { k.nvfp4_tiles(e.job, b, end); });
  } else {
    parallel_ranges(n / 16, 64, n, [&](int64_t b, int64_t end) { k.nvfp4_blocks(e.job, b, end); });
  }
}

// The producer's amaxes when they serve x^T's quantization (`rht`: with the RHT): gathered, with the
// transposed RHT amax when it is needed, and from an input small enough that it means what the
// passes below would compute. Otherwise those passes run (and report a non-finite input).
const SourceAmax* usable(const SourceAmax* known, bool rht) {
  if (!known || !known->valid || (rht && !known->rht)) return nullptr;
  return known->max_abs_bits < (rht ? kRhtFiniteInputBits : kFloatExponentAllOnes) ? known : nullptr;
}

// The row-wise NVFP4 quantization of x that quantize_both asks for alongside x^T's, made in x^T's
// encode pass (see RowCompanion::fits): while the pass holds a stretch of x in cache for x^T's
// blocks, the row-wise blocks of that stretch are encoded too, so x is read once less and the
// threads meet at one barrier less. Its amax is max |x|, which x^T's amax pass yields.
struct RowCompanion {
  const QuantOptions* opt = nullptr;  // null: x^T alone
  QuantizedTensor* q = nullptr;
  bool done = false;  // set once the row-wise tensor is complete
  Nvfp4Encoding e;

  // Row-wise options whose amax is max |x| and whose blocks are 1x16 blocks of x's rows.
  static bool fits(std::span<const float> x, int64_t rows, int64_t cols, const QuantOptions& o) {
    return o.format == Format::nvfp4 && !o.rht && !o.row_scaled && !o.tile_16x16 &&
           shape_and_options_ok(x.size(), rows, cols, o);
  }
  // After the amax pass, before the encode pass: max |x| (finite) gives the global scale.
  void prepare(std::span<const float> x, int64_t rows, int64_t cols, uint32_t max_abs_bits) {
    if (!opt) return;
    make_header(rows, cols, *opt, *q);
    prepare_nvfp4(std::bit_cast<float>(max_abs_bits), false, *opt, *q, e);
    e.job.x = x.data();
  }
  // Row-wise blocks of x's rows [row_begin, row_end), columns [col_begin, col_end) (multiples of 16).
  void encode(const Kernels& k, int64_t cols, int64_t row_begin, int64_t row_end, int64_t col_begin,
              int64_t col_end) const {
    if (!opt) return;
    const int64_t blocks_per_row = cols / 16;
    for (int64_t r = row_begin; r < row_end; ++r)
      k.nvfp4_blocks(e.job, r * blocks_per_row + col_begin / 16, r * blocks_per_row + col_end / 16);
  }
};

// NVFP4 1x16 blocks of x^T (x is [rows, cols]; q is [cols, rows]), the wgrad operands, and with
// `row` (its opt set) x's row-wise ones in the same encode pass. Without
// direct kernels (AVX2, scalar), x^T is made tile by tile in a per-thread buffer (below). Writing the whole transposed copy to memory and
// reading it back twice cost ~3x the row-wise quantize on training shapes. Returns false, having
// written nothing, when x holds a non-finite value (the caller then takes the path that reports it).
bool quantize_nvfp4_transposed(const Kernels& k, std::span<const float> x, int64_t rows, int64_t cols,
                               const QuantOptions& o, QuantizedTensor& q, uint32_t* max_abs_bits_seen,
                               RowCompanion& row, const SourceAmax* known) {
  const SourceAmax* gathered = usable(known, o.rht);
  // Where the ISA has them, kernels that read 16x16 tiles of x and transpose them in registers make
  // no copy at all (see Kernels::nvfp4_transposed).
  if (k.nvfp4_transposed && cols % 16 == 0 && rows % 16 == 0 && !o.four_over_six) {
    const int64_t n = rows * cols;
    const int64_t panels = (rows / 16 + 15) / 16 * (cols / 16);
    float amax = 0.0f;
    bool ok = true;
    if (gathered) {
      amax = o.rht ? gathered->transposed_rht_amax : std::bit_cast<float>(gathered->max_abs_bits);
      *max_abs_bits_seen = gathered->max_abs_bits;
    } else if (o.rht) {
      RhtAmax m;
      parallel_ranges(panels, 1, n, [&](int64_t b, int64_t e) {
        uint32_t bits;
        float t_amax;
        k.rht_amax_transposed(x.data(), cols, rows, cols, b, e, &bits, &t_amax);
        m.add(bits, t_amax);
      });
      // Huge or non-finite input: the strip path below handles (or reports) it.
      ok = m.input_bits.load() < kRhtFiniteInputBits;
      amax = m.transformed_amax();
      if (ok) *max_abs_bits_seen = m.input_bits.load();
    } else {
      const uint32_t bits = parallel_max_abs_bits(k, x.data(), n);
      if (bits >= kFloatExponentAllOnes) return false;
      amax = std::bit_cast<float>(bits);
      *max_abs_bits_seen = bits;
    }
    if (ok) {
      Nvfp4Encoding e;
      prepare_nvfp4(amax, o.rht, o, q, e);
      row.prepare(x, rows, cols, *max_abs_bits_seen);
      const int64_t column_groups = cols / 16;
      parallel_ranges(panels, 1, n, [&](int64_t b, int64_t end) {
        k.nvfp4_transposed(e.job, x.data(), cols, b, end);
        // The same panels row-wise, one run of column groups per token batch (256 rows of x).
        for (int64_t p = b; p < end;) {
          const int64_t batch = p / column_groups, g0 = p % column_groups;
          const int64_t g1 = std::min(column_groups, g0 + (end - p));
          row.encode(k, cols, batch * 256, std::min(rows, batch * 256 + 256), g0 * 16, g1 * 16);
          p += g1 - g0;
        }
      });
      row.done = row.opt != nullptr;
      return true;
    }
  }
  // Tiles of kBand tokens x kStrip columns of x, transposed into a per-thread buffer that stays in
  // L1/L2 and consumed at once: once for the RHT amax, once for the encode pass. Tiles run band by
  // band, the strips of a band in column order, so the rows of x being read advance sequentially
  // (pages stay in the TLB, the prefetchers follow). Strip by strip down all the tokens instead,
  // each 128-byte read would jump a row stride, a new page per row on training shapes, and the
  // transposes would wait on the TLB. Each block's bytes depend only on its values and
  // stream position, so the tiling changes no result.
  constexpr int64_t kStrip = 64, kBand = 256;  // 64 x 256 x 4 bytes = 64 KB
  const int64_t n = rows * cols;
  const int64_t strips = (cols + kStrip - 1) / kStrip, bands = (rows + kBand - 1) / kBand;
  const int64_t tiles = strips * bands;
  struct Tile {
    const float* buf;
    int64_t c0, width, t0, tokens;
  };
  auto transpose_tile = [&](int64_t tile) {
    static thread_local Workspace tile_workspace;
    float* buf = reinterpret_cast<float*>(tile_workspace.get(static_cast<size_t>(kStrip * kBand) * sizeof(float)));
    const int64_t band = tile / strips, strip = tile % strips;
    const int64_t c0 = strip * kStrip, width = std::min(kStrip, cols - c0);
    const int64_t t0 = band * kBand, tokens = std::min(kBand, rows - t0);
    // buf[c * tokens + t]: column c0 + c of x over tokens t0 + t, i.e. a run of x^T's row c0 + c.
    k.transpose(x.data() + t0 * cols + c0, cols, tokens, width, buf, 0, tokens);
    return Tile{buf, c0, width, t0, tokens};
  };
  float amax;
  bool rht_finite = false;
  uint32_t input_bits;  // max |x|, finite
  if (gathered) {
    input_bits = gathered->max_abs_bits;
    amax = o.rht ? gathered->transposed_rht_amax : std::bit_cast<float>(input_bits);
    rht_finite = o.rht;  // usable() checked max |x| < 2^122
  } else if (o.rht) {
    RhtAmax m;
    parallel_ranges(tiles, 1, n, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        const Tile tile = transpose_tile(t);
        rht_amax_into(k, tile.buf, tile.width * tile.tokens, m);
      }
    });
    if (m.input_bits.load() >= kFloatExponentAllOnes) return false;
    amax = m.transformed_amax();
    rht_finite = m.input_bits.load() < kRhtFiniteInputBits;
    input_bits = m.input_bits.load();
  } else {
    input_bits = parallel_max_abs_bits(k, x.data(), n);  // the same values in any order
    if (input_bits >= kFloatExponentAllOnes) return false;
    amax = std::bit_cast<float>(input_bits);
  }
  Nvfp4Encoding e;
  prepare_nvfp4(amax, rht_finite, o, q, e);
  row.prepare(x, rows, cols, input_bits);
  const int64_t blocks_per_row = rows / 16;
  parallel_ranges(tiles, 1, n, [&](int64_t b, int64_t end) {
    kernels::Nvfp4Job job = e.job;
    for (int64_t t = b; t < end; ++t) {
      const Tile tile = transpose_tile(t);
      const int64_t tile_blocks = tile.tokens / 16;
      for (int64_t c = 0; c < tile.width; ++c) {
        // x^T's row c0 + c, blocks [t0 / 16, t0 / 16 + tile_blocks): consecutive in q and in buf.
        job.x = tile.buf + c * tile.tokens;
        job.x_first_block = (tile.c0 + c) * blocks_per_row + tile.t0 / 16;
        k.nvfp4_blocks(job, job.x_first_block, job.x_first_block + tile_blocks);
      }
      row.encode(k, cols, tile.t0, tile.t0 + tile.tokens, tile.c0, tile.c0 + tile.width);
    }
  });
  row.done = row.opt != nullptr;
  return true;
}

void quantize_mx(const Kernels& k, std::span<const float> x, const QuantOptions& o, QuantizedTensor& q) {
  const int64_t n = q.rows * q.cols;
  const uint32_t bits = parallel_max_abs_bits(k, x.data(), n);
  if (bits >= kFloatExponentAllOnes) throw_non_finite(x, q.rows, q.cols, o);
  q.amax = std::bit_cast<float>(bits);
  q.decode_scale = 1.0f;
  float rcp_of_scale[256];
  for (int e = 0; e < 256; ++e) rcp_of_scale[e] = e8m0_decode_reciprocal(static_cast<uint8_t>(e));
  kernels::MxJob job;
  job.x = x.data();
  job.fp4 = o.format == Format::mxfp4;
  job.stochastic = o.rounding == Rounding::stochastic;
  job.seed = o.seed;
  job.offset = o.offset;
  job.max_rcp = job.fp4 ? 1.0f / kE2M1Max : 1.0f / kE4M3Max;
  job.rcp_of_scale = rcp_of_scale;
  job.codes = q.codes.data();
  job.scales = q.scales.data();
  parallel_ranges(n / 32, 32, n, [&](int64_t b, int64_t e) { k.mx_blocks(job, b, e); });
}

void quantize_fp8(const Kernels& k, std::span<const float> x, const QuantOptions& o, QuantizedTensor& q) {
  const int64_t n = q.rows * q.cols;
  const bool e4m3 = o.format == Format::fp8_e4m3;
  const uint32_t bits = parallel_max_abs_bits(k, x.data(), n);
  if (bits >= kFloatExponentAllOnes) throw_non_finite(x, q.rows, q.cols, o);
  q.amax = std::bit_cast<float>(bits);
  // The reference's current scaling, operation for operation.
  float scale = (e4m3 ? kE4M3Max : kE5M2Max) / q.amax;
  if (q.amax == 0.0f || !(scale > 0.0f)) scale = 1.0f;
  scale = std::min(scale, FLT_MAX);
  q.decode_scale = 1.0f / scale;
  parallel_ranges(n, 1024, n, [&](int64_t b, int64_t e) { k.fp8_range(x.data() + b, e - b, scale, e4m3, q.codes.data() + b); });
}

// Exact transpose of 16x16-tile NVFP4 codes and scales (ref::transpose_tiles), tile by tile.
// A 16x16 tile of E2M1 codes, transposed. Read as a little-endian word, row r's 8 bytes hold column c
// at bits 4c..4c+3 (element 2i in the low nibble of byte i), and so does each word written, so the
// transpose is four block-swap stages over the 16 words (the off-diagonal k x k blocks of every
// 2k x 2k block exchanged, k = 8, 4, 2, 1): ~200 word operations a tile instead of 512 nibble moves.
static_assert(std::endian::native == std::endian::little);
void transpose_code_tile(const uint8_t* src, int64_t src_stride, uint8_t* dst, int64_t dst_stride) {
  uint64_t w[16];
  for (int r = 0; r < 16; ++r) std::memcpy(&w[r], src + r * src_stride, 8);
  constexpr uint64_t kLeftColumns[4] = {0x00000000FFFFFFFFull, 0x0000FFFF0000FFFFull, 0x00FF00FF00FF00FFull,
                                        0x0F0F0F0F0F0F0F0Full};  // columns c with (c & k) == 0
  for (int stage = 0; stage < 4; ++stage) {
    const int k = 8 >> stage, shift = 4 * k;
    for (int i = 0; i < 16; ++i) {
      if (i & k) continue;
      // Row i's columns c | k move down to row i + k's columns c, and back.
      const uint64_t t = ((w[i] >> shift) ^ w[i + k]) & kLeftColumns[stage];
      w[i + k] ^= t;
      w[i] ^= t << shift;
    }
  }
  for (int c = 0; c < 16; ++c) std::memcpy(dst + c * dst_stride, &w[c], 8);
}

QuantizedTensor transpose_tiles_fast(const QuantizedTensor& q) {
  QuantizedTensor t;
  t.layout() = q.layout();
  t.amax = q.amax;
  t.decode_scale = q.decode_scale;
  t.rows = q.cols;
  t.cols = q.rows;
  t.codes.resize(q.codes.size());
  t.scales.resize(static_cast<size_t>(t.rows * (t.cols / 16)));
  const int64_t tile_rows = q.rows / 16, tile_cols = q.cols / 16;
  const int64_t src_row_bytes = q.cols / 2, dst_row_bytes = t.cols / 2;
  parallel_ranges(tile_rows * tile_cols, 1, q.rows * q.cols, [&](int64_t b, int64_t e) {
    for (int64_t tile = b; tile < e; ++tile) {
      const int64_t tr = tile / tile_cols, tc = tile % tile_cols;
      transpose_code_tile(q.codes.data() + tr * 16 * src_row_bytes + tc * 8, src_row_bytes,
                          t.codes.data() + tc * 16 * dst_row_bytes + tr * 8, dst_row_bytes);
    }
  });
  const int64_t t_scale_cols = t.cols / 16, q_scale_cols = q.cols / 16;
  for (int64_t r = 0; r < t.rows; ++r)
    for (int64_t b = 0; b < t_scale_cols; ++b) t.scales[r * t_scale_cols + b] = q.scales[(b * 16) * q_scale_cols + r / 16];
  return t;
}

}  // namespace

namespace kernels {
void set_kernels_override_for_tests(const Kernels* k) { kernels_override.store(k, std::memory_order_relaxed); }
}  // namespace kernels

QuantizedTensor quantize(std::span<const float> x, int64_t rows, int64_t cols, const QuantOptions& opt) {
  QuantizedTensor q;
  quantize_into(x, rows, cols, opt, q);
  return q;
}

void quantize_into(std::span<const float> x, int64_t rows, int64_t cols, const QuantOptions& opt, QuantizedTensor& q) {
  if (!shape_and_options_ok(x.size(), rows, cols, opt)) ref::validate(x, rows, cols, opt);  // throws its message
  const Kernels& k = active_kernels();
  make_header(rows, cols, opt, q);
  switch (opt.format) {
    case Format::nvfp4: quantize_nvfp4(k, x, opt, q); break;
    case Format::mxfp4:
    case Format::mxfp8: quantize_mx(k, x, opt, q); break;
    case Format::fp8_e4m3:
    case Format::fp8_e5m2: quantize_fp8(k, x, opt, q); break;
  }
}

float max_abs(std::span<const float> x) {
  return std::bit_cast<float>(parallel_max_abs_bits(active_kernels(), x.data(), static_cast<int64_t>(x.size())));
}

void quantize_rows_of_into(std::span<const float> x, int64_t rows, int64_t cols, const QuantOptions& opt,
                           float tensor_amax, QuantizedTensor& q) {
  if (opt.format != Format::nvfp4 || opt.rounding != Rounding::nearest || opt.rht || opt.row_scaled)
    throw UsageError("quantizing part of a tensor with the whole tensor's scale needs nvfp4 with round-to-nearest, "
                     "no RHT and no row scaling (the bytes of such a quantization depend on the global amax alone)");
  if (!shape_and_options_ok(x.size(), rows, cols, opt)) ref::validate(x, rows, cols, opt);  // throws its message
  const Kernels& k = active_kernels();
  const uint32_t bits = parallel_max_abs_bits(k, x.data(), rows * cols);
  if (bits >= kFloatExponentAllOnes) throw_non_finite(x, rows, cols, opt);
  const uint32_t tensor_bits = std::bit_cast<uint32_t>(tensor_amax);
  NIBBLE_CHECK(tensor_bits < kFloatExponentAllOnes && bits <= tensor_bits,
               "quantize_rows_of: rows with max |x| %g above the tensor amax %g", std::bit_cast<float>(bits),
               tensor_amax);
  make_header(rows, cols, opt, q);
  quantize_nvfp4(k, x, opt, q, &tensor_bits);
}

QuantizedTensor quantize(std::span<const bf16> x, int64_t rows, int64_t cols, const QuantOptions& opt) {
  const Kernels& k = active_kernels();
  std::vector<float> f(x.size());
  const int64_t n = static_cast<int64_t>(x.size());
  static_assert(sizeof(bf16) == sizeof(uint16_t));
  const uint16_t* bits = reinterpret_cast<const uint16_t*>(x.data());
  parallel_ranges(n, 1024, n, [&](int64_t b, int64_t e) { k.bf16_to_float(bits + b, e - b, f.data() + b); });
  return quantize(f, rows, cols, opt);
}

QuantizedTensor quantize_transposed(std::span<const float> x, int64_t rows, int64_t cols, const QuantOptions& opt) {
  QuantizedTensor q;
  quantize_transposed_into(x, rows, cols, opt, q);
  return q;
}

namespace {
// quantize_transposed_into; *max_abs_bits_seen gets max |x| (finite) when a pass computed it, else
// is left alone. When a direct or strip pass makes x^T, it makes `row`'s row-wise tensor too.
void quantize_transposed_impl(std::span<const float> x, int64_t rows, int64_t cols, const QuantOptions& opt,
                              QuantizedTensor& out, uint32_t* max_abs_bits_seen, RowCompanion& row,
                              const SourceAmax* known) {
  if (opt.format == Format::nvfp4 && opt.tile_16x16 && !opt.rht) {
    // One amax and one scale per tile serve both orientations: the transposed copy is the exact
    // transpose. The reference validates everything before it checks the rows.
    if (!shape_and_options_ok(x.size(), rows, cols, opt)) ref::validate(x, rows, cols, opt);
    if (rows % 16 != 0) {
      ref::validate(x, rows, cols, opt);  // a non-finite value is reported first, as the reference does
      throw UsageError("16x16 tiles need a multiple of 16 rows for the transposed copy (got " + std::to_string(rows) + ")");
    }
    out = transpose_tiles(quantize(x, rows, cols, opt));
    return;
  }
  if (static_cast<int64_t>(x.size()) != rows * cols) ref::validate(x, rows, cols, opt);  // reports the size mismatch
  const Kernels& k = active_kernels();
  // Row-scaled x^T (one scale per column of x) takes the transposed copy below: its rows are the
  // units of the row-scaled kernel.
  if (opt.format == Format::nvfp4 && !opt.tile_16x16 && !opt.row_scaled && shape_and_options_ok(x.size(), cols, rows, opt) &&
      rows > 0 && cols > 0) {
    make_header(cols, rows, opt, out);
    if (quantize_nvfp4_transposed(k, x, rows, cols, opt, out, max_abs_bits_seen, row, known)) return;
  }
  // The transposed copy lives in a grow-only per-thread buffer: a fresh zero-filled vector per call
  // (two per linear layer and step in training) cost its memset and page faults every time.
  static thread_local Workspace transposed;
  float* t = reinterpret_cast<float*>(transposed.get(x.size() * sizeof(float)));
  if (rows > 0 && cols > 0)
    parallel_ranges(rows, 16, rows * cols, [&](int64_t b, int64_t e) { k.transpose(x.data(), cols, rows, cols, t, b, e); });
  quantize_into(std::span<const float>(t, x.size()), cols, rows, opt, out);
}
}  // namespace

void quantize_transposed_into(std::span<const float> x, int64_t rows, int64_t cols, const QuantOptions& opt,
                              QuantizedTensor& out) {
  uint32_t unused = 0;
  RowCompanion none;
  quantize_transposed_impl(x, rows, cols, opt, out, &unused, none, nullptr);
}

void quantize_both_into(std::span<const float> x, int64_t rows, int64_t cols, const QuantOptions& row_opt,
                        QuantizedTensor& row_out, const QuantOptions& t_opt, QuantizedTensor& t_out,
                        const SourceAmax* known) {
  constexpr uint32_t kUnknown = 0xFFFFFFFFu;
  uint32_t bits = kUnknown;
  RowCompanion row;
  if (RowCompanion::fits(x, rows, cols, row_opt)) {
    row.opt = &row_opt;
    row.q = &row_out;
  }
  quantize_transposed_impl(x, rows, cols, t_opt, t_out, &bits, row, known);
  if (row.done) return;
  // max |x| serves the row-wise NVFP4 amax exactly when that takes no transform of its own.
  if (bits != kUnknown && bits < kFloatExponentAllOnes && row_opt.format == Format::nvfp4 && !row_opt.rht &&
      shape_and_options_ok(x.size(), rows, cols, row_opt)) {
    make_header(rows, cols, row_opt, row_out);
    quantize_nvfp4(active_kernels(), x, row_opt, row_out, &bits);
    return;
  }
  quantize_into(x, rows, cols, row_opt, row_out);
}

void gather_source_amax(const float* x, int64_t cols, int64_t row_begin, int64_t row_end, SourceAmax& into) {
  NIBBLE_CHECK(cols % 16 == 0 && (!into.rht || (row_begin % 16 == 0 && (row_end - row_begin) % 16 == 0)),
               "gather_source_amax: 16-column blocks and, with the RHT, whole 16-row token blocks");
  const Kernels& k = active_kernels();
  const float* stripe = x + row_begin * cols;
  const int64_t rows = row_end - row_begin;
  SourceAmax part;
  part.rht = into.rht;
  part.valid = true;
  if (!into.rht) {
    part.max_abs_bits = k.max_abs_bits(stripe, rows * cols);
  } else if (k.rht_amax_transposed) {  // the quantizer's own amax pass, on these rows' panels
    const int64_t panels = (rows / 16 + 15) / 16 * (cols / 16);  // as Kernels::nvfp4_transposed numbers them
    k.rht_amax_transposed(stripe, cols, rows, cols, 0, panels, &part.max_abs_bits, &part.transposed_rht_amax);
  } else {
    // 16 rows at a time, transposed into a per-thread buffer ([cols][16]: each column's 16 tokens,
    // one block of x^T), then the row-wise RHT amax over its blocks, as the strip path does.
    static thread_local Workspace gather_workspace;
    float* buf = reinterpret_cast<float*>(gather_workspace.get(static_cast<size_t>(16 * cols) * sizeof(float)));
    for (int64_t r = 0; r < rows; r += 16) {
      k.transpose(stripe + r * cols, cols, 16, cols, buf, 0, 16);
      uint32_t bits;
      float t_amax;
      k.rht_amax(buf, 16 * cols, &bits, &t_amax);
      part.max_abs_bits = std::max(part.max_abs_bits, bits);
      part.transposed_rht_amax = std::max(part.transposed_rht_amax, t_amax);
    }
  }
  merge_source_amax(part, into);
}

void merge_source_amax(const SourceAmax& part, SourceAmax& into) {
  if (!part.valid) return;
  into.valid = true;
  into.max_abs_bits = std::max(into.max_abs_bits, part.max_abs_bits);
  // Non-negative floats order like their bit patterns; a NaN (only from a huge input, whose gather
  // usable() discards) must not make the result depend on the order of the merges.
  into.transposed_rht_amax = std::bit_cast<float>(std::max(std::bit_cast<uint32_t>(into.transposed_rht_amax),
                                                           std::bit_cast<uint32_t>(part.transposed_rht_amax)));
}

QuantizedTensor transpose_tiles(const QuantizedTensor& q) {
  if (q.format != Format::nvfp4 || q.block != BlockShape::tile_16x16 || q.rows % 16 != 0)
    return ref::transpose_tiles(q);  // throws its message
  return transpose_tiles_fast(q);
}

void dequantize(const QuantizedTensor& q, std::span<float> out) {
  NIBBLE_CHECK(static_cast<int64_t>(out.size()) == q.rows * q.cols, "dequantize: an output of rows x cols values");
  const int64_t n = q.rows * q.cols;
  const int64_t block_len = q.block_len();
  // Layouts the kernels assume; anything else (a hand-built or damaged tensor) takes the reference.
  const bool blocked = q.block != BlockShape::per_tensor;
  const bool layout_ok = q.rows > 0 && q.cols > 0 && block_len > 0 && q.cols % block_len == 0 &&
                         (!blocked || block_len % 16 == 0) &&
                         static_cast<int64_t>(q.codes.size()) == (q.is_4bit() ? n / 2 : n) &&
                         (!blocked || static_cast<int64_t>(q.scales.size()) == n / block_len) &&
                         (!q.rht || (q.format == Format::nvfp4 && q.cols % 16 == 0));
  // Row-scaled tensors (one factor per row) are dequantized by the reference: tests and statistics
  // read them, training never does.
  if (!layout_ok || (q.is_4bit() && !blocked) || q.row_scaled) {
    ref::dequantize(q, out);
    return;
  }
  const Kernels& k = active_kernels();
  float factor_of_scale[256];
  float value_of_code[256];
  switch (q.format) {
    case Format::nvfp4:
    case Format::mxfp4: {
      for (int s = 0; s < 256; ++s)
        factor_of_scale[s] = q.format == Format::nvfp4 ? e4m3_decode(static_cast<uint8_t>(s)) * q.decode_scale
                                                       : e8m0_decode(static_cast<uint8_t>(s));
      parallel_ranges(n / block_len, 16, n, [&](int64_t b, int64_t e) {
        k.dequant_e2m1(q.codes.data(), q.scales.data(), factor_of_scale, block_len, q.rht, b, e, out.data());
      });
      return;
    }
    case Format::mxfp8:
    case Format::fp8_e4m3:
    case Format::fp8_e5m2: {
      for (int c = 0; c < 256; ++c)
        value_of_code[c] = q.format == Format::fp8_e5m2 ? e5m2_decode(static_cast<uint8_t>(c)) : e4m3_decode(static_cast<uint8_t>(c));
      const uint8_t* scales = nullptr;
      if (q.format == Format::mxfp8) {
        for (int s = 0; s < 256; ++s) factor_of_scale[s] = e8m0_decode(static_cast<uint8_t>(s));
        scales = q.scales.data();
      }
      // Shares are multiples of 32 elements, so each 16-chunk lies inside one MX block.
      parallel_ranges(n, 32, n, [&](int64_t b, int64_t e) {
        k.dequant_bytes(q.codes.data(), scales, factor_of_scale, scales ? block_len : 1, q.decode_scale, value_of_code,
                        b, e, out.data());
      });
      return;
    }
  }
}

}  // namespace nibble::cpu
