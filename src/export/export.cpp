#include "export/export.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <optional>
#include <string_view>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>

#include "format/codecs.h"
#include "format/quantize.h"
#include "io/atomic_file.h"
#include "io/regular_file.h"
#include "io/safetensors.h"
#include "io/write_rules.h"
#include "ops/backend.h"
#include "data/data.h"
#include "run/metrics.h"
#include "run/run.h"
#include "data/shards.h"

namespace nibble::train {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const char* const kBlockLinearArena[model::kLinearsPerBlock] = {"qkv", "attn_out", "gate_up", "down"};

double progress_of(const LoadedRun& run) {
  const auto& c = run.config.train;
  return std::min(1.0, static_cast<double>(run.state.step) / static_cast<double>(c.schedule.total_steps));
}

int64_t seq_of(const LoadedRun& run) {
  const auto& c = run.config.train;
  return c.seq > 0 ? c.seq : c.model.context;
}

Recipe recipe_of(const LoadedRun& run) {
  const auto& c = run.config.train;
  return Recipe(c.recipe, static_cast<int>(c.model.layers), run.model->block_linear_shapes(),
                std::max<int64_t>(1, c.batch) * seq_of(run), run.model->backend());
}

// The options Linear::forward passes to the backend's quantize for the weight (recipe/linear.cpp: `wo` is
// fprop.b, seeded only for stochastic rounding, which a forward weight never has), or nullopt when
// that GEMM does not take an NVFP4 weight.
std::optional<QuantOptions> forward_weight_options(const Recipe& recipe, int layer, int linear, double progress) {
  const LinearRecipe r = recipe.for_linear(layer, linear, progress);
  if (r.fprop.precision != GemmPrecision::quantized || r.fprop.b.format != Format::nvfp4) return std::nullopt;
  NIBBLE_CHECK(r.fprop.b.rounding == Rounding::nearest && !r.fprop.b.rht,
               "a forward NVFP4 weight is quantized with round-to-nearest and no RHT");
  return r.fprop.b;
}

// The weight of a block's linear quantized as its forward GEMM quantizes it, on the model's backend,
// where its arena lives (the same bytes on every backend).
std::unique_ptr<ops::Quantized> quantize_weight_on_backend(const LoadedRun& run, int layer, int which,
                                                           const QuantOptions& o) {
  const auto& arena = run.model->params();
  const auto& info = arena.find(fmt::format("block{}.{}", layer, kBlockLinearArena[which]));
  ops::Backend& backend = run.model->backend();
  auto q = backend.new_quantized();
  backend.quantize(arena.value(info.offset), info.rows, info.cols, o, *q);
  return q;
}

QuantizedTensor quantize_weight(const LoadedRun& run, int layer, model::BlockLinear which, const QuantOptions& o) {
  return quantize_weight_on_backend(run, layer, static_cast<int>(which), o)->to_host();
}

std::span<const uint8_t> bytes_of(const void* p, size_t n) { return {static_cast<const uint8_t*>(p), n}; }

io::Tensor dense_tensor(std::vector<int64_t> shape, std::span<const float> values, bool bf16) {
  if (!bf16) return io::make_f32_tensor(std::move(shape), values);
  std::vector<uint16_t> bits(values.size());
  for (size_t i = 0; i < values.size(); ++i) bits[i] = bf16_from_float_rn(values[i]).bits;
  return io::make_tensor(io::DType::BF16, std::move(shape), bytes_of(bits.data(), bits.size() * 2));
}

io::Tensor scalar_f32(float v, bool as_vector) {
  // ModelOpt stores per-tensor scales as 0-d tensors, compressed-tensors as [1] (see where used).
  return io::make_tensor(io::DType::F32, as_vector ? std::vector<int64_t>{1} : std::vector<int64_t>{},
                         bytes_of(&v, sizeof v));
}

std::string module_of(const std::string& hf_weight_name) {
  return hf_weight_name.substr(0, hf_weight_name.size() - std::string(".weight").size());
}

// Which block linear an hf_tensor_layout slot belongs to, or -1 (embeddings, norms, head).
int block_linear_of(const HfTensorSlot& slot, int& layer) {
  if (!slot.arena_name.starts_with("block")) return -1;
  const size_t dot = slot.arena_name.find('.');
  const std::string what = slot.arena_name.substr(dot + 1);
  for (int i = 0; i < model::kLinearsPerBlock; ++i)
    if (what == kBlockLinearArena[i]) {
      layer = std::stoi(slot.arena_name.substr(5, dot - 5));
      return i;
    }
  return -1;
}

json read_json(const fs::path& p) {
  try {
    return json::parse(read_text_file(p.string()));
  } catch (const json::exception& e) {
    throw UsageError(fmt::format("{} is not valid JSON ({}): the checkpoint is damaged", p.string(), e.what()));
  }
}

void write_text(const fs::path& p, const std::string& text) { io::write_file_atomically(p, bytes_of(text.data(), text.size())); }
void write_json(const fs::path& p, const json& j) { write_text(p, j.dump(2) + "\n"); }

// Removes a directory tree unless released: the export's temporary directory on any failure.
struct RemoveOnFailure {
  fs::path dir;
  bool armed = true;
  ~RemoveOnFailure() {
    if (!armed) return;
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

std::string fmt_loss(double v) { return fmt::format("{:.4f}", v); }

// A character-level run: nibble's table (one id per corpus byte, train/tokenizer.cpp) is kept as
// nibble_char_tokenizer.json, and when every byte is ASCII (one byte = one character) it is also
// written as a Hugging Face `tokenizers` file transformers opens with AutoTokenizer: a WordLevel
// vocabulary of the characters, a pre-tokenizer that isolates every character and the Fuse decoder
// (no spaces between tokens). Returns the model card's sentence about it.
std::string write_char_tokenizer(const fs::path& run_dir, const fs::path& out, int64_t context) {
  // nibble_tokenizer.json; tokenizer.json in a run directory an earlier nibble wrote.
  const bool earlier = !fs::exists(run_dir / kNibbleTokenizerFile) && fs::exists(run_dir / kTokenizerFile);
  const json table = read_json(run_dir / (earlier ? kTokenizerFile : kNibbleTokenizerFile));
  write_json(out / "nibble_char_tokenizer.json", table);
  std::vector<int> bytes = table.value("bytes", std::vector<int>{});
  const bool ascii = std::all_of(bytes.begin(), bytes.end(), [](int b) { return b >= 0 && b < 0x80; });
  if (!ascii)
    return fmt::format("Character-level (one id per byte, {} ids) with bytes outside ASCII, which a Hugging Face "
                       "tokenizer (it splits characters, not bytes) cannot reproduce: nibble_char_tokenizer.json "
                       "lists the byte of every id (id i = bytes[i]); pass token ids to the engine "
                       "(e.g. vLLM prompt_token_ids with skip_tokenizer_init).",
                       bytes.size());
  json vocab = json::object();
  for (size_t i = 0; i < bytes.size(); ++i) vocab[std::string(1, static_cast<char>(bytes[i]))] = i;
  const json tok = {{"version", "1.0"},
                    {"truncation", nullptr},
                    {"padding", nullptr},
                    {"added_tokens", json::array()},
                    {"normalizer", nullptr},
                    {"pre_tokenizer",
                     {{"type", "Split"}, {"pattern", {{"Regex", "[\\s\\S]"}}}, {"behavior", "Isolated"}, {"invert", false}}},
                    {"post_processor", nullptr},
                    {"decoder", {{"type", "Fuse"}}},
                    {"model", {{"type", "WordLevel"}, {"vocab", vocab}, {"unk_token", "<unk>"}}}};
  write_json(out / "tokenizer.json", tok);
  write_json(out / "tokenizer_config.json", {{"tokenizer_class", "PreTrainedTokenizerFast"},
                                             {"clean_up_tokenization_spaces", false},
                                             {"model_max_length", context}});
  return fmt::format("Character-level ({} ids, one per ASCII character of the corpus): tokenizer.json is a Hugging "
                     "Face `tokenizers` WordLevel vocabulary that splits text into single characters, so "
                     "AutoTokenizer gives nibble's ids; there are no BOS/EOS/unknown tokens (a character outside the "
                     "corpus cannot be encoded, as in nibble). nibble_char_tokenizer.json is nibble's own table.",
                     bytes.size());
}

}  // namespace

ExportFormat parse_export_format(std::string_view name) {
  if (name == "hf") return ExportFormat::hf;
  if (name == "modelopt-nvfp4") return ExportFormat::modelopt_nvfp4;
  if (name == "compressed-tensors-nvfp4") return ExportFormat::compressed_tensors_nvfp4;
  throw UsageError(fmt::format("--format {} is unknown: use hf, modelopt-nvfp4 or compressed-tensors-nvfp4", name));
}

std::string_view to_string(ExportFormat f) {
  switch (f) {
    case ExportFormat::hf: return "hf";
    case ExportFormat::modelopt_nvfp4: return "modelopt-nvfp4";
    case ExportFormat::compressed_tensors_nvfp4: return "compressed-tensors-nvfp4";
  }
  return "?";
}

std::optional<QuantizedTensor> forward_weight_quantization(const LoadedRun& run, int layer, model::BlockLinear which) {
  const Recipe recipe = recipe_of(run);
  const auto o = forward_weight_options(recipe, layer, static_cast<int>(which), progress_of(run));
  if (!o) return std::nullopt;
  return quantize_weight(run, layer, which, *o);
}

int apply_weight_only_quantization(LoadedRun& run) {
  const Recipe recipe = recipe_of(run);
  const double progress = progress_of(run);
  auto& arena = run.model->params();
  int replaced = 0;
  for (int l = 0; l < static_cast<int>(run.config.train.model.layers); ++l) {
    for (int i = 0; i < model::kLinearsPerBlock; ++i) {
      const auto o = forward_weight_options(recipe, l, i, progress);
      if (!o) continue;
      const auto& info = arena.find(fmt::format("block{}.{}", l, kBlockLinearArena[i]));
      run.model->backend().dequantize(*quantize_weight_on_backend(run, l, i, *o), arena.value(info.offset));
      ++replaced;
    }
  }
  return replaced;
}

void check_nvfp4_exportable(const std::string& tensor, int64_t rows, int64_t cols, ExportFormat format) {
  (void)rows;
  // Both loaders store one E4M3 scale per 16 elements along K (the input features) and two codes
  // per byte: vLLM's ModelOptNvFp4LinearMethod.create_weights refuses "in features size is not
  // multiple of 16" (vllm/model_executor/layers/quantization/modelopt.py); compressed-tensors'
  // group_size 16 likewise.
  if (cols % 16 != 0)
    throw UsageError(fmt::format("--format {} stores NVFP4 weights in blocks of 16 along the input features, but {} "
                                 "has K = {} input features, not a multiple of 16: export it with --format hf, or "
                                 "train a model whose width and mlp_hidden are multiples of 16",
                                 to_string(format), tensor, cols));
}

namespace {

// What an export writes, decided before any file is: the run, its Hugging Face tensor layout and,
// per block linear (layer * kLinearsPerBlock + linear), the options its forward GEMM quantizes the
// weight with (nullopt: a dense linear).
struct ExportPlan {
  const ExportOptions& opt;
  bool quantized_format = false;
  LoadedRun run;
  std::vector<HfTensorSlot> layout;
  std::vector<std::optional<QuantOptions>> module_options;
  std::vector<int> nvfp4_layers, bf16_layers;  // blocks with some NVFP4 linear, blocks with none
};

// Static activation amax per (layer, linear) from calibration batches through the run's recipe.
struct Calibration {
  std::vector<float> input_amax;
  int64_t windows = 0;
  fs::path file;
  bool static_inputs = false;  // input scales are written
};

struct ExportedWeights {
  io::SafetensorsFile file;
  std::vector<std::string> excluded_modules, quantized_modules;
};

// What an export writes. --force replaces only a directory that holds nothing else (an earlier
// export), so a mistyped -o (a home directory, a project) is never deleted.
constexpr std::array<std::string_view, 11> kExportFiles = {
    "model.safetensors", "config.json",           "generation_config.json", "hf_quant_config.json",
    "README.md",         "tokenizer.json",        "tokenizer_config.json",  "tokenizer.model",
    "special_tokens_map.json", "nibble_char_tokenizer.json", "tokenizer.tiktoken"};

// The first entry of `dir` that an export does not write (a user's file, a subdirectory, a link).
std::optional<fs::path> foreign_entry(const fs::path& dir) {
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const bool ours = std::find(kExportFiles.begin(), kExportFiles.end(), name) != kExportFiles.end() ||
                      io::is_temporary_name(name, name.substr(0, name.rfind(".tmp.")));
    if (!ours || it->is_symlink(ec) || !it->is_regular_file(ec)) return it->path();
  }
  if (ec) return dir;
  return std::nullopt;
}

// An existing output: an empty directory, or one an earlier export wrote, replaced only with --force.
void check_replaceable(const fs::path& out, bool force) {
  std::error_code ec;
  if (!fs::is_directory(out, ec))
    throw UsageError(fmt::format("-o {} exists and is not a directory: an export is a directory; choose another -o",
                                 out.string()));
  if (!force && !fs::is_empty(out, ec))
    throw UsageError(fmt::format("{} already exists: pass --force to replace it, or choose another -o", out.string()));
  if (const auto foreign = foreign_entry(out))
    throw UsageError(fmt::format("-o {} --force: {} is not a file an export writes, so {} is not an earlier export and "
                                 "is left as it is; choose another -o (or empty it yourself)",
                                 out.string(), foreign->string(), out.string()));
}

// Refuses a bad request before loading anything: an output inside a run or data directory, one
// that holds the run, one that is not a directory or not an earlier export.
void validate_request(ExportOptions& opt) {
  if (opt.output.empty()) throw UsageError("-o DIR is required: the directory to write the export into");
  if (opt.calibrate_batches < 0)
    throw UsageError(fmt::format("--calibrate {} is negative: give a batch count, or 0 for weight-only scales",
                                 opt.calibrate_batches));
  std::error_code ec;
  if (fs::is_symlink(opt.output, ec)) {  // the directory it names is the output; never the link replaced
    const fs::path target = fs::canonical(opt.output, ec);
    if (ec)
      throw UsageError(fmt::format("-o {} is a symlink to a directory that does not exist: create it, or choose "
                                   "another -o", opt.output.string()));
    opt.output = target;
  }
  std::vector<fs::path> inputs{opt.run_dir};
  if (opt.checkpoint) inputs.push_back(*opt.checkpoint);
  io::refuse_output_in_owned_directory(opt.output, "export");
  io::refuse_output_overlapping_inputs(opt.output, inputs, "export");
  if (fs::exists(fs::symlink_status(opt.output, ec))) check_replaceable(opt.output, opt.force);
}

// Opens the run and decides which blocks' weights are written as NVFP4; UsageError for a run or shape
// the format cannot hold.
ExportPlan plan_export(const ExportOptions& opt) {
  ExportPlan p{opt, opt.format != ExportFormat::hf, load_run(opt.run_dir, opt.checkpoint), {}, {}, {}, {}};
  // A model without its tokenizer is of no use to a Hugging Face user, and llm.c's files do not say
  // which tokenizer wrote them.
  if (!p.run.tokenizer)
    throw UsageError(fmt::format("{} was trained on data.format={} token files, which carry no tokenizer, so there is "
                                 "none to export with the model: train the run with data.tokenizer=FILE (the tokenizer "
                                 "that wrote the files), or use `nibble eval`, which works on this run",
                                 opt.run_dir.string(), to_string(p.run.config.data_format)));
  const int layers = static_cast<int>(p.run.config.train.model.layers);
  p.layout = hf_tensor_layout(*p.run.model);
  const Quantization q = p.run.config.train.recipe.quantization;
  // Shapes first (the Recipe itself refuses them with a training-time message).
  if (p.quantized_format) {
    if (q != Quantization::nvfp4 && !recipe_of(p.run).uses(Quantization::nvfp4))
      throw UsageError(fmt::format("--format {} writes the NVFP4 weights training used, but this run was trained with "
                                   "quantization={}{}, which has no NVFP4 weights: export it with --format hf",
                                   to_string(opt.format), to_string(q),
                                   p.run.config.train.recipe.precision_map.empty() ? "" : " and a precision_map"));
    for (const auto& slot : p.layout) {
      int layer = 0;
      if (block_linear_of(slot, layer) >= 0) check_nvfp4_exportable(slot.hf_name, slot.rows, slot.cols, opt.format);
    }
  }
  // Which blocks multiply NVFP4 weights (the recipe is not needed, nor built, for dense hf).
  p.module_options.resize(static_cast<size_t>(layers * model::kLinearsPerBlock));
  if (p.quantized_format) {
    const Recipe recipe = recipe_of(p.run);
    const double progress = progress_of(p.run);
    for (int l = 0; l < layers; ++l)
      for (int i = 0; i < model::kLinearsPerBlock; ++i)
        p.module_options[static_cast<size_t>(l * model::kLinearsPerBlock + i)] = forward_weight_options(recipe, l, i, progress);
  }
  for (int l = 0; l < layers; ++l) {
    bool any = false;
    for (int i = 0; i < model::kLinearsPerBlock; ++i) any |= p.module_options[static_cast<size_t>(l * model::kLinearsPerBlock + i)].has_value();
    (any ? p.nvfp4_layers : p.bf16_layers).push_back(l);
  }
  if (p.quantized_format && p.nvfp4_layers.empty())
    throw UsageError(fmt::format(
        "--format {}: at step {} no layer of this run multiplies NVFP4 weights in its forward pass "
        "(precision_switch_at={} with precision_switch_scope={} switched the forward GEMMs to BF16, or every layer is "
        "kept in BF16): export it with --format hf",
        to_string(opt.format), p.run.state.step, p.run.config.train.recipe.precision_switch_at,
        to_string(p.run.config.train.recipe.precision_switch_scope)));
  return p;
}

// --calibrate N: the largest input amax of every NVFP4 linear over N batches of validation windows.
Calibration calibrate(ExportPlan& p) {
  Calibration c;
  c.input_amax.assign(p.module_options.size(), 0.0f);
  c.static_inputs = p.quantized_format && p.opt.calibrate_batches > 0;
  if (!c.static_inputs) return c;
  // The first validation shard (a mixture run, data.sources: its first source's): calibration reads
  // a few batches of windows.
  const fs::path data_dir(p.run.config.data_sources().front().spec.dir);
  c.file = data_dir / (fs::exists(data_dir) ? prepared_shards(data_dir).val.front().file : std::string(kValShardFile));
  if (!fs::exists(c.file))
    throw UsageError(fmt::format("--calibrate reads the run's validation tokens, but {} is missing (the data "
                                 "directory moved?): restore it, or pass --calibrate 0 for weight-only scales",
                                 c.file.string()));
  const auto shard = read_token_shard(c.file);
  const int64_t batch = std::max<int64_t>(1, p.run.config.train.batch);
  const auto r = evaluate_token_stream(p.run, shard.tokens, p.opt.calibrate_batches * batch, true,
                                       [&](const model::Transformer& m) {
                                         for (int l : p.nvfp4_layers)
                                           for (int i = 0; i < model::kLinearsPerBlock; ++i) {
                                             const float a = m.linear(l, static_cast<model::BlockLinear>(i)).fprop_input_amax();
                                             float& slot = c.input_amax[static_cast<size_t>(l * model::kLinearsPerBlock + i)];
                                             slot = std::max(slot, a);
                                           }
                                       });
  c.windows = r.windows;
  return c;
}

// One NVFP4 module's tensors in the format's names: rows [row_begin, row_begin + rows) of the fused
// weight w. Codes K/2 bytes a row, element 2i in the low nibble (nibble's packing,
// format/quantized_tensor.h) -- the order compressed-tensors' unpack_fp4_from_uint8
// (compressors/nvfp4/helpers.py: low nibble first) and ModelOpt/vLLM read; scales K/16 E4M3 bytes a
// row, plain row-major (16x16 tile scales are already stored repeated per row), the [N, K/16] layout
// of vLLM's ModelOptNvFp4LinearMethod.create_weights (swizzling happens in the loader's
// process_weights_after_loading).
void add_nvfp4_module(io::SafetensorsFile& weights, const std::string& m, const HfTensorSlot& slot,
                      const QuantizedTensor& w, float x_amax, ExportFormat format, bool static_inputs) {
  const int64_t K = slot.cols, N = slot.rows;
  const auto codes = std::span<const uint8_t>(w.codes).subspan(static_cast<size_t>(slot.row_begin * K / 2),
                                                               static_cast<size_t>(N * K / 2));
  const auto scales = std::span<const uint8_t>(w.scales).subspan(static_cast<size_t>(slot.row_begin * K / 16),
                                                                 static_cast<size_t>(N * K / 16));
  const auto g = ref::nvfp4_global_scale(w.amax, nvfp4_global_numerator(w));
  // Activations: engines quantize them at run time with their own 448-ceiling kernels, so the
  // static global scale uses TE's numerator 2688 whatever the weights' Four Over Six setting.
  const auto gx = ref::nvfp4_global_scale(x_amax, kNvfp4GlobalScaleNumerator);
  if (format == ExportFormat::modelopt_nvfp4) {
    // vllm/model_executor/layers/quantization/modelopt.py, ModelOptNvFp4LinearMethod: weight U8
    // [N, K/2], weight_scale F8_E4M3 [N, K/16], weight_scale_2 and input_scale F32 scalars in the
    // decode direction (amax / 2688: alpha = input_scale * weight_scale_2 multiplies the GEMM).
    weights.tensors[m + ".weight"] = io::make_tensor(io::DType::U8, {N, K / 2}, codes);
    weights.tensors[m + ".weight_scale"] = io::make_tensor(io::DType::F8_E4M3, {N, K / 16}, scales);
    weights.tensors[m + ".weight_scale_2"] = scalar_f32(w.decode_scale, false);
    if (static_inputs) weights.tensors[m + ".input_scale"] = scalar_f32(gx.decode, false);
  } else {
    // compressed_tensors/compressors/nvfp4/base.py (NVFP4PackedCompressor): weight_packed U8
    // [N, K/2], weight_scale F8_E4M3 [N, K/16], weight_global_scale F32 [1] in the encode
    // direction (2688 / amax: dequantize divides by it; compressed_tensors/entrypoints/convert/
    // converters/modelopt_nvfp4.py maps ModelOpt's weight_scale_2 x to 1/x), input_global_scale likewise.
    weights.tensors[m + ".weight_packed"] = io::make_tensor(io::DType::U8, {N, K / 2}, codes);
    weights.tensors[m + ".weight_scale"] = io::make_tensor(io::DType::F8_E4M3, {N, K / 16}, scales);
    weights.tensors[m + ".weight_global_scale"] = scalar_f32(g.encode, true);
    if (static_inputs) weights.tensors[m + ".input_global_scale"] = scalar_f32(gx.encode, true);
  }
}

// Every tensor of the layout: dense, or (an NVFP4 block's linears) the training codes and scales.
ExportedWeights export_weights(const ExportPlan& p, const Calibration& c) {
  ExportedWeights out;
  out.file.metadata["format"] = "pt";  // transformers refuses a safetensors file without it
  std::map<std::pair<int, int>, QuantizedTensor> quantized;  // (layer, linear) -> fused weight
  const auto& arena = p.run.model->params();
  for (const auto& slot : p.layout) {
    const auto& info = arena.find(slot.arena_name);
    const std::span<const float> values(arena.value(info.offset) + slot.row_begin * slot.cols,
                                        static_cast<size_t>(slot.rows * slot.cols));
    int layer = -1;
    const int which = block_linear_of(slot, layer);
    if (which < 0 || !p.module_options[static_cast<size_t>(layer * model::kLinearsPerBlock + which)]) {
      out.file.tensors[slot.hf_name] = dense_tensor(slot.shape, values, p.opt.bf16);
      if (p.quantized_format && which >= 0) out.excluded_modules.push_back(module_of(slot.hf_name));
      continue;
    }
    auto key = std::make_pair(layer, which);
    auto it = quantized.find(key);
    if (it == quantized.end())
      it = quantized.emplace(key, quantize_weight(p.run, layer, static_cast<model::BlockLinear>(which),
                                                  *p.module_options[static_cast<size_t>(layer * model::kLinearsPerBlock + which)])).first;
    const std::string m = module_of(slot.hf_name);
    out.quantized_modules.push_back(m);
    add_nvfp4_module(out.file, m, slot, it->second,
                     c.input_amax[static_cast<size_t>(layer * model::kLinearsPerBlock + which)], p.opt.format,
                     c.static_inputs);
  }
  if (p.quantized_format) out.excluded_modules.push_back("lm_head");  // ModelOpt's exporter always lists it
  return out;
}

// A temporary directory beside the output, renamed into place by publish() when complete.
struct Staging {
  fs::path out, parent, tmp;
};

// Temporaries of an export killed before it finished (`OUT.tmp.PID`, `OUT.old.PID` of a pid that is
// no longer running) hold only export files: removed, as nothing else would remove them.
void remove_stale_staging(const fs::path& parent, const std::string& out_name) {
  std::error_code ec;
  for (fs::directory_iterator it(parent, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::optional<long> pid = io::temporary_owner_pid(name, out_name);
    if (!pid && name.starts_with(out_name + ".old."))
      pid = io::temporary_owner_pid(out_name + ".tmp." + name.substr(out_name.size() + 5), out_name);
    if (!pid || io::process_is_alive(*pid) || it->is_symlink(ec) || !it->is_directory(ec)) continue;
    if (foreign_entry(it->path())) continue;
    std::error_code removed;
    fs::remove_all(it->path(), removed);
  }
}

Staging open_staging_directory(const fs::path& out) {
  Staging s{out, out.parent_path().empty() ? fs::path(".") : out.parent_path(), {}};
  std::error_code ec;
  fs::create_directories(s.parent, ec);
  remove_stale_staging(s.parent, out.filename().string());
  s.tmp = s.parent / fmt::format("{}.tmp.{}", out.filename().string(), ::getpid());
  if (!fs::create_directory(s.tmp, ec))
    throw UsageError(fmt::format("cannot create {} ({}): check the permissions of {}", s.tmp.string(),
                                 ec ? ec.message() : "exists", s.parent.string()));
  return s;
}

// Into place: the old export (with --force) is removed only once the new one is complete.
void publish(const Staging& s, bool force) {
  std::error_code ec;
  if (fs::exists(fs::symlink_status(s.out, ec))) {
    // Checked again: another export to the same -o may have finished meanwhile, or a user's file
    // appeared; replaced only as validate_request would have allowed.
    check_replaceable(s.out, force);
    const fs::path old = s.parent / fmt::format("{}.old.{}", s.out.filename().string(), ::getpid());
    fs::rename(s.out, old);
    fs::rename(s.tmp, s.out);
    fs::remove_all(old, ec);
  } else {
    fs::rename(s.tmp, s.out);
  }
}

// ModelOpt: config.json's quantization_config, and the legacy hf_quant_config.json (written here)
// that vLLM's ModelOptNvFp4Config requires group_size, kv_cache_quant_algo and exclude_modules in
// (modelopt.py, _from_config), the same as ModelOpt's own exporter converts it
// (modelopt/torch/export/unified_export_hf.py + convert_hf_config.py).
json modelopt_quantization_config(const std::vector<std::string>& excluded_modules, bool static_inputs,
                                  const fs::path& dir) {
  const std::string producer_version = "nibble";
  const std::string algo = static_inputs ? "NVFP4" : "W4A16_NVFP4";
  const json hf_quant = {{"producer", {{"name", "nibble"}, {"version", producer_version}}},
                         {"quantization",
                          {{"quant_algo", algo}, {"group_size", 16}, {"kv_cache_quant_algo", nullptr},
                           {"exclude_modules", excluded_modules}}}};
  json groups = {{"weights", {{"dynamic", false}, {"num_bits", 4}, {"type", "float"}, {"group_size", 16}}}};
  if (static_inputs)
    groups["input_activations"] = {{"dynamic", false}, {"num_bits", 4}, {"type", "float"}, {"group_size", 16}};
  write_json(dir / "hf_quant_config.json", hf_quant);
  return {{"config_groups", {{"group_0", groups}}},
          {"ignore", excluded_modules},
          {"quant_algo", algo},
          {"producer", hf_quant["producer"]},
          {"quant_method", "modelopt"},
          {"quant_library", "modelopt"}};
}

// compressed_tensors/quantization/quant_scheme.py's NVFP4 preset (weights: 4-bit float,
// tensor_group, group 16, static global scale; inputs the same with dynamic "local": per-block
// scales at run time under the stored input_global_scale), NVFP4A16 without inputs; the
// QuantizationConfig fields of quant_config.py.
json compressed_tensors_quantization_config(const std::vector<std::string>& excluded_modules, bool static_inputs) {
  const json args = {{"num_bits", 4},        {"type", "float"},     {"symmetric", true},  {"group_size", 16},
                     {"strategy", "tensor_group"}, {"block_structure", nullptr}, {"dynamic", false},
                     {"actorder", nullptr},  {"observer", "minmax"}, {"observer_kwargs", json::object()}};
  json inputs = nullptr;
  if (static_inputs) {
    inputs = args;
    inputs["dynamic"] = "local";
    inputs["observer"] = "static_minmax";
  }
  return {{"quant_method", "compressed-tensors"},
          {"format", "nvfp4-pack-quantized"},
          {"quantization_status", "compressed"},
          {"global_compression_ratio", nullptr},
          {"kv_cache_scheme", nullptr},
          {"ignore", excluded_modules},
          {"config_groups",
           {{"group_0",
             {{"targets", {"Linear"}},
              {"weights", args},
              {"input_activations", inputs},
              {"output_activations", nullptr},
              {"format", "nvfp4-pack-quantized"}}}}}};
}

// The BOS and EOS ids config.json names: sentencepiece's defaults for nibble's BPE, which `nibble
// prepare` keeps (<unk> 0, <s> 1, </s> 2); a loaded tokenizer's own.
std::pair<std::optional<int32_t>, std::optional<int32_t>> special_ids(const Tokenizer& t) {
  if (t.kind() == TokenizerKind::bpe) return {1, 2};
  return {t.begin_of_text(), t.end_of_text()};
}

// A tokenizer file of the run copied into the export unchanged.
void copy_run_file(const fs::path& run_dir, const char* name, std::string_view what, const fs::path& dir) {
  io::write_file_atomically(dir / name, io::read_regular_file(run_dir / name, what));
}

// tokenizer_config.json's bos_token / eos_token: the tokens the run's tokenizer begins and ends text with.
void name_special_tokens(json& config, const Tokenizer& t) {
  if (const auto bos = t.begin_of_text()) config["bos_token"] = t.token_text(*bos);
  if (const auto eos = t.end_of_text()) config["eos_token"] = t.token_text(*eos);
}

// A Hugging Face tokenizer.json run: the file as it was given, and a tokenizer_config.json that
// makes AutoTokenizer a PreTrainedTokenizerFast of it (its post-processor adds what it adds).
std::string write_huggingface_tokenizer(const ExportPlan& p, const fs::path& dir, int64_t context) {
  copy_run_file(p.opt.run_dir, "tokenizer.json", "a tokenizer.json", dir);
  json config = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                 {"clean_up_tokenization_spaces", false},
                 {"model_max_length", context}};
  name_special_tokens(config, *p.run.tokenizer);
  write_json(dir / "tokenizer_config.json", config);
  return "tokenizer.json (the Hugging Face tokenizer the run was prepared with, unchanged) + tokenizer_config.json "
         "(PreTrainedTokenizerFast)";
}

// A sentencepiece model the run was prepared with (Llama 2, Gemma): the model as given, read by
// transformers' LlamaTokenizer, which adds BOS as nibble's documents begin (EOS ends a document,
// not a prompt, so it is not added).
std::string write_sentencepiece_tokenizer(const ExportPlan& p, const fs::path& dir, int64_t context) {
  copy_run_file(p.opt.run_dir, "tokenizer.model", "a sentencepiece model", dir);
  const Tokenizer& t = *p.run.tokenizer;
  // A BPE model with byte fallback and identity normalisation (Llama 2, Mistral) converts exactly:
  // AutoTokenizer then needs neither sentencepiece nor protobuf (its <s> is in the template).
  if (const auto converted = t.converted_to_huggingface()) {
    write_text(dir / "tokenizer.json", *converted);
    json config = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                   {"clean_up_tokenization_spaces", false},
                   {"model_max_length", context}};
    name_special_tokens(config, t);
    write_json(dir / "tokenizer_config.json", config);
    return "tokenizer.json (the sentencepiece BPE model the run was prepared with, converted: its pieces, the merges "
           "they imply, its dummy prefix, byte fallback, <s> in front) + tokenizer_config.json "
           "(PreTrainedTokenizerFast) + tokenizer.model (the model itself, unchanged)";
  }
  json config = {{"tokenizer_class", "LlamaTokenizer"},
                 {"add_bos_token", t.begin_of_text().has_value()},
                 {"add_eos_token", false},
                 {"legacy", true},
                 {"clean_up_tokenization_spaces", false},
                 {"model_max_length", context}};
  name_special_tokens(config, t);
  write_json(dir / "tokenizer_config.json", config);
  return "tokenizer.model (the sentencepiece model the run was prepared with, unchanged) + tokenizer_config.json "
         "(LlamaTokenizer, BOS added)";
}

// config.json (the checkpoint's LlamaConfig, plus dtype, token ids and the quantization block),
// hf_quant_config.json for ModelOpt, and generation_config.json.
void write_model_config(const ExportPlan& p, const ExportedWeights& w, bool static_inputs, const fs::path& dir) {
  json config = read_json(p.run.checkpoint / "config.json");
  config["torch_dtype"] = p.opt.bf16 ? "bfloat16" : "float32";
  const auto [bos, eos] = special_ids(*p.run.tokenizer);
  if (bos) config["bos_token_id"] = *bos;
  if (eos) config["eos_token_id"] = *eos;
  if (p.opt.format == ExportFormat::modelopt_nvfp4)
    config["quantization_config"] = modelopt_quantization_config(w.excluded_modules, static_inputs, dir);
  else if (p.opt.format == ExportFormat::compressed_tensors_nvfp4)
    config["quantization_config"] = compressed_tensors_quantization_config(w.excluded_modules, static_inputs);
  write_json(dir / "config.json", config);
  json generation = {{"max_length", p.run.config.train.model.context}};
  if (bos) generation["bos_token_id"] = *bos;
  if (eos) generation["eos_token_id"] = *eos;
  write_json(dir / "generation_config.json", generation);
}

// A tiktoken run: the ranks unchanged, and the same converted to a Hugging Face tokenizer.json.
std::string write_tiktoken_tokenizer(const ExportPlan& p, const fs::path& dir, int64_t context) {
  copy_run_file(p.opt.run_dir, kTiktokenFile, "a tiktoken file", dir);
  const std::string encoding = read_json(p.opt.run_dir / kNibbleTokenizerFile).value("encoding", std::string("?"));
  const std::string converted = *p.run.tokenizer->converted_to_huggingface();
  write_text(dir / "tokenizer.json", converted);
  write_json(dir / "tokenizer_config.json", {{"tokenizer_class", "PreTrainedTokenizerFast"},
                                             {"clean_up_tokenization_spaces", false},
                                             {"eos_token", "<|endoftext|>"},
                                             {"model_max_length", context}});
  return fmt::format("tokenizer.tiktoken (the tiktoken ranks the run was prepared with, unchanged; pattern {}, "
                     "<|endoftext|> = {}) and the same as a Hugging Face tokenizer.json (ranks as ids, the merges "
                     "they imply, the pattern as a Split) + tokenizer_config.json (PreTrainedTokenizerFast)",
                     encoding, p.run.tokenizer->end_of_text().value_or(-1));
}

// The tokenizer in the form transformers reads; returns the model card's sentence about it.
std::string write_tokenizer(const ExportPlan& p, const fs::path& dir) {
  const int64_t context = p.run.config.train.model.context;
  if (p.run.tokenizer->kind() == TokenizerKind::huggingface) return write_huggingface_tokenizer(p, dir, context);
  if (p.run.tokenizer->kind() == TokenizerKind::sentencepiece) return write_sentencepiece_tokenizer(p, dir, context);
  if (p.run.tokenizer->kind() == TokenizerKind::tiktoken) return write_tiktoken_tokenizer(p, dir, context);
  if (p.run.tokenizer->kind() != TokenizerKind::bpe) return write_char_tokenizer(p.opt.run_dir, dir, context);
  // nibble's BPE adds no BOS to training text, no dummy prefix, identity normalisation
  // (data/tokenizer.cpp). AutoTokenizer reads the converted tokenizer.json (PreTrainedTokenizerFast:
  // no sentencepiece or protobuf needed); the sentencepiece model stays beside it for its users.
  copy_run_file(p.opt.run_dir, "tokenizer.model", "a sentencepiece model", dir);
  write_text(dir / "tokenizer.json", *p.run.tokenizer->converted_to_huggingface());
  write_json(dir / "tokenizer_config.json",
             {{"tokenizer_class", "PreTrainedTokenizerFast"},
              {"bos_token", "<s>"},
              {"eos_token", "</s>"},
              {"unk_token", "<unk>"},
              {"clean_up_tokenization_spaces", false},
              {"model_max_length", context}});
  return "tokenizer.json (the sentencepiece BPE converted: its pieces, the merges they imply, byte fallback; no BOS "
         "added, as nibble trained) + tokenizer_config.json (PreTrainedTokenizerFast) + tokenizer.model (the "
         "sentencepiece model itself)";
}

// The model card's "Final losses" list.
std::string final_losses_text(const ExportPlan& p) {
  const auto history = read_metrics(p.opt.run_dir / kRunMetricsFile);
  std::string losses;
  if (!history.steps.empty())
    losses += fmt::format("- final train loss {} (step {})\n", fmt_loss(history.steps.back().loss), history.steps.back().step);
  if (!history.evals.empty())
    losses += fmt::format("- final validation loss {} (step {})\n", fmt_loss(history.evals.back().val_loss),
                          history.evals.back().step);
  if (p.run.state.best_val_step >= 0)
    losses += fmt::format("- best validation loss {} (step {})\n", fmt_loss(p.run.state.best_val_loss),
                          p.run.state.best_val_step);
  if (losses.empty()) losses = "- no metrics recorded (metrics.jsonl is missing or empty)\n";
  return losses;
}

// The model card's "Weights" section for an NVFP4 format: which blocks, what is exact, activations.
std::string nvfp4_weights_text(const ExportPlan& p, const Calibration& c, const ExportedWeights& w) {
  const QuantOptions& o = **std::find_if(p.module_options.begin(), p.module_options.end(),
                                         [](const auto& m) { return m.has_value(); });
  auto list = [](const std::vector<int>& v) {
    std::string s;
    for (int l : v) s += (s.empty() ? "" : ", ") + std::to_string(l);
    return s.empty() ? std::string("none") : s;
  };
  return fmt::format(
      "NVFP4 linears in blocks {} ({} weight scales{}); the linears the recipe kept in BF16 or FP32 (all of those of "
      "blocks {}) are written dense ({}), as are the embeddings, norms and LM head. Excluded modules: {}.\n\n"
      "**Exactness.** The weight codes and E4M3 block scales are the ones the run's forward pass multiplied at "
      "step {}: the recipe's forward weight quantization is deterministic (round to nearest, no stochastic "
      "rounding, no Hadamard transform for weights), so quantizing the checkpoint's FP32 master weights with "
      "exactly that quantizer reproduces the training codes bit for bit.{} nibble trains q/k/v as one fused "
      "linear and gate/up as one, so each group already has one global amax: q_proj, k_proj and v_proj (and "
      "gate_proj, up_proj) carry the same global scale, as vLLM's fused layers need, and their codes are exact, "
      "not re-quantized.\n\n"
      "**Activations.** {}\n",
      list(p.nvfp4_layers), o.tile_16x16 ? "16x16 tile" : "1x16 block",
      o.tile_16x16 ? ", stored repeated per row as a valid 1x16 layout" : "", list(p.bf16_layers),
      p.opt.bf16 ? "BF16" : "FP32", fmt::join(w.excluded_modules, ", "), p.run.state.step,
      o.four_over_six ? fmt::format(" The recipe uses Four Over Six (E4M3 ceiling {}), so the weights' global "
                                    "scale is amax / {:g}, not amax / 2688.",
                                    o.four_over_six_e4m3_max, nvfp4_global_numerator(o))
                      : std::string(),
      c.static_inputs
          ? fmt::format("Static input global scales from `--calibrate {}`: the input amax of every NVFP4 linear "
                        "over {} validation windows of {} run through the run's recipe forward (scale = amax / "
                        "2688). Training quantized activations with the current amax of each micro-batch; a "
                        "static scale is what these loaders take (a running amax recorded during training would "
                        "need trainer changes and is not recorded).",
                        p.opt.calibrate_batches, c.windows, c.file.string())
          : std::string("No activation scales (`--calibrate 0`): the export is weight-only (ModelOpt "
                        "W4A16_NVFP4 / compressed-tensors NVFP4A16); engines keep activations in BF16/FP16."));
}

// README.md, the model card: the model, final losses, weights, tokenizer, serving, training config.
std::string model_card(const ExportPlan& p, const Calibration& c, const ExportedWeights& w,
                       const std::string& tokenizer_note) {
  const auto& mc = p.run.config.train.model;
  const ExportOptions& opt = p.opt;
  const std::string quant_text =
      p.quantized_format
          ? nvfp4_weights_text(p, c, w)
          : fmt::format("Dense {} weights (the FP32 master weights{}); no quantization_config: an engine serves "
                        "them unquantized. The run's recipe was `{}`.\n",
                        opt.bf16 ? "BF16" : "FP32", opt.bf16 ? " rounded to nearest BF16" : ", exactly",
                        describe(p.run.config.train.recipe));
  const std::string config_yaml = read_text_file((opt.run_dir / kRunConfigFile).string());
  return fmt::format(
      "# {} (exported by nibble)\n\n"
      "A {}-layer Llama-style model (width {}, {} heads, {} KV heads, MLP {}, context {}, vocabulary {}) trained with "
      "nibble, exported as `{}` from {} (step {}, {} tokens).\n\n"
      "## Final losses (metrics.jsonl)\n\n{}\n"
      "## Weights\n\n{}\n"
      "## Tokenizer\n\n{}\n\n"
      "## Serving\n\n{}\n"
      "## Training configuration (config.yaml)\n\n```yaml\n{}```\n",
      opt.run_dir.filename().string(), mc.layers, mc.width, mc.heads, mc.kv_head_count(), mc.hidden(), mc.context,
      mc.vocab, to_string(opt.format), p.run.checkpoint.string(), p.run.state.step, p.run.state.tokens,
      final_losses_text(p), quant_text, tokenizer_note,
      opt.format == ExportFormat::modelopt_nvfp4
          ? "`vllm serve DIR --quantization modelopt_fp4` (vLLM reads hf_quant_config.json); TensorRT-LLM and "
            "SGLang read the same unified checkpoint. NVFP4 GEMMs need a Blackwell GPU (vLLM falls back to Marlin "
            "weight-only kernels on older ones).\n"
          : opt.format == ExportFormat::compressed_tensors_nvfp4
                ? "`vllm serve DIR` (quantization_config: compressed-tensors, nvfp4-pack-quantized), or transformers "
                  "`AutoModelForCausalLM.from_pretrained(DIR)` with the compressed-tensors package (on CPU: "
                  "`quantization_config=CompressedTensorsConfig(run_compressed=False)` decompresses to dense).\n"
                : "`vllm serve DIR` or `AutoModelForCausalLM.from_pretrained(DIR)`.\n",
      config_yaml);
}

// What export_run prints: what was written, what is exact, what is not.
std::string export_note(const ExportPlan& p, const Calibration& c, const ExportedWeights& w,
                        const std::string& tokenizer_note) {
  const ExportOptions& opt = p.opt;
  std::string note = fmt::format("exported {} (step {}) as {} to {}\n", p.run.checkpoint.string(), p.run.state.step,
                                 to_string(opt.format), opt.output.string());
  if (p.quantized_format) {
    note += fmt::format("  NVFP4 linears: blocks {} ({} modules) with the training codes and scales, bit for bit; "
                        "q/k/v and gate/up share one global scale per group (nibble trains them fused)\n",
                        fmt::join(p.nvfp4_layers, ", "), w.quantized_modules.size());
    note += fmt::format("  excluded (dense {}): {}\n", opt.bf16 ? "BF16" : "FP32", fmt::join(w.excluded_modules, ", "));
    note += c.static_inputs ? fmt::format("  activation scales: static, calibrated on {} validation windows of {} "
                                          "(training used each micro-batch's current amax)\n",
                                          c.windows, c.file.string())
                            : std::string("  activation scales: none (--calibrate 0): weight-only W4A16\n");
  } else {
    note += fmt::format("  dense {} weights\n", opt.bf16 ? "BF16" : "FP32");
  }
  note += "  tokenizer: " + tokenizer_note + "\n";
  return note;
}

}  // namespace

std::string export_run(const ExportOptions& options) {
  ExportOptions opt = options;
  validate_request(opt);
  ExportPlan plan = plan_export(opt);
  const Calibration calibration = calibrate(plan);
  const ExportedWeights weights = export_weights(plan, calibration);

  const Staging staging = open_staging_directory(opt.output);
  RemoveOnFailure guard{staging.tmp};
  io::write_safetensors(staging.tmp / "model.safetensors", weights.file);
  write_model_config(plan, weights, calibration.static_inputs, staging.tmp);
  const std::string tokenizer_note = write_tokenizer(plan, staging.tmp);
  write_text(staging.tmp / "README.md", model_card(plan, calibration, weights, tokenizer_note));
  publish(staging, opt.force);
  guard.armed = false;
  return export_note(plan, calibration, weights, tokenizer_note);
}

}  // namespace nibble::train
