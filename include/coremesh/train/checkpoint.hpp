// Checkpoints: one safetensors file per save holding everything needed to
// continue bit-exactly:
//   tensors   "param/<name>"   fp32 master weights
//             "adam_m/<name>"  "adam_v/<name>"  AdamW moments
//             "buffer/<name>"  non-trained state (router biases)
//   metadata  format, version, step, model_config (JSON), train_config (JSON),
//             rng_state, data_epoch, data_cursor, data_fingerprint,
//             checksum (64-bit hash of the data section, hex),
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
void check_compatible(const CheckpointState& ckpt, const model::ModelConfig& config,
                      const std::vector<std::pair<std::string, Shape>>& params, const std::string& path);
void check_compatible(const CheckpointState& ckpt, const model::ModelConfig& config,
                      const NamedTensors& params, const std::string& path);

// <dir>/step_<step, 8 digits>.safetensors
std::string checkpoint_path(const std::string& dir, int64_t step);
// The checkpoint with the highest step in `dir`, "" if none.
std::string latest_checkpoint(const std::string& dir);
// Deletes every checkpoint of `dir` (a run started over in its directory).
void remove_checkpoints(const std::string& dir);
// Deletes all but the newest `keep` checkpoints of `dir` (keep <= 0: none
// deleted) and the temporaries of writes whose process died (kill -9).
void prune_checkpoints(const std::string& dir, int keep);

}  // namespace coremesh::train
