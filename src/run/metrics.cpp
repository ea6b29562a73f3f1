#include "run/metrics.h"

#include <fmt/format.h>

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "io/atomic_file.h"

namespace nibble::train {

namespace {

// ordered_json: records read kind and step first, in the order written here.
nlohmann::ordered_json to_json(const StepRecord& r) {
  nlohmann::ordered_json j = {{"kind", "train"},        {"step", r.step},
                              {"tokens", r.tokens},     {"loss", r.loss},
                              {"lr", r.lr},             {"grad_norm", r.grad_norm},
                              {"step_time_s", r.step_time_s}, {"tokens_per_s", r.tokens_per_s},
                              {"mfu", r.mfu},           {"eta_s", r.eta_s},
                              {"elapsed_s", r.elapsed_s}};
  if (r.ranks > 1) {
    j["ranks"] = r.ranks;
    j["tokens_per_s_per_rank"] = r.tokens_per_s / static_cast<double>(r.ranks);
    j["comm_fraction"] = r.comm_fraction;
  }
  return j;
}

nlohmann::ordered_json to_json(const EvalRecord& r) {
  nlohmann::ordered_json j = {{"kind", "eval"}, {"step", r.step}, {"tokens", r.tokens}, {"val_loss", r.val_loss},
                              {"val_perplexity", r.perplexity()}};
  for (const auto& [name, loss] : r.sources) j["val_loss." + name] = loss;
  j["elapsed_s"] = r.elapsed_s;
  return j;
}

// JSON cannot hold NaN or infinity; null keeps the line parseable and the NaN visible.
nlohmann::ordered_json finite_or_null(nlohmann::ordered_json j) {
  for (auto& [key, value] : j.items())
    if (value.is_number_float() && !std::isfinite(value.get<double>())) value = nullptr;
  return j;
}

double number_or_nan(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : std::nan("");
}

}  // namespace

double EvalRecord::perplexity() const { return std::exp(val_loss); }

MetricsLog::MetricsLog(const std::filesystem::path& path, int64_t keep_through_step) : path_(path) {
  std::string kept;
  if (keep_through_step >= 0 && std::filesystem::exists(path)) {
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) {
      try {
        auto j = nlohmann::json::parse(line);
        if (j.at("step").get<int64_t>() <= keep_through_step) kept += line + "\n";
      } catch (const nlohmann::json::exception&) {
        // A line cut short by a crash: dropped.
      }
    }
  }
  io::write_file_atomically(path, std::span(reinterpret_cast<const uint8_t*>(kept.data()), kept.size()));
  file_ = std::fopen(path.c_str(), "a");
  if (!file_) throw UsageError(fmt::format("cannot open '{}' for appending: check permissions", path.string()));
}

MetricsLog::~MetricsLog() {
  if (file_) std::fclose(file_);
}

void MetricsLog::append(const std::string& line) {
  if (std::fputs(line.c_str(), file_) < 0 || std::fputc('\n', file_) == EOF || std::fflush(file_) != 0)
    throw UsageError(fmt::format("cannot write to '{}' (disk full?)", path_.string()));
}

void MetricsLog::write(const StepRecord& r) { append(finite_or_null(to_json(r)).dump()); }
void MetricsLog::write(const EvalRecord& r) { append(finite_or_null(to_json(r)).dump()); }

MetricsHistory read_metrics(const std::filesystem::path& path) {
  std::error_code ec;
  if (std::filesystem::exists(path, ec) && !std::filesystem::is_regular_file(path, ec))
    throw UsageError(fmt::format("'{}' is not a regular file (a device, FIFO or directory, perhaps through a symlink): a "
                                 "run's metrics.jsonl is a file nibble train writes",
                                 path.string()));
  std::ifstream in(path);
  if (!in) throw UsageError(fmt::format("cannot read '{}': is this a run directory of `nibble train`?", path.string()));
  MetricsHistory h;
  for (std::string line; std::getline(in, line);) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
      if (!j.is_object() || !j.contains("kind") || !j.contains("step")) continue;
      const std::string kind = j.at("kind").get<std::string>();
      if (kind == "train") {
        StepRecord r;
        r.step = j.at("step").get<int64_t>();
        r.tokens = j.value("tokens", int64_t{0});
        r.loss = number_or_nan(j, "loss");
        r.lr = number_or_nan(j, "lr");
        r.grad_norm = number_or_nan(j, "grad_norm");
        r.step_time_s = number_or_nan(j, "step_time_s");
        r.tokens_per_s = number_or_nan(j, "tokens_per_s");
        r.mfu = number_or_nan(j, "mfu");
        r.eta_s = number_or_nan(j, "eta_s");
        r.elapsed_s = number_or_nan(j, "elapsed_s");
        r.ranks = j.value("ranks", int64_t{1});
        r.comm_fraction = j.value("comm_fraction", 0.0);
        h.steps.push_back(r);
      } else if (kind == "eval") {
        EvalRecord r;
        r.step = j.at("step").get<int64_t>();
        r.tokens = j.value("tokens", int64_t{0});
        r.val_loss = number_or_nan(j, "val_loss");
        r.elapsed_s = number_or_nan(j, "elapsed_s");
        for (const auto& [key, value] : j.items())
          if (key.starts_with("val_loss."))
            r.sources.emplace_back(key.substr(9), value.is_number() ? value.get<double>() : std::nan(""));
        h.evals.push_back(r);
      }
    } catch (const nlohmann::json::exception&) {
      continue;
    }
  }
  return h;
}

uint32_t crc32c(std::span<const uint8_t> bytes) {
  // Castagnoli polynomial, reflected (0x82F63B78), bitwise: event files are small.
  uint32_t crc = 0xFFFFFFFFu;
  for (uint8_t b : bytes) {
    crc ^= b;
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
  }
  return ~crc;
}

namespace {

uint32_t masked_crc(std::span<const uint8_t> bytes) {
  const uint32_t crc = crc32c(bytes);
  return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u;
}

void put_le(std::vector<uint8_t>& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

void put_varint(std::vector<uint8_t>& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<uint8_t>(v | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<uint8_t>(v));
}

void put_bytes_field(std::vector<uint8_t>& out, uint8_t key, std::span<const uint8_t> bytes) {
  out.push_back(key);
  put_varint(out, bytes.size());
  out.insert(out.end(), bytes.begin(), bytes.end());
}

// Event.wall_time (field 1, fixed64 double) and Event.step (field 2, varint).
std::vector<uint8_t> event_header(double wall_time, int64_t step) {
  std::vector<uint8_t> e;
  uint64_t bits;
  std::memcpy(&bits, &wall_time, sizeof bits);
  e.push_back(0x09);
  put_le(e, bits, 8);
  e.push_back(0x10);
  put_varint(e, static_cast<uint64_t>(step));
  return e;
}

}  // namespace

std::vector<uint8_t> tfrecord_frame(std::span<const uint8_t> payload) {
  std::vector<uint8_t> out, length;
  put_le(length, payload.size(), 8);
  out.insert(out.end(), length.begin(), length.end());
  put_le(out, masked_crc(length), 4);
  out.insert(out.end(), payload.begin(), payload.end());
  put_le(out, masked_crc(payload), 4);
  return out;
}

std::vector<uint8_t> tensorboard_version_event(double wall_time) {
  std::vector<uint8_t> e = event_header(wall_time, 0);
  const std::string version = "brain.Event:2";
  put_bytes_field(e, 0x1A, std::span(reinterpret_cast<const uint8_t*>(version.data()), version.size()));  // file_version = 3
  return e;
}

std::vector<uint8_t> tensorboard_scalar_event(double wall_time, int64_t step, std::string_view tag, float value) {
  // Summary.Value { tag = 1 (string), simple_value = 2 (float) }
  std::vector<uint8_t> v;
  put_bytes_field(v, 0x0A, std::span(reinterpret_cast<const uint8_t*>(tag.data()), tag.size()));
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  v.push_back(0x15);
  put_le(v, bits, 4);
  std::vector<uint8_t> summary;
  put_bytes_field(summary, 0x0A, v);  // Summary.value = 1
  std::vector<uint8_t> e = event_header(wall_time, step);
  put_bytes_field(e, 0x2A, summary);  // Event.summary = 5
  return e;
}

namespace {
double unix_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}
}  // namespace

TensorBoardWriter::TensorBoardWriter(const std::filesystem::path& directory) {
  std::error_code ec;
  std::filesystem::create_directories(directory, ec);
  if (ec) throw UsageError(fmt::format("cannot create '{}': {}", directory.string(), ec.message()));
  const double now = unix_time();
  path_ = directory / fmt::format("events.out.tfevents.{}.nibble.{}", static_cast<int64_t>(now), ::getpid());
  file_ = std::fopen(path_.c_str(), "wb");
  if (!file_) throw UsageError(fmt::format("cannot create '{}': check permissions", path_.string()));
  const auto frame = tfrecord_frame(tensorboard_version_event(now));
  if (std::fwrite(frame.data(), 1, frame.size(), file_) != frame.size() || std::fflush(file_) != 0)
    throw UsageError(fmt::format("cannot write to '{}' (disk full?)", path_.string()));
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_) std::fclose(file_);
}

void TensorBoardWriter::scalar(std::string_view tag, int64_t step, double value) {
  if (!std::isfinite(value)) return;  // TensorBoard would draw a NaN as a gap anyway
  const auto frame = tfrecord_frame(tensorboard_scalar_event(unix_time(), step, tag, static_cast<float>(value)));
  if (std::fwrite(frame.data(), 1, frame.size(), file_) != frame.size())
    throw UsageError(fmt::format("cannot write to '{}' (disk full?)", path_.string()));
}

void TensorBoardWriter::write(const StepRecord& r) {
  scalar("train/loss", r.step, r.loss);
  scalar("train/lr", r.step, r.lr);
  scalar("train/grad_norm", r.step, r.grad_norm);
  scalar("train/tokens_per_s", r.step, r.tokens_per_s);
  scalar("train/mfu", r.step, r.mfu);
  if (std::fflush(file_) != 0) throw UsageError(fmt::format("cannot write to '{}' (disk full?)", path_.string()));
}

void TensorBoardWriter::write(const EvalRecord& r) {
  scalar("eval/loss", r.step, r.val_loss);
  scalar("eval/perplexity", r.step, r.perplexity());
  for (const auto& [name, loss] : r.sources) scalar("eval/loss." + name, r.step, loss);
  if (std::fflush(file_) != 0) throw UsageError(fmt::format("cannot write to '{}' (disk full?)", path_.string()));
}

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  if (s < 60) return fmt::format("{:.1f}s", s);
  const int64_t total = static_cast<int64_t>(std::llround(s));
  if (total < 3600) return fmt::format("{}m{:02d}s", total / 60, total % 60);
  return fmt::format("{}h{:02d}m", total / 3600, (total % 3600) / 60);
}

std::string format_si(double v) {
  if (!std::isfinite(v)) return "?";
  if (std::fabs(v) >= 1e9) return fmt::format("{:.2f}G", v / 1e9);
  if (std::fabs(v) >= 1e6) return fmt::format("{:.2f}M", v / 1e6);
  if (std::fabs(v) >= 1e3) return fmt::format("{:.1f}k", v / 1e3);
  return fmt::format("{:.0f}", v);
}

std::string format_step_line(const StepRecord& r) {
  const int width = static_cast<int>(std::to_string(r.total_steps).size());
  return fmt::format("step {:>{}}/{} | loss {:.4f} | lr {:.2e} | grad norm {:.3f} | {:.0f} ms/step | {} tok/s | "
                     "MFU {:.1f}% | ETA {}",
                     r.step, width, r.total_steps, r.loss, r.lr, r.grad_norm, r.step_time_s * 1e3,
                     format_si(r.tokens_per_s), 100.0 * r.mfu, format_duration(r.eta_s)) +
         (r.ranks > 1 ? fmt::format(" | {} ranks x {} tok/s, comm {:.1f}%", r.ranks,
                                    format_si(r.tokens_per_s / static_cast<double>(r.ranks)), 100.0 * r.comm_fraction)
                      : std::string());
}

std::string format_eval_line(const EvalRecord& r, int64_t total_steps) {
  const int width = static_cast<int>(std::to_string(total_steps).size());
  std::string per_source;
  for (const auto& [name, loss] : r.sources) per_source += fmt::format(" | {} {:.4f}", name, loss);
  return fmt::format("eval {:>{}}/{} | val loss {:.4f}{} | val perplexity {:.2f} | {} tokens seen | {}", r.step, width,
                     total_steps, r.val_loss,
                     r.sources.empty() ? std::string() : " (weight-averaged over the sources)" + per_source,
                     r.perplexity(), format_si(static_cast<double>(r.tokens)), format_duration(r.elapsed_s));
}

}  // namespace nibble::train
