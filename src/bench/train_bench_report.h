// `nibble bench train`'s runs and tables: speed (tokens/s, where the time goes, MFU and the ideal step
// against the peaks measured here; on a GPU tokens/s), quality (validation losses) and, with --vs-torch,
// PyTorch on the same model. Uses fmt and nlohmann/json, so only the full build has it (the offline GPU
// machine runs nibble_bench_train, bench/nibble_bench_train.cpp).
#pragma once
#include "bench/train_bench.h"

namespace nibble::bench {

// Speed, or quality with o.quality; UsageError for options that do not go together. Returns the exit code.
int run_train_bench(const TrainBenchOptions& o);

}  // namespace nibble::bench
