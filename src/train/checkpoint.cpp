#include "coremesh/train/checkpoint.hpp"

#include <signal.h>

#include <algorithm>
#include <charconv>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "coremesh/core/error.hpp"
#include "coremesh/train/safetensors.hpp"
#include "coremesh/train/tokenizer.hpp"

namespace coremesh::train {
namespace fs = std::filesystem;

uint64_t hash_bytes(const void* data, size_t size, uint64_t seed) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint64_t lane[4] = {seed ^ 0x243f6a8885a308d3ULL, seed ^ 0x13198a2e03707344ULL,
                      seed ^ 0xa4093822299f31d0ULL, seed ^ 0x082efa98ec4e6c89ULL};
  const uint64_t k = 0x9fb21c651e98df25ULL;
  size_t i = 0;
  for (; i + 32 <= size; i += 32)
    for (int j = 0; j < 4; ++j) {
      uint64_t w;
      std::memcpy(&w, p + i + 8 * j, 8);
      lane[j] = (lane[j] ^ w) * k;
      lane[j] ^= lane[j] >> 29;
    }
  uint64_t h = size * k;
  for (int j = 0; j < 4; ++j) h = (h ^ lane[j]) * k, h ^= h >> 32;
  for (; i < size; ++i) h = (h ^ p[i]) * 0x100000001b3ULL;
  h ^= h >> 33;
  return h * 0xff51afd7ed558ccdULL ^ (h >> 29);
}

namespace {

uint64_t hash_tensors(const NamedTensors& all) {
  uint64_t h = 0;
  for (const auto& [name, t] : all) {
    Tensor c = t.is_contiguous() ? t : t.contiguous();
    h = hash_bytes(c.raw_data(), c.nbytes(), h);
  }
  return h;
}

// The metadata (but this field) and each tensor's name, dtype and shape in the
// order the data checksum takes them: a flipped step, config or offset shows.
std::string header_checksum(const std::map<std::string, std::string>& meta, const NamedTensors& all) {
  std::string text;
  for (const auto& [key, value] : meta)
    if (key != "header_checksum") text += key + '\0' + value + '\0';
  for (const auto& [name, t] : all) text += fmt::format("{}\n{}{}\n", name, dtype_name(t.dtype()), shape_str(t.shape()));
  return fmt::format("{:016x}", hash_bytes(text.data(), text.size()));
}

const char* kHint = "the checkpoint is damaged or incomplete; resume from an earlier checkpoint";

// Base64 (RFC 4648) keeps the binary tokenizer proto in the JSON metadata.
const char kB64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

std::string to_base64(const std::string& in) {
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  for (unsigned char c : in) {
    acc = (acc << 8) | c, bits += 8;
    while (bits >= 6) out += kB64[(acc >> (bits -= 6)) & 63];
  }
  if (bits > 0) out += kB64[(acc << (6 - bits)) & 63];
  while (out.size() % 4) out += '=';
  return out;
}

// false on a character outside the alphabet
bool from_base64(const std::string& in, std::string& out) {
  out.clear();
  uint32_t acc = 0;
  int bits = 0;
  for (char c : in) {
    if (c == '=') break;
    const char* at = std::strchr(kB64, c);
    if (c == 0 || at == nullptr) return false;
    acc = (acc << 6) | uint32_t(at - kB64), bits += 6;
    if (bits >= 8) out += char((acc >> (bits -= 8)) & 255);
  }
  return true;
}

}  // namespace

void save_checkpoint(const std::string& path, const CheckpointState& s) {
  NamedTensors all;
  for (const auto& [n, t] : s.params) all.emplace_back("param/" + n, t);
  for (const auto& [n, t] : s.adam_m) all.emplace_back("adam_m/" + n, t);
  for (const auto& [n, t] : s.adam_v) all.emplace_back("adam_v/" + n, t);
  for (const auto& [n, t] : s.buffers) all.emplace_back("buffer/" + n, t);
  std::map<std::string, std::string> meta{
      {"format", kCheckpointFormat},
      {"version", std::to_string(kCheckpointVersion)},
      {"step", std::to_string(s.step)},
      {"model_config", model::to_json(s.config).dump()},
      {"train_config", s.train_config.dump()},
      {"rng_state", std::to_string(s.rng_state)},
      {"data_epoch", std::to_string(s.data_position.epoch)},
      {"data_cursor", std::to_string(s.data_position.cursor)},
      {"data_fingerprint", s.data_fingerprint},
      {"checksum", fmt::format("{:016x}", hash_tensors(all))},
      {"tokenizer", to_base64(s.tokenizer)},
      {"tokenizer_checksum", fmt::format("{:016x}", hash_bytes(s.tokenizer.data(), s.tokenizer.size()))}};
  meta["header_checksum"] = header_checksum(meta, all);
  write_safetensors(path, all, meta);
}

CheckpointState load_checkpoint(const std::string& path) {
  SafetensorsFile f = read_safetensors(path);
  auto meta = [&](const char* key) -> const std::string& {
    auto it = f.metadata.find(key);
    CM_CHECK(it != f.metadata.end(), kHint, "checkpoint '{}' lacks metadata field '{}'", path, key);
    return it->second;
  };
  CM_CHECK(meta("format") == kCheckpointFormat,
           "pass a checkpoint written by `coremesh train`",
           "'{}' is a safetensors file but not a coremesh checkpoint (format '{}')", path,
           meta("format"));
  CM_CHECK(meta("version") == std::to_string(kCheckpointVersion),
           "use the coremesh version that wrote it",
           "checkpoint '{}' has version {} but this build reads version {}", path, meta("version"),
           kCheckpointVersion);
  NamedTensors all;
  for (const auto& name : f.names) all.emplace_back(name, f.tensors.at(name));
  const std::string actual = fmt::format("{:016x}", hash_tensors(all));
  CM_CHECK(actual == meta("checksum"), kHint,
           "checkpoint '{}' is corrupt: data checksum {} does not match the recorded {}", path,
           actual, meta("checksum"));
  CheckpointState s;
  if (f.metadata.count("tokenizer")) {  // checkpoints before tokenizers: bytes
    CM_CHECK(from_base64(meta("tokenizer"), s.tokenizer) &&
                 meta("tokenizer_checksum") == fmt::format("{:016x}", hash_bytes(s.tokenizer.data(), s.tokenizer.size())),
             kHint, "checkpoint '{}' is corrupt: its tokenizer does not match its recorded checksum", path);
  }
  if (f.metadata.count("header_checksum"))  // checkpoints before it: the data checksum only
    CM_CHECK(header_checksum(f.metadata, all) == meta("header_checksum"), kHint,
             "checkpoint '{}' is corrupt: its header (step, configs, data position, tensor names, dtypes, shapes) "
             "does not match its recorded checksum", path);
  auto count = [&](const char* key) {  // a whole non-negative decimal number
    const std::string& text = meta(key);
    uint64_t v = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    CM_CHECK(ec == std::errc() && end == text.data() + text.size() && !text.empty(), kHint,
             "checkpoint '{}' has malformed metadata: {} is '{}', not a non-negative integer", path, key, text);
    return v;
  };
  s.step = int64_t(count("step"));
  CM_CHECK(s.step >= 0, kHint, "checkpoint '{}' has malformed metadata: step {}", path, meta("step"));
  s.rng_state = count("rng_state");
  s.data_position.epoch = count("data_epoch");
  s.data_position.cursor = count("data_cursor");
  for (const char* key : {"model_config", "train_config"}) {
    try {
      const nlohmann::json j = nlohmann::json::parse(meta(key));
      if (std::string(key) == "model_config") s.config = model::model_config_from_json(j);
      else s.train_config = j;
    } catch (const std::exception& e) {
      CM_THROW(InvalidArgument, kHint, "checkpoint '{}' has malformed metadata: {}: {}", path, key, e.what());
    }
  }
  s.data_fingerprint = meta("data_fingerprint");
  if (!s.tokenizer.empty()) {
    const int pieces = Tokenizer::from_serialized(s.tokenizer, "the tokenizer of checkpoint '" + path + "'").vocab_size();
    CM_CHECK(s.config.vocab_size == pieces, kHint,
             "checkpoint '{}' has a model of vocab_size {} but its tokenizer has {} pieces", path,
             s.config.vocab_size, pieces);
  }
  for (const auto& [name, t] : all) {
    auto slash = name.find('/');
    std::string kind = name.substr(0, slash), rest = slash == std::string::npos ? "" : name.substr(slash + 1);
    if (kind == "param") s.params.emplace_back(rest, t);
    else if (kind == "adam_m") s.adam_m.emplace_back(rest, t);
    else if (kind == "adam_v") s.adam_v.emplace_back(rest, t);
    else if (kind == "buffer") s.buffers.emplace_back(rest, t);
    else CM_THROW(InvalidArgument, kHint, "checkpoint '{}' holds unexpected tensor '{}'", path, name);
  }
  CM_CHECK(s.adam_m.size() == s.params.size() && s.adam_v.size() == s.params.size(), kHint,
           "checkpoint '{}' has {} parameters but {} / {} optimizer moments", path, s.params.size(),
           s.adam_m.size(), s.adam_v.size());
  return s;
}

void check_compatible(const CheckpointState& ckpt, const model::ModelConfig& config,
                      const NamedTensors& params, const std::string& path, const std::string& hint) {
  std::vector<std::pair<std::string, Shape>> shapes;
  for (const auto& [n, t] : params) shapes.emplace_back(n, t.shape());
  check_compatible(ckpt, config, shapes, path, hint);
}

void check_compatible(const CheckpointState& ckpt, const model::ModelConfig& config,
                      const std::vector<std::pair<std::string, Shape>>& params, const std::string& path,
                      const std::string& hint) {
  std::vector<std::string> diffs;
  for (const auto& d : model::config_differences(ckpt.config, config))
    diffs.push_back("model config " + d + " (checkpoint vs now)");
  std::map<std::string, Shape> have;
  for (const auto& [n, t] : ckpt.params) have[n] = t.shape();
  for (const auto& [n, shape] : params) {
    auto it = have.find(n);
    if (it == have.end()) diffs.push_back(fmt::format("parameter '{}' is missing", n));
    else if (it->second != shape)
      diffs.push_back(fmt::format("parameter '{}' has shape {} but the model needs {}", n,
                                  shape_str(it->second), shape_str(shape)));
    if (it != have.end()) have.erase(it);
  }
  for (const auto& [n, s] : have) diffs.push_back(fmt::format("unexpected parameter '{}'", n));
  if (diffs.empty()) return;
  std::string text = fmt::format("checkpoint '{}' does not match the model being trained:", path);
  for (const auto& d : diffs) text += "\n  - " + d;
  std::error_code ec;
  const fs::path run_config = fs::path(path).parent_path().parent_path() / "config.json";
  const std::string train_hint =
      fs::is_regular_file(run_config, ec)
          ? fmt::format("train with the checkpoint's config: --config {} (its run's; drop the overriding model "
                        "flags), or start without --resume", run_config.string())
          : "train with the checkpoint's config (drop the overriding flags) or start without --resume";
  CM_THROW(InvalidArgument, hint.empty() ? train_hint : hint, "{}", text);
}

std::string checkpoint_path(const std::string& dir, int64_t step) {
  return (fs::path(dir) / fmt::format("step_{:08d}.safetensors", step)).string();
}

namespace {
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::string name = e.path().filename().string();
    if (e.is_regular_file(ec) && name.size() == 5 + 8 + 12 && name.rfind("step_", 0) == 0 &&
        name.substr(13) == ".safetensors" &&
        std::all_of(name.begin() + 5, name.begin() + 13, ::isdigit))
      out.emplace_back(std::stoll(name.substr(5, 8)), e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}
}  // namespace

std::string latest_checkpoint(const std::string& dir) {
  auto all = list_checkpoints(dir);
  return all.empty() ? "" : all.back().second;
}

std::string previous_checkpoint(const std::string& dir) {
  auto all = list_checkpoints(dir);
  return all.size() < 2 ? "" : all[all.size() - 2].second;
}

void refuse_other_run(const std::string& out_dir, const std::string& ways_out) {
  const std::string latest = latest_checkpoint((fs::path(out_dir) / "checkpoints").string());
  CM_CHECK(latest.empty(), ways_out, "'{}' holds another run's checkpoints (the latest: {})", out_dir,
           fs::path(latest).filename().string());
}

void start_over(const std::string& out_dir) {
  std::error_code ec;
  for (const auto& [step, path] : list_checkpoints((fs::path(out_dir) / "checkpoints").string())) fs::remove(path, ec);
  fs::remove(fs::path(out_dir) / "metrics.jsonl", ec);
}

std::string set_aside_after(const std::string& out_dir, int64_t step) {
  const fs::path dir = fs::path(out_dir) / "checkpoints";
  std::vector<std::string> later;
  for (const auto& [s, path] : list_checkpoints(dir.string()))
    if (s > step) later.push_back(path);
  if (later.empty()) return "";
  fs::path aside = dir / fmt::format("superseded_after_step_{}", step);
  for (int n = 2; fs::exists(aside); ++n) aside = dir / fmt::format("superseded_after_step_{}_{}", step, n);
  try {
    fs::create_directory(aside);
    for (const auto& path : later) fs::rename(path, aside / fs::path(path).filename());
    const fs::path metrics = fs::path(out_dir) / "metrics.jsonl";
    if (fs::exists(metrics)) fs::copy_file(metrics, aside / "metrics.jsonl");
  } catch (const fs::filesystem_error& e) {
    CM_THROW(InvalidArgument, "make the run directory writable, or resume into another --out / out_dir",
             "cannot set the checkpoints past step {} aside into '{}': {}", step, aside.string(), e.what());
  }
  return aside.string();
}

void prune_checkpoints(const std::string& dir, int keep) {
  // a write cut short by a kill leaves ".step_<n>.safetensors.tmp.<pid>" of a dead process
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const size_t at = name.rfind(".tmp.");
    if (name.rfind(".step_", 0) != 0 || at == std::string::npos) continue;
    const pid_t pid = pid_t(std::atoll(name.c_str() + at + 5));
    if (pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH) fs::remove(e.path(), ec);
  }
  if (keep <= 0) return;
  auto all = list_checkpoints(dir);
  for (size_t i = 0; i + size_t(keep) < all.size(); ++i) {
    std::error_code ec;
    fs::remove(all[i].second, ec);
  }
}

}  // namespace coremesh::train
