// Checkpoints: one safetensors file per save holding everything needed to
// continue bit-exactly:
//   tensors   "param/<name>"   fp32 master weights
//             "adam_m/<name>"  "adam_v/<name>"  AdamW moments
//             "buffer/<name>"  non-trained state (router biases)
//   metadata  format, version, step, model_config (JSON), train_config (JSON),
//             rng_state, data_epoch, data_cursor, data_fingerprint,
//             checksum (64-bit hash of the data section, hex),
//             header_checksum (of the other metadata and each tensor's
//             name, dtype and shape; absent in older checkpoints),
//             tokenizer (the run's SentencePiece model proto, base64; "" or
//             absent: bytes) and tokenizer_checksum (its hash, hex)
// Writes are atomic (write_file_atomic). Loading checks the format, version,
// checksum and that every field is present, and that the tokenizer is
// intact and has the model's vocab_size; compatibility with the model
// being trained is checked separately so the message can list differences.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "coremesh/core/tensor.hpp"
#include "coremesh/model/config.hpp"
#include "coremesh/train/data.hpp"

namespace coremesh::train {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

struct CheckpointState {
  model::ModelConfig config;
  nlohmann::json train_config = nlohmann::json::object();
  int64_t step = 0;  // steps completed
  uint64_t rng_state = 0;
  DataPosition data_position;
  std::string data_fingerprint;
  std::string tokenizer;  // serialized SentencePiece model; "" for bytes
  NamedTensors params, adam_m, adam_v, buffers;
};

inline constexpr const char* kCheckpointFormat = "coremesh-checkpoint";
inline constexpr int kCheckpointVersion = 1;

// 64-bit hash of bytes (4 lanes of multiply-xorshift over 8-byte words).
uint64_t hash_bytes(const void* data, size_t size, uint64_t seed = 0);

void save_checkpoint(const std::string& path, const CheckpointState& state);
CheckpointState load_checkpoint(const std::string& path);

// Throws InvalidArgument listing every difference between the checkpoint and
// what is being trained (model config fields, parameter names and shapes).
// `hint`: what to do ("": train with the checkpoint's config, naming its
// run's config.json when the checkpoint sits in a run directory).
void check_compatible(const CheckpointState& ckpt, const model::ModelConfig& config,
                      const std::vector<std::pair<std::string, Shape>>& params, const std::string& path,
                      const std::string& hint = "");
void check_compatible(const CheckpointState& ckpt, const model::ModelConfig& config,
                      const NamedTensors& params, const std::string& path, const std::string& hint = "");

// <dir>/step_<step, 8 digits>.safetensors
std::string checkpoint_path(const std::string& dir, int64_t step);
// The checkpoint with the highest step in `dir`, "" if none.
std::string latest_checkpoint(const std::string& dir);
// The one before it, "" if none.
std::string previous_checkpoint(const std::string& dir);
// A new run may not write into a run directory that holds another run's
// checkpoints: its metrics and checkpoints would mix with that run's, and a
// later resume would take whichever step is highest. Throws InvalidArgument
// naming the latest one, with `ways_out` (the caller's options) as the hint.
void refuse_other_run(const std::string& out_dir, const std::string& ways_out);
// Deletes a run directory's checkpoints and metrics.jsonl (a run started over).
void start_over(const std::string& out_dir);
// A run resumed from an earlier checkpoint of its own directory: the
// checkpoints past `step` (the abandoned branch) would outrank the new ones
// (pruning and --resume take the highest step), so they move, with a copy of
// metrics.jsonl, into <out_dir>/checkpoints/superseded_after_step_<step>[_<n>].
// Returns that directory, or "" when no checkpoint is past `step`.
std::string set_aside_after(const std::string& out_dir, int64_t step);
// Deletes all but the newest `keep` checkpoints of `dir` (keep <= 0: none
// deleted) and the temporaries of writes whose process died (kill -9).
void prune_checkpoints(const std::string& dir, int keep);

}  // namespace coremesh::train
