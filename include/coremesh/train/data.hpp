// Training data from text files, as tokens of a Tokenizer (default: bytes).
//
// Every file is memory-mapped. Each file is split the same way: its first
// (1 - val_fraction) bytes are training data, the rest validation data, so
// both splits see every source. Byte tokens are read from the mapping; a
// subword tokenizer encodes each split of each file once, at construction.
// A split is cut into windows of T+1 tokens (stride T: input = tokens
// [s, s+T), target = tokens [s+1, s+T+1)). The training loader visits the
// windows in a permutation drawn from (seed, epoch); validation visits them
// in file order. The position (epoch, cursor) is all a checkpoint needs to
// continue the exact same sequence of batches.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "coremesh/train/tokenizer.hpp"

namespace coremesh::train {

enum class Split { train, validation };

class TextDataset {
 public:
  // `tokenizer` (nullptr: bytes) must outlive the dataset.
  TextDataset(const std::vector<std::string>& paths, double val_fraction, const Tokenizer* tokenizer = nullptr);
  ~TextDataset();
  TextDataset(const TextDataset&) = delete;
  TextDataset& operator=(const TextDataset&) = delete;

  int64_t total_bytes() const;
  int64_t split_bytes(Split split) const;
  int64_t split_tokens(Split split) const;
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  // Window starts (file index, token offset) of a split for sequence length T.
  struct Window {
    int32_t file;
    int64_t offset;
  };
  std::vector<Window> windows(Split split, int seq_len) const;
  // Copies a window's T+1 tokens.
  void read_window(const Window& w, int seq_len, int32_t* dst) const;
  // UTF-8 bytes of the text of a window's T targets (T for bytes).
  int64_t window_bytes(const Window& w, int seq_len) const;
  // A digest of sizes and names, saved in checkpoints to notice a changed corpus.
  std::string fingerprint() const;

 private:
  struct File {
    std::string path;
    const uint8_t* data = nullptr;
    int64_t size = 0;
    int64_t train_end = 0;  // bytes [0, train_end) train, [train_end, size) validation
    std::vector<int32_t> tokens;  // a subword tokenizer's; empty for bytes (read from `data`)
    int64_t train_tokens = 0;     // tokens [0, train_tokens) train, the rest validation
    int64_t num_tokens() const { return tokens.empty() ? size : int64_t(tokens.size()); }
  };
  const Tokenizer* tokenizer_;
  std::vector<File> files_;
};

struct DataPosition {
  uint64_t epoch = 0;
  uint64_t cursor = 0;  // next window index within the epoch's order
  bool operator==(const DataPosition&) const = default;
};

// Batches of B windows: inputs and targets are (B, T) int32, row-major.
class DataLoader {
 public:
  DataLoader(const TextDataset& dataset, Split split, int batch_size, int seq_len, uint64_t seed);

  int batch_size() const { return batch_size_; }
  int seq_len() const { return seq_len_; }
  int64_t num_windows() const { return int64_t(windows_.size()); }
  // Batches per epoch (the last partial batch wraps into the next epoch).
  int64_t batches_per_epoch() const;

  void next_batch(int32_t* inputs, int32_t* targets);
  void next_batch(std::vector<int32_t>& inputs, std::vector<int32_t>& targets);

  DataPosition position() const { return pos_; }
  void set_position(const DataPosition& pos);
  void reset() { set_position({}); }

 private:
  void shuffle_for_epoch();

  const TextDataset& dataset_;
  Split split_;
  int batch_size_, seq_len_;
  uint64_t seed_;
  std::vector<TextDataset::Window> windows_;
  std::vector<uint32_t> order_;
  uint64_t order_epoch_ = ~0ULL;
  DataPosition pos_;
  std::vector<int32_t> scratch_;
};

}  // namespace coremesh::train
