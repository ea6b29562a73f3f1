// `nibble export`: a trained run as a directory that serving engines open as a Hugging Face Llama
// model, without re-quantizing what training quantized.
//   hf                        dense weights (--dtype fp32 or bf16)
//   modelopt-nvfp4            NVIDIA ModelOpt's unified checkpoint (vLLM `modelopt_fp4`, TensorRT-LLM,
//                             SGLang): hf_quant_config.json; per NVFP4 linear weight (U8 [N, K/2]),
//                             weight_scale (F8_E4M3 [N, K/16]), weight_scale_2 and input_scale (F32)
//   compressed-tensors-nvfp4  compressed-tensors `nvfp4-pack-quantized` (vLLM, transformers):
//                             weight_packed, weight_scale, weight_global_scale, input_global_scale and
//                             config.json's quantization_config
// Every format also gets config.json, generation_config.json, the tokenizer in a form transformers
// reads where one exists, and README.md (the model card: training config, recipe, final losses,
// what is exact and what is not).
//
// The NVFP4 codes and block scales are the ones the run's forward pass multiplies: the forward
// weight quantization of TE's NVFP4 recipe (and nibble's, recipe.cpp Recipe::operands) is
// deterministic -- round to nearest, no stochastic rounding and no RHT for weights, 16x16 tiles
// (nvfp4.weight_2d, the default) or 1x16 blocks, Four Over Six when the recipe has it -- so
// quantizing the checkpoint's FP32 master weights with exactly the options Linear::forward passes
// to the backend's quantize reproduces the training codes bit for bit (tests/test_export.cpp checks this
// against the Linear's own quantized weight). 16x16 tile scales are stored repeated per row, which
// is a valid 1x16 layout. nibble trains q/k/v as one fused linear (and gate/up as one), so each
// group already has one global amax: split by rows, the parts share one global scale as vLLM
// needs, and their codes are still exact.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "format/quantized_tensor.h"
#include "model/transformer.h"
#include "run/open_run.h"

namespace nibble::train {

enum class ExportFormat : uint8_t { hf, modelopt_nvfp4, compressed_tensors_nvfp4 };
ExportFormat parse_export_format(std::string_view name);  // UsageError listing the three
std::string_view to_string(ExportFormat f);

// The quantized weight block `layer`'s linear `which` multiplies in the run's forward pass at the
// checkpoint's point of training: nullopt when that GEMM is not NVFP4 (a layer kept in BF16, a
// recipe of another format, or past precision_switch_at).
std::optional<QuantizedTensor> forward_weight_quantization(const LoadedRun& run, int layer, model::BlockLinear which);

// Replaces the FP32 weights of every NVFP4 linear in run.model by the dequantized values of
// forward_weight_quantization (embeddings, norms, head and BF16-kept layers stay FP32): the model
// an export serves, for `nibble eval --weights-only-quantized`. Returns the number of linears replaced.
int apply_weight_only_quantization(LoadedRun& run);

// The block of 16 along K (the columns) that both NVFP4 formats store: UsageError naming the tensor,
// K and the fix otherwise.
void check_nvfp4_exportable(const std::string& tensor, int64_t rows, int64_t cols, ExportFormat format);

struct ExportOptions {
  std::filesystem::path run_dir;
  std::optional<std::filesystem::path> checkpoint;  // default: the run's newest
  ExportFormat format = ExportFormat::hf;
  std::filesystem::path output;
  bool bf16 = true;                // tensors written dense (all of them for hf): BF16, else FP32
  bool force = false;              // replace an existing output directory
  int64_t calibrate_batches = 8;   // batches of validation windows for the static activation amax; 0: none
};

// Writes the export into options.output (via a temporary directory renamed into place, so a failure
// leaves nothing) and returns the note to print: what was written, what is exact, what is not.
// UsageError (exit 2) for a run without checkpoints, a format the recipe has no NVFP4 weights for,
// an existing output without force, an output that is the run itself, or a shape the format cannot hold.
std::string export_run(const ExportOptions& options);

}  // namespace nibble::train
