// The loop of a producer that gathers its output's SourceAmax in its epilogue (RMSNorm, SwiGLU):
// stripes of 16 rows handed out first come first served; each stripe's rows are written by
// write(r0, r1), which returns the output [N, cols], then gathered while they are in cache into the
// thread's own SourceAmax; the threads' parts are merged at the end. Every fold is a maximum, so
// neither the thread count nor which thread takes a stripe changes a bit. ISA-neutral (plain
// code, no intrinsics): the layers' .cpp files include it.
#pragma once
#include <omp.h>

#include <algorithm>
#include <cstdint>

#include "common/error.h"
#include "kernels/cpu/common/parallel.h"
#include "kernels/cpu/quantize/quantize.h"

namespace nibble::cpu {

template <class Write>
void for_stripes_gathering(int64_t n, int64_t cols, SourceAmax& amax, Write&& write) {
  NIBBLE_CHECK(cols % 16 == 0 && (!amax.rht || n % 16 == 0),
               "a gathering producer writes 16-column blocks and, with the RHT, whole 16-row token blocks");
  amax.valid = false;
  amax.max_abs_bits = 0;
  amax.transposed_rht_amax = 0.0f;
  const int64_t stripes = (n + 15) / 16;
#pragma omp parallel if (n * cols >= kMinParallelWork)
  {
    SourceAmax part;
    part.rht = amax.rht;
#pragma omp for schedule(dynamic, dynamic_chunk(stripes)) nowait
    for (int64_t s = 0; s < stripes; ++s) {
      const int64_t r0 = s * 16, r1 = std::min(n, r0 + 16);
      const float* out = write(r0, r1);
      gather_source_amax(out, cols, r0, r1, part);
    }
#pragma omp critical(nibble_source_amax_merge)
    merge_source_amax(part, amax);
  }
}

}  // namespace nibble::cpu
