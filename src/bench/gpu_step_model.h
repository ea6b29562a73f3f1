// A model of one training step's time on a named NVIDIA GPU, kernel kind by kernel kind, derived from
// each kind's FLOPs, bytes and launches (`nibble bench train --predict`, docs/gpu.md). Two columns:
//   design      every kernel at the GPU's roofline: max(FLOPs / the peak of the unit it runs on,
//               bytes / HBM bandwidth), and never shorter than one launch;
//   as written  the CUDA backend as it is today: the same roofline where a kernel fills the GPU, and
//               for the kernels that give one thread a row, a column or a chunk, the time their few
//               threads take (the FMA issue rate of the SMs they occupy), plus the host
//               synchronisations of a step (each quantization's non-finite check).
// Beside them the same step as PyTorch runs it in BF16 (autocast, SDPA flash attention, fused AdamW),
// on the same model, so that the first run on a GPU is compared kernel by kernel with a prediction.
// A model, not a measurement: its assumptions are the GpuSpec's rates and the comments below.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "model/transformer.h"
#include "recipe/recipe.h"

namespace nibble::bench {

struct GpuSpec {
  std::string name;
  double bf16_flops = 0;   // dense BF16 tensor cores, sustained by large cuBLAS GEMMs
  double fp32_flops = 0;   // FP32 on the CUDA cores (an FMA is 2)
  double nvfp4_flops = 0;  // dense NVFP4 tensor cores; 0: none (Hopper multiplies NVFP4 as BF16, emulated)
  double bandwidth = 0;    // HBM bytes/s, sustained by streaming kernels
  int sms = 0;
  double clock_hz = 0;
  double launch_s = 0;          // the shortest a kernel takes back to back on a stream (launch + gap)
  double sync_s = 0;            // a host synchronisation inside a step (stream drain, small copy, relaunch)
  double attention_fwd_efficiency = 0, attention_bwd_efficiency = 0;  // flash attention's share of bf16_flops
};

// "h200", "b200": UsageError listing the names for another.
const GpuSpec& gpu_spec(std::string_view name);
std::string gpu_names();

struct KernelKindTime {
  std::string kind;       // "linear GEMMs", "attention backward", ...
  std::string unit;       // what bounds it by design: "BF16 tensor cores", "HBM", "FP32 cores"
  double launches = 0;    // per step
  double flops = 0, bytes = 0;
  double design_s = 0, written_s = 0, torch_s = 0;
  std::string written_note;  // why as written differs, when it does
};

struct StepPrediction {
  std::vector<KernelKindTime> kinds;
  double syncs = 0;  // host synchronisations per step as written
  double design_s = 0, written_s = 0, torch_s = 0;
  int64_t tokens = 0;  // per step
};

// One optimizer step of `batch` sequences of `seq` tokens (one micro-batch) under `recipe`.
StepPrediction predict_step(const model::ModelConfig& m, const Recipe& recipe, int64_t batch, int64_t seq,
                            const GpuSpec& gpu);

// The table of one recipe's prediction, with tokens/s and the ratios to PyTorch BF16.
std::string prediction_table(const std::string& recipe_name, const StepPrediction& p, const GpuSpec& gpu);

}  // namespace nibble::bench
