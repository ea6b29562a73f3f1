// What a run reports while it trains: one JSON object per line in RUN/metrics.jsonl (the file
// `nibble compare` and any plotting script read) and a human-readable line per log interval.
//   {"kind":"train","step":100,"tokens":76800,"loss":2.41,"lr":0.001,"grad_norm":0.83,
//    "step_time_s":0.051,"tokens_per_s":15000,"mfu":0.031,"eta_s":95,"elapsed_s":5.2}
//   {"kind":"eval","step":250,"tokens":192000,"val_loss":1.98,"val_perplexity":7.2,"elapsed_s":13}
// A mixture run (data.sources) adds each source's validation loss, "val_loss.NAME", after
// val_perplexity; its val_loss is then the weight-averaged mean of those (train/trainer.h's Validation).
// Losses are written with the shortest decimal that reads back to the same double, so two runs
// can be compared bit for bit from their metrics files.
#pragma once
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <span>
#include <string_view>
#include <string>
#include <utility>
#include <vector>

namespace nibble::train {

struct StepRecord {
  int64_t step = 0, total_steps = 0, tokens = 0;
  double loss = 0, lr = 0, grad_norm = 0;
  double step_time_s = 0;   // mean over the log window
  double tokens_per_s = 0;  // over the log window
  double mfu = 0;           // model FLOPs utilisation in [0, 1]
  double eta_s = 0, elapsed_s = 0;
  // Data parallelism (written only when ranks > 1): tokens_per_s above counts all ranks;
  // per rank = tokens_per_s / ranks; comm_fraction = share of the step time spent summing
  // gradients across ranks (including waiting for the slowest), so 1 - comm_fraction is the
  // scaling efficiency relative to the same ranks computing without communication.
  int64_t ranks = 1;
  double comm_fraction = 0;
};

struct EvalRecord {
  int64_t step = 0, tokens = 0;
  double val_loss = 0, elapsed_s = 0;
  // A mixture's per-source losses (name, loss), in the order of data.sources; empty otherwise.
  std::vector<std::pair<std::string, double>> sources;
  double perplexity() const;
};

class MetricsLog {
 public:
  // Opens RUN/metrics.jsonl. keep_through_step < 0 starts an empty file; otherwise records after
  // that step (written by a run that crashed after its last checkpoint) are dropped first, so the
  // file holds exactly one history.
  MetricsLog(const std::filesystem::path& path, int64_t keep_through_step);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;
  // Each record is flushed as it is written: a killed run loses at most the line in progress.
  void write(const StepRecord& record);
  void write(const EvalRecord& record);

 private:
  void append(const std::string& line);
  std::filesystem::path path_;
  std::FILE* file_ = nullptr;
};

struct MetricsHistory {
  std::vector<StepRecord> steps;
  std::vector<EvalRecord> evals;
};
// Reads metrics.jsonl; a damaged line is skipped (a crash can cut the last one short).
MetricsHistory read_metrics(const std::filesystem::path& path);

// TensorBoard event files, the format MaxText users watch: RUN/tensorboard/events.out.tfevents.*
// with scalars per step (train/loss, train/lr, ..., eval/loss). Each record is TFRecord framing
// (u64 length, masked CRC32C of the length, an Event protobuf, masked CRC32C of the Event); the
// first Event names the file version. Written directly, without TensorFlow.
uint32_t crc32c(std::span<const uint8_t> bytes);
std::vector<uint8_t> tfrecord_frame(std::span<const uint8_t> payload);
std::vector<uint8_t> tensorboard_scalar_event(double wall_time, int64_t step, std::string_view tag, float value);
std::vector<uint8_t> tensorboard_version_event(double wall_time);

class TensorBoardWriter {
 public:
  explicit TensorBoardWriter(const std::filesystem::path& directory);  // a new event file per run start
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;
  void scalar(std::string_view tag, int64_t step, double value);
  void write(const StepRecord& r);
  void write(const EvalRecord& r);
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  std::FILE* file_ = nullptr;
};

std::string format_duration(double seconds);  // "1h02m", "3m05s", "12.3s"
std::string format_si(double value);          // "15.2k", "1.30M"
std::string format_step_line(const StepRecord& r);
std::string format_eval_line(const EvalRecord& r, int64_t total_steps);

}  // namespace nibble::train
