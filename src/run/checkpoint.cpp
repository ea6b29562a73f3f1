#include "run/checkpoint.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "io/atomic_file.h"
#include "io/regular_file.h"
#include "io/checksum.h"
#include "io/directory_lock.h"
#include "io/safetensors.h"

namespace nibble::train {

namespace fs = std::filesystem;

namespace {

constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kOptimizerFile = "optimizer.safetensors";
constexpr const char* kStateFile = "state.json";
constexpr const char* kHfConfigFile = "config.json";
constexpr const char* kStepPrefix = "step_";
constexpr const char* kPartialPrefix = ".partial-step_";

constexpr const char* kChecksumsKey = "checksums";
constexpr const char* kSelfChecksumKey = "checksum";
constexpr const char* kTokenizerKey = "tokenizer";

// Writes `bytes` and returns their checksum, recorded in state.json.
std::string write_bytes(const fs::path& path, std::span<const uint8_t> bytes) {
  io::write_file_atomically(path, bytes);
  return io::content_hash(bytes);
}

std::string write_json(const fs::path& path, const nlohmann::json& j) {
  const std::string text = j.dump(2) + "\n";
  return write_bytes(path, std::span(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
}

// state.json's own checksum covers its other fields as dump(2) writes them: nlohmann's objects
// are ordered and its numbers round-trip, so parse + dump reproduces the text that was hashed.
std::string state_checksum(nlohmann::json s) {
  s.erase(kSelfChecksumKey);
  return io::content_hash(s.dump(2));
}

std::string damage_advice(const fs::path& checkpoint) {
  return fmt::format("the checkpoint is damaged: resume=true continues from the newest checkpoint that verifies; "
                     "eval and generate take an earlier one with --checkpoint (or remove {})",
                     checkpoint.string());
}

// The bytes of a checkpoint file, verified against the checksum state.json recorded for them (not
// verified when `checksums` is null: a checkpoint written before nibble recorded any).
std::vector<uint8_t> read_verified(const fs::path& checkpoint, const char* name, const nlohmann::json* checksums) {
  const fs::path path = checkpoint / name;
  std::vector<uint8_t> bytes;
  try {
    bytes = io::read_regular_file(path, "a checkpoint file");
  } catch (const UsageError& e) {
    throw DamagedCheckpoint(fmt::format("{}\n{}", e.what(), damage_advice(checkpoint)));
  }
  if (checksums == nullptr) return bytes;
  const auto it = checksums->find(name);
  if (it == checksums->end() || !it->is_string())
    throw DamagedCheckpoint(fmt::format("{}: state.json records no checksum for it\n{}", path.string(),
                                        damage_advice(checkpoint)));
  const std::string actual = io::content_hash(bytes);
  if (actual != it->get<std::string>())
    throw DamagedCheckpoint(fmt::format("{}: its contents do not match the checksum written with it ({} on disk, {} "
                                        "recorded): the file was changed or damaged after it was saved\n{}",
                                        path.string(), actual, it->get<std::string>(), damage_advice(checkpoint)));
  return bytes;
}


io::SafetensorsFile arena_to_safetensors(const model::Transformer& model, std::span<const float> values,
                                         const std::string& prefix) {
  io::SafetensorsFile file;
  const auto& arena = model.params();
  for (const auto& slot : hf_tensor_layout(model)) {
    const auto& info = arena.find(slot.arena_name);
    const float* begin = values.data() + info.offset + slot.row_begin * slot.cols;
    file.tensors[prefix + slot.hf_name] =
        io::make_f32_tensor(slot.shape, std::span<const float>(begin, static_cast<size_t>(slot.rows * slot.cols)));
  }
  return file;
}

std::string shape_text(const std::vector<int64_t>& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

// Copies the tensors of `file` (names prefixed by `prefix`) into `values`, after checking them all.
void safetensors_to_arena(const io::SafetensorsFile& file, const std::string& source, const model::Transformer& model,
                          std::span<float> values, const std::string& prefix) {
  const auto layout = hf_tensor_layout(model);
  const auto& mc = model.config();
  std::vector<std::string> problems;
  for (const auto& slot : layout) {
    auto it = file.tensors.find(prefix + slot.hf_name);
    if (it == file.tensors.end()) {
      problems.push_back(fmt::format("tensor {} is missing", prefix + slot.hf_name));
      continue;
    }
    if (it->second.dtype != io::DType::F32)
      problems.push_back(fmt::format("tensor {} has dtype {}, expected F32", it->first, io::to_string(it->second.dtype)));
    else if (it->second.shape != slot.shape)
      problems.push_back(fmt::format("tensor {} has shape {}, this model needs {}", it->first, shape_text(it->second.shape),
                                     shape_text(slot.shape)));
  }
  for (const auto& [name, tensor] : file.tensors) {
    if (!name.starts_with(prefix)) continue;
    const std::string bare = name.substr(prefix.size());
    if (std::none_of(layout.begin(), layout.end(), [&](const HfTensorSlot& s) { return s.hf_name == bare; }))
      problems.push_back(fmt::format("tensor {} does not exist in this model", name));
  }
  if (!problems.empty()) {
    const size_t shown = std::min<size_t>(problems.size(), 6);
    std::string list;
    for (size_t i = 0; i < shown; ++i) list += "\n  " + problems[i];
    if (problems.size() > shown) list += fmt::format("\n  ... and {} more", problems.size() - shown);
    throw UsageError(fmt::format(
        "{} does not fit this model (layers={}, width={}, heads={}, kv_heads={}, mlp_hidden={}, vocab={}, "
        "tied_embeddings={}):{}\nthe checkpoint comes from a run with another model shape: use that run's config, "
        "or start a new run.dir",
        source, mc.layers, mc.width, mc.heads, mc.kv_head_count(), mc.hidden(), mc.vocab, mc.tied_embeddings, list));
  }
  // A NaN or infinity in a checkpoint (saved after the numbers went wrong, or damaged in a way the
  // checksum cannot see) would be trained on or sampled from silently.
  for (const auto& slot : layout) {
    const auto& tensor = file.tensors.at(prefix + slot.hf_name);
    const size_t count = tensor.data.size() / sizeof(float);
    for (size_t i = 0; i < count; ++i) {
      float v;
      std::memcpy(&v, tensor.data.data() + i * sizeof(float), sizeof v);
      if (!std::isfinite(v))
        throw DamagedCheckpoint(fmt::format("{}: tensor {} holds the non-finite value {} at element {}: these weights "
                                            "cannot be trained on or evaluated; use an earlier checkpoint",
                                            source, prefix + slot.hf_name, v, i));
    }
  }
  const auto& arena = model.params();
  for (const auto& slot : layout) {
    const auto& tensor = file.tensors.at(prefix + slot.hf_name);
    const auto& info = arena.find(slot.arena_name);
    std::memcpy(values.data() + info.offset + slot.row_begin * slot.cols, tensor.data.data(), tensor.data.size());
  }
}

nlohmann::json hf_config(const model::ModelConfig& m) {
  nlohmann::json j;
  j["architectures"] = {"LlamaForCausalLM"};
  j["model_type"] = "llama";
  j["hidden_size"] = m.width;
  j["intermediate_size"] = m.hidden();
  j["num_hidden_layers"] = m.layers;
  j["num_attention_heads"] = m.heads;
  j["num_key_value_heads"] = m.kv_head_count();
  j["head_dim"] = m.head_dim();
  j["vocab_size"] = m.vocab;
  j["max_position_embeddings"] = m.context;
  j["rms_norm_eps"] = m.norm_eps;
  j["rope_theta"] = m.rope_theta;
  j["tie_word_embeddings"] = m.tied_embeddings;
  j["hidden_act"] = "silu";
  j["attention_bias"] = false;
  j["mlp_bias"] = false;
  j["torch_dtype"] = "float32";
  return j;
}

void remove_quietly(const fs::path& p) {
  std::error_code ec;
  fs::remove_all(p, ec);
}

// state.json parsed, its own checksum verified (DamagedCheckpoint otherwise). `legacy`: written by a
// nibble from before checksums (neither key), which loads unverified: a run in progress must survive
// the upgrade, and its successors are verified. One key without the other is damage.
struct StateFile {
  nlohmann::json json;
  bool legacy = false;
};
StateFile read_state_file(const fs::path& checkpoint) {
  const fs::path state_path = checkpoint / kStateFile;
  StateFile f;
  try {
    const auto state_bytes = io::read_regular_file(state_path, "a checkpoint's state.json");
    f.json = nlohmann::json::parse(state_bytes.begin(), state_bytes.end());
    const nlohmann::json& s = f.json;
    if (!s.is_object()) throw DamagedCheckpoint(fmt::format("{}: not a JSON object\n{}", state_path.string(), damage_advice(checkpoint)));
    f.legacy = !s.contains(kSelfChecksumKey) && !s.contains(kChecksumsKey);
    if (!f.legacy && (!s.contains(kSelfChecksumKey) || !s.contains(kChecksumsKey)))
      throw DamagedCheckpoint(fmt::format("{}: holds only part of its checksums: damaged\n{}", state_path.string(),
                                          damage_advice(checkpoint)));
    const std::string recorded = f.legacy ? "" : s.at(kSelfChecksumKey).get<std::string>();
    const std::string actual = f.legacy ? "" : state_checksum(s);
    if (recorded != actual)
      throw DamagedCheckpoint(fmt::format("{}: its contents do not match the checksum written with it ({} on disk, {} "
                                          "recorded): the file was changed or damaged after it was saved\n{}",
                                          state_path.string(), actual, recorded, damage_advice(checkpoint)));
  } catch (const nlohmann::json::exception& e) {
    throw DamagedCheckpoint(fmt::format("{}: damaged ({})\n{}", state_path.string(), e.what(), damage_advice(checkpoint)));
  } catch (const DamagedCheckpoint&) {
    throw;
  } catch (const UsageError& e) {  // unreadable
    throw DamagedCheckpoint(fmt::format("{}\n{}", e.what(), damage_advice(checkpoint)));
  }
  return f;
}

TrainingState training_state(const StateFile& f, const fs::path& checkpoint) {
  const nlohmann::json& s = f.json;
  const fs::path state_path = checkpoint / kStateFile;
  TrainingState state;
  try {
    state.step = s.at("step").get<int64_t>();
    state.tokens = s.at("tokens").get<int64_t>();
    state.micro_batches = s.at("micro_batches").get<int64_t>();
    state.seed = s.at("seed").get<uint64_t>();
    state.elapsed_s = s.at("elapsed_s").get<double>();
    state.best_val_step = s.at("best_val_step").get<int64_t>();
    state.best_val_loss = s.at("best_val_loss").get<double>();
  } catch (const nlohmann::json::exception& e) {
    throw DamagedCheckpoint(fmt::format("{}: damaged ({})\n{}", state_path.string(), e.what(), damage_advice(checkpoint)));
  }
  if (state.step < 0) throw DamagedCheckpoint(fmt::format("{}: negative step {}", state_path.string(), state.step));
  return state;
}

// True when every file of `checkpoint` matches the checksum state.json records for it (a checkpoint
// from before checksums: when its state.json holds a training state, as loading takes it).
bool files_verify(const fs::path& checkpoint) {
  try {
    const StateFile f = read_state_file(checkpoint);
    training_state(f, checkpoint);
    if (f.legacy) return true;
    const nlohmann::json& checksums = f.json.at(kChecksumsKey);
    // Hashed in pieces: a training run holds its own state beside the file being checked.
    auto matches = [&](const char* name) {
      const auto it = checksums.find(name);
      return it != checksums.end() && it->is_string() && io::file_content_hash(checkpoint / name) == it->get<std::string>();
    };
    return matches(kHfConfigFile) && matches(kModelFile) && (!f.json.value("has_optimizer", false) || matches(kOptimizerFile));
  } catch (const UsageError&) {  // DamagedCheckpoint included
    return false;
  } catch (const nlohmann::json::exception&) {
    return false;
  }
}

constexpr const char* kReplacedPrefix = ".replaced-";
constexpr const char* kRemovingPrefix = ".removing-";

// Removes `dir` (a checkpoint, or a hidden leftover of a save) unless a reader holds it: a
// checkpoint is first renamed to a hidden name under the exclusive lock, so that a reader waiting
// for the lock finds it gone and lists again, and a crash mid-removal leaves a leftover that the
// next save removes. False when a reader holds it (it is removed at a later save).
bool remove_unless_read(const fs::path& dir) {
  const auto lock = io::CheckpointLock::for_removal_if_unread(dir);
  if (!lock) return false;
  fs::path doomed = dir;
  if (!dir.filename().string().starts_with(".")) {
    doomed = dir.parent_path() / fmt::format("{}{}-{}", kRemovingPrefix, dir.filename().string(), ::getpid());
    std::error_code ec;
    fs::rename(dir, doomed, ec);
    if (ec) doomed = dir;
  }
  remove_quietly(doomed);
  return true;
}

// What crashed or concurrent saves left in RUN/checkpoints: partial checkpoints, checkpoints moved
// aside for a replacement or for removal. Never complete checkpoints of their step: removed
// (symlinks and files of these names, which nibble never makes, are left alone).
void remove_save_leftovers(const fs::path& dir) {
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.starts_with(kPartialPrefix) || name.starts_with(kReplacedPrefix) || name.starts_with(kRemovingPrefix))
      remove_unless_read(it->path());
  }
}

// Puts the complete checkpoint `partial` at `final_path`. An existing checkpoint of that step (a
// damaged one that resume passed over) is moved aside first, since rename() cannot replace a
// non-empty directory, and removed after the new one is in place, unless a reader holds it (then
// the next save removes it).
void put_in_place(const fs::path& partial, const fs::path& final_path) {
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(final_path, ec))) {
    fs::rename(partial, final_path);
    return;
  }
  const auto lock = io::CheckpointLock::for_removal_if_unread(final_path);
  const fs::path displaced =
      final_path.parent_path() / fmt::format("{}{}-{}", kReplacedPrefix, final_path.filename().string(), ::getpid());
  fs::rename(final_path, displaced);
  try {
    fs::rename(partial, final_path);
  } catch (const fs::filesystem_error&) {
    fs::rename(displaced, final_path, ec);  // back in place: a hidden name would be removed as a leftover
    throw;
  }
  if (lock) remove_quietly(displaced);
}

// Rotation after `written` was saved: a checkpoint is removed only when `keep` checkpoints newer than
// it verify (`written` counts, known good), so a damaged or fake checkpoint never makes it delete a
// good one, and the newest that verifies always stays. Checkpoints newer than `written` (damaged ones
// that resume passed over, replaced as training reaches their step) and options.also_keep stay.
void rotate(const fs::path& run_dir, const fs::path& written, const CheckpointOptions& options,
            CheckpointVerdicts& verdicts) {
  const int64_t keep = std::max<int64_t>(options.keep, 1), written_step = checkpoint_step(written.filename().string());
  int64_t verified_newer = 1;
  const auto all = list_checkpoints(run_dir);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (checkpoint_step(it->filename().string()) >= written_step) continue;
    std::error_code ec;
    if (verified_newer < keep) {
      if (verdicts.verifies(*it)) ++verified_newer;
    } else if (!(options.also_keep && fs::equivalent(*it, *options.also_keep, ec))) {
      remove_unless_read(*it);
    }
  }
}

}  // namespace

int64_t checkpoint_step(const std::string& name) {
  if (!name.starts_with(kStepPrefix)) return -1;
  const std::string digits = name.substr(std::strlen(kStepPrefix));
  int64_t step = -1;
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
  // Digits only, and within int64 (a longer name is nobody's checkpoint).
  if (digits.empty() || digits[0] == '-' || digits[0] == '+' || error != std::errc() || end != digits.data() + digits.size())
    return -1;
  return step;
}

std::vector<HfTensorSlot> hf_tensor_layout(const model::Transformer& model) {
  const auto& m = model.config();
  const int64_t d = m.width, hd = m.head_dim(), f = m.hidden();
  const int64_t q_rows = m.heads * hd, kv_rows = m.kv_head_count() * hd;
  std::vector<HfTensorSlot> slots;
  slots.push_back({"model.embed_tokens.weight", "embedding", 0, m.vocab, d, {m.vocab, d}});
  for (int64_t l = 0; l < m.layers; ++l) {
    const std::string hf = fmt::format("model.layers.{}.", l), ours = fmt::format("block{}.", l);
    slots.push_back({hf + "input_layernorm.weight", ours + "norm1", 0, 1, d, {d}});
    // The fused QKV rows are [q heads | k heads | v heads] (kernels/cpu/layers/attention.h), each head
    // half-split for RoPE as Hugging Face's rotate_half expects, so the split is a plain row range.
    slots.push_back({hf + "self_attn.q_proj.weight", ours + "qkv", 0, q_rows, d, {q_rows, d}});
    slots.push_back({hf + "self_attn.k_proj.weight", ours + "qkv", q_rows, kv_rows, d, {kv_rows, d}});
    slots.push_back({hf + "self_attn.v_proj.weight", ours + "qkv", q_rows + kv_rows, kv_rows, d, {kv_rows, d}});
    slots.push_back({hf + "self_attn.o_proj.weight", ours + "attn_out", 0, d, q_rows, {d, q_rows}});
    slots.push_back({hf + "post_attention_layernorm.weight", ours + "norm2", 0, 1, d, {d}});
    // gate_up rows: gate in [0, f), up in [f, 2f) (kernels/cpu/layers/swiglu.h).
    slots.push_back({hf + "mlp.gate_proj.weight", ours + "gate_up", 0, f, d, {f, d}});
    slots.push_back({hf + "mlp.up_proj.weight", ours + "gate_up", f, f, d, {f, d}});
    slots.push_back({hf + "mlp.down_proj.weight", ours + "down", 0, d, f, {d, f}});
  }
  slots.push_back({"model.norm.weight", "final_norm", 0, 1, d, {d}});
  // Tied embeddings: Hugging Face omits lm_head.weight and sets tie_word_embeddings.
  if (!m.tied_embeddings) slots.push_back({"lm_head.weight", "lm_head", 0, m.vocab, d, {m.vocab, d}});
  return slots;
}

fs::path checkpoints_dir(const fs::path& run_dir) { return run_dir / "checkpoints"; }

fs::path checkpoint_path(const fs::path& run_dir, int64_t step) {
  return checkpoints_dir(run_dir) / fmt::format("{}{:08d}", kStepPrefix, step);
}

std::vector<fs::path> list_checkpoints(const fs::path& run_dir) {
  std::vector<std::pair<int64_t, fs::path>> found;
  std::error_code ec;
  for (fs::directory_iterator it(checkpoints_dir(run_dir), ec), end; !ec && it != end; it.increment(ec)) {
    const int64_t step = checkpoint_step(it->path().filename().string());
    // A symlink is not a checkpoint nibble wrote: never listed, so never loaded by default nor rotated.
    std::error_code status_ec;
    if (step >= 0 && it->symlink_status(status_ec).type() == fs::file_type::directory) found.emplace_back(step, it->path());
  }
  std::sort(found.begin(), found.end());
  std::vector<fs::path> paths;
  for (auto& [step, path] : found) paths.push_back(path);
  return paths;
}

std::optional<fs::path> latest_checkpoint(const fs::path& run_dir) {
  auto all = list_checkpoints(run_dir);
  if (all.empty()) return std::nullopt;
  return all.back();
}

fs::path abandoned_dir(const fs::path& run_dir) { return run_dir / "abandoned"; }

std::vector<MovedCheckpoint> abandon_checkpoints_after(const fs::path& run_dir, int64_t step) {
  std::vector<MovedCheckpoint> moves;
  for (const fs::path& checkpoint : list_checkpoints(run_dir)) {
    if (checkpoint_step(checkpoint.filename().string()) <= step) continue;
    const fs::path dir = abandoned_dir(run_dir);
    fs::path target = dir / checkpoint.filename();
    for (int n = 2; fs::exists(target); ++n) target = dir / fmt::format("{}-{}", checkpoint.filename().string(), n);
    std::error_code ec;
    fs::create_directories(dir, ec);
    // Within one run directory, so one filesystem: rename moves the whole directory atomically.
    if (!ec) fs::rename(checkpoint, target, ec);
    if (ec)
      throw UsageError(fmt::format("could not move {} to {}: {}: make {} writable and run again (nothing was "
                                   "deleted; {} checkpoint(s) were moved before it)",
                                   checkpoint.string(), target.string(), ec.message(), run_dir.string(), moves.size()));
    moves.push_back({checkpoint, target});
  }
  return moves;
}

std::string checkpoint_names(const std::vector<fs::path>& checkpoints) {
  std::string names;
  for (const auto& c : checkpoints) names += (names.empty() ? "" : ", ") + c.filename().string();
  return names.empty() ? "none" : names;
}

bool CheckpointVerdicts::verifies(const fs::path& checkpoint) {
  const auto [it, added] = verdicts_.try_emplace(checkpoint.filename().string(), false);
  if (added) it->second = files_verify(checkpoint);
  return it->second;
}

void CheckpointVerdicts::known_good(const fs::path& checkpoint) { verdicts_[checkpoint.filename().string()] = true; }

fs::path save_checkpoint(const fs::path& run_dir, const model::Transformer& model, const AdamW* optimizer,
                         const TrainingState& state, const CheckpointOptions& options) {
  if (!optimizer) return save_checkpoint_state(run_dir, model, nullptr, state, options);
  const AdamWState whole = optimizer->gather_state();
  return save_checkpoint_state(run_dir, model, &whole, state, options);
}

fs::path save_checkpoint_state(const fs::path& run_dir, const model::Transformer& model, const AdamWState* optimizer,
                               const TrainingState& state, const CheckpointOptions& options) {
  const fs::path dir = checkpoints_dir(run_dir), final_path = checkpoint_path(run_dir, state.step);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw UsageError(fmt::format("cannot create '{}': {}", dir.string(), ec.message()));
  remove_save_leftovers(dir);

  const fs::path partial = dir / fmt::format("{}{:08d}-{}", kPartialPrefix, state.step, ::getpid());
  fs::create_directories(partial, ec);
  if (ec) throw UsageError(fmt::format("cannot create '{}': {}", partial.string(), ec.message()));
  try {
    nlohmann::json checksums;
    {  // scoped: its copy of the weights is freed before the optimizer state's are made
      io::SafetensorsFile weights = arena_to_safetensors(model, model.params().host_values(), "");
      weights.metadata["format"] = "pt";  // what Hugging Face's loaders look for
      weights.metadata["nibble.step"] = std::to_string(state.step);
      checksums[kModelFile] = write_bytes(partial / kModelFile, io::serialize_safetensors(weights));
    }
    if (options.after_weights_written) options.after_weights_written(state.step);
    checksums[kHfConfigFile] = write_json(partial / kHfConfigFile, hf_config(model.config()));
    if (optimizer) {
      io::SafetensorsFile moments = arena_to_safetensors(model, optimizer->first, "exp_avg.");
      io::SafetensorsFile second = arena_to_safetensors(model, optimizer->second, "exp_avg_sq.");
      moments.tensors.merge(second.tensors);
      moments.metadata["adam_step"] = std::to_string(optimizer->steps);
      checksums[kOptimizerFile] = write_bytes(partial / kOptimizerFile, io::serialize_safetensors(moments));
    }
    nlohmann::json s;
    s["step"] = state.step;
    s["tokens"] = state.tokens;
    s["micro_batches"] = state.micro_batches;
    s["seed"] = state.seed;
    s["elapsed_s"] = state.elapsed_s;
    s["best_val_step"] = state.best_val_step;
    s["best_val_loss"] = state.best_val_step >= 0 ? state.best_val_loss : 0.0;
    s["has_optimizer"] = optimizer != nullptr;
    s[kTokenizerKey] = options.tokenizer_identity;
    s[kChecksumsKey] = checksums;
    s[kSelfChecksumKey] = state_checksum(s);
    write_json(partial / kStateFile, s);
    put_in_place(partial, final_path);
  } catch (const fs::filesystem_error& e) {
    remove_quietly(partial);
    throw UsageError(fmt::format("could not write checkpoint '{}': {} (previous checkpoints are intact)",
                                 final_path.string(), e.what()));
  } catch (const UsageError& e) {
    remove_quietly(partial);
    throw UsageError(fmt::format("could not write checkpoint '{}': {} (previous checkpoints are intact)",
                                 final_path.string(), e.what()));
  }
  CheckpointVerdicts local;
  CheckpointVerdicts& verdicts = options.verdicts ? *options.verdicts : local;
  verdicts.known_good(final_path);
  rotate(run_dir, final_path, options, verdicts);
  return final_path;
}

TrainingState load_checkpoint(const fs::path& checkpoint, model::Transformer& model, AdamW* optimizer,
                              const std::optional<std::string>& tokenizer_identity) {
  AdamWState whole;
  const TrainingState state = load_checkpoint_state(checkpoint, model, optimizer ? &whole : nullptr, tokenizer_identity);
  if (optimizer) optimizer->scatter_state(whole);
  return state;
}

TrainingState load_checkpoint_state(const fs::path& checkpoint, model::Transformer& model, AdamWState* optimizer,
                                    const std::optional<std::string>& tokenizer_identity) {
  if (!fs::is_directory(checkpoint))
    throw UsageError(fmt::format("checkpoint '{}' is not a directory (expected RUN/checkpoints/step_NNNNNNNN)",
                                 checkpoint.string()));
  const StateFile state_file = read_state_file(checkpoint);
  const nlohmann::json& s = state_file.json;
  if (state_file.legacy)
    fmt::print(stderr,
               "warning: {} was written by a nibble that recorded no checksums: loading it unverified (the "
               "checkpoints written from now on are verified)\n",
               checkpoint.string());
  const TrainingState state = training_state(state_file, checkpoint);
  const nlohmann::json* checksums = state_file.legacy ? nullptr : &s.at(kChecksumsKey);
  if (tokenizer_identity && !state_file.legacy) {
    const std::string saved = s.value(kTokenizerKey, std::string());
    if (saved != *tokenizer_identity)
      throw UsageError(fmt::format("{} was trained with another tokenizer (identity {}) than this one ({}), although "
                                   "the vocabulary size may be the same: token ids would mean other text. Use the "
                                   "data.dir (or the tokenizer.json) the run was trained with, or start a new run.dir",
                                   checkpoint.string(), saved.empty() ? "unknown" : saved, *tokenizer_identity));
  }
  read_verified(checkpoint, kHfConfigFile, checksums);
  const fs::path model_path = checkpoint / kModelFile;
  const auto model_bytes = read_verified(checkpoint, kModelFile, checksums);
  // Load into a copy first so that a mismatch leaves the model as it was.
  std::vector<float> values = model.params().host_values();
  safetensors_to_arena(io::parse_safetensors(model_bytes, model_path.string()), model_path.string(), model, values, "");
  if (optimizer) {
    const fs::path opt_path = checkpoint / kOptimizerFile;
    if (!s.value("has_optimizer", false))
      throw UsageError(fmt::format("{}: saved without optimizer state, which resuming needs", checkpoint.string()));
    const auto file = io::parse_safetensors(read_verified(checkpoint, kOptimizerFile, checksums), opt_path.string());
    std::vector<float> m(values.size()), v(values.size());
    safetensors_to_arena(file, opt_path.string(), model, m, "exp_avg.");
    safetensors_to_arena(file, opt_path.string(), model, v, "exp_avg_sq.");
    const std::string& adam_step = file.metadata_value("adam_step", opt_path.string());
    int64_t t = -1;
    try {
      t = std::stoll(adam_step);
    } catch (const std::exception&) {
    }
    if (t != state.step)
      throw UsageError(fmt::format("{}: optimizer step '{}' disagrees with state.json step {}", opt_path.string(),
                                   adam_step, state.step));
    *optimizer = AdamWState{std::move(m), std::move(v), t};
  }
  model.params().set_values(values);
  return state;
}

}  // namespace nibble::train
