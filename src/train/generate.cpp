#include "coremesh/train/generate.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <vector>

#include "coremesh/core/error.hpp"
#include "coremesh/model/rng.hpp"
#include "coremesh/runtime/stream.hpp"

namespace coremesh::train {
namespace {

// A checkpoint whose tensors do not fit its own recorded model.
constexpr const char* kDamagedHint =
    "the checkpoint's tensors do not fit its own model config: it is damaged or from another coremesh version; "
    "use another checkpoint of the run";

constexpr int kSlot = -1;  // apart from the micro-batch slots a trainer uses

// The next token from one row of logits (V).
int pick(const float* logits, int64_t V, const SampleOptions& o, model::Rng& rng) {
  std::vector<int> ids(static_cast<size_t>(V));
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  if (o.temperature <= 0) return ids[0];
  const size_t k = o.top_k > 0 ? std::min<size_t>(size_t(o.top_k), ids.size()) : ids.size();
  std::vector<double> p(k);
  double sum = 0;
  for (size_t i = 0; i < k; ++i) sum += p[i] = std::exp((double(logits[ids[i]]) - logits[ids[0]]) / o.temperature);
  double u = double(rng.next_u64() >> 11) * (1.0 / 9007199254740992.0) * sum;
  for (size_t i = 0; i < k; ++i)
    if ((u -= p[i]) < 0) return ids[i];
  return ids[k - 1];
}

// `n` of `all`, spread evenly (all of them when n is 0 or not less).
std::vector<TextDataset::Window> spread(std::vector<TextDataset::Window> all, size_t n) {
  if (n == 0 || n >= all.size()) return all;
  std::vector<TextDataset::Window> some;
  for (size_t i = 0; i < n; ++i) some.push_back(all[i * all.size() / n]);
  return some;
}

}  // namespace

double EvalResult::bits_per_byte() const {
  return bytes > 0 ? loss * double(tokens) / double(bytes) / std::log(2.0) : 0.0;
}

double mean_of(const Tensor& t) {
  double sum = 0;
  const float* v = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) sum += v[i];
  return t.numel() ? sum / double(t.numel()) : 0.0;
}

std::string printable(const std::string& text) {
  std::string out;
  for (unsigned char ch : text) {
    if (ch == '\n') out += "\\n";
    else out += (ch < 32 || ch == 127) ? '?' : char(ch);
  }
  return out;
}

std::string generate(model::Model& model, const std::string& prompt, const SampleOptions& o,
                     const OnProgress& on_progress) {
  return generate(model, Tokenizer::bytes(), prompt, o, on_progress);
}

std::string generate(model::Model& model, const Tokenizer& tokenizer, const std::string& prompt,
                     const SampleOptions& o, const OnProgress& on_progress) {
  const model::ModelConfig& c = model.config();
  CM_CHECK(!prompt.empty(), "give a prompt of at least one byte", "empty prompt");
  CM_CHECK(o.tokens >= 0 && o.top_k >= 0 && o.temperature >= 0 && std::isfinite(o.temperature),
           "use tokens >= 0, top_k >= 0 and a finite temperature >= 0 (0: greedy)",
           "bad sampling options: tokens {}, top_k {}, temperature {}", o.tokens, o.top_k, o.temperature);
  CM_CHECK(tokenizer.byte_level() ? c.vocab_size >= 256 : c.vocab_size == tokenizer.vocab_size(),
           "generate with the tokenizer the model was trained with",
           "the model's vocab_size {} does not fit the tokenizer ({})", c.vocab_size, tokenizer.describe());
  std::vector<int32_t> tokens = tokenizer.encode(prompt);
  const size_t prompt_tokens = tokens.size();
  model::Rng rng(o.seed);
  runtime::Stream stream = runtime::current_stream();
  if (on_progress) on_progress(0, o.tokens);
  for (int i = 0; i < o.tokens; ++i) {
    const int T = int(std::min<size_t>(tokens.size(), size_t(c.max_seq_len)));
    const int32_t* window = tokens.data() + tokens.size() - size_t(T);
    model.forward(kSlot, {window, window, 1, T});  // the targets are not used
    const Tensor logits = model.logits(kSlot);
    model.close_slot(kSlot);
    stream.synchronize();
    // among the tokenizer's pieces: a byte-level model's vocabulary may be
    // wider (padded), and no text maps to the ids past the 256 bytes
    const int64_t pieces = std::min<int64_t>(c.vocab_size, tokenizer.vocab_size());
    tokens.push_back(pick(logits.data<float>() + int64_t(T - 1) * c.vocab_size, pieces, o, rng));
    if (on_progress) on_progress(i + 1, o.tokens);
  }
  return tokenizer.decode({tokens.begin() + std::ptrdiff_t(prompt_tokens), tokens.end()});
}

EvalResult evaluate(model::Model& model, const TextDataset& data, Split split, int batch_size, int seq_len,
                    int64_t max_bytes, const OnProgress& on_progress) {
  CM_CHECK(batch_size > 0 && seq_len > 0 && seq_len <= model.config().max_seq_len,
           "use batch_size >= 1 and 1 <= seq_len <= max_seq_len", "batch {} x {} (max_seq_len {})", batch_size,
           seq_len, model.config().max_seq_len);
  CM_CHECK(max_bytes == 0 || max_bytes >= seq_len, "use max_bytes >= seq_len (or 0: all)",
           "max_bytes {} is less than one window of {} tokens", max_bytes, seq_len);
  std::vector<TextDataset::Window> windows = data.windows(split, seq_len);
  CM_CHECK(!windows.empty(), "evaluate on a text longer than seq_len tokens",
           "no window of {} + 1 tokens in the data", seq_len);
  if (max_bytes > 0) {  // bytes of text, not tokens (a subword token stands for several)
    int64_t bytes = 0;
    for (const auto& w : windows) bytes += data.window_bytes(w, seq_len);
    const double per_window = double(bytes) / double(windows.size());
    windows = spread(std::move(windows), std::max<size_t>(1, size_t(double(max_bytes) / per_window)));
    int64_t kept = 0;
    size_t n = 0;
    while (n < windows.size() && (n == 0 || kept + data.window_bytes(windows[n], seq_len) <= max_bytes))
      kept += data.window_bytes(windows[n++], seq_len);
    windows.resize(n);
  }
  const int64_t total = int64_t(windows.size()) * seq_len;
  if (on_progress) on_progress(0, total);
  runtime::Stream stream = runtime::current_stream();
  std::vector<int32_t> buf(size_t(seq_len) + 1), x, y;
  EvalResult r;
  double sum = 0;
  for (size_t w = 0; w < windows.size(); w += size_t(batch_size)) {
    const int B = int(std::min(windows.size() - w, size_t(batch_size)));
    x.clear(), y.clear();
    for (int b = 0; b < B; ++b) {
      data.read_window(windows[w + size_t(b)], seq_len, buf.data());
      r.bytes += data.window_bytes(windows[w + size_t(b)], seq_len);
      x.insert(x.end(), buf.begin(), buf.end() - 1);
      y.insert(y.end(), buf.begin() + 1, buf.end());
    }
    model.forward(kSlot, {x.data(), y.data(), B, seq_len});
    const Tensor losses = model.token_losses(kSlot);
    model.close_slot(kSlot);
    stream.synchronize();
    sum += mean_of(losses) * double(losses.numel());
    r.tokens += losses.numel();
    if (on_progress) on_progress(r.tokens, total);
  }
  r.loss = sum / double(r.tokens);
  return r;
}

std::unique_ptr<model::Model> load_model(const std::string& path, CheckpointState* state_out) {
  CheckpointState s = load_checkpoint(path);
  auto model = std::make_unique<model::Model>(s.config);
  check_compatible(s, s.config, model->named_params(), path, kDamagedHint);
  std::map<std::string, Tensor> params(s.params.begin(), s.params.end()), bufs(s.buffers.begin(), s.buffers.end());
  for (auto& [name, t] : model->named_params()) t.copy_from(params.at(name));
  for (auto& [name, b] : model->named_buffers()) {
    auto it = bufs.find(name);
    CM_CHECK(it != bufs.end() && it->second.shape() == b.shape(), "use a complete checkpoint",
             "checkpoint '{}' lacks buffer '{}'", path, name);
    b.copy_from(it->second);
  }
  if (state_out) *state_out = std::move(s);
  return model;
}

}  // namespace coremesh::train
