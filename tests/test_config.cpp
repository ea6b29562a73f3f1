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
    // Out-of-range values are refused as they are read, the rest by validate(): both name the key.
    return error_of([&] {
      apply_config_overrides(r, overrides);
      r.validate();
    });
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

// Every integer key has bounds, so no value overflows the sizes computed from it (model.width=2^62
// ended in an assertion, batch=2^62 in a crash); the message names the key and the range.
TEST(Config, IntegerKeysAreBoundedNamingTheRange) {
  RunConfig c;
  const auto refusal = [&](const std::string& word) { return error_of([&] { apply_config_overrides(c, {word}); }); };
  EXPECT_NE(refusal("model.width=4611686018427387904").find("model.width=4611686018427387904 is out of range: give a "
                                                            "value in [1, 1048576]"),
            std::string::npos);
  EXPECT_NE(refusal("batch=99999999999999999999999").find("batch=99999999999999999999999 is out of range"), std::string::npos);
  EXPECT_NE(refusal("steps=-1").find("steps=-1 is out of range: give a value in [1, 1099511627776]"), std::string::npos);
  EXPECT_NE(refusal("threads=5000").find("[0, 4096]"), std::string::npos);
  EXPECT_NE(refusal("seq=-1").find("seq=-1 is out of range"), std::string::npos);
  EXPECT_NE(refusal("model.layers=1.5").find("not an integer"), std::string::npos);
  EXPECT_NE(refusal("nvfp4.bf16_first_layers=99999999999").find("is out of range"), std::string::npos);
  for (const auto& key : config_keys()) {  // the largest int64 is out of every integer key's range
    if (key.kind == ConfigValueKind::integer && key.name != "seed" && !key.name.starts_with("nvfp4.")) {
      EXPECT_NE(refusal(key.name + "=9223372036854775807").find("is out of range"), std::string::npos) << key.name;
    }
  }
  // Within the bounds, their products are capped: here the attention probabilities alone would
  // be 2^30 x 4 x 2^48 values.
  RunConfig big;
  big.data_dir = "d";
  apply_config_overrides(big, {"batch=1073741824", "model.context=16777216", "schedule.warmup_steps=0"});
  EXPECT_NE(error_of([&] { big.validate(); }).find("bytes of memory"), std::string::npos) << error_of([&] { big.validate(); });
  for (const char* large : {"batch=1000000000", "model.layers=10000000"}) {
    RunConfig fits;  // large but representable: left to train's check against the machine's memory
    fits.data_dir = "d";
    apply_config_overrides(fits, {large});
    EXPECT_EQ(error_of([&] { fits.validate(); }), "(no error)") << large;
  }
}

// A key given twice, a second document and a tag would each be dropped or half-applied silently.
TEST(Config, DuplicateKeysSecondDocumentsAndTagsAreRefusedNamingTheLine) {
  const auto refusal = [](const std::string& yaml) {
    RunConfig c;
    return error_of([&] { apply_config_yaml(c, yaml, "c.yaml"); });
  };
  EXPECT_NE(refusal("steps: 3\nbatch: 2\nsteps: 5\n").find("c.yaml:3: steps is given twice (also at line 1)"),
            std::string::npos);
  EXPECT_NE(refusal("model:\n  width: 64\nmodel:\n  layers: 3\n").find("c.yaml:3: model is given twice"), std::string::npos);
  EXPECT_NE(refusal("model.width: 64\nmodel:\n  width: 32\n").find("c.yaml:3: model.width is given twice (also at line 1)"),
            std::string::npos);
  EXPECT_NE(refusal("steps: 3\n---\nsteps: 5\n").find("c.yaml:3: a second YAML document"), std::string::npos);
  EXPECT_NE(refusal("steps: 3\n---\n").find("a second YAML document"), std::string::npos);
  EXPECT_NE(refusal("steps: !!str 3\n").find("c.yaml:1: steps carries the YAML tag 'tag:yaml.org,2002:str'"),
            std::string::npos);
  EXPECT_NE(refusal("batch: 2\nsteps: !foo 3\n").find("c.yaml:2: steps carries the YAML tag '!foo'"), std::string::npos);
  EXPECT_NE(refusal("!!map\nsteps: 3\n").find("the config carries the YAML tag"), std::string::npos);
  EXPECT_EQ(refusal("steps: 3\n...\n"), "(no error)");  // an end marker alone is one document
  EXPECT_EQ(refusal("---\nsteps: 3\nrun:\n  dir: 'x'\n"), "(no error)");
}

// Text values are saved so that they read back byte for byte: a newline in run.dir came back as a
// space, and resuming through the saved config.yaml started a run elsewhere.
TEST(Config, SavedTextValuesReadBackExactly) {
  for (const std::string& dir : {std::string("runs/a\nb"), std::string("tab\there"), std::string("cr\rlf\n"),
                                std::string("q\"uo\\te'"), std::string("ctl\x01\x1F\x7F"), std::string("caf\xC3\xA9"),
                                std::string("raw\xFF"), std::string("  spaced  "), std::string("#not a comment")}) {
    RunConfig c;
    c.run_dir = dir;
    c.data_dir = dir + "/data";
    RunConfig back;
    apply_config_yaml(back, config_to_yaml(c), "saved");
    EXPECT_EQ(back.run_dir, dir) << config_to_yaml(c);
    EXPECT_EQ(back.data_dir, dir + "/data");
  }
  RunConfig c;
  EXPECT_NE(error_of([&] { apply_config_yaml(c, "run:\n  dir: \"a\\0b\"\n", "c.yaml"); }).find("NUL"), std::string::npos);
}

// precision_map in YAML is a list of PATTERN: QUANTIZATION items, in order; on the command line
// and in config.yaml, the text form. Both read back to the same rules.
TEST(Config, PrecisionMapListAndTextFormsRoundTrip) {
  RunConfig c;
  apply_config_yaml(c, R"(
quantization: bf16
precision_map:
  - block*.qkv: bf16
  - "block[0-1].*": nvfp4
  - lm_head=bf16
)",
                    "map.yaml");
  const std::vector<PrecisionRule> want = {
      {"block*.qkv", Quantization::bf16}, {"block[0-1].*", Quantization::nvfp4}, {"lm_head", Quantization::bf16}};
  EXPECT_EQ(c.train.recipe.precision_map, want);
  RunConfig text;
  apply_config_overrides(text, {"quantization=bf16", "precision_map=block*.qkv=bf16; block[0-1].*=nvfp4; lm_head=bf16"});
  EXPECT_EQ(text.train.recipe.precision_map, want);
  const std::string yaml = config_to_yaml(c);
  EXPECT_NE(yaml.find("precision_map: \"block*.qkv=bf16; block[0-1].*=nvfp4; lm_head=bf16\""), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("nvfp4:"), std::string::npos) << yaml;  // a rule runs NVFP4: its knobs are written
  RunConfig back;
  apply_config_yaml(back, yaml, "printed");
  EXPECT_EQ(config_values(back), config_values(c));
  EXPECT_EQ(back.train.recipe.precision_map, want);

  EXPECT_NE(error_of([] {
              RunConfig r;
              apply_config_yaml(r, "precision_map:\n  - block*.qkv: bf16\n  - block*.qkv: nvfp4\n", "dup.yaml");
            }).find("dup.yaml:3: precision_map: precision_map gives the pattern 'block*.qkv' twice"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              RunConfig r;
              apply_config_yaml(r, "precision_map:\n  - {block*.qkv: bf16, lm_head: bf16}\n", "two.yaml");
            }).find("each item of the list is one rule"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              RunConfig r;
              apply_config_overrides(r, {"precision_map=block*.qkv"});
            }).find("is not PATTERN=QUANTIZATION"),
            std::string::npos);
}
