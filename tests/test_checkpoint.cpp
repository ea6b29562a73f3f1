// Checkpoints: Hugging Face layout, save/load round trip, validation, pruning, crash leftovers and
// bitwise resume of the Trainer.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "io/safetensors.h"
#include "run/checkpoint.h"
#include "data/data.h"
#include "train/trainer.h"
#include "support/temp_dir.h"
#include "support/tiny_model.h"

using namespace nibble;
using namespace nibble::train;
namespace fs = std::filesystem;

namespace {

// save_checkpoint's options: keep the newest `n`, and `also` whatever the rotation.
CheckpointOptions keep_newest(int64_t n, std::optional<fs::path> also = std::nullopt) {
  CheckpointOptions options;
  options.keep = n;
  options.also_keep = std::move(also);
  return options;
}

fs::path fresh_dir(const std::string& name) { return nibble_test::fresh_dir("test_checkpoint", name); }

model::ModelConfig tiny_model() { return nibble_test::tiny_model({.vocab = 65, .layers = 2, .width = 64, .context = 32}); }

const std::vector<int32_t>& corpus() {
  static const std::vector<int32_t> tokens = [] {
    std::string text = read_text_file(std::string(NIBBLE_SOURCE_DIR) + "/data/tinyshakespeare.txt");
    CharTokenizer tok(text);
    return tok.encode(std::string_view(text).substr(0, 50000));
  }();
  return tokens;
}

TrainConfig tiny_training(Quantization q) {
  TrainConfig c;
  c.model = tiny_model();
  c.recipe.quantization = q;
  c.batch = 2;
  c.schedule.total_steps = 6;
  c.schedule.warmup_steps = 2;
  c.eval_batches = 2;
  return c;
}

}  // namespace

TEST(Checkpoint, HuggingFaceLayoutSplitsFusedWeights) {
  auto m = tiny_model();
  m.tied_embeddings = false;
  model::Transformer model(m, ops::cpu());
  const auto layout = hf_tensor_layout(model);
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const auto& s : layout) shapes[s.hf_name] = s.shape;
  const int64_t f = m.hidden();
  EXPECT_EQ(shapes["model.embed_tokens.weight"], (std::vector<int64_t>{65, 64}));
  EXPECT_EQ(shapes["model.layers.1.self_attn.q_proj.weight"], (std::vector<int64_t>{64, 64}));
  EXPECT_EQ(shapes["model.layers.1.self_attn.k_proj.weight"], (std::vector<int64_t>{32, 64}));  // 2 kv heads x 16
  EXPECT_EQ(shapes["model.layers.1.self_attn.v_proj.weight"], (std::vector<int64_t>{32, 64}));
  EXPECT_EQ(shapes["model.layers.0.self_attn.o_proj.weight"], (std::vector<int64_t>{64, 64}));
  EXPECT_EQ(shapes["model.layers.0.mlp.gate_proj.weight"], (std::vector<int64_t>{f, 64}));
  EXPECT_EQ(shapes["model.layers.0.mlp.up_proj.weight"], (std::vector<int64_t>{f, 64}));
  EXPECT_EQ(shapes["model.layers.0.mlp.down_proj.weight"], (std::vector<int64_t>{64, f}));
  EXPECT_EQ(shapes["model.layers.0.input_layernorm.weight"], (std::vector<int64_t>{64}));
  EXPECT_EQ(shapes["model.layers.0.post_attention_layernorm.weight"], (std::vector<int64_t>{64}));
  EXPECT_EQ(shapes["model.norm.weight"], (std::vector<int64_t>{64}));
  EXPECT_EQ(shapes["lm_head.weight"], (std::vector<int64_t>{65, 64}));
  // Every arena element is covered exactly once.
  int64_t covered = 0;
  for (const auto& s : layout) covered += s.rows * s.cols;
  EXPECT_EQ(covered, model.params().parameter_count());
}

TEST(Checkpoint, SaveLoadRoundTripAndHuggingFaceReadable) {
  const fs::path run = fresh_dir("roundtrip");
  model::Transformer a(tiny_model(), ops::cpu());
  a.init_weights(7);
  AdamW opt_a(a.params(), AdamWConfig{}, a.backend());
  std::vector<float> m(a.params().values().size()), v(m.size());
  for (size_t i = 0; i < m.size(); ++i) {
    m[i] = 0.001f * static_cast<float>(i % 97);
    v[i] = 0.002f * static_cast<float>(i % 89);
  }
  opt_a.set_moments(m, v);
  opt_a.set_steps(12);
  TrainingState s;
  s.step = 12;
  s.tokens = 12 * 64;
  s.micro_batches = 12;
  s.seed = 99;
  s.best_val_loss = 2.5;
  s.best_val_step = 10;
  const fs::path path = save_checkpoint(run, a, &opt_a, s, keep_newest(3));
  EXPECT_EQ(path, checkpoint_path(run, 12));
  EXPECT_TRUE(fs::exists(path / "config.json"));

  // q_proj is the first rows of the fused qkv weight.
  const auto st = io::read_safetensors(path / "model.safetensors");
  const auto& q = st.tensor("model.layers.1.self_attn.q_proj.weight");
  const float* qkv = a.params().value(a.params().find("block1.qkv").offset);
  EXPECT_EQ(std::memcmp(q.data.data(), qkv, q.data.size()), 0);
  EXPECT_EQ(st.metadata.at("format"), "pt");

  model::Transformer b(tiny_model(), ops::cpu());
  b.init_weights(8);
  AdamW opt_b(b.params(), AdamWConfig{}, b.backend());
  const TrainingState loaded = load_checkpoint(path, b, &opt_b);
  EXPECT_EQ(loaded.step, 12);
  EXPECT_EQ(loaded.seed, 99u);
  EXPECT_EQ(loaded.best_val_step, 10);
  EXPECT_EQ(opt_b.steps(), 12);
  EXPECT_TRUE(std::equal(a.params().values().begin(), a.params().values().end(), b.params().values().begin()));
  EXPECT_EQ(opt_a.first_moments(), opt_b.first_moments());
  EXPECT_EQ(opt_a.second_moments(), opt_b.second_moments());
}

TEST(Checkpoint, AnotherModelShapeIsRefusedNamingTheTensors) {
  const fs::path run = fresh_dir("mismatch");
  model::Transformer a(tiny_model(), ops::cpu());
  save_checkpoint(run, a, nullptr, TrainingState{}, keep_newest(1));
  auto wider = tiny_model();
  wider.width = 96;
  model::Transformer b(wider, ops::cpu());
  const std::vector<float> before(b.params().values().begin(), b.params().values().end());
  try {
    load_checkpoint(checkpoint_path(run, 0), b, nullptr);
    FAIL() << "a checkpoint of another width must be refused";
  } catch (const UsageError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("model.embed_tokens.weight has shape [65, 64], this model needs [65, 96]"), std::string::npos) << m;
    EXPECT_NE(m.find("width=96"), std::string::npos) << m;
  }
  // Nothing of the refused checkpoint reached the model.
  EXPECT_TRUE(std::equal(before.begin(), before.end(), b.params().values().begin()));

  auto deeper = tiny_model();
  deeper.layers = 3;
  model::Transformer c(deeper, ops::cpu());
  try {
    load_checkpoint(checkpoint_path(run, 0), c, nullptr);
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.2.self_attn.q_proj.weight is missing"), std::string::npos);
  }
  model::Transformer d(tiny_model(), ops::cpu());
  AdamW opt(d.params(), AdamWConfig{}, d.backend());
  EXPECT_THROW(load_checkpoint(checkpoint_path(run, 0), d, &opt), UsageError);  // saved without optimizer state
  EXPECT_THROW(load_checkpoint(run / "checkpoints" / "step_00000099", d, nullptr), UsageError);
}

TEST(Checkpoint, KeepsTheNewestAndIgnoresCrashLeftovers) {
  const fs::path run = fresh_dir("keep");
  model::Transformer a(tiny_model(), ops::cpu());
  // A crashed save leaves a hidden partial directory: never listed, removed by the next save.
  fs::create_directories(checkpoints_dir(run) / ".partial-step_00000005-123");
  for (int64_t step : {10, 20, 30, 40}) {
    TrainingState s;
    s.step = step;
    save_checkpoint(run, a, nullptr, s, keep_newest(2));
  }
  const auto all = list_checkpoints(run);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].filename(), "step_00000030");
  EXPECT_EQ(all[1].filename(), "step_00000040");
  EXPECT_FALSE(fs::exists(checkpoints_dir(run) / ".partial-step_00000005-123"));
  // Saving a step again replaces it.
  TrainingState s;
  s.step = 40;
  s.tokens = 777;
  save_checkpoint(run, a, nullptr, s, keep_newest(2));
  model::Transformer b(tiny_model(), ops::cpu());
  EXPECT_EQ(load_checkpoint(*latest_checkpoint(run), b, nullptr).tokens, 777);
}

TEST(Checkpoint, RotationSparesTheCheckpointToKeepAlso) {
  // During a loss spike the run keeps the last checkpoint before it, however many follow.
  const fs::path run = fresh_dir("keep-also");
  model::Transformer a(tiny_model(), ops::cpu());
  for (int64_t step : {10, 20, 30, 40, 50}) {
    TrainingState s;
    s.step = step;
    save_checkpoint(run, a, nullptr, s, keep_newest(2, checkpoint_path(run, 20)));
  }
  const auto all = list_checkpoints(run);
  ASSERT_EQ(all.size(), 3u);
  EXPECT_EQ(all[0].filename(), "step_00000020");
  EXPECT_EQ(all[1].filename(), "step_00000040");
  EXPECT_EQ(all[2].filename(), "step_00000050");
}

TEST(Checkpoint, AbandonedCheckpointsAreMovedNeverDeleted) {
  const fs::path run = fresh_dir("abandon");
  model::Transformer a(tiny_model(), ops::cpu());
  for (int64_t step : {10, 20, 30}) {
    TrainingState s;
    s.step = step;
    save_checkpoint(run, a, nullptr, s, keep_newest(5));
  }
  const auto moved = abandon_checkpoints_after(run, 10);
  ASSERT_EQ(moved.size(), 2u);
  EXPECT_EQ(moved[0].from, checkpoint_path(run, 20));
  EXPECT_EQ(moved[0].to, abandoned_dir(run) / "step_00000020");
  EXPECT_EQ(moved[1].to, abandoned_dir(run) / "step_00000030");
  ASSERT_EQ(list_checkpoints(run).size(), 1u);
  EXPECT_EQ(*latest_checkpoint(run), checkpoint_path(run, 10));
  model::Transformer b(tiny_model(), ops::cpu());
  EXPECT_NO_THROW(load_checkpoint(abandoned_dir(run) / "step_00000030", b, nullptr));
  // A second abandoned branch with the same step names: suffixed, the first one kept.
  TrainingState s;
  s.step = 20;
  save_checkpoint(run, a, nullptr, s, keep_newest(5));
  const auto again = abandon_checkpoints_after(run, 10);
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].to, abandoned_dir(run) / "step_00000020-2");
  EXPECT_TRUE(fs::exists(abandoned_dir(run) / "step_00000020" / "state.json"));
  EXPECT_TRUE(abandon_checkpoints_after(run, 10).empty());
}

TEST(Checkpoint, ResumedTrainingIsBitwiseTheUninterruptedRun) {
  for (Quantization q : {Quantization::none, Quantization::nvfp4}) {
    const TrainConfig config = tiny_training(q);
    Trainer whole(config, corpus());
    std::vector<double> losses;
    for (int i = 0; i < 6; ++i) losses.push_back(whole.step().loss);
    const double whole_val = whole.evaluate();

    const fs::path run = fresh_dir(std::string("resume_") + std::string(to_string(q)));
    {
      Trainer first(config, corpus());
      for (int i = 0; i < 3; ++i) EXPECT_EQ(first.step().loss, losses[i]);
      first.evaluate();  // an evaluation before the checkpoint must not disturb what follows
      TrainingState s;
      s.step = 3;
      s.micro_batches = 3;
      save_checkpoint(run, first.model(), &first.optimizer(), s, keep_newest(2));
    }
    Trainer second(config, corpus());
    load_checkpoint(checkpoint_path(run, 3), second.model(), &second.optimizer());
    for (int i = 3; i < 6; ++i) EXPECT_EQ(second.step().loss, losses[i]) << to_string(q) << " step " << i;
    EXPECT_EQ(second.evaluate(), whole_val);
    EXPECT_TRUE(std::equal(whole.model().params().values().begin(), whole.model().params().values().end(),
                           second.model().params().values().begin()));
  }
}
