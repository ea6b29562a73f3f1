#include "run/config.h"

#include <fmt/format.h>
// yaml-cpp 0.7's node headers trip GCC 12's -Wdangling-pointer (a false positive in their
// iterator code); silence it for the include only.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdangling-pointer"
#include <yaml-cpp/yaml.h>
#pragma GCC diagnostic pop

#include <algorithm>
#include <charconv>
#include <cmath>
#include <functional>
#include <map>

#include "format/quantized_tensor.h"
#include "data/data.h"

namespace nibble::train {

namespace {

struct KeyEntry {
  ConfigKeyInfo info;
  std::function<void(RunConfig&, std::string_view key, std::string_view value, std::string_view origin)> set;
  std::function<std::string(const RunConfig&)> get;
  // Keys printed only when they matter (the nvfp4 knobs under another quantization would be refused
  // when the saved file is loaded again).
  std::function<bool(const RunConfig&)> printed = [](const RunConfig&) { return true; };
};

std::string where(std::string_view origin, std::string_view key) {
  return fmt::format("{}: {}", origin, key);
}

int64_t parse_integer(std::string_view key, std::string_view value, std::string_view origin) {
  int64_t v = 0;
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  if (value.empty() || ec != std::errc() || end != value.data() + value.size())
    throw UsageError(fmt::format("{}='{}' is not an integer: write a whole number, e.g. {}=4", where(origin, key), value,
                                 key));
  return v;
}

double parse_real(std::string_view key, std::string_view value, std::string_view origin) {
  std::string s(value);
  char* end = nullptr;
  errno = 0;
  double v = s.empty() ? 0.0 : std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || errno == ERANGE || !std::isfinite(v))
    throw UsageError(fmt::format("{}='{}' is not a finite number: write e.g. {}=0.001 or 1e-3", where(origin, key),
                                 value, key));
  return v;
}

bool parse_boolean(std::string_view key, std::string_view value, std::string_view origin) {
  if (value == "true") return true;
  if (value == "false") return false;
  throw UsageError(fmt::format("{}='{}' is not a boolean: write true or false", where(origin, key), value));
}

// An integer key's value within [lo, hi]. Every integer key has bounds: a value past them would
// overflow the sizes computed from it (model.width=2^62 once ended in an assertion) long before
// any machine could hold the run.
int64_t parse_bounded(std::string_view key, std::string_view value, std::string_view origin, int64_t lo, int64_t hi,
                      std::string_view help) {
  int64_t v = 0;
  auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
  const bool whole = !value.empty() && end == value.data() + value.size();
  if (!whole || (ec != std::errc() && ec != std::errc::result_out_of_range)) return parse_integer(key, value, origin);
  if (ec == std::errc::result_out_of_range || v < lo || v > hi)
    throw UsageError(fmt::format("{}={} is out of range: give a value in [{}, {}] ({})", where(origin, key), value, lo, hi,
                                 help));
  return v;
}

// Builders for the common field kinds: `field` picks the member from a RunConfig.
KeyEntry int_key(std::string name, std::string help, int64_t lo, int64_t hi, std::function<int64_t&(RunConfig&)> field) {
  KeyEntry e{{name, ConfigValueKind::integer, help}, {}, {}};
  e.set = [field, lo, hi, help](RunConfig& c, std::string_view k, std::string_view v, std::string_view o) {
    field(c) = parse_bounded(k, v, o, lo, hi, help);
  };
  e.get = [field](const RunConfig& c) { return std::to_string(field(const_cast<RunConfig&>(c))); };
  return e;
}

KeyEntry float_key(std::string name, std::string help, std::function<float&(RunConfig&)> field) {
  KeyEntry e{{name, ConfigValueKind::real, std::move(help)}, {}, {}};
  e.set = [field](RunConfig& c, std::string_view k, std::string_view v, std::string_view o) {
    double d = parse_real(k, v, o);
    if (std::fabs(d) > 3.0e38)
      throw UsageError(fmt::format("{}={} is out of the FP32 range", where(o, k), v));
    field(c) = static_cast<float>(d);
  };
  e.get = [field](const RunConfig& c) { return fmt::format("{}", field(const_cast<RunConfig&>(c))); };
  return e;
}

KeyEntry double_key(std::string name, std::string help, std::function<double&(RunConfig&)> field) {
  KeyEntry e{{name, ConfigValueKind::real, std::move(help)}, {}, {}};
  e.set = [field](RunConfig& c, std::string_view k, std::string_view v, std::string_view o) {
    field(c) = parse_real(k, v, o);
  };
  e.get = [field](const RunConfig& c) { return fmt::format("{}", field(const_cast<RunConfig&>(c))); };
  return e;
}

KeyEntry bool_key(std::string name, std::string help, std::function<bool&(RunConfig&)> field) {
  KeyEntry e{{name, ConfigValueKind::boolean, std::move(help)}, {}, {}};
  e.set = [field](RunConfig& c, std::string_view k, std::string_view v, std::string_view o) {
    field(c) = parse_boolean(k, v, o);
  };
  e.get = [field](const RunConfig& c) { return field(const_cast<RunConfig&>(c)) ? "true" : "false"; };
  return e;
}

KeyEntry text_key(std::string name, std::string help, std::function<std::string&(RunConfig&)> field) {
  KeyEntry e{{name, ConfigValueKind::text, std::move(help)}, {}, {}};
  e.set = [field](RunConfig& c, std::string_view k, std::string_view v, std::string_view o) {
    // A path ends at its first NUL for the system, so "runs/a\0b" would name runs/a.
    if (v.find('\0') != std::string_view::npos)
      throw UsageError(fmt::format("{}: the value holds a NUL character, which no path can: remove it", where(o, k)));
    field(c) = std::string(v);
  };
  e.get = [field](const RunConfig& c) { return field(const_cast<RunConfig&>(c)); };
  return e;
}

// A recipe key (recipe/recipe.h's table, which owns its name, parser, printer and help): its parser
// keeps the recipe's rules (e.g. the nvfp4.* knobs marked as given) in one place; the message gains
// the origin.
KeyEntry recipe_key(const RecipeKey& key) {
  KeyEntry e{{std::string(key.name), key.kind, std::string(key.help)}, {}, {}};
  e.set = [](RunConfig& c, std::string_view k, std::string_view v, std::string_view o) {
    try {
      apply_recipe_option(c.train.recipe, k, v);
    } catch (const UsageError& err) {
      throw UsageError(fmt::format("{}: {}", o, err.what()));
    }
  };
  e.get = [&key](const RunConfig& c) { return key.print(c.train.recipe); };
  e.printed = [&key](const RunConfig& c) { return key.printed(c.train.recipe); };
  return e;
}

// A text key whose value a library parser reads (device, schedule.kind): its message gains the key.
template <typename T>
KeyEntry parsed_key(std::string name, std::string help, T (*parse)(std::string_view), std::function<T&(RunConfig&)> field,
                    std::function<std::string(const RunConfig&)> get) {
  KeyEntry e{{name, ConfigValueKind::text, std::move(help)}, {}, std::move(get)};
  e.set = [parse, field](RunConfig& c, std::string_view k, std::string_view v, std::string_view o) {
    try {
      field(c) = parse(v);
    } catch (const UsageError& err) {
      throw UsageError(fmt::format("{}: {}", where(o, k), err.what()));
    }
  };
  return e;
}


using C = RunConfig;

// Bounds of the integer keys: far beyond any run (2^40 steps, 16M-token contexts), and small
// enough that the product of two model or batch sizes fits in int64; refuse_unrepresentable_sizes
// bounds the products of more.
constexpr int64_t kMaxSteps = int64_t{1} << 40;
constexpr int64_t kMaxContext = int64_t{1} << 24;

// data.format, data.train_files, data.val_files: pre-tokenized files read in place. Written to a
// run's config.yaml only when set, so runs on prepared directories read as before.
void add_data_format_keys(std::vector<KeyEntry>& t) {
  KeyEntry format = parsed_key<TokenFormat>(
      "data.format", "nibble (a `nibble prepare` directory), llmc (llm.c .bin shards) or nanogpt (raw uint16 train.bin/val.bin)",
      parse_token_format, [](C& c) -> TokenFormat& { return c.data_format; },
      [](const C& c) { return std::string(to_string(c.data_format)); });
  format.printed = [](const C& c) { return c.data_format != TokenFormat::nibble; };
  t.push_back(std::move(format));
  KeyEntry train = text_key("data.train_files", "llmc/nanogpt: training files, glob patterns separated by commas (relative to data.dir when set)",
                            [](C& c) -> std::string& { return c.train_files; });
  train.printed = [](const C& c) { return !c.train_files.empty(); };
  t.push_back(std::move(train));
  KeyEntry val = text_key("data.val_files", "llmc/nanogpt: validation files, as data.train_files",
                          [](C& c) -> std::string& { return c.val_files; });
  val.printed = [](const C& c) { return !c.val_files.empty(); };
  t.push_back(std::move(val));
  KeyEntry tokenizer = text_key("data.tokenizer", "llmc/nanogpt: the tokenizer that wrote the files (tokenizer.json, x.model, "
                                "NAME.tiktoken), copied into the run so generate and export work; its vocabulary must fit model.vocab",
                                [](C& c) -> std::string& { return c.data_tokenizer; });
  tokenizer.printed = [](const C& c) { return !c.data_tokenizer.empty(); };
  t.push_back(std::move(tokenizer));
}

// data.sources. In YAML a list of maps, one per source:
//   sources:
//     - {dir: data/edu, weight: 0.7}
//     - {name: web, dir: data/web, weight: 0.3, format: llmc}
// On the command line (and as a YAML string) the short form [NAME=]DIR:WEIGHT, sources separated by
// commas: data.sources=edu=data/edu:0.7,data/web:0.3 (the weight after the last ':'; the format,
// data.format's). config.yaml keeps the list form, which names every field.
constexpr std::string_view kSourceKeys = "dir, weight, name, format, train_files, val_files";

double parse_source_weight(std::string_view text, std::string_view origin, std::string_view source) {
  std::string s(text);
  char* end = nullptr;
  errno = 0;
  const double w = s.empty() ? 0.0 : std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || errno == ERANGE || !std::isfinite(w) || !(w > 0))
    throw UsageError(fmt::format("{}: data.sources: the weight '{}' of source '{}' is not a positive number: give each "
                                 "source a weight > 0, e.g. 0.3 (the weights are normalised to sum to 1)",
                                 origin, text, source));
  return w;
}

// A source without a name takes its directory's; the names must differ (they key the metrics).
void finish_sources(std::vector<SourceConfig>& sources, std::string_view origin) {
  for (size_t i = 0; i < sources.size(); ++i) {
    SourceConfig& s = sources[i];
    if (s.name.empty()) s.name = default_source_name(s.dir);
    check_source_name(s.name, "give the source a name (name: NAME in YAML, NAME=DIR:WEIGHT on the command line)");
    for (size_t j = 0; j < i; ++j)
      if (sources[j].name == s.name)
        throw UsageError(fmt::format("{}: data.sources: two sources are named '{}': give each its own name (name: NAME "
                                     "in YAML, NAME=DIR:WEIGHT on the command line)",
                                     origin, s.name));
  }
  if (sources.empty())
    throw UsageError(fmt::format("{}: data.sources is empty: list at least one source, or set data.dir", origin));
}

std::vector<SourceConfig> parse_sources_text(std::string_view value, std::string_view origin) {
  std::vector<SourceConfig> sources;
  for (size_t begin = 0; begin <= value.size();) {
    const size_t comma = std::min(value.find(',', begin), value.size());
    const std::string_view item = value.substr(begin, comma - begin);
    const size_t colon = item.rfind(':');
    if (colon == std::string_view::npos)
      throw UsageError(fmt::format("{}: data.sources: '{}' has no weight: write [NAME=]DIR:WEIGHT, sources separated "
                                   "by commas, e.g. data.sources=edu=data/edu:0.7,data/web:0.3",
                                   origin, item));
    SourceConfig s;
    std::string_view where = item.substr(0, colon);
    if (const size_t eq = where.find('='); eq != std::string_view::npos) {
      s.name = std::string(where.substr(0, eq));
      where = where.substr(eq + 1);
    }
    s.dir = std::string(where);
    if (s.dir.empty())
      throw UsageError(fmt::format("{}: data.sources: '{}' names no directory: write [NAME=]DIR:WEIGHT", origin, item));
    s.weight = parse_source_weight(item.substr(colon + 1), origin, s.name.empty() ? s.dir : s.name);
    sources.push_back(std::move(s));
    begin = comma + 1;
  }
  finish_sources(sources, origin);
  return sources;
}

SourceConfig parse_source_entry(const YAML::Node& entry, std::string_view origin) {
  if (!entry.IsMap())
    throw UsageError(fmt::format("{}: data.sources: each entry is a map such as {{dir: data/web, weight: 0.3}}", origin));
  SourceConfig s;
  std::string weight;
  for (auto it = entry.begin(); it != entry.end(); ++it) {
    const std::string key = it->first.Scalar();
    const YAML::Node value = it->second;
    if (!value.IsScalar())
      throw UsageError(fmt::format("{}: data.sources: '{}' of a source takes a single value", origin, key));
    const std::string text = value.Scalar();
    if (key == "dir") s.dir = text;
    else if (key == "weight") weight = text;
    else if (key == "name") s.name = text;
    else if (key == "train_files") s.train_files = text;
    else if (key == "val_files") s.val_files = text;
    else if (key == "format") {
      try {
        s.format = parse_token_format(text);
      } catch (const UsageError& e) {
        throw UsageError(fmt::format("{}: data.sources: format: {}", origin, e.what()));
      }
    } else {
      throw UsageError(fmt::format("{}: data.sources: unknown key '{}' in a source: the keys of a source are {}", origin,
                                   key, kSourceKeys));
    }
  }
  const std::string label = !s.name.empty() ? s.name : !s.dir.empty() ? s.dir : s.train_files;
  if (weight.empty())
    throw UsageError(fmt::format("{}: data.sources: source '{}' has no weight: add weight: W (a positive number)",
                                 origin, label));
  s.weight = parse_source_weight(weight, origin, label);
  return s;
}

std::vector<SourceConfig> parse_sources_yaml(const YAML::Node& list, std::string_view origin) {
  std::vector<SourceConfig> sources;
  for (const YAML::Node& entry : list) sources.push_back(parse_source_entry(entry, origin));
  finish_sources(sources, origin);
  return sources;
}

// The list form config.yaml keeps (a YAML flow sequence; text values quoted as yaml_scalar does).
std::string print_sources(const std::vector<SourceConfig>& sources, const std::function<std::string(const std::string&)>& quote) {
  std::string out = "[";
  for (const SourceConfig& s : sources) {
    if (out.size() > 1) out += ", ";
    out += fmt::format("{{name: {}, dir: {}, weight: {}", quote(s.name), quote(s.dir), s.weight);
    if (s.format) out += fmt::format(", format: {}", to_string(*s.format));
    if (!s.train_files.empty()) out += ", train_files: " + quote(s.train_files);
    if (!s.val_files.empty()) out += ", val_files: " + quote(s.val_files);
    out += "}";
  }
  return out + "]";
}

std::string yaml_scalar(const std::string& value, ConfigValueKind kind);

void add_sources_key(std::vector<KeyEntry>& t) {
  KeyEntry e{{"data.sources", ConfigValueKind::text,
              "a mixture instead of data.dir: [NAME=]DIR:WEIGHT,... (or a YAML list of {dir, weight, name, format, "
              "train_files, val_files}); each row of a batch comes from one source, in the weights' proportions"},
             {},
             {}};
  e.set = [](C& c, std::string_view, std::string_view v, std::string_view o) { c.sources = parse_sources_text(v, o); };
  e.get = [](const C& c) {
    return print_sources(c.sources, [](const std::string& v) { return yaml_scalar(v, ConfigValueKind::text); });
  };
  e.printed = [](const C& c) { return !c.sources.empty(); };
  t.push_back(std::move(e));
}

// run.dir .. resume: where the run lives and how it steps.
void add_run_keys(std::vector<KeyEntry>& t) {
  t.push_back(text_key("run.dir", "directory for config, metrics, checkpoints, tokenizer", [](C& c) -> std::string& { return c.run_dir; }));
  KeyEntry dir = text_key("data.dir", "directory written by `nibble prepare` (or of llm.c / nanoGPT token files, see data.format)", [](C& c) -> std::string& { return c.data_dir; });
  dir.printed = [](const C& c) { return c.sources.empty() || !c.data_dir.empty(); };  // a mixture has data.sources
  t.push_back(std::move(dir));
  add_data_format_keys(t);
  add_sources_key(t);
  {
    KeyEntry e{{"seed", ConfigValueKind::integer, "initialisation, data order and stochastic rounding"}, {}, {}};
    e.set = [](C& c, std::string_view k, std::string_view v, std::string_view o) {
      c.train.seed = static_cast<uint64_t>(parse_bounded(k, v, o, 0, INT64_MAX, "a seed >= 0"));
    };
    e.get = [](const C& c) { return std::to_string(c.train.seed); };
    t.push_back(std::move(e));
  }
  t.push_back(int_key("steps", "optimizer steps", 1, kMaxSteps, [](C& c) -> int64_t& { return c.train.schedule.total_steps; }));
  t.push_back(int_key("batch", "sequences per micro-batch", 1, 1 << 30, [](C& c) -> int64_t& { return c.train.batch; }));
  t.push_back(int_key("seq", "tokens per sequence (0: model.context)", 0, kMaxContext, [](C& c) -> int64_t& { return c.train.seq; }));
  t.push_back(int_key("grad_accum", "micro-batches per optimizer step", 1, 1 << 30, [](C& c) -> int64_t& { return c.train.grad_accum; }));
  t.push_back(int_key("threads", "OpenMP threads (0: all)", 0, 4096, [](C& c) -> int64_t& { return c.threads; }));
  KeyEntry device = parsed_key<ops::Device>(
      "device", "where the model trains: cpu, or cuda (one NVIDIA GPU)", ops::parse_device,
      [](C& c) -> ops::Device& { return c.train.device; },
      [](const C& c) { return std::string(ops::to_string(c.train.device)); });
  // Written to a run's config.yaml only when not the default, so CPU runs read as before.
  device.printed = [](const C& c) { return c.train.device != ops::Device::cpu; };
  t.push_back(std::move(device));
  KeyEntry shard = parsed_key<ShardMode>(
      "distributed.shard",
      "what each MPI rank keeps of the AdamW state, gradients and weights: none (all of it), optimizer (ZeRO-1: the "
      "moments of its slice of the parameters), gradients (ZeRO-2: that, and of the summed gradient only its slice, "
      "reduced during the backward pass) or full (ZeRO-3: the weights of its slice too, each block's gathered around "
      "its use); every mode trains bitwise as none",
      parse_shard_mode, [](C& c) -> ShardMode& { return c.train.shard; },
      [](const C& c) { return std::string(to_string(c.train.shard)); });
  // Written to a run's config.yaml only when not the default, so unsharded runs read as before.
  shard.printed = [](const C& c) { return c.train.shard != ShardMode::none; };
  t.push_back(std::move(shard));
  KeyEntry fp4_gather = bool_key(
      "distributed.fp4_param_gather",
      "with distributed.shard=full and NVFP4 weights in 16x16 tiles (the nvfp4 recipe's), all-gather each linear's "
      "weight quantized (codes and scales: about 0.14x the bytes of FP32; the same bits) rather than in FP32; false "
      "gathers FP32 (to compare)",
      [](C& c) -> bool& { return c.train.fp4_param_gather; });
  fp4_gather.printed = [](const C& c) { return !c.train.fp4_param_gather; };
  t.push_back(std::move(fp4_gather));
  t.push_back(bool_key("resume", "continue from the newest checkpoint in run.dir that verifies (`nibble train --checkpoint STEP` picks another)", [](C& c) -> bool& { return c.resume; }));
}

void add_model_keys(std::vector<KeyEntry>& t) {
  KeyEntry vocab = int_key("model.vocab", "vocabulary size: required for data.format llmc/nanogpt (50257 GPT-2, 128256 Llama 3); 0: the tokenizer's",
                           0, INT32_MAX, [](C& c) -> int64_t& { return c.vocab; });
  vocab.printed = [](const C& c) { return c.vocab != 0; };
  t.push_back(std::move(vocab));
  t.push_back(int_key("model.layers", "transformer blocks", 1, 1 << 24, [](C& c) -> int64_t& { return c.train.model.layers; }));
  t.push_back(int_key("model.heads", "attention heads", 1, 1 << 16, [](C& c) -> int64_t& { return c.train.model.heads; }));
  t.push_back(int_key("model.kv_heads", "key/value heads (0: heads, no GQA)", 0, 1 << 16, [](C& c) -> int64_t& { return c.train.model.kv_heads; }));
  t.push_back(int_key("model.width", "residual width", 1, 1 << 20, [](C& c) -> int64_t& { return c.train.model.width; }));
  t.push_back(int_key("model.mlp_hidden", "SwiGLU hidden size (0: 8/3 width)", 0, 1 << 24, [](C& c) -> int64_t& { return c.train.model.mlp_hidden; }));
  t.push_back(int_key("model.context", "maximum sequence length", 1, kMaxContext, [](C& c) -> int64_t& { return c.train.model.context; }));
  t.push_back(bool_key("model.tied_embeddings", "LM head shares the embedding matrix", [](C& c) -> bool& { return c.train.model.tied_embeddings; }));
  t.push_back(double_key("model.rope_theta", "RoPE base", [](C& c) -> double& { return c.train.model.rope_theta; }));
  t.push_back(float_key("model.norm_eps", "RMSNorm epsilon", [](C& c) -> float& { return c.train.model.norm_eps; }));
  t.push_back(float_key("model.init_std", "initialisation standard deviation", [](C& c) -> float& { return c.train.model.init_std; }));
}

// optimizer.* and schedule.*: AdamW and its learning rate.
void add_optimizer_keys(std::vector<KeyEntry>& t) {
  t.push_back(float_key("optimizer.beta1", "AdamW beta1", [](C& c) -> float& { return c.train.optimizer.beta1; }));
  t.push_back(float_key("optimizer.beta2", "AdamW beta2", [](C& c) -> float& { return c.train.optimizer.beta2; }));
  t.push_back(float_key("optimizer.eps", "AdamW epsilon", [](C& c) -> float& { return c.train.optimizer.eps; }));
  t.push_back(float_key("optimizer.weight_decay", "decoupled weight decay", [](C& c) -> float& { return c.train.optimizer.weight_decay; }));
  t.push_back(float_key("optimizer.clip_norm", "global gradient-norm clip (<= 0: off)", [](C& c) -> float& { return c.train.optimizer.clip_norm; }));
  t.push_back(parsed_key<Schedule>("schedule.kind", "cosine, wsd or constant", parse_schedule,
                                   [](C& c) -> Schedule& { return c.train.schedule.kind; },
                                   [](const C& c) { return schedule_name(c.train.schedule.kind); }));
  t.push_back(float_key("schedule.lr", "peak learning rate", [](C& c) -> float& { return c.train.schedule.lr; }));
  t.push_back(float_key("schedule.min_lr", "final learning rate", [](C& c) -> float& { return c.train.schedule.min_lr; }));
  t.push_back(int_key("schedule.warmup_steps", "linear warmup steps", 0, kMaxSteps, [](C& c) -> int64_t& { return c.train.schedule.warmup_steps; }));
  t.push_back(float_key("schedule.wsd_decay_fraction", "WSD: final fraction of steps that decays", [](C& c) -> float& { return c.train.schedule.wsd_decay_fraction; }));
  KeyEntry rewarm = bool_key("schedule.rewarm",
                             "at a resume whose new steps/schedule raise the learning rate: accept the re-warm "
                             "(not saved; without it such a resume is refused, naming the choices)",
                             [](C& c) -> bool& { return c.schedule_rewarm; });
  rewarm.printed = [](const C&) { return false; };
  t.push_back(std::move(rewarm));
}

// eval.*, checkpoint.*, log.*: what the run writes and when.
void add_output_keys(std::vector<KeyEntry>& t) {
  t.push_back(int_key("eval.interval", "steps between validation evaluations", 1, kMaxSteps, [](C& c) -> int64_t& { return c.eval_interval; }));
  t.push_back(int_key("eval.batches", "validation batches per evaluation", 1, 1 << 30, [](C& c) -> int64_t& { return c.train.eval_batches; }));
  t.push_back(int_key("checkpoint.interval", "steps between checkpoints", 1, kMaxSteps, [](C& c) -> int64_t& { return c.checkpoint_interval; }));
  t.push_back(int_key("checkpoint.keep", "newest checkpoints kept", 1, 1 << 20, [](C& c) -> int64_t& { return c.checkpoint_keep; }));
  t.push_back(int_key("log.interval", "steps between log lines and metrics records", 1, kMaxSteps, [](C& c) -> int64_t& { return c.log_interval; }));
  t.push_back(bool_key("log.tensorboard", "also write TensorBoard event files to RUN/tensorboard", [](C& c) -> bool& { return c.tensorboard; }));
}

// Every config key in the order config.yaml and `nibble train --keys` print them.
const std::vector<KeyEntry>& key_table() {
  static const std::vector<KeyEntry> table = [] {
    std::vector<KeyEntry> t;
    add_run_keys(t);
    for (const RecipeKey& k : recipe_keys()) t.push_back(recipe_key(k));
    add_model_keys(t);
    add_optimizer_keys(t);
    add_output_keys(t);
    return t;
  }();
  return table;
}

const KeyEntry* find_key(std::string_view name) {
  for (const auto& e : key_table())
    if (e.info.name == name) return &e;
  return nullptr;
}

std::string_view last_component(std::string_view key) {
  size_t dot = key.rfind('.');
  return dot == std::string_view::npos ? key : key.substr(dot + 1);
}

// YAML features a config has no use for, refused where they would otherwise pass silently: an
// explicit tag (`!!str 5`, `!foo`) would be dropped, not applied.
void refuse_tag(const YAML::Node& node, std::string_view origin, std::string_view what) {
  const std::string& tag = node.Tag();
  if (!tag.empty() && tag != "?" && tag != "!")  // "?", "!": a plain or quoted value without a tag
    throw UsageError(fmt::format("{}:{}: {} carries the YAML tag '{}': nibble's config takes plain values; remove the tag",
                                 origin, node.Mark().line + 1, what, tag));
}

// precision_map as a YAML list, one rule per item, in order:
//   precision_map:
//     - block*.qkv: bf16
//     - lm_head: bf16
// (an item may also be the text form "block*.qkv=bf16").
std::vector<PrecisionRule> parse_precision_map_yaml(const YAML::Node& list, std::string_view origin) {
  std::vector<PrecisionRule> rules;
  for (const YAML::Node& item : list) {
    try {
      if (item.IsMap() && item.size() == 1 && item.begin()->first.IsScalar() && item.begin()->second.IsScalar())
        add_precision_rule(rules, item.begin()->first.Scalar(), item.begin()->second.Scalar());
      else if (item.IsScalar())
        for (const PrecisionRule& r : parse_precision_map(item.Scalar()))
          add_precision_rule(rules, r.pattern, to_string(r.quantization));
      else
        throw UsageError("each item of the list is one rule 'PATTERN: QUANTIZATION' (e.g. - block*.qkv: bf16)");
    } catch (const UsageError& e) {
      throw UsageError(fmt::format("{}:{}: precision_map: {}", origin, item.Mark().line + 1, e.what()));
    }
  }
  return rules;
}

// `seen`: every dotted key set so far with its line, so that a key given twice (`steps: 3` then
// `steps: 5`, or `model.width` both nested and dotted) is refused instead of the last one winning.
void flatten_yaml(RunConfig& config, const YAML::Node& node, const std::string& prefix, std::string_view origin,
                  std::map<std::string, int>& seen) {
  for (auto it = node.begin(); it != node.end(); ++it) {
    if (!it->first.IsScalar())
      throw UsageError(fmt::format("{}: a key under '{}' is not a plain name", origin, prefix.empty() ? "the top level" : prefix));
    const std::string key = prefix.empty() ? it->first.Scalar() : prefix + "." + it->first.Scalar();
    // By value: yaml-cpp's iterator hands out a temporary pair, so a reference to its `second`
    // dangles (found by fuzz_config under ASan).
    const YAML::Node value = it->second;
    const int line = it->first.Mark().line + 1;
    const std::string located = fmt::format("{}:{}", origin, line);
    refuse_tag(it->first, origin, "the key " + key);
    refuse_tag(value, origin, key);
    if (const auto [first, added] = seen.emplace(key, line); !added)
      throw UsageError(fmt::format("{}: {} is given twice (also at line {}): keep one", located, key, first->second));
    if (key == "data.sources" && value.IsSequence()) {
      config.sources = parse_sources_yaml(value, located);
    } else if (key == "precision_map" && value.IsSequence()) {
      config.train.recipe.precision_map = parse_precision_map_yaml(value, origin);
    } else if (value.IsMap()) {
      flatten_yaml(config, value, key, origin, seen);
    } else if (value.IsScalar()) {
      set_config_value(config, key, value.Scalar(), located);
    } else if (value.IsNull()) {
      // An unknown key is still reported as unknown before the missing value.
      if (!find_key(key)) set_config_value(config, key, "", located);
      throw UsageError(fmt::format("{}: {} has no value: write '{}: VALUE'", located, key, last_component(key)));
    } else {
      throw UsageError(fmt::format("{}: {} is a list; it takes a single value", located, key));
    }
  }
}

// A text value as a YAML double-quoted scalar that reads back as exactly the same bytes: quotes,
// backslashes and control characters escaped (a newline in run.dir once came back as a space, so
// resuming started a new run elsewhere). Other bytes are written as they are.
std::string yaml_scalar(const std::string& value, ConfigValueKind kind) {
  if (kind != ConfigValueKind::text) return value;
  std::string out = "\"";
  for (char c : value) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') out += {'\\', c};
    else if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '\r') out += "\\r";
    else if (u < 0x20 || u == 0x7F) out += fmt::format("\\x{:02X}", u);
    else out.push_back(c);
  }
  return out + "\"";
}

// The memory a run would need, multiplied out in double as run/report.cpp's estimate_memory does in
// int64 (an upper bound of it: every term there is a product of these positive sizes): beyond
// 2^60 bytes (an exbibyte) no machine has it, and that estimate, the model's array sizes and the
// tokens per step would overflow int64. Below it, train's own memory check (report.h) speaks.
void refuse_unrepresentable_sizes(const TrainConfig& t) {
  const model::ModelConfig& m = t.model;
  auto v = [](int64_t x) { return static_cast<double>(x); };
  const double d = v(m.width), f = v(m.hidden()), heads = v(m.heads), seq = v(t.seq > 0 ? t.seq : m.context);
  const double attention = d * (heads + 2 * v(m.kv_head_count()));  // the qkv projection's outputs
  const double params = 2 * v(m.vocab) * d + v(m.layers) * (2 * d + attention + d * d + 3 * f * d) + d;
  const double tokens = v(t.batch) * seq;
  const double block = tokens * (2 * d + 2 + attention + 2 * f) + v(t.batch) * heads * seq * seq;
  const double linear_inputs = tokens * (3 * d + f);
  const double activations = v(m.layers) * (block + linear_inputs) + tokens * (2 * d + 2 + v(m.vocab));
  const double bytes = 16 * params + 12 * activations;  // weights, gradients, AdamW; FP32 and recipe copies
  constexpr double kMaxBytes = 1152921504606846976.0;  // 2^60
  if (bytes > kMaxBytes || tokens * v(t.grad_accum) > kMaxBytes)
    throw UsageError(fmt::format("this run would need about {:.3g} bytes of memory ({:.3g} parameters; {:.3g} tokens "
                                 "of batch x seq per micro-batch, {:.3g} per step with grad_accum), beyond any "
                                 "machine: lower batch, grad_accum, seq or model.context, or the model's size "
                                 "(model.width, model.layers)",
                                 bytes, params, tokens, tokens * v(t.grad_accum)));
}

}  // namespace

std::string schedule_name(Schedule s) {
  switch (s) {
    case Schedule::cosine: return "cosine";
    case Schedule::wsd: return "wsd";
    case Schedule::constant: return "constant";
  }
  return "cosine";
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::string closest_config_key(std::string_view key) {
  std::string best;
  size_t best_distance = SIZE_MAX;
  for (const auto& e : key_table()) {
    // A misplaced section ("layers" for "model.layers") is as close as a typo in the last part.
    size_t d = std::min(edit_distance(key, e.info.name), edit_distance(last_component(key), last_component(e.info.name)) +
                                                             (key.find('.') == std::string_view::npos ? 0 : 1));
    if (d < best_distance) {
      best_distance = d;
      best = e.info.name;
    }
  }
  return best;
}

std::vector<ConfigKeyInfo> config_keys() {
  std::vector<ConfigKeyInfo> keys;
  for (const auto& e : key_table()) keys.push_back(e.info);
  return keys;
}

void set_config_value(RunConfig& config, std::string_view key, std::string_view value, std::string_view origin) {
  const KeyEntry* entry = find_key(key);
  if (!entry) {
    if (key.starts_with("nvfp4.")) apply_recipe_option(config.train.recipe, key, value);  // lists the knobs
    throw UsageError(fmt::format("{}: unknown config key '{}': did you mean '{}'? (`nibble train --keys` lists them all)",
                                 origin, key, closest_config_key(key)));
  }
  entry->set(config, key, value, origin);
}

void apply_config_yaml(RunConfig& config, std::string_view yaml_text, std::string_view origin) {
  std::vector<YAML::Node> documents;
  try {
    documents = YAML::LoadAll(std::string(yaml_text));
  } catch (const YAML::Exception& e) {
    throw UsageError(fmt::format("{}:{}:{}: not valid YAML: {}", origin, e.mark.line + 1, e.mark.column + 1, e.msg));
  }
  // A second document (after `---`) would be ignored: its keys never applied.
  if (documents.size() > 1)
    throw UsageError(fmt::format("{}:{}: a second YAML document begins here, whose keys nibble would ignore: a config "
                                 "is one document; join them or remove the '---' line",
                                 origin, std::max(1, documents[1].Mark().line + 1)));
  if (documents.empty() || documents[0].IsNull()) return;  // an empty file: all defaults
  const YAML::Node& root = documents[0];
  if (!root.IsMap())
    throw UsageError(fmt::format("{}: the config must be a map of keys (e.g. 'steps: 2000'), not a single value or list",
                                 origin));
  refuse_tag(root, origin, "the config");
  std::map<std::string, int> seen;
  flatten_yaml(config, root, "", origin, seen);
}

void apply_config_overrides(RunConfig& config, const std::vector<std::string>& overrides) {
  for (const auto& word : overrides) {
    const size_t eq = word.find('=');
    if (eq == std::string::npos || eq == 0)
      throw UsageError(fmt::format("command line: '{}' is not key=value (example: quantization=nvfp4)", word));
    set_config_value(config, std::string_view(word).substr(0, eq), std::string_view(word).substr(eq + 1), "command line");
  }
}

RunConfig load_run_config(const std::string& path, const std::vector<std::string>& overrides) {
  RunConfig config;
  apply_config_yaml(config, read_text_file(path), path);
  apply_config_overrides(config, overrides);
  config.validate();
  return config;
}

void RunConfig::validate() const {
  if (run_dir.empty()) throw UsageError("run.dir is empty: set run.dir=runs/NAME");
  validate_sources();
  if (data_dir.empty() && train_files.empty() && sources.empty())
    throw UsageError("data.dir is not set: run `nibble prepare TEXT_FILE -o DIR` and set data.dir=DIR (or, for llm.c "
                     "or nanoGPT token files, data.format=llmc|nanogpt with data.dir or data.train_files/val_files)");
  if (data_format == TokenFormat::nibble && (!train_files.empty() || !val_files.empty()))
    throw UsageError("data.train_files and data.val_files are for data.format=llmc or nanogpt: a `nibble prepare` "
                     "directory is given by data.dir alone");
  if (data_format == TokenFormat::nibble && !data_tokenizer.empty())
    throw UsageError(fmt::format("data.tokenizer={} is for data.format=llmc or nanogpt, whose files carry no tokenizer: a "
                                 "`nibble prepare` directory has its own (prepare --tokenizer {}); leave data.tokenizer out",
                                 data_tokenizer, data_tokenizer));
  auto positive = [](const char* key, int64_t v) {
    if (v <= 0) throw UsageError(fmt::format("{}={} must be positive", key, v));
  };
  positive("eval.interval", eval_interval);
  positive("checkpoint.interval", checkpoint_interval);
  positive("checkpoint.keep", checkpoint_keep);
  positive("log.interval", log_interval);
  if (threads < 0) throw UsageError(fmt::format("threads={} must be >= 0 (0: all cores)", threads));
  train.validate();
  refuse_unrepresentable_sizes(train);
}

// data.sources replaces data.dir and the file globs, which would be ambiguous beside it.
void RunConfig::validate_sources() const {
  if (sources.empty()) return;
  if (!data_dir.empty())
    throw UsageError(fmt::format("data.sources and data.dir are both set (data.dir={}): a run reads either one "
                                 "directory (data.dir) or a mixture (data.sources); remove one of them",
                                 data_dir));
  if (!train_files.empty() || !val_files.empty())
    throw UsageError("data.train_files and data.val_files do not apply to data.sources: give each source its own "
                     "train_files/val_files in its entry");
  for (const SourceConfig& s : sources) {
    const TokenFormat format = s.format.value_or(data_format);
    if (format == TokenFormat::nibble && (!s.train_files.empty() || !s.val_files.empty()))
      throw UsageError(fmt::format("data.sources: source '{}': train_files and val_files are for format llmc or "
                                   "nanogpt: a `nibble prepare` directory is given by dir alone",
                                   s.name));
    if (s.dir.empty() && s.train_files.empty())
      throw UsageError(fmt::format("data.sources: source '{}' has neither dir nor train_files: give dir: DIR", s.name));
  }
}

std::vector<DataSource> RunConfig::data_sources() const {
  if (sources.empty()) return {DataSource{"", 1.0, data_spec()}};
  std::vector<DataSource> out;
  for (const SourceConfig& s : sources) {
    DataSpec spec = data_spec();
    spec.format = s.format.value_or(data_format);
    spec.dir = s.dir;
    spec.train_files = s.train_files;
    spec.val_files = s.val_files;
    out.push_back(DataSource{s.name, s.weight, std::move(spec)});
  }
  return out;
}

DataSpec RunConfig::data_spec() const {
  DataSpec spec;
  spec.format = data_format;
  spec.dir = data_dir;
  spec.train_files = train_files;
  spec.val_files = val_files;
  spec.tokenizer = data_tokenizer;
  spec.vocab = vocab;
  spec.vocab_key = "model.vocab";
  return spec;
}

std::vector<std::pair<std::string, std::string>> config_values(const RunConfig& config) {
  std::vector<std::pair<std::string, std::string>> values;
  for (const auto& e : key_table())
    if (e.printed(config)) values.emplace_back(e.info.name, e.get(config));
  return values;
}

std::string config_to_yaml(const RunConfig& config) {
  std::string out;
  std::string section;
  for (const auto& e : key_table()) {
    if (!e.printed(config)) continue;
    const std::string& name = e.info.name;
    const size_t dot = name.find('.');
    const std::string this_section = dot == std::string::npos ? "" : name.substr(0, dot);
    if (this_section != section && !this_section.empty()) out += this_section + ":\n";
    section = this_section;
    const std::string leaf = dot == std::string::npos ? name : name.substr(dot + 1);
    // data.sources prints itself as a YAML list, its text values already quoted.
    const std::string value = name == "data.sources" ? e.get(config) : yaml_scalar(e.get(config), e.info.kind);
    out += fmt::format("{}{}: {}  # {}\n", section.empty() ? "" : "  ", leaf, value,
                       e.info.help);
  }
  return out;
}

}  // namespace nibble::train
