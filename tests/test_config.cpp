// The run configuration: YAML + dotted overrides, refusal messages, and the printed form.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>

#include <fmt/format.h>

#include "common/shortest_decimal.h"
#include "format/quantized_tensor.h"
#include "run/config.h"
#include "support/check.h"

using namespace nibble;
using namespace nibble::train;

namespace {

using nibble_test::error_of;

constexpr const char* kYaml = R"(
run:
  dir: runs/x
data:
  dir: data/x
steps: 300
quantization: nvfp4
nvfp4:
  rht: false
model:
  layers: 3
  width: 96
  heads: 3
schedule:
  lr: 2e-3
  warmup_steps: 10
  kind: wsd
)";

}  // namespace

// The recipe's key table prints reals without fmt (the offline CUDA-only build has none), yet
// config.yaml must read as the rest of the config, which fmt prints: the same text for every double.
TEST(Config, ShortestDecimalIsFmtsText) {
  for (double v : {0.0, 1.0, -1.0, 0.75, 1e-4, 1e-5, 1.2345e-4, 1e15, 1e16, 123456789012345.6, 0.1, 2.5e-5, 1e-300,
                   5e-324, 1.7976931348623157e308})
    EXPECT_EQ(nibble::shortest_decimal(v), fmt::format("{}", v)) << v;
  std::mt19937_64 bits(7);
  for (int i = 0; i < 100000; ++i) {
    const uint64_t b = bits();
    double v = 0;
    std::memcpy(&v, &b, sizeof v);
    if (v != v) continue;
    ASSERT_EQ(nibble::shortest_decimal(v), fmt::format("{}", v)) << "bits " << b;
    const double fraction = static_cast<double>(b >> 11) / 9007199254740992.0;
    ASSERT_EQ(nibble::shortest_decimal(fraction), fmt::format("{}", fraction));
  }
}

TEST(Config, NestedYamlAndOverridesSetTheFields) {
  RunConfig c;
  apply_config_yaml(c, kYaml, "test.yaml");
  apply_config_overrides(c, {"model.layers=5", "optimizer.weight_decay=0", "resume=true"});
  c.validate();
  EXPECT_EQ(c.run_dir, "runs/x");
  EXPECT_EQ(c.data_dir, "data/x");
  EXPECT_EQ(c.train.schedule.total_steps, 300);
  EXPECT_EQ(c.train.recipe.quantization, Quantization::nvfp4);
  EXPECT_FALSE(c.train.recipe.nvfp4.rht);
  EXPECT_EQ(c.train.model.layers, 5);  // the override wins
  EXPECT_EQ(c.train.model.width, 96);
  EXPECT_FLOAT_EQ(c.train.schedule.lr, 2e-3f);
  EXPECT_EQ(c.train.schedule.kind, Schedule::wsd);
  EXPECT_EQ(c.train.optimizer.weight_decay, 0.0f);
  EXPECT_TRUE(c.resume);
}

TEST(Config, UnknownKeysNameTheClosestValidKey) {
  RunConfig c;
  EXPECT_NE(error_of([&] { apply_config_overrides(c, {"model.layer=3"}); }).find("did you mean 'model.layers'"),
            std::string::npos);
  EXPECT_NE(error_of([&] { apply_config_overrides(c, {"lr=0.1"}); }).find("did you mean 'schedule.lr'"), std::string::npos);
  EXPECT_NE(error_of([&] { apply_config_overrides(c, {"quantisation=nvfp4"}); }).find("did you mean 'quantization'"),
            std::string::npos);
  const std::string from_yaml = error_of([&] { apply_config_yaml(c, "model:\n  widht: 64\n", "cfg.yaml"); });
  EXPECT_NE(from_yaml.find("cfg.yaml:2"), std::string::npos) << from_yaml;
  EXPECT_NE(from_yaml.find("'model.width'"), std::string::npos) << from_yaml;
  EXPECT_EQ(closest_config_key("checkpoint.intervall"), "checkpoint.interval");
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
}

TEST(Config, WrongTypesAreRefusedNamingTheExpectedType) {
  RunConfig c;
  EXPECT_NE(error_of([&] { apply_config_overrides(c, {"steps=abc"}); }).find("not an integer"), std::string::npos);
  EXPECT_NE(error_of([&] { apply_config_overrides(c, {"steps=1.5"}); }).find("not an integer"), std::string::npos);
  EXPECT_NE(error_of([&] { apply_config_overrides(c, {"model.tied_embeddings=yes"}); }).find("true or false"),
            std::string::npos);
  EXPECT_NE(error_of([&] { apply_config_overrides(c, {"schedule.lr=fast"}); }).find("not a finite number"),
            std::string::npos);
  EXPECT_NE(error_of([&] { apply_config_overrides(c, {"schedule.lr=nan"}); }).find("not a finite number"),
            std::string::npos);
  EXPECT_NE(error_of([&] { apply_config_overrides(c, {"quantization=int3"}); }).find("nvfp4"), std::string::npos);
  EXPECT_NE(error_of([&] { apply_config_overrides(c, {"schedule.kind=linear"}); }).find("cosine"), std::string::npos);
  EXPECT_NE(error_of([&] { apply_config_overrides(c, {"steps"}); }).find("not key=value"), std::string::npos);
  EXPECT_NE(error_of([&] { apply_config_overrides(c, {"seed=-4"}); }).find(">= 0"), std::string::npos);
  EXPECT_NE(error_of([&] { apply_config_yaml(c, "model:\n  layers: [1, 2]\n", "c.yaml"); }).find("is a list"),
            std::string::npos);
  EXPECT_NE(error_of([&] { apply_config_yaml(c, "steps:\n", "c.yaml"); }).find("has no value"), std::string::npos);
}

TEST(Config, SyntaxErrorsAndNonMapsAreRefusedWithTheLocation) {
  RunConfig c;
  const std::string e = error_of([&] { apply_config_yaml(c, "steps: 3\nmodel: [1\n", "broken.yaml"); });
  EXPECT_NE(e.find("broken.yaml:"), std::string::npos) << e;
  EXPECT_NE(e.find("not valid YAML"), std::string::npos) << e;
  EXPECT_NE(error_of([&] { apply_config_yaml(c, "- 1\n- 2\n", "list.yaml"); }).find("must be a map"), std::string::npos);
  EXPECT_EQ(error_of([&] { apply_config_yaml(c, "", "empty.yaml"); }), "(no error)");
}

TEST(Config, ValidationNamesTheKeyAndTheFix) {
  RunConfig c;
  EXPECT_NE(error_of([&] { c.validate(); }).find("data.dir is not set"), std::string::npos);
  c.data_dir = "d";
  c.checkpoint_keep = 0;
  EXPECT_NE(error_of([&] { c.validate(); }).find("checkpoint.keep=0"), std::string::npos);
  c.checkpoint_keep = 2;
  apply_config_overrides(c, {"model.width=100", "model.heads=3"});
  EXPECT_NE(error_of([&] { c.validate(); }).find("model.width=100 must be a positive multiple of model.heads=3"),
            std::string::npos);
  // Each message names the key as the config spells it (section included).
  const auto refusal = [](const std::vector<std::string>& overrides) {
    RunConfig r;
    r.data_dir = "d";
    apply_config_overrides(r, overrides);
    return error_of([&] { r.validate(); });
  };
  EXPECT_NE(refusal({"steps=40"}).find("schedule.warmup_steps=100 must lie in [0, steps=40]"), std::string::npos)
      << refusal({"steps=40"});
  EXPECT_NE(refusal({"schedule.min_lr=1"}).find("schedule.min_lr="), std::string::npos);
  EXPECT_NE(refusal({"eval.batches=0"}).find("eval.batches=0"), std::string::npos);
  EXPECT_NE(refusal({"model.kv_heads=3"}).find("model.kv_heads=3 must divide model.heads="), std::string::npos);
  EXPECT_NE(refusal({"seq=512", "model.context=256"}).find("seq=512 exceeds model.context=256"), std::string::npos);
}

// The recipe's keys come from the recipe's own table (recipe_keys()), in its order and with its help.
TEST(Config, RecipeKeysAreTheRecipeTable) {
  const auto keys = config_keys();
  const auto first = std::find_if(keys.begin(), keys.end(), [](const auto& k) { return k.name == "quantization"; });
  ASSERT_NE(first, keys.end());
  ASSERT_GE(keys.end() - first, static_cast<std::ptrdiff_t>(recipe_keys().size()));
  for (size_t i = 0; i < recipe_keys().size(); ++i) {
    const RecipeKey& r = recipe_keys()[i];
    EXPECT_EQ(first[i].name, r.name);
    EXPECT_EQ(first[i].help, r.help);
    EXPECT_EQ(first[i].kind, r.kind) << r.name;
  }
}

TEST(Config, PrintedYamlLoadsBackToTheSameConfig) {
  RunConfig c;
  apply_config_yaml(c, kYaml, "test.yaml");
  apply_config_overrides(c, {"optimizer.eps=1e-7", "model.rope_theta=500000", "run.dir=runs/with \"quotes\""});
  const std::string yaml = config_to_yaml(c);
  RunConfig back;
  apply_config_yaml(back, yaml, "printed");
  EXPECT_EQ(config_values(back), config_values(c)) << yaml;
  EXPECT_EQ(back.train.optimizer.eps, c.train.optimizer.eps);
  EXPECT_EQ(back.run_dir, "runs/with \"quotes\"");

  // The nvfp4 knobs are left out under another quantization, so the saved file stays loadable.
  RunConfig bf16;
  apply_config_overrides(bf16, {"quantization=bf16"});
  const std::string bf16_yaml = config_to_yaml(bf16);
  EXPECT_EQ(bf16_yaml.find("nvfp4:"), std::string::npos);
  RunConfig bf16_back;
  apply_config_yaml(bf16_back, bf16_yaml, "printed");
  EXPECT_EQ(bf16_back.train.recipe.quantization, Quantization::bf16);
}

TEST(Config, FourOverSixKeysRoundTripAndRefuseBadValues) {
  RunConfig c;
  apply_config_overrides(c, {"quantization=nvfp4", "nvfp4.four_over_six=true", "nvfp4.four_over_six_error=mse",
                             "nvfp4.four_over_six_e4m3_max=256"});
  EXPECT_EQ(c.train.recipe.nvfp4.four_over_six_error, FourOverSixError::mse);
  EXPECT_EQ(c.train.recipe.nvfp4.four_over_six_e4m3_max, 256);
  const std::string yaml = config_to_yaml(c);
  EXPECT_NE(yaml.find("four_over_six_error: \"mse\""), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("four_over_six_e4m3_max: 256"), std::string::npos) << yaml;
  RunConfig back;
  apply_config_yaml(back, yaml, "printed");
  EXPECT_EQ(config_values(back), config_values(c));
  // YAML order does not matter: the knobs may come before four_over_six itself.
  RunConfig nested;
  apply_config_yaml(nested, "quantization: nvfp4\nnvfp4:\n  four_over_six_e4m3_max: 256\n  four_over_six: true\n", "t.yaml");
  EXPECT_EQ(nested.train.recipe.nvfp4.four_over_six_e4m3_max, 256);
  // Without four_over_six the two knobs are not printed (the recipe would refuse other values).
  RunConfig plain;
  apply_config_overrides(plain, {"quantization=nvfp4"});
  EXPECT_EQ(config_to_yaml(plain).find("four_over_six_error"), std::string::npos);
  EXPECT_NE(config_to_yaml(plain).find("four_over_six: false"), std::string::npos);
  // Bad values: the origin, the key, the value and the valid ones.
  RunConfig bad;
  const std::string e = error_of([&] { apply_config_overrides(bad, {"nvfp4.four_over_six_e4m3_max=300"}); });
  EXPECT_NE(e.find("command line"), std::string::npos) << e;
  EXPECT_NE(e.find("'300'"), std::string::npos) << e;
  EXPECT_NE(e.find("448"), std::string::npos) << e;
  EXPECT_NE(e.find("256"), std::string::npos) << e;
  const std::string e2 = error_of([&] { apply_config_yaml(bad, "nvfp4:\n  four_over_six_error: l1\n", "b.yaml"); });
  EXPECT_NE(e2.find("b.yaml:2"), std::string::npos) << e2;
  EXPECT_NE(e2.find("'l1'"), std::string::npos) << e2;
  EXPECT_NE(e2.find("mae"), std::string::npos) << e2;
}

TEST(Config, EveryKeyIsListedOnce) {
  auto keys = config_keys();
  std::set<std::string> names;
  for (const auto& k : keys) EXPECT_TRUE(names.insert(k.name).second) << k.name;
  EXPECT_TRUE(names.contains("quantization"));
  EXPECT_TRUE(names.contains("nvfp4.four_over_six"));
  EXPECT_TRUE(names.contains("nvfp4.four_over_six_error"));
  EXPECT_TRUE(names.contains("nvfp4.four_over_six_e4m3_max"));
  for (const auto& k : keys) {
    if (k.name == "nvfp4.four_over_six_error" || k.name == "nvfp4.four_over_six_e4m3_max") {
      EXPECT_NE(k.help.find("TE's default"), std::string::npos) << k.name << ": " << k.help;
    }
  }
  EXPECT_TRUE(names.contains("checkpoint.keep"));
}
