// `nibble export` (issue 17) through the binary on a tiny NVFP4 run trained once for the suite:
// each format's files, tensors and scale formulas, each refusal (exit 2, nothing written), and --
// in process -- that the export's weight quantization is the one the Linear layer itself multiplies.
// The independent round trip (safetensors + compressed-tensors + transformers) is tests/export/.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "format/codecs.h"
#include "format/quantize.h"
#include "io/safetensors.h"
#include "data/data.h"
#include "export/export.h"
#include "run/checkpoint.h"
#include "run/open_run.h"
#include "data/shards.h"
#include "support/cli.h"
#include "support/temp_dir.h"

namespace fs = std::filesystem;
using namespace nibble;
using nlohmann::json;

namespace {

using cli_test::contains;
using cli_test::file_bytes;
using cli_test::Result;
using cli_test::run;

fs::path work_dir() { return nibble_test::process_dir("test_export"); }

json read_json(const fs::path& p) { return json::parse(train::read_text_file(p.string())); }

float f32_of(const io::Tensor& t) {
  EXPECT_EQ(t.dtype, io::DType::F32);
  EXPECT_EQ(t.data.size(), 4u);
  float v;
  std::memcpy(&v, t.data.data(), 4);
  return v;
}

// Nothing named DIR or DIR.tmp.* / DIR.old.* beside it.
void expect_no_output(const fs::path& out) {
  EXPECT_FALSE(fs::exists(out)) << out;
  for (const auto& e : fs::directory_iterator(out.parent_path()))
    EXPECT_FALSE(e.path().filename().string().starts_with(out.filename().string() + ".")) << e.path();
}

class ExportCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // 3 blocks: the recipe's default keeps the last in BF16 (nvfp4.bf16_last_layers auto), so the
    // export has NVFP4 blocks 0-1 and a dense block 2.
    cli_test::set_up_tiny_run(work_dir(), data(), config(), /*steps=*/8, /*layers=*/3);
  }
  static void TearDownTestSuite() {
    if (!::testing::Test::HasFailure()) fs::remove_all(work_dir());
  }
  static fs::path data() { return work_dir() / "data"; }
  static fs::path config() { return work_dir() / "tiny.yaml"; }
  static std::string train(const fs::path& dir, const std::string& extra = "") {
    return "train " + config().string() + " run.dir=" + dir.string() + " " + extra;
  }
  static const fs::path& reference() {
    static const fs::path dir = [] {
      const fs::path d = work_dir() / "reference";
      const Result r = run(train(d));
      EXPECT_EQ(r.exit_code, 0) << r.output;
      return d;
    }();
    return dir;
  }
  static std::string exporting(const std::string& format, const fs::path& out, const std::string& extra = "") {
    return "export " + reference().string() + " --format " + format + " -o " + out.string() + " " + extra;
  }
};

}  // namespace

// The export quantizes the FP32 master weights with the recipe's forward weight quantizer; the
// Linear layer's own quantized weight after a forward pass must be the same bytes.
TEST_F(ExportCli, WeightQuantizationIsTheOneTheLinearMultiplies) {
  auto loaded = train::load_run(reference(), std::nullopt);
  const auto shard = train::read_token_shard(data() / train::prepared_shards(data()).val.front().file);
  train::evaluate_token_stream(loaded, shard.tokens, 2, true);
  int nvfp4 = 0;
  for (int l = 0; l < 3; ++l)
    for (int i = 0; i < model::kLinearsPerBlock; ++i) {
      const auto which = static_cast<model::BlockLinear>(i);
      const auto q = train::forward_weight_quantization(loaded, l, which);
      const std::optional<QuantizedTensor> w = loaded.model->linear(l, which).fprop_weight();
      if (l == 2) {  // kept in BF16
        EXPECT_FALSE(q.has_value());
        EXPECT_FALSE(w.has_value());
        continue;
      }
      ASSERT_TRUE(q.has_value());
      ASSERT_TRUE(w.has_value());
      ++nvfp4;
      EXPECT_EQ(q->block, BlockShape::tile_16x16);
      EXPECT_EQ(q->codes, w->codes) << "layer " << l << " linear " << i;
      EXPECT_EQ(q->scales, w->scales);
      EXPECT_EQ(q->amax, w->amax);
      EXPECT_EQ(q->decode_scale, w->decode_scale);
      EXPECT_GT(loaded.model->linear(l, which).fprop_input_amax(), 0.0f);
    }
  EXPECT_EQ(nvfp4, 8);
}

// Other forward weight quantizers of the recipe: 1x16 blocks, Four Over Six with the 256 ceiling
// (global scale amax / 1536, which weight_scale_2 must carry as is), and an untied LM head.
TEST_F(ExportCli, FourOverSixOneBySixteenUntiedHeadAreExactToo) {
  const fs::path dir = work_dir() / "four-over-six";
  const Result t = run(train(dir, "steps=2 nvfp4.weight_2d=false nvfp4.four_over_six=true "
                                  "nvfp4.four_over_six_e4m3_max=256 model.tied_embeddings=false"));
  ASSERT_EQ(t.exit_code, 0) << t.output;
  auto loaded = train::load_run(dir, std::nullopt);
  train::evaluate_token_stream(loaded, train::read_token_shard(data() / train::prepared_shards(data()).val.front().file).tokens, 2, true);
  const auto q = train::forward_weight_quantization(loaded, 1, model::BlockLinear::down);
  const std::optional<QuantizedTensor> w = loaded.model->linear(1, model::BlockLinear::down).fprop_weight();
  ASSERT_TRUE(q.has_value());
  ASSERT_TRUE(w.has_value());
  EXPECT_EQ(q->block, BlockShape::row_1x16);
  EXPECT_TRUE(q->four_over_six);
  EXPECT_EQ(q->codes, w->codes);
  EXPECT_EQ(q->scales, w->scales);
  EXPECT_EQ(q->decode_scale, w->decode_scale);
  const fs::path out = work_dir() / "four-over-six-export";
  const Result r = run("export " + dir.string() + " --format modelopt-nvfp4 --calibrate 1 -o " + out.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto st = io::read_safetensors(out / "model.safetensors");
  EXPECT_EQ(f32_of(st.tensor("model.layers.1.mlp.down_proj.weight_scale_2")), q->decode_scale);
  EXPECT_FLOAT_EQ(q->decode_scale, q->amax / 1536.0f);
  EXPECT_EQ(st.tensor("lm_head.weight").dtype, io::DType::BF16);
  EXPECT_TRUE(contains(train::read_text_file((out / "README.md").string()), "amax / 1536"));
}

TEST_F(ExportCli, ModelOptLayoutScalesAndConfig) {
  const fs::path out = work_dir() / "modelopt";
  const Result r = run(exporting("modelopt-nvfp4", out, "--calibrate 2"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "bit for bit")) << r.output;
  for (const char* f : {"config.json", "generation_config.json", "model.safetensors", "hf_quant_config.json",
                        "README.md", "tokenizer.json", "tokenizer_config.json"})
    EXPECT_TRUE(fs::exists(out / f)) << f;
  const json hq = read_json(out / "hf_quant_config.json");
  EXPECT_EQ(hq["producer"]["name"], "nibble");
  EXPECT_EQ(hq["quantization"]["quant_algo"], "NVFP4");
  EXPECT_EQ(hq["quantization"]["group_size"], 16);
  EXPECT_TRUE(hq["quantization"].contains("kv_cache_quant_algo"));
  const auto excluded = hq["quantization"]["exclude_modules"].get<std::vector<std::string>>();
  EXPECT_NE(std::find(excluded.begin(), excluded.end(), "model.layers.2.self_attn.q_proj"), excluded.end());
  EXPECT_NE(std::find(excluded.begin(), excluded.end(), "lm_head"), excluded.end());
  EXPECT_EQ(std::find(excluded.begin(), excluded.end(), "model.layers.0.self_attn.q_proj"), excluded.end());
  const json cfg = read_json(out / "config.json");
  EXPECT_EQ(cfg["quantization_config"]["quant_method"], "modelopt");
  EXPECT_EQ(cfg["torch_dtype"], "bfloat16");

  const auto st = io::read_safetensors(out / "model.safetensors");
  EXPECT_EQ(st.metadata.at("format"), "pt");
  auto loaded = train::load_run(reference(), std::nullopt);
  const auto qkv = train::forward_weight_quantization(loaded, 0, model::BlockLinear::qkv);
  ASSERT_TRUE(qkv.has_value());
  // q, k, v: rows of the one fused weight, one global scale; element 2i in the low nibble.
  int64_t row = 0;
  for (const char* p : {"q_proj", "k_proj", "v_proj"}) {
    const std::string m = std::string("model.layers.0.self_attn.") + p;
    const auto& w = st.tensor(m + ".weight");
    EXPECT_EQ(w.dtype, io::DType::U8);
    ASSERT_EQ(w.shape, (std::vector<int64_t>{32, 16}));
    EXPECT_TRUE(std::equal(w.data.begin(), w.data.end(), qkv->codes.begin() + row * 16));
    const auto& s = st.tensor(m + ".weight_scale");
    EXPECT_EQ(s.dtype, io::DType::F8_E4M3);
    ASSERT_EQ(s.shape, (std::vector<int64_t>{32, 2}));
    EXPECT_TRUE(std::equal(s.data.begin(), s.data.end(), qkv->scales.begin() + row * 2));
    EXPECT_TRUE(st.tensor(m + ".weight_scale_2").shape.empty());
    EXPECT_EQ(f32_of(st.tensor(m + ".weight_scale_2")), qkv->decode_scale);
    EXPECT_FLOAT_EQ(f32_of(st.tensor(m + ".weight_scale_2")), qkv->amax / 2688.0f);
    EXPECT_GT(f32_of(st.tensor(m + ".input_scale")), 0.0f);
    EXPECT_EQ(f32_of(st.tensor(m + ".input_scale")),
              f32_of(st.tensor("model.layers.0.self_attn.q_proj.input_scale")));  // one input
    row += 32;
  }
  // The BF16-kept block and the embeddings are dense BF16.
  EXPECT_EQ(st.tensor("model.layers.2.mlp.down_proj.weight").dtype, io::DType::BF16);
  EXPECT_EQ(st.tensor("model.embed_tokens.weight").dtype, io::DType::BF16);
  EXPECT_FALSE(st.tensors.contains("model.layers.2.mlp.down_proj.weight_scale"));
  const std::string card = train::read_text_file((out / "README.md").string());
  EXPECT_TRUE(contains(card, "final validation loss")) << card;
  EXPECT_TRUE(contains(card, "quantization: \"nvfp4\"")) << card;
}

TEST_F(ExportCli, CompressedTensorsGlobalScalesAreReciprocal) {
  const fs::path out = work_dir() / "ct";
  const Result r = run(exporting("compressed-tensors-nvfp4", out, "--calibrate 1"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const json q = read_json(out / "config.json")["quantization_config"];
  EXPECT_EQ(q["quant_method"], "compressed-tensors");
  EXPECT_EQ(q["format"], "nvfp4-pack-quantized");
  EXPECT_EQ(q["config_groups"]["group_0"]["weights"]["strategy"], "tensor_group");
  EXPECT_EQ(q["config_groups"]["group_0"]["input_activations"]["dynamic"], "local");
  EXPECT_FALSE(fs::exists(out / "hf_quant_config.json"));
  const auto st = io::read_safetensors(out / "model.safetensors");
  auto loaded = train::load_run(reference(), std::nullopt);
  const auto gu = train::forward_weight_quantization(loaded, 1, model::BlockLinear::gate_up);
  ASSERT_TRUE(gu.has_value());
  const auto enc = ref::nvfp4_global_scale(gu->amax, 2688.0f).encode;
  for (const char* p : {"gate_proj", "up_proj"}) {
    const std::string m = std::string("model.layers.1.mlp.") + p;
    EXPECT_EQ(st.tensor(m + ".weight_packed").dtype, io::DType::U8);
    EXPECT_EQ(st.tensor(m + ".weight_global_scale").shape, std::vector<int64_t>{1});
    EXPECT_EQ(f32_of(st.tensor(m + ".weight_global_scale")), enc);
    EXPECT_GT(f32_of(st.tensor(m + ".input_global_scale")), 0.0f);
  }
  // Weight-only: no input scales, W4A16 schemes.
  const fs::path wo = work_dir() / "ct-weight-only";
  ASSERT_EQ(run(exporting("compressed-tensors-nvfp4", wo, "--calibrate 0")).exit_code, 0);
  EXPECT_TRUE(read_json(wo / "config.json")["quantization_config"]["config_groups"]["group_0"]["input_activations"].is_null());
  EXPECT_FALSE(io::read_safetensors(wo / "model.safetensors").tensors.count("model.layers.0.mlp.up_proj.input_global_scale"));
  const fs::path mo = work_dir() / "modelopt-weight-only";
  ASSERT_EQ(run(exporting("modelopt-nvfp4", mo, "--calibrate 0")).exit_code, 0);
  EXPECT_EQ(read_json(mo / "hf_quant_config.json")["quantization"]["quant_algo"], "W4A16_NVFP4");
}

TEST_F(ExportCli, HfFp32IsTheCheckpointExactly) {
  const fs::path out = work_dir() / "hf";
  const Result r = run(exporting("hf", out, "--dtype fp32"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto st = io::read_safetensors(out / "model.safetensors");
  const auto ck = io::read_safetensors(reference() / "checkpoints" / "step_00000008" / "model.safetensors");
  ASSERT_EQ(st.tensors.size(), ck.tensors.size());
  for (const auto& [name, t] : ck.tensors) {
    EXPECT_EQ(st.tensor(name).dtype, io::DType::F32) << name;
    EXPECT_EQ(st.tensor(name).data, t.data) << name;
  }
  EXPECT_EQ(read_json(out / "config.json")["torch_dtype"], "float32");
  EXPECT_FALSE(read_json(out / "config.json").contains("quantization_config"));
  // BF16: round to nearest of the FP32 weights.
  const fs::path bf = work_dir() / "hf-bf16";
  ASSERT_EQ(run(exporting("hf", bf)).exit_code, 0);
  const auto bf_file = io::read_safetensors(bf / "model.safetensors");
  const auto& e = bf_file.tensor("model.embed_tokens.weight");
  const auto& e32 = ck.tensor("model.embed_tokens.weight");
  ASSERT_EQ(e.dtype, io::DType::BF16);
  for (size_t i = 0; i < 64; ++i) {
    float v;
    std::memcpy(&v, e32.data.data() + 4 * i, 4);
    uint16_t b;
    std::memcpy(&b, e.data.data() + 2 * i, 2);
    EXPECT_EQ(b, bf16_from_float_rn(v).bits);
  }
}

TEST_F(ExportCli, ExistingOutputIsRefusedUnlessForced) {
  const fs::path out = work_dir() / "existing";
  fs::create_directories(out);
  ASSERT_EQ(run(exporting("hf", out / "earlier")).exit_code, 0);
  const Result r = run(exporting("hf", out / "earlier"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "already exists") && contains(r.output, "--force")) << r.output;
  // --force replaces an earlier export...
  const Result f = run(exporting("modelopt-nvfp4", out / "earlier", "--force --calibrate 1"));
  ASSERT_EQ(f.exit_code, 0) << f.output;
  EXPECT_TRUE(fs::exists(out / "earlier" / "hf_quant_config.json"));
  // ...and nothing else: a directory with a file an export does not write is left as it is.
  fs::create_directories(out / "mine");
  std::ofstream(out / "mine" / "keep.txt") << "mine";
  const Result mine = run(exporting("hf", out / "mine", "--force"));
  EXPECT_EQ(mine.exit_code, 2) << mine.output;
  EXPECT_TRUE(contains(mine.output, "keep.txt") && contains(mine.output, "not an earlier export")) << mine.output;
  EXPECT_TRUE(fs::exists(out / "mine" / "keep.txt"));
  EXPECT_FALSE(fs::exists(out / "mine" / "config.json"));
  // The run itself (or a folder holding it) is never an output, even with --force.
  const Result self = run("export " + reference().string() + " --format hf --force -o " + reference().string());
  EXPECT_EQ(self.exit_code, 2) << self.output;
  const Result parent = run("export " + reference().string() + " --format hf --force -o " + work_dir().string());
  EXPECT_EQ(parent.exit_code, 2) << parent.output;
  EXPECT_TRUE(fs::exists(reference() / "config.yaml"));
}

// Outputs inside a run (only the trainer writes there) or a data directory are refused, --force or
// not, and leave every byte of the run as it was.
TEST_F(ExportCli, OutputsInsideARunOrDataDirectoryAreRefused) {
  const fs::path run_dir = work_dir() / "inside";
  fs::remove_all(run_dir);
  fs::copy(reference(), run_dir, fs::copy_options::recursive);
  const auto checkpoints = train::list_checkpoints(run_dir);
  ASSERT_FALSE(checkpoints.empty());
  const auto weights = file_bytes(checkpoints.back() / "model.safetensors");
  const auto config = file_bytes(run_dir / "config.yaml");
  const std::vector<fs::path> outputs = {run_dir / "checkpoints", run_dir / "checkpoints" / "step_99999999",
                                         run_dir / "config.yaml", checkpoints.back(), run_dir / "new-export",
                                         data(), data() / "export"};
  for (const fs::path& out : outputs) {
    const Result r = run("export " + run_dir.string() + " --format hf --force -o " + out.string());
    EXPECT_EQ(r.exit_code, 2) << out << ": " << r.output;
    EXPECT_TRUE(contains(r.output, "run directory") || contains(r.output, "data directory")) << r.output;
  }
  EXPECT_EQ(train::list_checkpoints(run_dir), checkpoints);
  EXPECT_FALSE(fs::exists(run_dir / "checkpoints" / "step_99999999"));
  EXPECT_FALSE(fs::exists(run_dir / "new-export"));
  EXPECT_EQ(file_bytes(checkpoints.back() / "model.safetensors"), weights);
  EXPECT_EQ(file_bytes(run_dir / "config.yaml"), config);
  EXPECT_TRUE(fs::exists(data() / "prepare.json"));
}

// A device node or any other non-directory as -o is refused and left as it is (as root, --force
// used to rename it away and delete it); a symlink to a directory exports into that directory.
TEST_F(ExportCli, SpecialOutputsAreNeverReplaced) {
  const fs::path dir = work_dir() / "special";
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::vector<fs::path> outputs = {dir / "file"};
  std::ofstream(dir / "file") << "mine";
  if (::geteuid() == 0 && ::mknod((dir / "null").c_str(), S_IFCHR | 0666, ::makedev(1, 3)) == 0)
    outputs.push_back(dir / "null");
  for (const fs::path& out : outputs) {
    const Result r = run(exporting("hf", out, "--force"));
    EXPECT_EQ(r.exit_code, 2) << out << ": " << r.output;
    EXPECT_TRUE(contains(r.output, "is not a directory")) << r.output;
  }
  EXPECT_EQ(file_bytes(dir / "file"), std::vector<uint8_t>({'m', 'i', 'n', 'e'}));
  if (outputs.size() > 1) {
    EXPECT_TRUE(fs::is_character_file(dir / "null"));
  }
  fs::create_directories(dir / "target");
  fs::create_directory_symlink("target", dir / "link");
  const Result linked = run(exporting("hf", dir / "link"));
  ASSERT_EQ(linked.exit_code, 0) << linked.output;
  EXPECT_TRUE(fs::is_symlink(dir / "link"));
  EXPECT_TRUE(fs::exists(dir / "target" / "model.safetensors"));
}

// A killed export leaves OUT.tmp.PID/: the next export to OUT removes it when that process is gone
// and it holds only export files; a live process's, or one holding a user's file, stays.
TEST_F(ExportCli, StaleTemporariesOfAKilledExportAreRemoved) {
  const fs::path dir = work_dir() / "stale";
  fs::remove_all(dir);
  const long dead = 4194305;  // above Linux's largest pid_max: never a live process
  const fs::path stale = dir / ("out.tmp." + std::to_string(dead)), live = dir / ("out.tmp." + std::to_string(::getpid()));
  const fs::path users = dir / ("out.old." + std::to_string(dead));
  for (const fs::path& d : {stale, live, users}) {
    fs::create_directories(d);
    std::ofstream(d / "model.safetensors") << "half";
  }
  std::ofstream(users / "notes.txt") << "mine";
  const Result r = run(exporting("hf", dir / "out"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(live / "model.safetensors"));
  EXPECT_TRUE(fs::exists(users / "notes.txt"));
}

TEST_F(ExportCli, RunWithoutCheckpointsIsRefused) {
  const fs::path dir = work_dir() / "no-checkpoints";
  fs::remove_all(dir);
  fs::copy(reference(), dir, fs::copy_options::recursive);
  fs::remove_all(dir / "checkpoints");
  const fs::path out = work_dir() / "from-no-checkpoints";
  const Result r = run("export " + dir.string() + " --format modelopt-nvfp4 -o " + out.string());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "no checkpoint")) << r.output;
  expect_no_output(out);
}

TEST_F(ExportCli, RecipeWithoutNvfp4WeightsExportsOnlyHf) {
  const fs::path bf16 = work_dir() / "bf16-run";
  ASSERT_EQ(run(train(bf16, "quantization=bf16 steps=2")).exit_code, 0);
  const fs::path out = work_dir() / "bf16-export";
  for (const char* f : {"modelopt-nvfp4", "compressed-tensors-nvfp4"}) {
    const Result r = run("export " + bf16.string() + " --format " + f + " -o " + out.string());
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_TRUE(contains(r.output, "quantization=bf16") && contains(r.output, "--format hf")) << r.output;
    expect_no_output(out);
  }
  EXPECT_EQ(run("export " + bf16.string() + " --format hf -o " + out.string()).exit_code, 0);
  EXPECT_EQ(run("export " + bf16.string() + " --format onnx -o " + (work_dir() / "x").string()).exit_code, 2);
}

// K not a multiple of 16: no NVFP4 run can be trained so, but a run's config can say nvfp4 for a
// model trained otherwise (here a BF16 run of width 40, its config edited): the export names the
// tensor, K and the fix before anything else.
TEST_F(ExportCli, ShapeTheFormatCannotHoldIsRefused) {
  const fs::path dir = work_dir() / "width40";
  ASSERT_EQ(run(train(dir, "quantization=bf16 steps=2 model.width=40")).exit_code, 0);
  std::string yaml = train::read_text_file((dir / "config.yaml").string());
  const std::string from = "quantization: \"bf16\"";
  const size_t at = yaml.find(from);
  ASSERT_NE(at, std::string::npos) << yaml;
  yaml.replace(at, from.size(), "quantization: \"nvfp4\"");
  std::ofstream(dir / "config.yaml") << yaml;
  const fs::path out = work_dir() / "width40-export";
  const Result r = run("export " + dir.string() + " --format compressed-tensors-nvfp4 -o " + out.string());
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "K = 40") && contains(r.output, "multiple of 16") && contains(r.output, "--format hf"))
      << r.output;
  expect_no_output(out);
  // The dense format needs no NVFP4 block, nor the recipe.
  EXPECT_EQ(run("export " + dir.string() + " --format hf -o " + out.string()).exit_code, 0);
}

TEST_F(ExportCli, EvalWeightsOnlyQuantized) {
  const Result w = run("eval " + reference().string() + " --weights-only-quantized --max-windows 4");
  ASSERT_EQ(w.exit_code, 0) << w.output;
  EXPECT_TRUE(contains(w.output, "dequantized NVFP4 weights of 8 linears")) << w.output;
  const Result f = run("eval " + reference().string() + " --fp32 --max-windows 4");
  ASSERT_EQ(f.exit_code, 0) << f.output;
  EXPECT_NE(w.output.substr(w.output.find("loss")), f.output.substr(f.output.find("loss")));
  EXPECT_EQ(run("eval " + reference().string() + " --fp32 --weights-only-quantized").exit_code, 2);
}
