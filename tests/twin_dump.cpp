// twin_dump: one FP32 forward + backward of a tiny Transformer, written to a safetensors file for
// the PyTorch twin (tests/twin/test_torch_twin.py) to recompute independently in float64.
//
//   twin_dump OUT.safetensors [layers=2 heads=4 kv_heads=2 width=32 context=16 vocab=65 batch=3
//                              seq=16 tied=1 init_std=0.02 seed=1]
//
// The file holds, in nibble's parameter names and [rows, cols] shapes:
//   param.<name>  F32  the weights the step ran with
//   grad.<name>   F32  d(mean loss)/d(weight)
//   tokens, targets  I32 [batch, seq];  loss  F64 [1]
// and, in __metadata__, the resolved model configuration (so a mismatch of conventions such as
// norm_eps or rope_theta is reported by name rather than as a gradient difference).
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "model/transformer.h"

using namespace nibble;

namespace {

struct DumpOptions {
  model::ModelConfig model;
  int64_t batch = 3, seq = 0;  // seq 0: the model's context
  uint64_t seed = 1;
};

DumpOptions default_options() {
  DumpOptions o;
  o.model.layers = 2;
  o.model.heads = 4;
  o.model.kv_heads = 2;
  o.model.width = 32;
  o.model.context = 16;
  o.model.vocab = 65;
  return o;
}

int64_t parse_int(const std::string& key, const std::string& value) {
  size_t used = 0;
  int64_t v = 0;
  try {
    v = std::stoll(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != value.size()) throw UsageError(key + "=" + value + " is not an integer");
  return v;
}

float parse_real(const std::string& key, const std::string& value) {
  size_t used = 0;
  float v = 0;
  try {
    v = std::stof(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != value.size()) throw UsageError(key + "=" + value + " is not a number");
  return v;
}

void apply(DumpOptions& o, const std::string& word) {
  const auto eq = word.find('=');
  if (eq == std::string::npos) throw UsageError("'" + word + "' is not key=value");
  const std::string key = word.substr(0, eq), value = word.substr(eq + 1);
  model::ModelConfig& m = o.model;
  if (key == "layers") m.layers = parse_int(key, value);
  else if (key == "heads") m.heads = parse_int(key, value);
  else if (key == "kv_heads") m.kv_heads = parse_int(key, value);
  else if (key == "width") m.width = parse_int(key, value);
  else if (key == "mlp_hidden") m.mlp_hidden = parse_int(key, value);
  else if (key == "context") m.context = parse_int(key, value);
  else if (key == "vocab") m.vocab = parse_int(key, value);
  else if (key == "tied") m.tied_embeddings = parse_int(key, value) != 0;
  else if (key == "init_std") m.init_std = parse_real(key, value);
  else if (key == "batch") o.batch = parse_int(key, value);
  else if (key == "seq") o.seq = parse_int(key, value);
  else if (key == "seed") o.seed = static_cast<uint64_t>(parse_int(key, value));
  else
    throw UsageError("unknown key '" + key +
                     "': use layers, heads, kv_heads, width, mlp_hidden, context, vocab, tied, init_std, batch, "
                     "seq or seed");
}

// splitmix64: the tokens and gains only need to be reproducible from the seed, and they travel in
// the file, so the twin never regenerates them.
uint64_t next_random(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint64_t& state) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(next_random(state) % static_cast<uint64_t>(vocab));
  return t;
}

// init_weights sets every norm gain to 1, where a backward that forgets to multiply by the gain
// (or a forward that applies it twice) computes the right numbers. Gains in [0.5, 1.5) expose it.
void randomize_norm_gains(model::ParamArena& params, uint64_t& state) {
  for (const auto& p : params.params()) {
    if (p.rows != 1) continue;
    float* g = params.value(p.offset);
    for (int64_t i = 0; i < p.size(); ++i)
      g[i] = 0.5f + static_cast<float>(next_random(state) >> 40) * 0x1.0p-24f;
  }
}

io::Tensor i32_tensor(std::vector<int64_t> shape, const std::vector<int32_t>& v) {
  return io::make_tensor(io::DType::I32, std::move(shape),
                         std::span(reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(int32_t)));
}

int run(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0) {
    std::fprintf(stderr, "usage: twin_dump OUT.safetensors [key=value ...]\n");
    return 2;
  }
  DumpOptions o = default_options();
  for (int i = 2; i < argc; ++i) apply(o, argv[i]);
  if (o.seq == 0) o.seq = o.model.context;
  if (o.batch <= 0) throw UsageError("batch=" + std::to_string(o.batch) + " must be positive");

  model::Transformer model(o.model, ops::cpu());
  model.init_weights(o.seed);
  uint64_t state = o.seed;
  randomize_norm_gains(model.params(), state);
  const int64_t tokens_n = o.batch * o.seq;
  const std::vector<int32_t> tokens = random_tokens(tokens_n, o.model.vocab, state);
  const std::vector<int32_t> targets = random_tokens(tokens_n, o.model.vocab, state);

  model::ModelStep step;  // no recipe: every GEMM in FP32 (quantization=none)
  model.params().zero_grads();
  const double loss = model.forward(tokens, targets, o.batch, o.seq, step);
  model.backward(1.0f);

  io::SafetensorsFile file;
  const model::ModelConfig& m = model.config();
  auto exact = [](double v) {
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.17g", v);
    return std::string(buf);
  };
  file.metadata = {{"layers", std::to_string(m.layers)},
                   {"heads", std::to_string(m.heads)},
                   {"kv_heads", std::to_string(m.kv_head_count())},
                   {"width", std::to_string(m.width)},
                   {"mlp_hidden", std::to_string(m.hidden())},
                   {"context", std::to_string(m.context)},
                   {"vocab", std::to_string(m.vocab)},
                   {"tied_embeddings", m.tied_embeddings ? "1" : "0"},
                   {"rope_theta", exact(m.rope_theta)},
                   {"norm_eps", exact(m.norm_eps)},
                   {"batch", std::to_string(o.batch)},
                   {"seq", std::to_string(o.seq)}};
  const model::ParamArena& params = model.params();
  for (const auto& p : params.params()) {
    const auto offset = static_cast<size_t>(p.offset), size = static_cast<size_t>(p.size());
    file.tensors["param." + p.name] = io::make_f32_tensor({p.rows, p.cols}, params.values().subspan(offset, size));
    file.tensors["grad." + p.name] = io::make_f32_tensor({p.rows, p.cols}, params.grads().subspan(offset, size));
  }
  file.tensors["tokens"] = i32_tensor({o.batch, o.seq}, tokens);
  file.tensors["targets"] = i32_tensor({o.batch, o.seq}, targets);
  file.tensors["loss"] =
      io::make_tensor(io::DType::F64, {1}, std::span(reinterpret_cast<const uint8_t*>(&loss), sizeof loss));
  io::write_safetensors(argv[1], file);  // temporary name, then rename (io/atomic_file.h)
  std::printf("twin_dump: loss %.9f, %zu parameter tensors -> %s\n", loss, params.params().size(), argv[1]);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "twin_dump: %s\n", e.what());
    return 2;
  }
}
