#include "format/quant_stats.h"

#include <cmath>
#include <limits>
#include <vector>

#include "format/codecs.h"
#include "format/hadamard.h"
#include "format/quantize.h"

namespace nibble {

QuantStats quant_stats(std::span<const float> x, const QuantizedTensor& q) {
  const int64_t n = q.rows * q.cols;
  NIBBLE_CHECK(static_cast<int64_t>(x.size()) == n, "quant_stats: %zu source values for a tensor of %lld", x.size(),
               static_cast<long long>(n));
  std::vector<float> domain(x.begin(), x.end());  // x in the quantized domain (transformed when rht)
  if (q.rht) rht_rows(x, q.rows, q.cols, domain, /*round_bf16=*/false);
  std::vector<float> deq(static_cast<size_t>(n));
  ref::dequantize_codes(q, deq);

  const float elem_max = (q.format == Format::nvfp4 || q.format == Format::mxfp4) ? kE2M1Max
                         : q.format == Format::fp8_e5m2                          ? kE5M2Max
                                                                                 : kE4M3Max;
  QuantStats s;
  s.count = n;
  s.amax = q.amax;
  double err2 = 0, ref2 = 0;
  const int64_t bl = q.block_len();
  for (int64_t i = 0; i < n; ++i) {
    double d = static_cast<double>(domain[i]) - deq[i];
    err2 += d * d;
    ref2 += static_cast<double>(domain[i]) * domain[i];
    if (domain[i] != 0.0f && deq[i] == 0.0f) ++s.flushed_to_zero;
    double block_scale = 1.0;
    switch (q.format) {
      case Format::nvfp4:
        block_scale = static_cast<double>(e4m3_decode(q.scales[i / bl])) * q.decode_scale_of_row(i / q.cols);
        break;
      case Format::mxfp4:
      case Format::mxfp8: block_scale = e8m0_decode(q.scales[i / bl]); break;
      default: block_scale = q.decode_scale;
    }
    if (std::fabs(static_cast<double>(domain[i])) > elem_max * block_scale) ++s.saturated;
  }
  s.rel_rms_error = ref2 > 0 ? std::sqrt(err2 / ref2) : 0.0;
  s.snr_db = s.rel_rms_error > 0 ? -20.0 * std::log10(s.rel_rms_error) : std::numeric_limits<double>::infinity();
  return s;
}

}  // namespace nibble
