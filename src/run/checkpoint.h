// Checkpoints of a run: everything needed to continue it bit for bit, in files other tools read.
//   RUN/checkpoints/step_00000500/
//     model.safetensors      FP32 weights under Hugging Face Llama names (model.embed_tokens.weight,
//                            model.layers.N.self_attn.q_proj.weight, ...; nibble's fused qkv and
//                            gate_up weights are split into q/k/v and gate/up)
//     config.json            the matching Hugging Face LlamaConfig
//     optimizer.safetensors  AdamW moments (exp_avg.NAME, exp_avg_sq.NAME) and its step count
//     state.json             step, tokens, seed, data position, elapsed time, best validation loss;
//                            the XXH3 checksum of every other file's contents, the identity of the
//                            run's tokenizer (Tokenizer::identity) and a checksum of itself
// A checkpoint is written into a hidden temporary directory and renamed into place only when every
// file is complete and flushed, so a crash (kill -9, full disk) mid-write leaves the previous
// checkpoints untouched and no half-written step_* directory. The newest `keep` are kept. Loading
// verifies every checksum and refuses non-finite weights, so flipped bytes on disk are never
// trained on or evaluated.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/error.h"
#include "model/transformer.h"
#include "train/optimizer.h"

namespace nibble::train {

// A checkpoint whose bytes are wrong (checksum mismatch, truncated or unparsable file, non-finite
// values): an earlier checkpoint may still be good, unlike after a shape or tokenizer mismatch,
// which every checkpoint of the run shares.
struct DamagedCheckpoint : UsageError {
  using UsageError::UsageError;
};

struct TrainingState {
  int64_t step = 0;            // optimizer steps done
  int64_t tokens = 0;          // training tokens consumed
  int64_t micro_batches = 0;   // batches drawn from the sampler (its position: batch k is a function of k)
  uint64_t seed = 0;
  double elapsed_s = 0;        // training wall time so far, across resumes
  double best_val_loss = 0;    // meaningful when best_val_step >= 0
  int64_t best_val_step = -1;
};

// One tensor of the Hugging Face layout and where it lives in nibble's arena.
struct HfTensorSlot {
  std::string hf_name;
  std::string arena_name;
  int64_t row_begin = 0, rows = 0, cols = 0;  // the rows of the arena parameter it covers
  std::vector<int64_t> shape;                 // as stored ([cols] for norm gains)
};
std::vector<HfTensorSlot> hf_tensor_layout(const model::Transformer& model);

std::filesystem::path checkpoints_dir(const std::filesystem::path& run_dir);
std::filesystem::path checkpoint_path(const std::filesystem::path& run_dir, int64_t step);
// The step of a checkpoint directory name ("step_00000500" -> 500), or -1 for any other name.
int64_t checkpoint_step(const std::string& name);
// Complete checkpoints (step_NNNNNNNN directories, not symlinks), oldest first.
std::vector<std::filesystem::path> list_checkpoints(const std::filesystem::path& run_dir);
std::optional<std::filesystem::path> latest_checkpoint(const std::filesystem::path& run_dir);
// "step_00000100, step_00000200" (their directory names), or "none", for messages.
std::string checkpoint_names(const std::vector<std::filesystem::path>& checkpoints);

// RUN/abandoned/: checkpoints of a continuation that a resume from an older checkpoint gave up
// (`nibble train ... --checkpoint`). Kept, not deleted, but out of RUN/checkpoints, so that nothing
// that takes the newest checkpoint (resume=true, eval, generate) picks them.
std::filesystem::path abandoned_dir(const std::filesystem::path& run_dir);
struct MovedCheckpoint {
  std::filesystem::path from, to;
};
// Moves every checkpoint of `run_dir` newer than `step` into abandoned_dir(run_dir), under its own
// name, or NAME-2, NAME-3, ... where that is taken already. Returns the moves, oldest first. Throws
// UsageError naming the checkpoint that could not be moved (nothing is ever deleted).
std::vector<MovedCheckpoint> abandon_checkpoints_after(const std::filesystem::path& run_dir, int64_t step);

// What rotation learned of each checkpoint of a run directory (by name): whether its files match
// their checksums. Rotation asks after every save; remembered so that a training process reads a
// checkpoint at most once for it (the ones it wrote or resumed from are known good).
class CheckpointVerdicts {
 public:
  bool verifies(const std::filesystem::path& checkpoint);  // reads and checks it the first time
  void known_good(const std::filesystem::path& checkpoint);

 private:
  std::map<std::string, bool> verdicts_;
};

// How save_checkpoint writes and rotates. `tokenizer_identity` (Tokenizer::identity) is stored for
// load_checkpoint to compare.
struct CheckpointOptions {
  int64_t keep = 1;                                   // the newest `keep` checkpoints stay
  std::string tokenizer_identity;
  std::optional<std::filesystem::path> also_keep;     // never removed by the rotation
  std::shared_ptr<CheckpointVerdicts> verdicts;       // kept across saves (none: each save checks afresh)
  // Called after the weights file is written and before the checkpoint is renamed into place:
  // where a test's fault plan (run/faults.h) kills the process, as a crash mid-checkpoint would.
  std::function<void(int64_t step)> after_weights_written;
};

// Writes the checkpoint of `state.step`, then rotates: an older checkpoint is removed only when
// `keep` checkpoints newer than it verify (the one just written counts), never `also_keep` (the last
// checkpoint before a loss spike, which a divergence message would name), never a checkpoint newer
// than the one written (a damaged one resume passed over, replaced when training reaches its step),
// and never one a reader holds (io::CheckpointLock; removed at a later save). A damaged or fake
// checkpoint therefore never makes rotation delete a good one, and the run keeps the one just written.
// Throws UsageError (disk full, permissions) with nothing of the previous checkpoints lost.
std::filesystem::path save_checkpoint(const std::filesystem::path& run_dir, const model::Transformer& model,
                                      const AdamW* optimizer, const TrainingState& state,
                                      const CheckpointOptions& options);
// The same from an optimizer state already in one piece (AdamW::gather_state: a sharded optimizer's
// is gathered on rank 0 first, so a checkpoint is the same files whichever shard mode wrote it).
std::filesystem::path save_checkpoint_state(const std::filesystem::path& run_dir, const model::Transformer& model,
                                            const AdamWState* optimizer, const TrainingState& state,
                                            const CheckpointOptions& options);

// Loads weights (and the optimizer state when `optimizer` is given) into an already constructed
// model, after verifying every file's checksum (DamagedCheckpoint, naming the file), checking every
// tensor's presence, dtype and shape (UsageError; mismatches are named together) and that every
// value is finite (DamagedCheckpoint). With `tokenizer_identity`, a checkpoint trained with another
// tokenizer is refused (UsageError). On any throw the model and optimizer are left as they were.
TrainingState load_checkpoint(const std::filesystem::path& checkpoint, model::Transformer& model, AdamW* optimizer,
                              const std::optional<std::string>& tokenizer_identity = std::nullopt);
// The same with the optimizer state read into host arrays (for AdamW::scatter_state on every rank).
TrainingState load_checkpoint_state(const std::filesystem::path& checkpoint, model::Transformer& model,
                                    AdamWState* optimizer,
                                    const std::optional<std::string>& tokenizer_identity = std::nullopt);

}  // namespace nibble::train
