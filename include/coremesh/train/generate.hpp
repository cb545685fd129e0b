// Using a trained model: greedy or sampled continuation of a prompt, and the
// loss over a whole text. Both run a whole-model stage on the current stream
// and synchronize it (they read logits and losses on the host).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "coremesh/core/tensor.hpp"
#include "coremesh/model/model.hpp"
#include "coremesh/train/checkpoint.hpp"
#include "coremesh/train/data.hpp"
#include "coremesh/train/tokenizer.hpp"

namespace coremesh::train {

struct SampleOptions {
  int tokens = 64;           // tokens to generate
  double temperature = 0.8;  // 0: greedy (argmax; the lowest id wins a tie)
  int top_k = 40;            // sample among the k most likely tokens (0: all)
  uint64_t seed = 1;
};
// Told the units done of the total: once with 0 before the work, then after
// each piece (a progress bar's feed).
using OnProgress = std::function<void(int64_t done, int64_t total)>;

// The continuation of `prompt` (without the prompt), decoded. The prompt is
// encoded with `tokenizer` (the model's: vocab sizes must agree); each new
// token reads the logits of the last position of the window of the last
// max_seq_len tokens. Without a tokenizer: bytes. on_progress counts tokens
// generated.
std::string generate(model::Model& model, const Tokenizer& tokenizer, const std::string& prompt,
                     const SampleOptions& options, const OnProgress& on_progress = {});
std::string generate(model::Model& model, const std::string& prompt, const SampleOptions& options,
                     const OnProgress& on_progress = {});

struct EvalResult {
  double loss = 0;      // mean cross entropy, nats per token
  int64_t tokens = 0;   // tokens scored
  int64_t bytes = 0;    // UTF-8 bytes of the text those tokens stand for
  double bits_per_byte() const;  // loss x tokens / bytes / ln 2
};
// Mean loss over every window of `split` (stride seq_len), batch_size
// sequences at a time (the last batch may hold fewer), with the dataset's
// tokenizer. max_bytes > 0 scores max_bytes / seq_len windows spread evenly
// over the split instead (all when there are not more). on_progress counts
// tokens scored.
EvalResult evaluate(model::Model& model, const TextDataset& data, Split split, int batch_size, int seq_len,
                    int64_t max_bytes = 0, const OnProgress& on_progress = {});

// A whole model with a checkpoint's weights and router biases; `state` gets
// the rest of the checkpoint (config, step, tokenizer, ...).
std::unique_ptr<model::Model> load_model(const std::string& checkpoint, CheckpointState* state = nullptr);

// Mean of an f32 tensor's elements (host; the stream must have reached it).
double mean_of(const Tensor& t);
// Text with control bytes (other than newline) shown as '?' and newlines as
// the two characters "\n": safe for a one-line log.
std::string printable(const std::string& text);

}  // namespace coremesh::train
