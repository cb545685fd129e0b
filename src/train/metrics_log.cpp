#include "coremesh/train/metrics_log.hpp"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <type_traits>
#include <sstream>

#include "coremesh/core/allocator.hpp"
#include "coremesh/core/error.hpp"
#include "coremesh/train/safetensors.hpp"

namespace coremesh::train {
namespace fs = std::filesystem;
using nlohmann::json;
using nlohmann::ordered_json;

MemoryRecord memory_now() {
  const HostAllocatorStats a = host_allocator_stats();
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return {int64_t(a.allocated_bytes), int64_t(a.cached_bytes), 0, int64_t(usage.ru_maxrss) * 1024};
}

namespace {
ordered_json sample_json(const SampleRecord& s) { return {{"prompt", s.prompt}, {"text", s.text}}; }
}  // namespace

ordered_json to_json(const MetricsLine& line) {
  const StepRecord& r = line.record;
  ordered_json j;
  j["step"] = r.step + 1;
  j["loss"] = r.loss;
  j["aux_loss"] = r.aux_loss;
  if (line.val_loss >= 0) j["val_loss"] = line.val_loss;
  if (line.val_loss >= 0 && line.val_bits_per_byte >= 0) j["val_bits_per_byte"] = line.val_bits_per_byte;
  j["lr"] = r.lr;
  j["grad_norm"] = r.grad_norm;
  j["tokens"] = line.tokens;
  j["tokens_per_s"] = r.tokens_per_s;
  j["step_seconds"] = r.seconds;
  j["mfu"] = r.mfu;
  ordered_json balance = ordered_json::array();
  for (const auto& shares : line.expert_load) balance.push_back(expert_balance(shares));
  j["expert_balance"] = balance;
  j["expert_load"] = line.expert_load;
  j["memory"] = {{"tensor_bytes", line.memory.tensor_bytes},
                 {"cached_bytes", line.memory.cached_bytes},
                 {"optimizer_state_bytes", line.memory.optimizer_state_bytes},
                 {"peak_rss_bytes", line.memory.peak_rss_bytes}};
  if (line.sample) j["sample"] = sample_json(*line.sample);
  j["time"] = line.time;
  return j;
}

namespace {

template <typename T>
T field(const json& j, const char* key) {
  CM_CHECK(j.contains(key), "write metrics.jsonl with coremesh train (or add the key)",
           "a metrics line lacks \"{}\"", key);
  // JSON has no NaN or infinity: the writer gives null, read back as NaN
  if constexpr (std::is_floating_point_v<T>)
    if (j.at(key).is_null()) return std::numeric_limits<T>::quiet_NaN();
  try {
    return j.at(key).get<T>();
  } catch (const json::exception& e) {
    CM_THROW(InvalidArgument, "write metrics.jsonl with coremesh train", "metrics key \"{}\" has the wrong type: {}",
             key, e.what());
  }
}

// The complete lines of a file (a last line without '\n' is left out).
std::vector<std::string> complete_lines(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t nl; (nl = text.find('\n', start)) != std::string::npos; start = nl + 1)
    if (nl > start) lines.push_back(text.substr(start, nl - start));
  return lines;
}

}  // namespace

MetricsLine metrics_line_from_json(const json& j) {
  CM_CHECK(j.is_object(), "each line of metrics.jsonl is one JSON object", "a metrics line is not an object");
  MetricsLine m;
  StepRecord& r = m.record;
  r.step = field<int64_t>(j, "step") - 1;
  r.loss = field<double>(j, "loss");
  r.aux_loss = field<double>(j, "aux_loss");
  if (j.contains("val_loss")) m.val_loss = field<double>(j, "val_loss");
  if (j.contains("val_bits_per_byte")) m.val_bits_per_byte = field<double>(j, "val_bits_per_byte");
  r.lr = field<double>(j, "lr");
  r.grad_norm = field<double>(j, "grad_norm");
  m.tokens = field<int64_t>(j, "tokens");
  r.tokens_per_s = field<double>(j, "tokens_per_s");
  r.seconds = field<double>(j, "step_seconds");
  r.mfu = field<double>(j, "mfu");
  m.expert_load = field<std::vector<std::vector<double>>>(j, "expert_load");
  for (const auto& shares : m.expert_load) r.expert_balance = std::max(r.expert_balance, expert_balance(shares));
  const json memory = field<json>(j, "memory");
  m.memory = {field<int64_t>(memory, "tensor_bytes"), field<int64_t>(memory, "cached_bytes"),
              field<int64_t>(memory, "optimizer_state_bytes"), field<int64_t>(memory, "peak_rss_bytes")};
  if (j.contains("sample")) {
    const json s = field<json>(j, "sample");
    m.sample = SampleRecord{r.step, field<std::string>(s, "prompt"), field<std::string>(s, "text")};
  }
  m.time = field<double>(j, "time");
  return m;
}

std::vector<MetricsLine> read_metrics(const std::string& path) {
  CM_CHECK(fs::exists(path), "train first (the leader writes <out_dir>/metrics.jsonl)", "no metrics file '{}'",
           path);
  std::vector<MetricsLine> out;
  int number = 0;
  for (const std::string& text : complete_lines(path)) {
    ++number;
    try {
      out.push_back(metrics_line_from_json(json::parse(text)));
    } catch (const std::exception& e) {
      CM_THROW(InvalidArgument, "restore the file or delete the line (one JSON object per line)",
               "'{}' line {} is not a metrics line: {}", path, number, e.what());
    }
  }
  return out;
}

std::string metrics_path_of_checkpoint(const std::string& checkpoint) {
  fs::path dir = fs::path(checkpoint).parent_path();
  if (dir.filename() == "checkpoints") dir = dir.parent_path();
  return (dir / "metrics.jsonl").string();
}

void fill_report(ReportData& d, const std::vector<MetricsLine>& lines, int64_t heat_every) {
  heat_every = std::max<int64_t>(1, heat_every);
  for (const MetricsLine& m : lines) {
    d.steps.push_back(m.record);
    if (m.val_loss >= 0) d.validation.push_back({m.record.step, m.val_loss, m.val_bits_per_byte});
    if (!m.expert_load.empty() && m.record.step % heat_every == 0)
      d.expert_load.push_back({m.record.step, m.expert_load});
    if (m.sample) d.samples.push_back(*m.sample);
  }
}

MetricsLog::MetricsLog(std::string path, int64_t steps_done, const std::string& history) : path_(std::move(path)) {
  // The kept lines, exactly as they were written.
  std::string kept;
  if (steps_done > 0 && !history.empty() && fs::exists(history))
    for (const std::string& text : complete_lines(history)) {
      const json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
      if (j.is_object() && j.contains("step") && j["step"].is_number_integer() && j["step"].get<int64_t>() <= steps_done) {
        kept += text + "\n";
        if (j["step"].get<int64_t>() == steps_done) kept_last_ = text, last_validated_ = j.contains("val_loss");
      }
    }
  write_file_atomic(path_, kept);  // creates the directory
  fd_ = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  CM_CHECK(fd_ >= 0, "check that the run directory is writable", "cannot open '{}': {}", path_,
           std::strerror(errno));
}

MetricsLog::~MetricsLog() {
  if (fd_ >= 0) ::close(fd_);
}

void MetricsLog::add_validation(double val_loss, double val_bits_per_byte, const std::optional<SampleRecord>& sample) {
  if (kept_last_.empty() || last_validated_) return;
  const ordered_json old = ordered_json::parse(kept_last_);
  ordered_json j;  // the documented key order: the validation after aux_loss, the sample before the time
  for (const auto& [key, value] : old.items()) {
    if (key == "time" && sample) j["sample"] = sample_json(*sample);
    j[key] = value;
    if (key == "aux_loss") j["val_loss"] = val_loss, j["val_bits_per_byte"] = val_bits_per_byte;
  }
  const std::string line = j.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
  std::string all;
  for (const std::string& text : complete_lines(path_)) all += (text == kept_last_ ? line : text) + "\n";
  write_file_atomic(path_, all);
  ::close(fd_);
  fd_ = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  CM_CHECK(fd_ >= 0, "check that the run directory is writable", "cannot open '{}': {}", path_, std::strerror(errno));
  kept_last_ = line, last_validated_ = true;
}

void MetricsLog::append(const MetricsLine& line) {
  ordered_json j = to_json(line);
  j["time"] = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const std::string text = j.dump(-1, ' ', false, ordered_json::error_handler_t::replace) + "\n";
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t w = ::write(fd_, text.data() + done, text.size() - done);
    if (w < 0 && errno == EINTR) continue;
    CM_CHECK(w > 0, "free disk space in the run directory", "writing '{}' failed: {}", path_,
             std::strerror(errno));
    done += size_t(w);
  }
}

}  // namespace coremesh::train
