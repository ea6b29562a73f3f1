// The fast CPU quantizers (kernels/cpu/quantize/quantize.h) against the scalar reference, bit for bit: every
// ISA variant this machine runs (scalar, AVX2, AVX-512) with 1 and 2 threads, on fresh random
// tensors of many shapes, scales and distributions, every format and option, stochastic rounding
// included (same Philox stream), plus the error paths (same messages, same first bad index).
// Built a second time as test_quantize_avx512_emulated (see variants()).
//
// The random seed changes every run and is printed on failure; set NIBBLE_TEST_SEED to replay.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "format/quantize.h"
#include "kernels/cpu/common/cpu_features.h"
#include "kernels/cpu/quantize/quantize.h"
#include "kernels/cpu/quantize/quantize_kernels.h"

using namespace nibble;
using cpu::Isa;

namespace {

uint64_t test_seed() {
  static const uint64_t seed = []() -> uint64_t {
    if (const char* e = std::getenv("NIBBLE_TEST_SEED")) return std::strtoull(e, nullptr, 10);
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) | rd();
  }();
  return seed;
}

std::string seed_note() { return "random seed " + std::to_string(test_seed()) + " (replay: NIBBLE_TEST_SEED=" + std::to_string(test_seed()) + ")"; }

struct Variant {
  Isa isa;
  int threads;
  bool emulated_avx512 = false;  // the AVX-512 kernels on the software model (see variants())
  std::string name() const {
    return std::string(emulated_avx512 ? "avx512 (emulated)" : cpu::to_string(isa)) + "/" + std::to_string(threads) + "t";
  }
};

std::vector<Variant> variants() {
  std::vector<Variant> v;
#ifdef NIBBLE_EMULATED_INTRINSICS
  // test_quantize_avx512_emulated: this same file built with quantize_avx512.cpp compiled against a
  // software model of its intrinsics (tests/emulated/avx512_quantize_intrinsics.h), so the AVX-512
  // kernels meet every test here on CPUs without AVX-512 too. They are its only variant.
  for (int t : {1, 2}) v.push_back({Isa::scalar, t, true});
#else
  for (Isa isa : {Isa::scalar, Isa::avx2, Isa::avx512})
    if (isa <= cpu::detected_isa())
      for (int t : {1, 2}) v.push_back({isa, t});
#endif
  return v;
}

// Selects a variant for the scope and restores the defaults afterwards.
struct UseVariant {
  explicit UseVariant(const Variant& v) {
    cpu::set_isa_limit(v.isa);
    if (v.emulated_avx512) cpu::kernels::set_kernels_override_for_tests(&cpu::kernels::avx512_kernels());
    omp_set_num_threads(v.threads);
  }
  ~UseVariant() {
    cpu::kernels::set_kernels_override_for_tests(nullptr);
    cpu::set_isa_limit(Isa::avx512);
    omp_set_num_threads(2);
  }
};

enum class Dist { normal, student_t, cauchy, zero_blocks, single_outlier, all_zero, wide_range };
const char* name_of(Dist d) {
  switch (d) {
    case Dist::normal: return "normal";
    case Dist::student_t: return "student-t(2)";
    case Dist::cauchy: return "cauchy";
    case Dist::zero_blocks: return "zero-blocks";
    case Dist::single_outlier: return "single-outlier";
    case Dist::all_zero: return "all-zero";
    case Dist::wide_range: return "wide-range";
  }
  return "?";
}
constexpr Dist kDists[] = {Dist::normal, Dist::student_t, Dist::cauchy, Dist::zero_blocks,
                           Dist::single_outlier, Dist::all_zero, Dist::wide_range};

// Values of the distribution times `scale`, kept finite.
std::vector<float> make_tensor(std::mt19937_64& rng, int64_t rows, int64_t cols, Dist d, float scale) {
  std::vector<float> x(static_cast<size_t>(rows * cols));
  std::normal_distribution<float> normal;
  std::student_t_distribution<float> student(2.0f);
  std::cauchy_distribution<float> cauchy;
  std::uniform_real_distribution<float> uni(-30.0f, 30.0f);
  auto finite = [](float v) { return std::isfinite(v) ? v : 0.0f; };
  for (auto& v : x) {
    switch (d) {
      case Dist::normal:
      case Dist::zero_blocks:
      case Dist::single_outlier: v = normal(rng) * scale; break;
      case Dist::student_t: v = finite(student(rng) * scale); break;
      case Dist::cauchy: v = finite(cauchy(rng) * scale); break;
      case Dist::all_zero: v = 0.0f; break;
      case Dist::wide_range: v = finite(normal(rng) * std::pow(10.0f, uni(rng) / 3.0f) * scale); break;
    }
  }
  if (d == Dist::zero_blocks) {
    std::bernoulli_distribution zero(0.3);
    for (size_t b = 0; b + 16 <= x.size(); b += 16)
      if (zero(rng))
        for (int k = 0; k < 16; ++k) x[b + k] = (k % 5 == 0) ? -0.0f : 0.0f;
  }
  if (d == Dist::single_outlier) {
    std::uniform_int_distribution<size_t> where(0, x.size() - 1);
    x[where(rng)] = finite(scale * 1e4f * (rng() & 1 ? 1.0f : -1.0f));
  }
  return x;
}

struct Case {
  std::string name;
  QuantOptions opt;
};

std::vector<Case> all_options() {
  std::vector<Case> cases;
  int four_over_six_case = 0;  // cycles through the error measures and E4M3 ceilings
  for (bool tile : {false, true})
    for (bool sr : {false, true})
      for (bool rht : {false, true})
        for (bool fos : {false, true}) {
          QuantOptions o;
          o.format = Format::nvfp4;
          o.tile_16x16 = tile;
          o.rounding = sr ? Rounding::stochastic : Rounding::nearest;
          o.seed = 0x1234567890ABCDEFull;
          o.offset = 12345;  // not a multiple of 16: every block takes SR bytes of two Philox outputs
          o.rht = rht;
          o.four_over_six = fos;
          std::string fos_name;
          if (fos) {
            const int k = four_over_six_case++;
            o.four_over_six_error = (k & 1) ? FourOverSixError::mse : FourOverSixError::mae;
            o.four_over_six_e4m3_max = (k & 2) ? 256 : 448;
            fos_name = std::string(" 4/6 ") + std::string(to_string(o.four_over_six_error)) + " " +
                       std::to_string(o.four_over_six_e4m3_max);
          }
          cases.push_back({std::string("nvfp4 ") + (tile ? "16x16" : "1x16") + (sr ? " sr" : " rn") + (rht ? " rht" : "") +
                               fos_name,
                           o});
        }
  for (bool sr : {false, true}) {
    QuantOptions o;
    o.format = Format::mxfp4;
    o.rounding = sr ? Rounding::stochastic : Rounding::nearest;
    o.seed = 99;
    o.offset = 7;
    cases.push_back({sr ? "mxfp4 sr" : "mxfp4 rn", o});
  }
  for (Format f : {Format::mxfp8, Format::fp8_e4m3, Format::fp8_e5m2}) {
    QuantOptions o;
    o.format = f;
    cases.push_back({std::string(to_string(f)), o});
  }
  return cases;
}

bool same_floats(std::span<const float> a, std::span<const float> b, size_t* first_diff) {
  if (a.size() != b.size()) return *first_diff = 0, false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i])) return *first_diff = i, false;
  return true;
}

// Every field of the two tensors, the first differing byte named.
::testing::AssertionResult same_tensor(const QuantizedTensor& want, const QuantizedTensor& got) {
  auto fail = [&](const std::string& what) { return ::testing::AssertionFailure() << what; };
  if (want.format != got.format || want.block != got.block || want.rounding != got.rounding || want.rht != got.rht ||
      want.four_over_six != got.four_over_six || want.four_over_six_error != got.four_over_six_error ||
      want.four_over_six_e4m3_max != got.four_over_six_e4m3_max || want.row_scaled != got.row_scaled ||
      want.rows != got.rows || want.cols != got.cols)
    return fail("header differs");
  size_t at = 0;
  if (!same_floats(want.row_amax, got.row_amax, &at)) return fail("row amax " + std::to_string(at) + " differs");
  if (!same_floats(want.row_decode_scale, got.row_decode_scale, &at))
    return fail("row decode scale " + std::to_string(at) + " differs");
  if (std::bit_cast<uint32_t>(want.amax) != std::bit_cast<uint32_t>(got.amax))
    return fail("amax " + std::to_string(want.amax) + " vs " + std::to_string(got.amax));
  if (std::bit_cast<uint32_t>(want.decode_scale) != std::bit_cast<uint32_t>(got.decode_scale))
    return fail("decode_scale differs");
  if (want.codes.size() != got.codes.size() || want.scales.size() != got.scales.size()) return fail("sizes differ");
  for (size_t i = 0; i < want.codes.size(); ++i)
    if (want.codes[i] != got.codes[i])
      return fail("code byte " + std::to_string(i) + ": ref " + std::to_string(want.codes[i]) + ", fast " +
                  std::to_string(got.codes[i]));
  for (size_t i = 0; i < want.scales.size(); ++i)
    if (want.scales[i] != got.scales[i])
      return fail("scale byte " + std::to_string(i) + ": ref " + std::to_string(want.scales[i]) + ", fast " +
                  std::to_string(got.scales[i]));
  return ::testing::AssertionSuccess();
}

// The error message of f(), or nullopt if it did not throw UsageError.
template <class F>
std::optional<std::string> usage_error_of(F&& f) {
  try {
    f();
  } catch (const UsageError& e) {
    return std::string(e.what());
  }
  return std::nullopt;
}

// Quantize (and dequantize) with the reference and with every variant; everything must match.
void check_all_variants(const std::vector<float>& x, int64_t rows, int64_t cols, const Case& c, const std::string& what) {
  SCOPED_TRACE(what + ", " + c.name + ", " + seed_note());
  std::optional<QuantizedTensor> want;
  auto ref_error = usage_error_of([&] { want = ref::quantize(x, rows, cols, c.opt); });
  std::vector<float> want_deq;
  if (want) {
    want_deq.resize(x.size());
    ref::dequantize(*want, want_deq);
  }
  for (const Variant& v : variants()) {
    SCOPED_TRACE(v.name());
    UseVariant use(v);
    std::optional<QuantizedTensor> got;
    auto error = usage_error_of([&] { got = cpu::quantize(x, rows, cols, c.opt); });
    ASSERT_EQ(ref_error, error);
    if (!want) continue;
    ASSERT_TRUE(same_tensor(*want, *got));
    // quantize_into must overwrite whatever a previous, differently shaped result left behind.
    static QuantizedTensor reused;
    std::fill(reused.codes.begin(), reused.codes.end(), uint8_t{0xA5});
    std::fill(reused.scales.begin(), reused.scales.end(), uint8_t{0x5A});
    cpu::quantize_into(x, rows, cols, c.opt, reused);
    ASSERT_TRUE(same_tensor(*want, reused)) << "quantize_into";
    std::vector<float> deq(x.size());
    cpu::dequantize(*want, deq);
    size_t at = 0;
    ASSERT_TRUE(same_floats(want_deq, deq, &at)) << "dequantized value " << at << ": ref " << want_deq[at] << ", fast "
                                                 << deq[at];
  }
}

float random_scale(std::mt19937_64& rng) {
  std::uniform_real_distribution<float> e(-30.0f, 30.0f);
  return std::pow(10.0f, e(rng));
}

}  // namespace

TEST(QuantizeFast, ReportsVariants) {
  std::string names;
  for (const Variant& v : variants()) names += v.name() + " ";
  std::printf("variants under test: %s\n%s\n", names.c_str(), seed_note().c_str());
  EXPECT_FALSE(variants().empty());
}

TEST(QuantizeFast, SmallShapesEveryOptionEveryDistribution) {
  std::mt19937_64 rng(test_seed());
  const auto cases = all_options();
  const int64_t row_choices[] = {1, 2, 3, 5, 15, 16, 17, 31, 32, 33, 48, 67};
  const int64_t col_choices[] = {32, 64, 96, 160, 256, 480, 1024};
  for (Dist d : kDists) {
    for (int trial = 0; trial < 4; ++trial) {
      int64_t rows = row_choices[rng() % std::size(row_choices)];
      int64_t cols = col_choices[rng() % std::size(col_choices)];
      float scale = random_scale(rng);
      auto x = make_tensor(rng, rows, cols, d, scale);
      for (const Case& c : cases)
        check_all_variants(x, rows, cols, c,
                           std::string(name_of(d)) + " [" + std::to_string(rows) + "x" + std::to_string(cols) +
                               "] scale " + std::to_string(scale));
      if (HasFatalFailure()) return;
    }
  }
}

TEST(QuantizeFast, NarrowNvfp4Rows) {
  // cols = 16: one block per row; 48: an odd number of blocks per row.
  std::mt19937_64 rng(test_seed() + 1);
  for (int64_t cols : {16, 48})
    for (int64_t rows : {1, 7, 16, 67}) {
      auto x = make_tensor(rng, rows, cols, Dist::wide_range, random_scale(rng));
      for (const Case& c : all_options())
        if (c.opt.format == Format::nvfp4)
          check_all_variants(x, rows, cols, c, "[" + std::to_string(rows) + "x" + std::to_string(cols) + "]");
    }
}

TEST(QuantizeFast, LargeTensorsSplitAcrossThreads) {
  // Above the single-thread cut-off, so the 2-thread variants really split the work.
  std::mt19937_64 rng(test_seed() + 2);
  const auto cases = all_options();
  const std::pair<int64_t, int64_t> shapes[] = {{67, 1024}, {256, 2048}, {1000, 96}};
  for (auto [rows, cols] : shapes) {
    Dist d = kDists[rng() % std::size(kDists)];
    auto x = make_tensor(rng, rows, cols, d, random_scale(rng));
    for (const Case& c : cases)
      check_all_variants(x, rows, cols, c,
                         std::string(name_of(d)) + " [" + std::to_string(rows) + "x" + std::to_string(cols) + "]");
    if (HasFatalFailure()) return;
  }
}

TEST(QuantizeFast, StochasticRoundingSameBitsForAnyThreadCountAndOffset) {
  std::mt19937_64 rng(test_seed() + 3);
  const int64_t rows = 512, cols = 1024;
  auto x = make_tensor(rng, rows, cols, Dist::normal, 1.0f);
  // Offsets off a multiple of 16 (blocks straddle Philox outputs), a counter whose low word wraps
  // (2^36 - 37: counter 2^32 - 3), and positions wrapping past 2^64.
  for (uint64_t offset : {uint64_t{0}, uint64_t{1}, uint64_t{3}, uint64_t{15}, uint64_t{16}, uint64_t{17},
                          (uint64_t{1} << 32) - 5, (uint64_t{1} << 36) - 37, uint64_t{0xFFFFFFFFFFF0ull},
                          ~uint64_t{0} - 300000}) {
    QuantOptions o;
    o.rounding = Rounding::stochastic;
    o.seed = rng();
    o.offset = offset;
    o.rht = offset & 1;
    check_all_variants(x, rows, cols, {"nvfp4 sr offset " + std::to_string(offset), o}, "normal [512x1024]");
    o.format = Format::mxfp4;
    o.rht = false;
    check_all_variants(x, rows, cols, {"mxfp4 sr offset " + std::to_string(offset), o}, "normal [512x1024]");
  }
}

TEST(QuantizeFast, StochasticRoundingEveryOffsetResidue) {
  // Every offset mod 16 on a tensor whose block count is not a multiple of 16 and that the
  // 2-thread variants split into two ranges (so each thread's first block starts off a counter
  // boundary too), for every SR option: the fast paths' batched Philox must give each element the
  // reference's byte.
  std::mt19937_64 rng(test_seed() + 9);
  const int64_t rows = 700, cols = 112;  // 4900 blocks, 78400 values
  auto x = make_tensor(rng, rows, cols, Dist::student_t, random_scale(rng));
  const uint64_t base = rng() & ~uint64_t{15};
  for (uint64_t r = 0; r < 16; ++r) {
    for (int variant = 0; variant < 5; ++variant) {
      QuantOptions o;
      o.rounding = Rounding::stochastic;
      o.seed = rng();
      o.offset = base + r;
      o.rht = variant == 1 || variant == 3;
      o.four_over_six = variant == 3;
      o.tile_16x16 = variant == 2 && r % 4 == 0;  // tiles need rows % 16 == 0 only for the transpose
      if (variant == 4) o.format = Format::mxfp4;
      check_all_variants(x, rows, cols, {"sr offset residue " + std::to_string(r) + " variant " + std::to_string(variant), o},
                         "student-t [700x112]");
      if (HasFatalFailure()) return;
    }
  }
}

TEST(QuantizeFast, StochasticRoundingOnAndAroundEveryGridPoint) {
  // Tensor amax 2688 gives S_enc = 1, and a block whose maximum is 6 gets scale 1.0 and element
  // multiplier 1: its values reach the encoders unchanged. Fill such blocks with every E2M1 grid
  // point, its float neighbours, the midpoints and random values in each grid interval (both signs,
  // zeros, subnormals, values past 6), so the SR encoders' interval lookup, exact fractions and
  // saturation are compared with the reference where it matters.
  std::vector<float> values;
  static constexpr float kGrid[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (int g = 0; g < 8; ++g) {
    for (float v : {kGrid[g], std::nextafter(kGrid[g], 0.0f), std::nextafter(kGrid[g], 10.0f)}) values.push_back(v);
    if (g < 7) {
      const float lo = kGrid[g], hi = kGrid[g + 1];
      for (int s = 1; s < 64; ++s) values.push_back(lo + (hi - lo) * static_cast<float>(s) / 64.0f);
    }
  }
  for (float v : {0.124999f, 0.125f, 0.126f, 1e-30f, 1e-40f, 5.9999995f})
    values.push_back(v);
  std::mt19937_64 rng(test_seed() + 10);
  std::uniform_real_distribution<float> in(0.0f, 6.0f);
  for (int i = 0; i < 2000; ++i) values.push_back(in(rng));
  std::vector<float> x;
  for (size_t i = 0; i < values.size(); ++i) {
    if (x.size() % 16 == 0) x.push_back(6.0f);  // the block maximum
    x.push_back((i & 1) ? -values[i] : values[i]);
  }
  while (x.size() % 64 != 0) x.push_back(0.0f);
  x.insert(x.end(), 64, 0.0f);
  x[x.size() - 64] = 2688.0f;  // the tensor amax, in a block of its own
  const int64_t cols = 64, rows = static_cast<int64_t>(x.size()) / cols;
  for (uint64_t offset : {uint64_t{0}, uint64_t{5}, uint64_t{16 * 12345 + 11}}) {
    QuantOptions o;
    o.rounding = Rounding::stochastic;
    o.seed = rng();
    o.offset = offset;
    check_all_variants(x, rows, cols, {"nvfp4 sr grid sweep, offset " + std::to_string(offset), o}, "grid sweep");
    o.four_over_six = true;
    check_all_variants(x, rows, cols, {"nvfp4 sr 4/6 grid sweep, offset " + std::to_string(offset), o}, "grid sweep");
  }
  auto q = ref::quantize(x, rows, cols, {.rounding = Rounding::stochastic});
  EXPECT_EQ(q.decode_scale, 1.0f);
  EXPECT_EQ(q.scales[0], 0x38);  // scale 1.0: the values were encoded as they are
}

TEST(QuantizeFast, BlockScaleTiesAndSubnormals) {
  // Global amax 448 makes S_enc * (1/6) exactly 1, so the block scale is the block amax itself:
  // put block maxima on every E4M3 value, every midpoint between neighbours (ties to even) and
  // just either side of them, including the subnormal scales and values beyond 448.
  std::vector<float> maxima;
  for (int c = 0; c < 0x7F; ++c) {
    float v = e4m3_decode(static_cast<uint8_t>(c)), next = e4m3_decode(static_cast<uint8_t>(c + 1));
    float mid = c + 1 < 0x7F ? (v + next) / 2 : 456.0f;
    for (float m : {v, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f)}) maxima.push_back(m);
  }
  maxima.push_back(464.0f);
  maxima.push_back(1e-12f);
  const int64_t blocks = static_cast<int64_t>(maxima.size()) + 1, cols = 16 * 4;
  const int64_t rows = (blocks + 3) / 4;
  std::vector<float> x(static_cast<size_t>(rows * cols), 0.0f);
  std::mt19937_64 rng(test_seed() + 4);
  std::uniform_real_distribution<float> frac(-1.0f, 1.0f);
  x[0] = 448.0f;
  for (size_t b = 0; b < maxima.size(); ++b) {
    float* block = x.data() + (b + 1) * 16;
    for (int k = 0; k < 16; ++k) block[k] = maxima[b] * frac(rng);
    block[rng() % 16] = (rng() & 1) ? maxima[b] : -maxima[b];
  }
  for (const Case& c : all_options())
    if (c.opt.format == Format::nvfp4 && !c.opt.rht && !c.opt.tile_16x16) check_all_variants(x, rows, cols, c, "scale sweep");
}

TEST(QuantizeFast, ExtremeValuesNearFloatMax) {
  // Values near FLT_MAX: the RHT overflows to Inf and Inf - Inf gives NaN, which the reference's
  // amax ignores and its encoders map in a fixed way; the fast paths must agree even then.
  std::mt19937_64 rng(test_seed() + 5);
  std::uniform_real_distribution<float> u(-3.4e38f, 3.4e38f);
  std::vector<float> x(64 * 64);
  for (auto& v : x) v = u(rng);
  for (const Case& c : all_options()) check_all_variants(x, 64, 64, c, "near FLT_MAX");
  // And tiny ones: subnormal inputs, amax subnormal (S_enc clamps to FLT_MAX).
  for (auto& v : x) v = std::ldexp(u(rng) / 3.4e38f, -126);  // |v| < 2^-126
  for (const Case& c : all_options()) check_all_variants(x, 64, 64, c, "subnormal");
}

TEST(QuantizeFast, NonFiniteInputNamesTheSameFirstIndex) {
  std::mt19937_64 rng(test_seed() + 6);
  const float bad_values[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                              -std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::quiet_NaN()};
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{3, 64}, {300, 512}}) {
    auto clean = make_tensor(rng, rows, cols, Dist::normal, 1.0f);
    for (const Case& c : all_options()) {
      for (int trial = 0; trial < 3; ++trial) {
        auto x = clean;
        size_t first = rng() % x.size(), second = first + rng() % (x.size() - first);
        x[second] = bad_values[rng() % 4];
        x[first] = bad_values[rng() % 4];
        auto want = usage_error_of([&] { ref::quantize(x, rows, cols, c.opt); });
        ASSERT_TRUE(want.has_value());
        EXPECT_THROW(cpu::quantize(x, rows, cols, c.opt), NumericalError) << c.name;
        for (const Variant& v : variants()) {
          UseVariant use(v);
          auto got = usage_error_of([&] { cpu::quantize(x, rows, cols, c.opt); });
          ASSERT_EQ(want, got) << c.name << " " << v.name() << " " << seed_note();
          auto want_t = usage_error_of([&] { ref::quantize_transposed(x, rows, cols, c.opt); });
          auto got_t = usage_error_of([&] { cpu::quantize_transposed(x, rows, cols, c.opt); });
          ASSERT_EQ(want_t, got_t) << c.name << " transposed " << v.name() << " " << seed_note();
        }
      }
    }
  }
}

TEST(QuantizeFast, BadShapesAndOptionsGiveTheReferenceMessage) {
  std::vector<float> x(48 * 20, 1.0f);
  struct Bad {
    int64_t rows, cols;
    QuantOptions opt;
  };
  QuantOptions mx;
  mx.format = Format::mxfp4;
  QuantOptions fp8_sr;
  fp8_sr.format = Format::fp8_e4m3;
  fp8_sr.rounding = Rounding::stochastic;
  QuantOptions mx_rht = mx;
  mx_rht.rht = true;
  QuantOptions tile;
  tile.tile_16x16 = true;
  QuantOptions ceiling;
  ceiling.four_over_six = true;
  ceiling.four_over_six_e4m3_max = 300;  // neither 448 nor 256
  const Bad bad[] = {{48, 20, {}},     {20, 48, mx},     {0, 48, {}},    {48, 21, {}}, {48, 20, fp8_sr},
                     {20, 48, mx_rht}, {30, 32, tile},   {16, 32, ceiling}};
  for (const Bad& b : bad) {
    std::vector<float> in(x.begin(), x.begin() + std::max<int64_t>(0, std::min<int64_t>(x.size(), b.rows * b.cols)));
    auto want = usage_error_of([&] { ref::quantize(in, b.rows, b.cols, b.opt); });
    auto got = usage_error_of([&] { cpu::quantize(in, b.rows, b.cols, b.opt); });
    if (b.opt.four_over_six) {
      EXPECT_TRUE(want.has_value());  // the bad ceiling is refused
    }
    EXPECT_EQ(want, got);
    auto want_t = usage_error_of([&] { ref::quantize_transposed(in, b.rows, b.cols, b.opt); });
    auto got_t = usage_error_of([&] { cpu::quantize_transposed(in, b.rows, b.cols, b.opt); });
    EXPECT_EQ(want_t, got_t);
  }
}

TEST(QuantizeFast, TransposedCopyMatchesReference) {
  std::mt19937_64 rng(test_seed() + 7);
  const std::pair<int64_t, int64_t> shapes[] = {{32, 64}, {48, 160}, {96, 32}, {17, 64}, {64, 1024}, {320, 256}, {48, 100}, {33, 77}};
  for (auto [rows, cols] : shapes) {
    auto x = make_tensor(rng, rows, cols, kDists[rng() % std::size(kDists)], random_scale(rng));
    for (const Case& c : all_options()) {
      SCOPED_TRACE(c.name + " [" + std::to_string(rows) + "x" + std::to_string(cols) + "] " + seed_note());
      std::optional<QuantizedTensor> want;
      auto want_error = usage_error_of([&] { want = ref::quantize_transposed(x, rows, cols, c.opt); });
      for (const Variant& v : variants()) {
        UseVariant use(v);
        std::optional<QuantizedTensor> got;
        auto error = usage_error_of([&] { got = cpu::quantize_transposed(x, rows, cols, c.opt); });
        ASSERT_EQ(want_error, error) << v.name();
        if (want) {
          ASSERT_TRUE(same_tensor(*want, *got)) << v.name();
        }
      }
    }
  }
}

// distributed.fp4_param_gather's pieces: rows [16 a, 16 b) of a weight quantized with the whole
// weight's amax are the whole quantization's codes and scales of those rows (16x16 tiles and 1x16
// blocks, every kernel variant), including a last band of fewer than 16 rows; options whose bytes
// depend on more than the global amax are refused, and so is an amax below the rows' own.
TEST(QuantizeFast, RowsOfATensorWithItsAmaxAreThatTensorsBytes) {
  std::mt19937_64 rng(test_seed() + 11);
  const std::pair<int64_t, int64_t> shapes[] = {{64, 64}, {96, 160}, {40, 32}, {48, 1024}};
  for (auto [rows, cols] : shapes) {
    const auto x = make_tensor(rng, rows, cols, kDists[rng() % std::size(kDists)], random_scale(rng));
    for (bool tiles : {true, false}) {
      QuantOptions o;
      o.tile_16x16 = tiles;
      const QuantizedTensor whole = ref::quantize(x, rows, cols, o);
      const int64_t bands = (rows + 15) / 16, a = static_cast<int64_t>(rng() % bands);
      const int64_t b = a + 1 + static_cast<int64_t>(rng() % (bands - a));
      const int64_t r0 = 16 * a, r1 = std::min(rows, 16 * b);
      SCOPED_TRACE("[" + std::to_string(rows) + "x" + std::to_string(cols) + "] rows [" + std::to_string(r0) + ", " +
                   std::to_string(r1) + ") " + (tiles ? "16x16" : "1x16") + " " + seed_note());
      for (const Variant& v : variants()) {
        UseVariant use(v);
        QuantizedTensor part;
        cpu::quantize_rows_of_into(std::span<const float>(x).subspan(static_cast<size_t>(r0 * cols),
                                                                     static_cast<size_t>((r1 - r0) * cols)),
                                   r1 - r0, cols, o,
                                   whole.amax, part);
        ASSERT_EQ(part.rows, r1 - r0) << v.name();
        ASSERT_EQ(part.amax, whole.amax) << v.name();
        ASSERT_EQ(part.decode_scale, whole.decode_scale) << v.name();
        ASSERT_TRUE(std::equal(part.codes.begin(), part.codes.end(), whole.codes.begin() + r0 * cols / 2)) << v.name();
        ASSERT_TRUE(std::equal(part.scales.begin(), part.scales.end(), whole.scales.begin() + r0 * cols / 16)) << v.name();
      }
    }
  }
  const std::vector<float> x(32 * 32, 0.5f);
  QuantizedTensor q;
  QuantOptions rht;
  rht.rht = true;
  EXPECT_THROW(cpu::quantize_rows_of_into(x, 32, 32, rht, 0.5f, q), UsageError);
  QuantOptions sr;
  sr.rounding = Rounding::stochastic;
  EXPECT_THROW(cpu::quantize_rows_of_into(x, 32, 32, sr, 0.5f, q), UsageError);
  EXPECT_DEATH(cpu::quantize_rows_of_into(x, 32, 32, QuantOptions{}, 0.25f, q), "above the tensor amax");
}

TEST(QuantizeFast, BothOrientationsAtOnceMatchTheSeparateCalls) {
  // quantize_both_into takes the row-wise NVFP4 amax from the x^T pass: the bytes must be those of
  // the two separate quantizations, for the recipe's pairs (fprop X / wgrad X^T, dgrad dY / wgrad dY^T)
  // and with the RHT off.
  std::mt19937_64 rng(test_seed() + 17);
  QuantOptions x_row{.format = Format::nvfp4}, x_t{.format = Format::nvfp4, .rht = true};
  QuantOptions dy_row{.format = Format::nvfp4, .rounding = Rounding::stochastic, .seed = 9};
  QuantOptions dy_t{.format = Format::nvfp4, .rounding = Rounding::stochastic, .seed = 10, .rht = true};
  QuantOptions plain_t{.format = Format::nvfp4};
  const std::pair<QuantOptions, QuantOptions> pairs[] = {{x_row, x_t}, {dy_row, dy_t}, {x_row, plain_t}};
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{64, 1024}, {320, 48}, {48, 112}}) {
    auto x = make_tensor(rng, rows, cols, Dist::student_t, random_scale(rng));
    for (const auto& [row_opt, t_opt] : pairs)
      for (const Variant& v : variants()) {
        UseVariant use(v);
        SCOPED_TRACE(v.name() + " [" + std::to_string(rows) + "x" + std::to_string(cols) + "] " + seed_note());
        QuantizedTensor row, t;
        cpu::quantize_both_into(x, rows, cols, row_opt, row, t_opt, t);
        ASSERT_TRUE(same_tensor(cpu::quantize(x, rows, cols, row_opt), row));
        ASSERT_TRUE(same_tensor(cpu::quantize_transposed(x, rows, cols, t_opt), t));
      }
  }
}

TEST(QuantizeFast, BothOrientationsInOnePassMatchTheReferenceOnThreadedShapes) {
  // quantize_both_into encodes the row-wise blocks in x^T's encode pass, chunk by chunk of x^T's
  // panels (16 columns x 256 tokens) or strips (64 columns x 256 tokens). Shapes large enough to
  // thread, whose token count is not a multiple of 256 and whose column groups do not divide into
  // whole chunks (a chunk then spans two token batches), against the reference quantizer of each
  // orientation, byte for byte, on every ISA with 1, 2 and 3 threads; row-wise Four Over Six too,
  // and a stale, larger row-wise tensor whose buffers are reused.
  std::mt19937_64 rng(test_seed() + 19);
  QuantOptions x_row{.format = Format::nvfp4}, x_t{.format = Format::nvfp4, .rht = true};
  QuantOptions dy_row{.format = Format::nvfp4, .rounding = Rounding::stochastic, .seed = 9, .offset = 5};
  QuantOptions dy_t{.format = Format::nvfp4, .rounding = Rounding::stochastic, .seed = 10, .rht = true};
  QuantOptions plain_t{.format = Format::nvfp4, .rounding = Rounding::stochastic, .seed = 3};
  QuantOptions four_six{.format = Format::nvfp4, .four_over_six = true};
  const std::pair<QuantOptions, QuantOptions> pairs[] = {{x_row, x_t}, {dy_row, dy_t}, {four_six, plain_t}};
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{528, 400}, {272, 272}, {784, 112}}) {
    auto x = make_tensor(rng, rows, cols, Dist::student_t, random_scale(rng));
    for (const auto& [row_opt, t_opt] : pairs) {
      const QuantizedTensor want_row = ref::quantize(x, rows, cols, row_opt);
      const QuantizedTensor want_t = ref::quantize_transposed(x, rows, cols, t_opt);
      for (Variant v : variants()) {
        for (int threads : {v.threads, 3}) {
          if (threads == 3 && v.threads != 2) continue;  // one 3-thread run per ISA
          v.threads = threads;
          UseVariant use(v);
          SCOPED_TRACE(v.name() + " [" + std::to_string(rows) + "x" + std::to_string(cols) + "] " + seed_note());
          QuantizedTensor row = cpu::quantize(std::vector<float>(2 * rows * cols, 1.0f), 2 * rows, cols, x_row), t;
          cpu::quantize_both_into(x, rows, cols, row_opt, row, t_opt, t);
          ASSERT_TRUE(same_tensor(want_row, row));
          ASSERT_TRUE(same_tensor(want_t, t));
        }
      }
    }
  }
}

// A producer's gather (gather_source_amax), 16-row stripes in a shuffled order folded into a few
// parts and merged, as the threads of RMSNorm or SwiGLU would.
SourceAmax gather_in_shuffled_stripes(const std::vector<float>& x, int64_t rows, int64_t cols, bool rht,
                                      std::mt19937_64& rng) {
  std::vector<int64_t> stripes;
  for (int64_t r = 0; r < rows; r += 16) stripes.push_back(r);
  std::shuffle(stripes.begin(), stripes.end(), rng);
  SourceAmax parts[3], all;
  all.rht = rht;
  for (SourceAmax& p : parts) p.rht = rht;
  for (size_t i = 0; i < stripes.size(); ++i)
    cpu::gather_source_amax(x.data(), cols, stripes[i], std::min(rows, stripes[i] + 16), parts[i % 3]);
  for (const SourceAmax& p : parts) cpu::merge_source_amax(p, all);
  return all;
}

TEST(QuantizeFast, ProducerGatheredAmaxGivesTheReferenceBytes) {
  // quantize_both_into with the amaxes a producer gathered (16-row stripes in any order, any
  // thread) skips its amax pass and must still give the reference's bytes of both copies, on every
  // ISA with 1, 2 and 3 threads. The gathered values are the ones it encodes with: doubled, the
  // bytes change (so the test would see a gather the quantizer ignored, or one it misread). A
  // non-finite input is reported as without a gather.
  std::mt19937_64 rng(test_seed() + 29);
  QuantOptions x_row{.format = Format::nvfp4}, x_t{.format = Format::nvfp4, .rht = true};
  QuantOptions dy_row{.format = Format::nvfp4, .rounding = Rounding::stochastic, .seed = 9};
  QuantOptions plain_t{.format = Format::nvfp4};
  const std::pair<QuantOptions, QuantOptions> pairs[] = {{x_row, x_t}, {dy_row, plain_t}};
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{528, 400}, {64, 96}}) {
    auto x = make_tensor(rng, rows, cols, Dist::student_t, random_scale(rng));
    for (const auto& [row_opt, t_opt] : pairs) {
      const QuantizedTensor want_row = ref::quantize(x, rows, cols, row_opt);
      const QuantizedTensor want_t = ref::quantize_transposed(x, rows, cols, t_opt);
      for (Variant v : variants()) {
        for (int threads : {v.threads, 3}) {
          if (threads == 3 && v.threads != 2) continue;
          v.threads = threads;
          UseVariant use(v);
          SCOPED_TRACE(v.name() + " [" + std::to_string(rows) + "x" + std::to_string(cols) + "] " + seed_note());
          const SourceAmax known = gather_in_shuffled_stripes(x, rows, cols, t_opt.rht, rng);
          ASSERT_TRUE(known.valid);
          QuantizedTensor row, t;
          cpu::quantize_both_into(x, rows, cols, row_opt, row, t_opt, t, &known);
          ASSERT_TRUE(same_tensor(want_row, row));
          ASSERT_TRUE(same_tensor(want_t, t));
          SourceAmax doubled = known;
          doubled.max_abs_bits += 0x00800000u;  // x2: one more in the exponent
          doubled.transposed_rht_amax *= 2;
          cpu::quantize_both_into(x, rows, cols, row_opt, row, t_opt, t, &doubled);
          EXPECT_NE(want_row.scales, row.scales);
          EXPECT_NE(want_t.scales, t.scales);
        }
      }
    }
  }
  // An Inf: the gather says so, and quantize_both reports it as it does without one.
  auto x = make_tensor(rng, 64, 96, Dist::normal, 1.0f);
  x[777] = std::numeric_limits<float>::infinity();
  const SourceAmax known = gather_in_shuffled_stripes(x, 64, 96, true, rng);
  EXPECT_GE(known.max_abs_bits, 0x7F800000u);
  auto message_of = [&](const SourceAmax* k) {
    QuantizedTensor row, t;
    try {
      cpu::quantize_both_into(x, 64, 96, x_row, row, x_t, t, k);
    } catch (const NumericalError& e) {
      return std::string(e.what());
    }
    return std::string("no NumericalError");
  };
  EXPECT_EQ(message_of(nullptr), message_of(&known));
  EXPECT_NE(message_of(nullptr), "no NumericalError");
}

TEST(QuantizeFast, FourOverSixEveryMeasureCeilingAndRoute) {
  // Four Over Six through every CPU route (row-wise 1x16 blocks and 16x16 tiles, the transposed
  // copy: tile transpose, the strip path and the generic one, quantize_both_into) for both error
  // measures and both ceilings, on fresh random tensors, against the reference byte for byte; and
  // with tiles every tile holds one scale.
  std::mt19937_64 rng(test_seed() + 23);
  const std::pair<int64_t, int64_t> shapes[] = {{64, 96}, {48, 1024}, {33, 64}, {320, 48}};
  for (auto [rows, cols] : shapes) {
    const Dist d = kDists[rng() % std::size(kDists)];
    auto x = make_tensor(rng, rows, cols, d, random_scale(rng));
    for (FourOverSixError e : {FourOverSixError::mae, FourOverSixError::mse})
      for (int ceiling : {448, 256})
        for (bool tile : {false, true})
          for (bool sr : {false, true})
            for (bool rht : {false, true}) {
              QuantOptions o;
              o.tile_16x16 = tile;
              o.rounding = sr ? Rounding::stochastic : Rounding::nearest;
              o.seed = rng();
              o.offset = rng() % 1000;
              o.rht = rht;
              o.four_over_six = true;
              o.four_over_six_error = e;
              o.four_over_six_e4m3_max = ceiling;
              const std::string name = std::string(name_of(d)) + " [" + std::to_string(rows) + "x" + std::to_string(cols) +
                                       "] " + (tile ? "16x16" : "1x16") + (sr ? " sr" : " rn") + (rht ? " rht " : " ") +
                                       std::string(to_string(e)) + " " + std::to_string(ceiling);
              check_all_variants(x, rows, cols, {name, o}, "four over six");
              if (HasFatalFailure()) return;
              SCOPED_TRACE(name + ", " + seed_note());
              const QuantizedTensor want_rows = ref::quantize(x, rows, cols, o);
              if (tile) {
                for (int64_t r = 0; r < rows; ++r)
                  for (int64_t b = 0; b < cols / 16; ++b)
                    ASSERT_EQ(want_rows.scales[r * (cols / 16) + b], want_rows.scales[(r / 16 * 16) * (cols / 16) + b]);
              }
              std::optional<QuantizedTensor> want_t;
              auto want_error = usage_error_of([&] { want_t = ref::quantize_transposed(x, rows, cols, o); });
              for (const Variant& v : variants()) {
                UseVariant use(v);
                std::optional<QuantizedTensor> got_t;
                auto error = usage_error_of([&] { got_t = cpu::quantize_transposed(x, rows, cols, o); });
                ASSERT_EQ(want_error, error) << v.name();
                if (!want_t) continue;
                ASSERT_TRUE(same_tensor(*want_t, *got_t)) << v.name() << " transposed";
                QuantizedTensor row, t;
                cpu::quantize_both_into(x, rows, cols, o, row, o, t);
                ASSERT_TRUE(same_tensor(want_rows, row)) << v.name() << " both, row-wise";
                ASSERT_TRUE(same_tensor(*want_t, t)) << v.name() << " both, transposed";
              }
            }
  }
}

TEST(QuantizeFast, Bf16InputMatchesReference) {
  std::mt19937_64 rng(test_seed() + 8);
  const int64_t rows = 70, cols = 1024;
  auto f = make_tensor(rng, rows, cols, Dist::student_t, random_scale(rng));
  std::vector<bf16> x(f.size());
  for (size_t i = 0; i < f.size(); ++i) x[i] = bf16_from_float_rn(f[i]);
  for (const Case& c : all_options()) {
    auto want = ref::quantize(std::span<const bf16>(x), rows, cols, c.opt);
    for (const Variant& v : variants()) {
      UseVariant use(v);
      ASSERT_TRUE(same_tensor(want, cpu::quantize(std::span<const bf16>(x), rows, cols, c.opt)))
          << c.name << " " << v.name() << " " << seed_note();
    }
  }
}

TEST(QuantizeFast, SpecExamplesThroughTheFastPath) {
  // The spec's worked examples, byte for byte, on every variant (also pinned in test_quantize_ref).
  std::vector<float> x = {0, .25f, .5f, .75f, 1, 1.25f, 1.5f, 1.75f, 2, 2.5f, 3, 3.5f, 4, 5, 6, -6};
  for (const Variant& v : variants()) {
    UseVariant use(v);
    auto q = cpu::quantize(x, 1, 16, {});
    EXPECT_EQ(q.scales[0], 0x7E) << v.name();
    EXPECT_EQ(q.codes, (std::vector<uint8_t>{0x00, 0x21, 0x22, 0x43, 0x44, 0x65, 0x66, 0xF7})) << v.name();
    std::vector<float> zeros(64, 0.0f), d(64, 1.0f);
    auto z = cpu::quantize(zeros, 2, 32, {});
    EXPECT_EQ(z.decode_scale, 1.0f);
    cpu::dequantize(z, d);
    for (float f : d) EXPECT_EQ(f, 0.0f);
  }
}

// Row-scaled NVFP4 (TE's row_scaled_nvfp4): rows of very different magnitudes (10^-20 .. 10^20),
// all-zero rows and single outliers, row-wise, transposed (one scale per column of x: wgrad's X^T)
// and both at once, on every variant, against the reference; the refused options give the
// reference's message.
TEST(QuantizeFast, RowScaledEveryRouteMatchesReference) {
  std::mt19937_64 rng(test_seed() + 31);
  const QuantOptions row_scaled{.format = Format::nvfp4, .row_scaled = true};
  const std::pair<int64_t, int64_t> shapes[] = {{1, 16}, {7, 48}, {32, 64}, {48, 160}, {96, 32}, {256, 768}, {33, 80}};
  for (auto [rows, cols] : shapes) {
    auto x = make_tensor(rng, rows, cols, kDists[rng() % std::size(kDists)], 1.0f);
    // Every row its own magnitude (10^-20 .. 10^20, so that the widest distribution stays finite);
    // some rows all zero.
    std::uniform_real_distribution<float> decade(-20.0f, 20.0f);
    for (int64_t r = 0; r < rows; ++r) {
      const float row_scale = rng() % 5 == 0 ? 0.0f : std::pow(10.0f, decade(rng));
      for (int64_t c = 0; c < cols; ++c) x[r * cols + c] *= row_scale;
    }
    check_all_variants(x, rows, cols, {"nvfp4 1x16 rn row-scaled", row_scaled},
                       "[" + std::to_string(rows) + "x" + std::to_string(cols) + "]");
    if (rows % 16 != 0) continue;  // x^T needs whole blocks along the rows of x
    const QuantizedTensor want_t = ref::quantize_transposed(x, rows, cols, row_scaled);
    ASSERT_EQ(static_cast<int64_t>(want_t.row_amax.size()), cols);
    for (const Variant& v : variants()) {
      UseVariant use(v);
      SCOPED_TRACE(v.name() + " [" + std::to_string(rows) + "x" + std::to_string(cols) + "] " + seed_note());
      ASSERT_TRUE(same_tensor(want_t, cpu::quantize_transposed(x, rows, cols, row_scaled)));
      QuantizedTensor row, t;
      cpu::quantize_both_into(x, rows, cols, row_scaled, row, row_scaled, t);
      ASSERT_TRUE(same_tensor(ref::quantize(x, rows, cols, row_scaled), row));
      ASSERT_TRUE(same_tensor(want_t, t));
    }
  }
  // What Transformer Engine's row-scaled quantizer refuses, refused with the reference's message.
  auto x = make_tensor(rng, 32, 64, Dist::normal, 1.0f);
  for (QuantOptions o : {QuantOptions{.format = Format::nvfp4, .rht = true},
                         QuantOptions{.format = Format::nvfp4, .rounding = Rounding::stochastic},
                         QuantOptions{.format = Format::nvfp4, .tile_16x16 = true},
                         QuantOptions{.format = Format::nvfp4, .four_over_six = true},
                         QuantOptions{.format = Format::mxfp4}}) {
    o.row_scaled = true;
    const auto want = usage_error_of([&] { ref::quantize(x, 32, 64, o); });
    ASSERT_TRUE(want.has_value());
    EXPECT_NE(want->find("row-scaled"), std::string::npos) << *want;
    for (const Variant& v : variants()) {
      UseVariant use(v);
      EXPECT_EQ(want, usage_error_of([&] { cpu::quantize(x, 32, 64, o); })) << v.name();
    }
  }
}
